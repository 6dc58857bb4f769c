#!/usr/bin/env python3
"""Reference logits from llama.cpp (through llama-cpp-python) for a GGUF model.

Evaluates a prompt in one batch, keeps the logits of every prompt position,
then generates greedily (argmax of the raw logits; no sampling, penalties or
EOS stop) and keeps the logits of each generation step.  The result is the
ground truth that sparsim's forward pass is compared against.

Usage:
    python scripts/reference/llamacpp_reference.py --model M.gguf --tokens 1,450,4996 \\
        --n-greedy 32 --threads 2 --out ref.h5
    python scripts/reference/llamacpp_reference.py --model M.gguf --prompt-len 64 --seed 7 \\
        --n-greedy 32 --out ref.h5

Random prompts (--prompt-len/--seed) are drawn uniformly from
[first_normal_token, n_vocab) with numpy.random.default_rng(seed), where
first_normal_token is the lowest id llama.cpp classifies as a normal token.
No BOS is prepended: the ids are fed exactly as given.

Settings that fix the numerics: CPU only, F32 KV cache (--kv-type f16 to
see the effect of a half-precision cache), flash attention off, the whole
prompt in one micro-batch (n_batch = n_ubatch >= prompt length), no mmap,
no weight repacking (extra buffer types off).

Requires llama-cpp-python in the scripts venv; tested with 0.3.36 (bundled
llama.cpp 0c1e570, ggml 0.25.3), built on CPU with
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=2 pip install llama-cpp-python

Output (HDF5):
    prompt_tokens  int32   [T]         ids fed at positions 0..T-1
    prompt_logits  float32 [T][V]      logits at every prompt position
    greedy_tokens  int32   [n]         greedy_tokens[0] = argmax(prompt_logits[T-1]),
                                       greedy_tokens[k] = argmax(greedy_logits[k-1])
    greedy_logits  float32 [n][V]      logits after feeding greedy_tokens[k] at
                                       position T+k
  so prompt_tokens ++ greedy_tokens fed teacher-forced reproduces
  prompt_logits ++ greedy_logits.  argmax ties resolve to the lowest id.
    attributes: llama_cpp_python_version, llama_cpp_version, ggml_version,
                ggml_commit, system_info,
                model_path, model_sha256, model_desc, threads, kv_type, ...
"""
import argparse
import ctypes
import hashlib
import os
import sys
import time

import numpy as np
import h5py

import llama_cpp as lc

KV_TYPES = {"f32": lc.GGML_TYPE_F32, "f16": lc.GGML_TYPE_F16}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def ggml_build_info():
    """(version, commit) of the ggml library bundled with llama-cpp-python."""
    libdir = os.path.join(os.path.dirname(lc.__file__), "lib")
    try:
        lib = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
        out = []
        for fn in ("ggml_version", "ggml_commit"):
            f = getattr(lib, fn)
            f.restype = ctypes.c_char_p
            out.append(f().decode(errors="replace"))
        return tuple(out)
    except (OSError, AttributeError):
        return ("unknown", "unknown")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF file")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", help="comma-separated token ids")
    src.add_argument("--prompt-len", type=int, help="number of random token ids")
    ap.add_argument("--seed", type=int, default=0, help="seed for --prompt-len")
    ap.add_argument("--n-greedy", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--kv-type", choices=sorted(KV_TYPES), default="f32")
    ap.add_argument("--out", required=True, help="output .h5")
    ap.add_argument("--verbose", action="store_true", help="show llama.cpp log")
    return ap.parse_args()


class LlamaCpp:
    """Minimal wrapper over the llama.cpp C API for one sequence."""

    def __init__(self, path, n_ctx, n_batch, threads, kv_type, verbose):
        # keep the callback object alive for the lifetime of the process
        def log(level, text, user):
            if verbose:
                sys.stderr.write(text.decode(errors="replace"))
        self._log_cb = lc.llama_log_callback(log)
        lc.llama_log_set(self._log_cb, ctypes.c_void_p(0))
        lc.llama_backend_init()

        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.load_mode = lc.LLAMA_LOAD_MODE_NONE      # read the file, no mmap
        mp.use_extra_bufts = False                  # no CPU weight repacking
        self.model = lc.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise RuntimeError("llama.cpp failed to load %s (rerun with --verbose)" % path)
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)

        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch
        cp.n_seq_max = 1
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = kv_type
        cp.type_v = kv_type
        cp.embeddings = False
        cp.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp failed to create a context (rerun with --verbose)")
        self.n_ctx = lc.llama_n_ctx(self.ctx)
        self.batch = lc.llama_batch_init(n_batch, 0, 1)
        self.n_batch = n_batch
        self.n_past = 0

    def first_normal_token(self):
        for t in range(self.n_vocab):
            if lc.llama_vocab_get_attr(self.vocab, t) & lc.LLAMA_TOKEN_ATTR_NORMAL:
                return t
        raise RuntimeError("vocabulary has no normal token")

    def desc(self):
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(self.model, buf, ctypes.sizeof(buf))
        return buf.value.decode(errors="replace")

    def decode(self, tokens):
        """Feed tokens at the next positions; return their logits [len][V]."""
        n = len(tokens)
        if n > self.n_batch or self.n_past + n > self.n_ctx:
            raise ValueError("batch or context too small")
        b = self.batch
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i] = int(t)
            b.pos[i] = self.n_past + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1
        rc = lc.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError("llama_decode returned %d" % rc)
        out = np.empty((n, self.n_vocab), dtype=np.float32)
        for i in range(n):
            p = lc.llama_get_logits_ith(self.ctx, i)
            out[i] = np.ctypeslib.as_array(p, shape=(self.n_vocab,))
        self.n_past += n
        return out

    def close(self):
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)
        lc.llama_backend_free()


