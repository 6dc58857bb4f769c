#!/usr/bin/env python3
"""Independent NumPy forward pass of a Llama GGUF model (second reference).

Reads the GGUF with gguf.GGUFReader (F32/F16 tensors only) and implements the
llama.cpp semantics of architecture "llama" directly:
  * weights: GGUF ne = [IN, OUT]  ->  NumPy array (OUT, IN), y = W @ x
  * RMSNorm: x / sqrt(mean(x^2) + eps) * w
  * RoPE "normal" mode: rotates adjacent pairs (2j, 2j+1) of each head by
    pos * base^(-2j/D) / rope_freqs[j]  (rope_freqs.weight optional)
  * GQA: query head h reads KV head h // (n_head / n_head_kv); causal softmax
    attention scaled by 1/sqrt(D)
  * SwiGLU FFN: down(silu(gate x) * up x)
  * output.weight, or token_embd.weight when it is absent (tied head)
Computation is in float64 by default.

Usage:
    # same prompt/greedy protocol and HDF5 layout as llamacpp_reference.py
    python scripts/reference/numpy_llama_reference.py --model M.gguf --tokens 1,2,3 \\
        --n-greedy 8 --out np.h5
    python scripts/reference/numpy_llama_reference.py --model M.gguf --prompt-len 32 --seed 7 \\
        --n-greedy 8 --out np.h5
    # teacher-force the tokens of a llama.cpp reference file and compare
    python scripts/reference/numpy_llama_reference.py --model M.gguf --compare ref.h5

--compare feeds prompt_tokens ++ greedy_tokens from the given file, reports
the max abs difference of all logits and whether the greedy argmaxes agree,
and exits non-zero if the difference exceeds --tol.
"""
import argparse
import sys

import numpy as np
import gguf


