#!/usr/bin/env python3
"""Speed against llama.cpp in one run: SmolLM2-135M (F32 and BF16 weights), prefill of a
512-token prompt and 128 decode steps, same thread count; tokens/s, their ratio and the peak
RSS of each program (each runs in its own child process; RSS from wait4).

    python scripts/bench_vs_llamacpp.py [--threads 2] [--reps 3] [--out FILE.json]

llama.cpp is llama-cpp-python's bundled build (CPU, F32 KV cache, flash attention off, no
mmap); sparsim is build/bin/sparsim bench. Medians over --reps repetitions.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def rss_of(cmd):
    """Runs cmd (stdout discarded) and returns its peak RSS in MiB, from wait4."""
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.execvp(cmd[0], cmd)
    _, status, ru = os.wait4(pid, 0)
    if status != 0:
        raise SystemExit("failed (%d): %s" % (status, " ".join(cmd)))
    return ru.ru_maxrss / 1024.0


def llama_child(model, prompt, decode, threads, reps):
    sys.path.insert(0, HERE)
    import llama_cpp as lc
    from llamacpp_reference import LlamaCpp
    llm = LlamaCpp(model, n_ctx=prompt + decode + 8, n_batch=prompt, threads=threads, kv_type=0,
                   verbose=False)
    toks = [(i * 7919 + 13) % llm.n_vocab for i in range(prompt)]
    pre, dec = [], []
    for _ in range(reps):
        lc.llama_memory_clear(lc.llama_get_memory(llm.ctx), True)
        llm.n_past = 0
        t0 = time.perf_counter()
        llm.decode(toks)
        pre.append(time.perf_counter() - t0)
        nxt, steps = toks[-1], []
        for s in range(decode):
            t0 = time.perf_counter()
            llm.decode([nxt])
            steps.append(time.perf_counter() - t0)
            nxt = (nxt * 31 + 7) % llm.n_vocab
        dec.append(statistics.median(steps))
    print(json.dumps({"prefill_tokens_per_s": prompt / statistics.median(pre),
                      "decode_tokens_per_s": 1.0 / statistics.median(dec)}))


def convert(src, dst, ftype_name):
    import llama_cpp as lc
    lc.llama_backend_init()
    p = lc.llama_model_quantize_default_params()
    p.ftype = getattr(lc, ftype_name)
    p.allow_requantize = True
    if lc.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) != 0:
        raise SystemExit("quantize to %s failed" % ftype_name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--work", default="/tmp/sparsim-bench-llamacpp")
    ap.add_argument("--out")
    ap.add_argument("--llama-child", nargs=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.llama_child:
        llama_child(a.llama_child[0], a.prompt, a.decode, a.threads, a.reps)
        return 0
    sys.path.insert(0, HERE)
    from compare_smollm2_llamacpp import find_smollm2
    os.makedirs(a.work, exist_ok=True)
    src = find_smollm2()
    sparsim = os.path.join(ROOT, "build", "bin", "sparsim")
    results = {"threads": a.threads, "prompt": a.prompt, "decode": a.decode, "reps": a.reps, "runs": {}}
    for name, ftype, storage in [("f32", "LLAMA_FTYPE_ALL_F32", "f32"),
                                 ("bf16", "LLAMA_FTYPE_MOSTLY_BF16", "bf16")]:
        model = os.path.join(a.work, "smollm2-%s.gguf" % name)
        if not os.path.exists(model):
            convert(src, model, ftype)
        sj = os.path.join(a.work, "sparsim-%s.json" % name)
        lj = os.path.join(a.work, "llama-%s.json" % name)
        s_rss = rss_of([sparsim, "bench", "--model", model, "--storage", storage, "--prompt", str(a.prompt),
                        "--decode", str(a.decode), "--reps", str(a.reps), "--threads", str(a.threads),
                        "--json", sj, "--log-level", "error"])
        with open(lj, "w") as f:
            pid = os.fork()
            if pid == 0:
                os.dup2(f.fileno(), 1)
                os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "--llama-child", model,
                                          "--prompt", str(a.prompt), "--decode", str(a.decode),
                                          "--threads", str(a.threads), "--reps", str(a.reps)])
            _, status, ru = os.wait4(pid, 0)
        if status != 0:
            raise SystemExit("llama.cpp run failed")
        l_rss = ru.ru_maxrss / 1024.0
        s, l = json.load(open(sj)), json.load(open(lj))
        results["runs"][name] = {
            "sparsim": {"prefill_tokens_per_s": s["prefill_tokens_per_s"],
                        "decode_tokens_per_s": s["decode_tokens_per_s"],
                        "decode_fraction_of_bandwidth_ideal": s["decode_fraction_of_ideal"],
                        "peak_rss_mib": s_rss},
            "llama_cpp": dict(l, peak_rss_mib=l_rss),
            "ratio_prefill": s["prefill_tokens_per_s"] / l["prefill_tokens_per_s"],
            "ratio_decode": s["decode_tokens_per_s"] / l["decode_tokens_per_s"],
        }
    print(json.dumps(results, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