def main():
    a = parse_args()
    if a.n_greedy < 0:
        raise SystemExit("--n-greedy must be >= 0")
    T = len(a.tokens.split(",")) if a.tokens else a.prompt_len
    if T is None or T < 1:
        raise SystemExit("empty prompt")
    need = T + a.n_greedy

    t0 = time.time()
    m = LlamaCpp(os.path.abspath(a.model), need, T, a.threads, KV_TYPES[a.kv_type],
                 a.verbose)
    first_normal = m.first_normal_token()
    if a.tokens:
        prompt = np.array([int(x) for x in a.tokens.split(",")], dtype=np.int64)
    else:
        rng = np.random.default_rng(a.seed)
        prompt = rng.integers(first_normal, m.n_vocab, size=T)
    if prompt.min() < 0 or prompt.max() >= m.n_vocab:
        raise SystemExit("token id out of range [0, %d)" % m.n_vocab)
    t_load = time.time() - t0

    t0 = time.time()
    prompt_logits = m.decode(prompt.tolist())
    greedy_tokens = np.empty(a.n_greedy, dtype=np.int32)
    greedy_logits = np.empty((a.n_greedy, m.n_vocab), dtype=np.float32)
    last = prompt_logits[-1]
    for k in range(a.n_greedy):
        greedy_tokens[k] = int(np.argmax(last))
        last = m.decode([int(greedy_tokens[k])])[0]
        greedy_logits[k] = last
    t_eval = time.time() - t0

    with h5py.File(a.out, "w") as f:
        f.create_dataset("prompt_tokens", data=prompt.astype(np.int32))
        f.create_dataset("prompt_logits", data=prompt_logits)
        f.create_dataset("greedy_tokens", data=greedy_tokens)
        f.create_dataset("greedy_logits", data=greedy_logits)
        at = f.attrs
        at["generator"] = "llama.cpp via llama-cpp-python"
        at["llama_cpp_python_version"] = lc.__version__
        at["llama_cpp_version"] = lc.llama_version().decode(errors="replace")
        at["ggml_version"], at["ggml_commit"] = ggml_build_info()
        at["system_info"] = lc.llama_print_system_info().decode(errors="replace")
        at["model_path"] = os.path.abspath(a.model)
        at["model_sha256"] = sha256_file(a.model)
        at["model_desc"] = m.desc()
        at["n_vocab"] = m.n_vocab
        at["first_normal_token"] = first_normal
        at["threads"] = a.threads
        at["kv_type"] = a.kv_type
        at["flash_attn"] = 0
        at["n_ctx"] = m.n_ctx
        at["n_ubatch"] = T
        at["prompt_source"] = "tokens" if a.tokens else "random"
        if not a.tokens:
            at["seed"] = a.seed
        at["command"] = " ".join(sys.argv)
    m.close()
    print("%s: T=%d n_greedy=%d vocab=%d load %.2fs eval %.2fs -> %s"
          % (os.path.basename(a.model), T, a.n_greedy, prompt_logits.shape[1],
             t_load, t_eval, a.out))


if __name__ == "__main__":
    main()
