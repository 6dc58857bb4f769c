#!/usr/bin/env python3
"""Independent NumPy forward pass of a Hugging Face Llama directory.

Reads config.json and model.safetensors (or the shards of
model.safetensors.index.json) with its own minimal safetensors parser (F32, F16,
BF16) and implements the transformers LlamaForCausalLM semantics directly:
  * weights: safetensors shape (OUT, IN), y = W @ x
  * RMSNorm: x / sqrt(mean(x^2) + eps) * w
  * RoPE with rotate_half: inv_freq = 1 / theta^(arange(0, D, 2) / D),
    cos/sin = cat(freqs, freqs), x' = x*cos + rotate_half(x)*sin where
    rotate_half(x) = cat(-x[D/2:], x[:D/2])  (dimension j pairs with j + D/2);
    rope_scaling "llama3" as in transformers' _compute_llama3_parameters
  * GQA, causal softmax attention scaled by 1/sqrt(D); SwiGLU MLP
  * lm_head.weight, or the embedding when tie_word_embeddings is true
Computation is in float64 by default.

Usage:
    python scripts/reference/hf_reference.py --model DIR --tokens 1,2,3 --n-greedy 8 --out hf.h5
    # teacher-force the tokens of a reference file (a llama.cpp/NumPy reference file,
    # or a `sparsim forward --out` run file) and compare logits
    python scripts/reference/hf_reference.py --model DIR --compare run.h5 --tol 1e-4
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    data = memoryview(buf)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[b:e]
        dt = info["dtype"]
        if dt == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dt == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit("%s: tensor %s has dtype %s (F32/F16/BF16 only)" % (path, name, dt))
        out[name] = a.reshape(info["shape"])
    return out


def load_dir(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        t = {}
        for s in shards:
            t.update(read_safetensors(os.path.join(d, s)))
        return t
    return read_safetensors(os.path.join(d, "model.safetensors"))


class Model:
    def __init__(self, d, dtype=np.float64):
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        if c.get("model_type") != "llama":
            raise SystemExit("model_type %r is not 'llama'" % c.get("model_type"))
        self.n_layer = c["num_hidden_layers"]
        self.n_embd = c["hidden_size"]
        self.n_head = c["num_attention_heads"]
        self.n_head_kv = c.get("num_key_value_heads") or self.n_head
        self.head_dim = c.get("head_dim") or self.n_embd // self.n_head
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        theta = float(c.get("rope_theta", 10000.0))
        D = self.head_dim
        inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
        rs = c.get("rope_scaling")
        if rs:
            kind = rs.get("rope_type", rs.get("type"))
            if kind == "llama3":
                factor = rs["factor"]
                lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
                old = rs["original_max_position_embeddings"]
                lo_wl, hi_wl = old / lo, old / hi
                wl = 2 * np.pi / inv
                scaled = np.where(wl > lo_wl, inv / factor, inv)
                smooth = (old / wl - lo) / (hi - lo)
                smoothed = (1 - smooth) * scaled / factor + smooth * scaled
                medium = ~(wl < hi_wl) & ~(wl > lo_wl)
                inv = np.where(medium, smoothed, scaled)
            elif kind != "default":
                raise SystemExit("rope_scaling %r not supported" % kind)
        self.inv_freq = inv
        t = {k: v.astype(dtype) for k, v in load_dir(d).items()}
        self.t = t
        self.embed = t["model.embed_tokens.weight"]
        self.tied = bool(c.get("tie_word_embeddings", False))
        self.lm_head = self.embed if self.tied else t["lm_head.weight"]
        self.n_vocab = self.embed.shape[0]
        self.dtype = dtype
        self.reset()

    def reset(self):
        self.k_cache = [None] * self.n_layer
        self.v_cache = [None] * self.n_layer
        self.n_past = 0

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        # x: (T, H, D); HF: x*cos + rotate_half(x)*sin with cos/sin = cat(freqs, freqs)
        f = pos[:, None] * self.inv_freq[None, :]
        emb = np.concatenate([f, f], axis=-1)
        c = np.cos(emb)[:, None, :].astype(self.dtype)
        s = np.sin(emb)[:, None, :].astype(self.dtype)
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * c + rot * s

    def forward(self, tokens):
        """Feed tokens at the next positions; return logits (T, V)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        H, HKV, D = self.n_head, self.n_head_kv, self.head_dim
        pos = np.arange(self.n_past, self.n_past + T, dtype=np.float64)
        x = self.embed[tokens]
        n_all = self.n_past + T
        qpos = np.arange(self.n_past, n_all)[:, None]
        kpos = np.arange(n_all)[None, :]
        mask = np.where(kpos <= qpos, 0.0, -np.inf)
        group = H // HKV
        for il in range(self.n_layer):
            p = "model.layers.%d." % il
            w = lambda n: self.t[p + n + ".weight"]
            h = self.rmsnorm(x, w("input_layernorm"))
            q = (h @ w("self_attn.q_proj").T).reshape(T, H, D)
            k = (h @ w("self_attn.k_proj").T).reshape(T, HKV, D)
            v = (h @ w("self_attn.v_proj").T).reshape(T, HKV, D)
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            if self.k_cache[il] is not None:
                k = np.concatenate([self.k_cache[il], k], axis=0)
                v = np.concatenate([self.v_cache[il], v], axis=0)
            self.k_cache[il], self.v_cache[il] = k, v
            kh = np.repeat(k, group, axis=1)
            vh = np.repeat(v, group, axis=1)
            sc = np.einsum("thd,nhd->htn", q, kh) / np.sqrt(D) + mask[None]
            sc = sc - sc.max(axis=-1, keepdims=True)
            pr = np.exp(sc)
            pr = pr / pr.sum(axis=-1, keepdims=True)
            att = np.einsum("htn,nhd->thd", pr, vh).reshape(T, H * D)
            x = x + att @ w("self_attn.o_proj").T
            h = self.rmsnorm(x, w("post_attention_layernorm"))
            g = h @ w("mlp.gate_proj").T
            u = h @ w("mlp.up_proj").T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ w("mlp.down_proj").T
        self.n_past = n_all
        x = self.rmsnorm(x, self.t["model.norm.weight"])
        return x @ self.lm_head.T


