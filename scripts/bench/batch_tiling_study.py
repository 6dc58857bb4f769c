#!/usr/bin/env python3
"""--batch independence and the cost of per-sequence GEMM tiles: two sparsim binaries (before
and after the change, built from their commits) in the same run, interleaved.

For each binary:
  * the largest |NLL difference| of a window between `eval --batch 1` and `--batch B`, and
    whether the window NLLs are bitwise equal: 320-token windows (B = 2, 4) and the default
    protocol, 2048-token windows scoring 512 (B = 2; one run each, also timed);
  * the perplexity time of eval with 4 windows of 320 tokens per batch (not a multiple of the
    256-token tile, so the tiles changed: 5 tiles of 256 rows per batch before, 256 + 64 per
    window after), and `bench` prefill tokens/s (one sequence: the same tiles before and after;
    so are batches of windows whose length is a multiple of 256, e.g. the default 2048);
medians over --reps repetitions (interleaved), ratios after/before, and the machine's load
before and after.

  scripts/bench/batch_tiling_study.py --before base/build/bin/sparsim --after build/bin/sparsim \
      --json docs/results/robustness/batch_tiling.json

Needs h5py (the scripts venv made by scripts/setup.sh has it).
"""
import argparse
import json
import os
import sys
import platform
import statistics
import subprocess
import tempfile

import h5py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402


def load():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def eval_run(binary, args, out, batch, context, stride, windows):
    run([binary, "eval", "--model", args.model, "--corpus", args.corpus, "--context",
         str(context), "--stride", str(stride), "--max-windows", str(windows), "--batch",
         str(batch), "--threads", str(args.threads), "--progress", "never", "--log-level",
         "error", "--out", out])
    with h5py.File(out, "r") as f:
        nll = f["results/perplexity/window_nll"][...]
        t = float(f["timings/perplexity_seconds"][()])
    os.remove(out)
    return nll, t


def bench_prefill(binary, args, out):
    run([binary, "bench", "--model", args.model, "--prompt", str(args.prompt), "--decode", "1",
         "--reps", "1", "--threads", str(args.threads), "--json", out])
    with open(out) as f:
        v = json.load(f)["prefill_tokens_per_s"]
    os.remove(out)
    return v


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="sparsim binary before the change")
    p.add_argument("--after", required=True, help="sparsim binary after the change")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--corpus", default="default")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--windows", type=int, default=4, help="320-token windows per eval")
    p.add_argument("--json", required=True)
    a = p.parse_args()

    bins = {"before": a.before, "after": a.after}
    res = {"model": a.model, "corpus": a.corpus, "threads": a.threads, "reps": a.reps,
           "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "load_start": load(), "independence": {}, "speed": {}}
    tmp = tempfile.mkdtemp(prefix="sparsim-batch-")
    out = os.path.join(tmp, "r.h5")

    # (context, stride, windows, batches): 320-token windows (a full 256-token tile and a
    # 64-token one each) and the default protocol, 2048-token windows scoring 512 (LM head
    # tails of 513 rows: one row left over per window, which used to make a 1-column tile).
    protocols = [(320, 160, a.windows, (2, 4)), (2048, 512, 2, (2,))]
    times = {n: {} for n in bins}
    for name, b in bins.items():
        res["independence"][name] = []
        for ctx, stride, windows, batches in protocols:
            ref, t1 = eval_run(b, a, out, 1, ctx, stride, windows)
            times[name][f"eval_ctx{ctx}_batch1_perplexity_s"] = t1
            rows = {}
            for batch in batches:
                nll, t = eval_run(b, a, out, batch, ctx, stride, windows)
                times[name][f"eval_ctx{ctx}_batch{batch}_perplexity_s"] = t
                rows[str(batch)] = {"max_abs_diff_nats": float(abs(nll - ref).max()),
                                    "bitwise_equal": bool(nll.tobytes() == ref.tobytes())}
            res["independence"][name].append({"context": ctx, "stride": stride,
                                              "windows": windows, "vs_batch_1": rows})
    res["single_runs_seconds"] = times

    cases = [("eval_ctx320_batch4_perplexity_s",
              lambda b: eval_run(b, a, out, 4, 320, 160, a.windows)[1]),
             ("bench_prefill_tokens_per_s",
              lambda b: bench_prefill(b, a, os.path.join(tmp, "b.json")))]
    for key, f in cases:
        samples = {n: [] for n in bins}
        for _ in range(a.reps):
            for n, b in bins.items():  # interleaved, so both see the same load
                samples[n].append(f(b))
        med = {n: statistics.median(v) for n, v in samples.items()}
        res["speed"][key] = {"samples": samples, "median": med,
                             "after_over_before": med["after"] / med["before"]}
    res["load_end"] = load()
    os.rmdir(tmp)
    write_json(a.json, res, indent=2)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
