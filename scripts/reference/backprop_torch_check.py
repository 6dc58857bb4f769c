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

4. LoRA weight gradients (`sparsim recover`): the synthetic model is pruned with RAP and with
   KVPruner (`sparsim prune`, orphaned RoPE channels included), `sparsim recover --steps 1
   --dump-gradients` writes the adapters of every projection (B drawn nonzero, so that dL/dA is
   not 0), the tokens of the step and dL/dA, dL/dB of the loss CE + w*T^2*KL(student, teacher)
   (both KL directions); here the pruned student with the adapters (index-aware RoPE of the
   kept channels) and the dense teacher are written in PyTorch, the same loss is differentiated
   by autograd and the gradients are compared.

Exits non-zero when a max |sparsim - torch| / max |torch| exceeds --tol (default 1e-4:
sparsim's production path is fp32).

  pip install torch --index-url https://download.pytorch.org/whl/cpu   # or: pip install torch
  scripts/reference/backprop_torch_check.py [--sparsim build/bin/sparsim] [--tokens 48]

Needs torch, numpy, gguf and h5py; not installed by scripts/setup.sh (opt-in). The output of a
run is kept in docs/results/recovery/backprop_torch_check.txt.
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
ROOT = os.path.dirname(os.path.dirname(HERE))


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


def pruned_layout(r, L, HKV, D):
    """Per layer: (qk width, v width, kept K channels [HKV][qk], kept V channels [HKV][v]);
    the full layout for a dense model."""
    kw = field(r, "sparsim.attention.key_length_per_layer")
    if kw is None:
        full = np.tile(np.arange(D), (HKV, 1))
        return [(D, D, full, full) for _ in range(L)]
    vw = field(r, "sparsim.attention.value_length_per_layer")
    kc = np.asarray(field(r, "sparsim.attention.key_channels"))
    vc = np.asarray(field(r, "sparsim.attention.value_channels"))
    out, ko, vo = [], 0, 0
    for l in range(L):
        q, v = int(kw[l]), int(vw[l])
        out.append((q, v, kc[ko:ko + HKV * q].reshape(HKV, q), vc[vo:vo + HKV * v].reshape(HKV, v)))
        ko += HKV * q
        vo += HKV * v
    return out


def llama_logits(path, tokens, lora=None):
    """Logits [T][V] (float64) of the GGUF model at `path` (dense or pruned, adjacent RoPE
    layout) on `tokens`; `lora` maps "blk.L.attn_q"-style names to (A, B, scale) tensors."""
    r = gguf.GGUFReader(path)
    kv = lambda k, d=None: field(r, "llama." + k, d)
    L, H = int(kv("block_count")), int(kv("attention.head_count"))
    HKV = int(kv("attention.head_count_kv", H))
    D = int(kv("attention.key_length"))
    eps, base = float(kv("attention.layer_norm_rms_epsilon")), float(kv("rope.freq_base"))
    t = {ten.name: torch.tensor(np.asarray(ten.data), dtype=torch.float64) for ten in r.tensors}
    layout = pruned_layout(r, L, HKV, D)
    emb = t["token_embd.weight"]
    out_w = t.get("output.weight", emb)
    T = len(tokens)
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    inv = base ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)

    def rope(x, chans):  # x [T, heads, w]; chans [heads, w]: full-head channel of each column
        y = torch.zeros_like(x)
        for h in range(x.shape[1]):
            c = [int(v) for v in chans[h]]
            at = {ch: i for i, ch in enumerate(c)}
            for i, ch in enumerate(c):
                ang = pos[:, 0] * inv[ch // 2]
                cos, sin = torch.cos(ang), torch.sin(ang)
                j = at.get(ch ^ 1)  # the RoPE partner, if kept (an orphan is x*cos)
                y[:, h, i] = x[:, h, i] * cos
                if j is not None:
                    y[:, h, i] = y[:, h, i] + (-1 if ch % 2 == 0 else 1) * x[:, h, j] * sin
        return y

    def norm(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    def proj(x, l, name):
        y = x @ t[f"blk.{l}.{name}.weight"].T
        if lora and f"blk.{l}.{name}" in lora:
            a, b, s = lora[f"blk.{l}.{name}"]
            y = y + s * (x @ a.T) @ b.T
        return y

    x = emb[torch.tensor(tokens)]
    mask = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
    for l in range(L):
        qk, vw, kc, vc = layout[l]
        h = norm(x, t[f"blk.{l}.attn_norm.weight"])
        q = proj(h, l, "attn_q").reshape(T, H, qk)
        k = proj(h, l, "attn_k").reshape(T, HKV, qk)
        v = proj(h, l, "attn_v").reshape(T, HKV, vw)
        q = rope(q, np.repeat(kc, H // HKV, axis=0))
        k = rope(k, kc)
        k = k.repeat_interleave(H // HKV, dim=1)
        v = v.repeat_interleave(H // HKV, dim=1)
        s = torch.einsum("thd,phd->htp", q, k) / np.sqrt(D) + mask
        a = torch.einsum("htp,phd->thd", torch.softmax(s, -1), v).reshape(T, H * vw)
        x = x + proj(a, l, "attn_output")
        h = norm(x, t[f"blk.{l}.ffn_norm.weight"])
        x = x + proj(torch.nn.functional.silu(proj(h, l, "ffn_gate")) * proj(h, l, "ffn_up"), l,
                     "ffn_down")
    return norm(x, t["output_norm.weight"]) @ out_w.T


def check_lora(a, d, teacher, corpus, cal, method, direction):
    """sparsim's LoRA gradients of one recovery step against autograd; returns the error."""
    student = os.path.join(d, f"{method}.gguf")
    if not os.path.exists(student):
        subprocess.run([a.sparsim, "prune", "--model", teacher, "--method", method, "--retain",
                        "0.5", "--calibration", cal, "--out", student, "--flops-context", "64"],
                       check=True, stdout=subprocess.DEVNULL)
    dump = os.path.join(d, f"grads_{method}_{direction}.h5")
    T, w = 2.0, 0.7
    subprocess.run([a.sparsim, "recover", "--model", student, "--teacher", teacher, "--corpus",
                    corpus, "--steps", "1", "--seq-len", str(a.lora_tokens), "--batch", "2",
                    "--lora-rank", "3", "--lora-alpha", "5", "--lora-dropout", "0",
                    "--lora-init-b-std", "0.05", "--targets", "q,k,v,o,gate,up,down",
                    "--kd-temperature", str(T), "--kd-weight", str(w), "--kd-direction",
                    direction, "--dump-gradients", dump, "--checkpoint", "off",
                    "--progress", "never", "--log-level", "warn",
                    "--out", os.path.join(d, f"rec_{method}_{direction}.gguf")],
                   check=True, stdout=subprocess.DEVNULL)
    names = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}
    with h5py.File(dump, "r") as f:
        scale = float(f.attrs["scale"])
        s_loss = float(f.attrs["loss"])
        seqs = [[int(x) for x in row] for row in f["tokens"][...]]
        lora, grads = {}, {}
        for n in f["adapters"]:
            g = f["adapters"][n]
            assert n.split(".", 2)[2] in names, n
            lora[n] = (torch.tensor(g["A"][...], requires_grad=True),
                       torch.tensor(g["B"][...], requires_grad=True), scale)
            grads[n] = (g["grad_A"][...], g["grad_B"][...])
    loss = 0
    for seq in seqs:
        z = llama_logits(student, seq, lora)[:-1]
        with torch.no_grad():
            zt = llama_logits(teacher, seq)[:-1]
        ce = torch.nn.functional.cross_entropy(z, torch.tensor(seq[1:]))
        ls, lt = torch.log_softmax(z / T, -1), torch.log_softmax(zt / T, -1)
        kl = ((ls.exp() * (ls - lt)) if direction == "reverse" else (lt.exp() * (lt - ls))).sum(-1)
        loss = loss + (ce + w * T * T * kl.mean()) / len(seqs)
    loss.backward()
    ta = np.concatenate([np.concatenate([lora[n][0].grad.numpy().ravel(),
                                         lora[n][1].grad.numpy().ravel()]) for n in sorted(lora)])
    sa = np.concatenate([np.concatenate([grads[n][0].ravel(), grads[n][1].ravel()])
                         for n in sorted(lora)])
    err = np.abs(sa - ta).max() / np.abs(ta).max()
    lerr = abs(s_loss - float(loss)) / abs(float(loss))
    print(f"LoRA gradients, {method} student, {direction} KL, {len(lora)} adapters "
          f"({sa.size} values): loss sparsim {s_loss:.10f}, PyTorch {float(loss):.10f}; "
          f"max |sparsim - torch| / max |torch| = {err:.3e}")
    return max(err, lerr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--lora-tokens", type=int, default=24, help="tokens per sequence of the LoRA check")
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
                        "--stride", "16", "--max-windows", "1", "--save-tokens", "--out", run,
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
        lora_errs = [check_lora(a, d, model, corpus, cal, m, k)
                     for m in ("rap", "kvpruner") for k in ("reverse", "forward")]
    ek = np.abs(sk - tk).max() / np.abs(tk).max()
    ev = np.abs(sv - tv).max() / np.abs(tv).max()
    print(f"loss: sparsim {s_loss:.10f}, PyTorch {t_loss:.10f}")
    print(f"K gate gradients: max |sparsim - torch| / max |torch| = {ek:.3e}")
    print(f"V gate gradients: max |sparsim - torch| / max |torch| = {ev:.3e}")
    ok = (ek <= a.tol and ev <= a.tol and abs(s_loss - t_loss) <= a.tol * abs(t_loss)
          and max(lora_errs) <= a.tol)
    print("PASS" if ok else f"FAIL (tolerance {a.tol})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
