#!/usr/bin/env python3
"""Opt-in check of sparsim's backward pass against PyTorch autograd (CPU, float64).

1. `sparsim synth` writes a small synthetic Llama GGUF (F32; GQA);
2. `sparsim eval --save-tokens` tokenizes a generated text with the model's own tokenizer and
   `sparsim calibrate --fisher` runs the backward pass over the first --tokens tokens: the
   per-sequence K/V gate gradients G_c = sum_t dL/dk_tc * k_tc land in the calibration file;
3. here the same model is written in PyTorch from the GGUF tensors (gguf.GGUFReader), every
   pre-RoPE K and V channel multiplied by a gate m = 1 (requires_grad), the mean next-token
   cross-entropy of the same tokens is differentiated by autograd, and dL/dm is compared with
   sparsim's G.

Exits non-zero when max |G_sparsim - G_torch| / max |G_torch| exceeds --tol (default 1e-4:
sparsim's production path is fp32).

  pip install torch --index-url https://download.pytorch.org/whl/cpu   # or: pip install torch
  scripts/backprop_torch_check.py [--sparsim build/bin/sparsim] [--tokens 48]

Needs torch, numpy, gguf and h5py; not installed by scripts/setup.sh (opt-in).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

try:
    import torch
except ImportError:
    raise SystemExit("backprop_torch_check: PyTorch is not installed (pip install torch)")
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def torch_gate_grads(path, tokens):
    r = gguf.GGUFReader(path)
    kv = lambda k, d=None: field(r, "llama." + k, d)
    L, H = int(kv("block_count")), int(kv("attention.head_count"))
    HKV = int(kv("attention.head_count_kv", H))
    D = int(kv("attention.key_length"))
    eps, base = float(kv("attention.layer_norm_rms_epsilon")), float(kv("rope.freq_base"))
    t = {ten.name: torch.tensor(np.asarray(ten.data), dtype=torch.float64) for ten in r.tensors}
    emb = t["token_embd.weight"]
    out_w = t.get("output.weight", emb)
    T = len(tokens)
    pos = torch.arange(T, dtype=torch.float64)
    inv = base ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
    ang = pos[:, None] * inv[None, :]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]

    def rope(x):  # GGUF layout: adjacent pairs (2j, 2j+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y = torch.empty_like(x)
        y[..., 0::2] = x0 * cos - x1 * sin
        y[..., 1::2] = x0 * sin + x1 * cos
        return y

    def norm(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    gk = [torch.ones(HKV * D, dtype=torch.float64, requires_grad=True) for _ in range(L)]
    gv = [torch.ones(HKV * D, dtype=torch.float64, requires_grad=True) for _ in range(L)]
    x = emb[torch.tensor(tokens)]
    mask = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
    for l in range(L):
        w = lambda n: t[f"blk.{l}.{n}.weight"]
        h = norm(x, w("attn_norm"))
        q = (h @ w("attn_q").T).reshape(T, H, D)
        k = ((h @ w("attn_k").T) * gk[l]).reshape(T, HKV, D)
        v = ((h @ w("attn_v").T) * gv[l]).reshape(T, HKV, D)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(H // HKV, dim=1)
        v = v.repeat_interleave(H // HKV, dim=1)
        s = torch.einsum("thd,phd->htp", q, k) / np.sqrt(D) + mask
        a = torch.einsum("htp,phd->thd", torch.softmax(s, -1), v).reshape(T, H * D)
        x = x + a @ w("attn_output").T
        h = norm(x, w("ffn_norm"))
        x = x + (torch.nn.functional.silu(h @ w("ffn_gate").T) * (h @ w("ffn_up").T)) @ w("ffn_down").T
    z = norm(x, t["output_norm.weight"]) @ out_w.T
    loss = torch.nn.functional.cross_entropy(z[:-1], torch.tensor(tokens[1:]))
    loss.backward()
    return float(loss), np.stack([g.grad.numpy() for g in gk]), np.stack([g.grad.numpy() for g in gv])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model, corpus = os.path.join(d, "m.gguf"), os.path.join(d, "text.txt")
        subprocess.run([a.sparsim, "synth", "--out", model, "--layers", "3", "--seed", "5"],
                       check=True, stdout=subprocess.DEVNULL)
        rng = np.random.default_rng(3)
        words = ["".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(1, 8)))
                 for _ in range(800)]
        with open(corpus, "w") as f:
            f.write(" ".join(words) + "\n")
        run, cal = os.path.join(d, "tok.h5"), os.path.join(d, "fisher.h5")
        subprocess.run([a.sparsim, "eval", "--model", model, "--corpus", corpus, "--context", "32",
                        "--stride", "32", "--max-windows", "1", "--save-tokens", "--out", run,
                        "--progress", "never"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([a.sparsim, "calibrate", "--fisher", "--model", model, "--corpus", corpus,
                        "--fisher-seqs", "1", "--fisher-tokens", str(a.tokens), "--out", cal,
                        "--progress", "never"], check=True, stdout=subprocess.DEVNULL)
        with h5py.File(run, "r") as f:
            tokens = [int(x) for x in f["corpus/tokens"][: a.tokens]]
        with h5py.File(cal, "r") as f:
            sk = f["fisher/gate_grad_k"][0]
            sv = f["fisher/gate_grad_v"][0]
            s_loss = float(f["fisher/loss"][0])
        t_loss, tk, tv = torch_gate_grads(model, tokens)
    ek = np.abs(sk - tk).max() / np.abs(tk).max()
    ev = np.abs(sv - tv).max() / np.abs(tv).max()
    print(f"loss: sparsim {s_loss:.10f}, PyTorch {t_loss:.10f}")
    print(f"K gate gradients: max |sparsim - torch| / max |torch| = {ek:.3e}")
    print(f"V gate gradients: max |sparsim - torch| / max |torch| = {ev:.3e}")
    ok = ek <= a.tol and ev <= a.tol and abs(s_loss - t_loss) <= a.tol * abs(t_loss)
    print("PASS" if ok else f"FAIL (tolerance {a.tol})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