def field_value(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class Model:
    def __init__(self, path, dtype=np.float64):
        r = gguf.GGUFReader(path)
        arch = field_value(r, "general.architecture")
        if arch != "llama":
            raise SystemExit("architecture %r not supported (only 'llama')" % arch)
        kv = lambda k, d=None: field_value(r, "llama." + k, d)
        self.n_layer = int(kv("block_count"))
        self.n_embd = int(kv("embedding_length"))
        self.n_head = int(kv("attention.head_count"))
        self.n_head_kv = int(kv("attention.head_count_kv", self.n_head))
        self.head_dim = int(kv("attention.key_length", self.n_embd // self.n_head))
        n_rot = int(kv("rope.dimension_count", self.head_dim))
        if n_rot != self.head_dim:
            raise SystemExit("rope.dimension_count != head dim (llama.cpp rejects this)")
        self.eps = float(kv("attention.layer_norm_rms_epsilon"))
        self.base = float(kv("rope.freq_base", 10000.0))
        scaling = kv("rope.scaling.type", "linear")
        factor = float(kv("rope.scaling.factor", 0.0) or 0.0)
        if scaling not in ("none", "linear"):
            raise SystemExit("rope scaling type %r not supported" % scaling)
        self.freq_scale = 1.0 / factor if factor else 1.0
        ttype = field_value(r, "tokenizer.ggml.token_type")
        self.first_normal_token = (int(np.flatnonzero(np.asarray(ttype) == 1)[0])
                                   if ttype is not None else 0)

        t = {}
        for ten in r.tensors:
            if ten.tensor_type not in (gguf.GGMLQuantizationType.F32,
                                       gguf.GGMLQuantizationType.F16):
                raise SystemExit("tensor %s has type %s; only F32/F16 supported"
                                 % (ten.name, ten.tensor_type.name))
            # GGUFReader returns the array with NumPy shape = reversed ne
            t[ten.name] = np.asarray(ten.data).astype(dtype)
        self.t = t
        self.tok_embd = t["token_embd.weight"]            # (V, E)
        self.output = t.get("output.weight", self.tok_embd)
        self.tied = "output.weight" not in t
        self.n_vocab = self.tok_embd.shape[0]
        D = self.head_dim
        j = np.arange(D // 2, dtype=np.float64)
        inv = self.base ** (-2.0 * j / D) * self.freq_scale
        if "rope_freqs.weight" in t:
            inv = inv / t["rope_freqs.weight"].astype(np.float64)
        self.inv_freq = inv
        self.dtype = dtype
        self.reset()

    def reset(self):
        self.k_cache = [None] * self.n_layer
        self.v_cache = [None] * self.n_layer
        self.n_past = 0

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        # x: (T, H, D); rotate (x[..., 2j], x[..., 2j+1])
        ang = pos[:, None] * self.inv_freq[None, :]          # (T, D/2)
        c = np.cos(ang)[:, None, :].astype(self.dtype)
        s = np.sin(ang)[:, None, :].astype(self.dtype)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def forward(self, tokens):
        """Feed tokens at the next positions; return logits (T, V)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        H, HKV, D = self.n_head, self.n_head_kv, self.head_dim
        pos = np.arange(self.n_past, self.n_past + T, dtype=np.float64)
        x = self.tok_embd[tokens]                              # (T, E)
        n_all = self.n_past + T
        # causal mask over all cached + new positions
        qpos = np.arange(self.n_past, n_all)[:, None]
        kpos = np.arange(n_all)[None, :]
        mask = np.where(kpos <= qpos, 0.0, -np.inf)
        group = H // HKV
        for il in range(self.n_layer):
            p = "blk.%d." % il
            w = lambda n: self.t[p + n + ".weight"]
            h = self.rmsnorm(x, w("attn_norm"))
            q = (h @ w("attn_q").T).reshape(T, H, D)
            k = (h @ w("attn_k").T).reshape(T, HKV, D)
            v = (h @ w("attn_v").T).reshape(T, HKV, D)
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            if self.k_cache[il] is not None:
                k = np.concatenate([self.k_cache[il], k], axis=0)
                v = np.concatenate([self.v_cache[il], v], axis=0)
            self.k_cache[il], self.v_cache[il] = k, v
            kh = np.repeat(k, group, axis=1)                   # (N, H, D)
            vh = np.repeat(v, group, axis=1)
            sc = np.einsum("thd,nhd->htn", q, kh) / np.sqrt(D) + mask[None]
            sc = sc - sc.max(axis=-1, keepdims=True)
            pr = np.exp(sc)
            pr = pr / pr.sum(axis=-1, keepdims=True)
            att = np.einsum("htn,nhd->thd", pr, vh).reshape(T, H * D)
            x = x + att @ w("attn_output").T
            h = self.rmsnorm(x, w("ffn_norm"))
            g = h @ w("ffn_gate").T
            u = h @ w("ffn_up").T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ w("ffn_down").T
        self.n_past = n_all
        x = self.rmsnorm(x, self.t["output_norm.weight"])
        return x @ self.output.T


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens")
    src.add_argument("--prompt-len", type=int)
    src.add_argument("--compare", metavar="REF_H5",
                     help="teacher-force the tokens of this file and compare logits")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-greedy", type=int, default=32)
    ap.add_argument("--out", help="output .h5 (same layout as llamacpp_reference.py)")
    ap.add_argument("--float32", action="store_true", help="compute in float32")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()

    m = Model(a.model, np.float32 if a.float32 else np.float64)

    if a.compare:
        import h5py
        with h5py.File(a.compare, "r") as f:
            pt = f["prompt_tokens"][...]
            gt = f["greedy_tokens"][...]
            ref = np.concatenate([f["prompt_logits"][...], f["greedy_logits"][...]])
        logits = np.concatenate([m.forward(pt), m.forward(gt)]) if len(gt) else m.forward(pt)
        diff = np.abs(logits - ref)
        T = len(pt)
        amax_ref = ref.argmax(axis=1)
        amax_np = logits.argmax(axis=1)
        print("positions %d (prompt %d + greedy %d), vocab %d, tied head: %s"
              % (len(ref), T, len(gt), m.n_vocab, m.tied))
        print("max |logit| %.4g" % np.abs(ref).max())
        print("max abs diff: prompt %.3e  greedy %.3e  all %.3e"
              % (diff[:T].max(), diff[T:].max() if len(gt) else 0.0, diff.max()))
        print("argmax agreement: %d/%d positions" % ((amax_ref == amax_np).sum(), len(ref)))
        ok = diff.max() <= a.tol
        print("PASS" if ok else "FAIL (tol %g)" % a.tol)
        sys.exit(0 if ok else 1)

    if not a.out:
        raise SystemExit("--out is required unless --compare is given")
    if a.tokens:
        prompt = np.array([int(x) for x in a.tokens.split(",")], dtype=np.int64)
    else:
        prompt = np.random.default_rng(a.seed).integers(
            m.first_normal_token, m.n_vocab, size=a.prompt_len)
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
        f.attrs["generator"] = "scripts/reference/numpy_llama_reference.py"
        f.attrs["model_path"] = a.model
        f.attrs["first_normal_token"] = m.first_normal_token
        f.attrs["dtype"] = "float32" if a.float32 else "float64"
    print("wrote", a.out)


if __name__ == "__main__":
    main()