def read_reference(path):
    import h5py
    with h5py.File(path, "r") as f:
        g = f["results"] if "results" in f else f  # sparsim run file or reference file
        pt = g["prompt_tokens"][...]
        gt = g["greedy_tokens"][...] if "greedy_tokens" in g else np.zeros(0, np.int32)
        parts = [g["prompt_logits"][...]]
        if len(gt):
            parts.append(g["greedy_logits"][...])
    return pt, gt, np.concatenate(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens")
    src.add_argument("--compare", metavar="REF_H5")
    ap.add_argument("--n-greedy", type=int, default=8)
    ap.add_argument("--out")
    ap.add_argument("--float32", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    m = Model(a.model, np.float32 if a.float32 else np.float64)

    if a.compare:
        pt, gt, ref = read_reference(a.compare)
        logits = np.concatenate([m.forward(pt), m.forward(gt)]) if len(gt) else m.forward(pt)
        diff = np.abs(logits - ref)
        rel = diff.max() / np.abs(ref).max()
        agree = (logits.argmax(axis=1) == ref.argmax(axis=1)).sum()
        print("positions %d, vocab %d, tied head: %s" % (len(ref), m.n_vocab, m.tied))
        print("max |logit| %.4g, max abs diff %.3e, relative %.3e"
              % (np.abs(ref).max(), diff.max(), rel))
        print("argmax agreement: %d/%d positions" % (agree, len(ref)))
        ok = diff.max() <= a.tol
        print("PASS" if ok else "FAIL (tol %g)" % a.tol)
        sys.exit(0 if ok else 1)

    if not a.out:
        raise SystemExit("--out is required unless --compare is given")
    prompt = np.array([int(x) for x in a.tokens.split(",")], dtype=np.int64)
    prompt_logits = m.forward(prompt)
    greedy_tokens = np.empty(a.n_greedy, dtype=np.int32)
    greedy_logits = np.empty((a.n_greedy, m.n_vocab), dtype=np.float32)
    last = prompt_logits[-1]
    for k in range(a.n_greedy):
        greedy_tokens[k] = int(np.argmax(last))
        last = m.forward([greedy_tokens[k]])[0]
        greedy_logits[k] = last
    import h5py
    with h5py.File(a.out, "w") as f:
        f.create_dataset("prompt_tokens", data=prompt.astype(np.int32))
        f.create_dataset("prompt_logits", data=prompt_logits.astype(np.float32))
        f.create_dataset("greedy_tokens", data=greedy_tokens)
        f.create_dataset("greedy_logits", data=greedy_logits)
        f.attrs["generator"] = "scripts/reference/hf_reference.py"
        f.attrs["model_path"] = a.model
        f.attrs["dtype"] = "float32" if a.float32 else "float64"
    print("wrote", a.out)


if __name__ == "__main__":
    main()
