#!/usr/bin/env python3
"""Write a tiny synthetic Llama model as an F32 GGUF file (test fixture).

The file carries exactly the metadata llama.cpp needs to load an
architecture "llama" model with a SentencePiece-style ("llama") vocabulary,
so it can be evaluated by scripts/reference/llamacpp_reference.py and
scripts/reference/numpy_llama_reference.py.

Usage:
    python scripts/tools/make_tiny_gguf.py --out tiny.gguf [--seed 0] [--tied]
        [--rope-freqs] [--n-layer 2] [--n-embd 64] [--n-head 4]
        [--n-head-kv 2] [--n-ff 128] [--n-vocab 512] [--n-ctx 256]

Weights are stored in GGUF order: a weight mapping an input of size IN to an
output of size OUT has ne = [IN, OUT], i.e. a NumPy array of shape (OUT, IN)
applied as y = W @ x.  Q/K rows are in llama.cpp's RoPE layout (rotation on
adjacent pairs (2i, 2i+1) of each head).
"""
import argparse

import numpy as np
import gguf

# llama.cpp token types (llama_token_type)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_BYTE = 1, 2, 3, 6


def build_vocab(n_vocab):
    """<unk>, <s>, </s>, 256 byte tokens, then unique filler pieces."""
    if n_vocab < 3 + 256 + 1:
        raise SystemExit("n_vocab must be at least 260")
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TT_UNKNOWN, TT_CONTROL, TT_CONTROL]
    tokens += ["<0x%02X>" % b for b in range(256)]
    types += [TT_BYTE] * 256
    i = 0
    while len(tokens) < n_vocab:
        tokens.append("\u2581t%d" % i)
        types.append(TT_NORMAL)
        i += 1
    scores = [0.0] * 3 + [0.0] * 256 + [-float(k) for k in range(n_vocab - 259)]
    return tokens, scores, types


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-head-kv", type=int, default=2)
    ap.add_argument("--n-ff", type=int, default=128)
    ap.add_argument("--n-vocab", type=int, default=512)
    ap.add_argument("--n-ctx", type=int, default=256)
    ap.add_argument("--rope-base", type=float, default=10000.0)
    ap.add_argument("--rms-eps", type=float, default=1e-5)
    ap.add_argument("--tied", action="store_true",
                    help="omit output.weight (llama.cpp then uses token_embd.weight)")
    ap.add_argument("--rope-freqs", action="store_true",
                    help="add a rope_freqs.weight tensor (per-pair frequency divisors)")
    a = ap.parse_args()

    E, H, HKV, FF, V = a.n_embd, a.n_head, a.n_head_kv, a.n_ff, a.n_vocab
    if E % H or H % HKV:
        raise SystemExit("n_embd must be divisible by n_head, n_head by n_head_kv")
    D = E // H
    rng = np.random.default_rng(a.seed)

    def lin(n_out, n_in):
        # numpy shape (OUT, IN) == GGUF ne [IN, OUT]
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("sparsim-tiny-llama")
    w.add_context_length(a.n_ctx)
    w.add_embedding_length(E)
    w.add_block_count(a.n_layer)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_dimension_count(D)
    w.add_rope_freq_base(a.rope_base)
    w.add_layer_norm_rms_eps(a.rms_eps)
    w.add_vocab_size(V)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    tokens, scores, types = build_vocab(V)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    w.add_tensor("token_embd.weight", rng.standard_normal((V, E)).astype(np.float32))
    if a.rope_freqs:
        # one divisor per rotated pair, shared by all layers
        w.add_tensor("rope_freqs.weight",
                     np.linspace(1.0, 8.0, D // 2).astype(np.float32))
    for i in range(a.n_layer):
        p = "blk.%d." % i
        w.add_tensor(p + "attn_norm.weight", norm(E))
        w.add_tensor(p + "attn_q.weight", lin(H * D, E))
        w.add_tensor(p + "attn_k.weight", lin(HKV * D, E))
        w.add_tensor(p + "attn_v.weight", lin(HKV * D, E))
        w.add_tensor(p + "attn_output.weight", lin(E, H * D))
        w.add_tensor(p + "ffn_norm.weight", norm(E))
        w.add_tensor(p + "ffn_gate.weight", lin(FF, E))
        w.add_tensor(p + "ffn_up.weight", lin(FF, E))
        w.add_tensor(p + "ffn_down.weight", lin(E, FF))
    w.add_tensor("output_norm.weight", norm(E))
    if not a.tied:
        w.add_tensor("output.weight", lin(V, E))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", a.out)


if __name__ == "__main__":
    main()
