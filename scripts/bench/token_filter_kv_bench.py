#!/usr/bin/env python3
"""Token Filtering's dropped-token memory saving at batch 8 and 32 (docs/token-filter.md).

  scripts/bench/token_filter_kv_bench.py --model smollm2 --json docs/results/token_filter/token_filter_kv_bytes.json

Runs `sparsim bench --method token-filter --tf-ratio R --tf-drop-skipped --batch B` for every
batch size: a prefill of --prompt tokens and --decode decode steps with the dense engine and
with the gate, whose gated layers keep only the tokens they did not skip. Records per batch
size the KV bytes held at the end and at the peak against the bytes a dense cache holds for the
same tokens, the bytes allocated at the peak against the dense engine's allocation, the
realised skip ratio and the decode step time against dense (profiled, median of the
repetitions). With --masked the same runs with --tf-drop-mode mask are added: the dropped
tokens masked, not freed (the allocation stays dense; the step time of the masked layout). The
machine's load average (os.getloadavg) is recorded before and after every run.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402
from machine_info import cpu_info, require_threads  # noqa: E402


def run(a, batch, mode):
    js = a.json + f".b{batch}.{mode}.tmp"
    cmd = [a.sparsim, "bench", "--model", a.model, "--method", "token-filter",
           "--tf-ratio", str(a.ratio), "--tf-drop-skipped", "--tf-drop-mode", mode,
           "--batch", str(batch), "--prompt", str(a.prompt), "--decode", str(a.decode),
           "--reps", str(a.reps), "--threads", str(a.threads), "--json", js]
    load0 = os.getloadavg()
    t0 = time.time()
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(r.stdout + r.stderr, flush=True)
    if r.returncode != 0:
        raise SystemExit(f"bench failed ({r.returncode})")
    with open(js) as f:
        j = json.load(f)
    os.remove(js)
    require_threads(j, a.threads)
    kv = j["kv_bytes"]
    return {
        "batch": batch,
        "drop_mode": mode,
        "realised": j["token_filter"]["realised"],
        "kv_bytes": kv,
        "kv_cache_per_layer": j["token_filter"]["kv_cache"]["per_layer"],
        "held_vs_dense_final": kv["held_vs_dense_final"],
        "allocated_peak_vs_dense": kv["allocated_peak_vs_dense"],
        "step_ratio": j["step_ratio"],
        "dense_step_seconds": j["dense_step_seconds"],
        "method_step_seconds": j["method_step_seconds"],
        "load_before": list(load0),
        "load_after": list(os.getloadavg()),
        "wall_seconds": time.time() - t0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--masked", action="store_true",
                    help="also run --tf-drop-mode mask (dropped tokens masked, not freed)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    out = {"settings": vars(a), "cpu": cpu_info(), "runs": []}
    modes = ["compact"] + (["mask"] if a.masked else [])
    for b in (int(x) for x in a.batches.split(",") if x):
        for m in modes:
            out["runs"].append(run(a, b, m))
    write_json(a.json, out)
    for r in out["runs"]:
        kv = r["kv_bytes"]
        print(f"batch {r['batch']:3d} {r['drop_mode']:7s}: held {kv['held_final'] / 2**20:8.2f} MiB"
              f" of {kv['dense_final'] / 2**20:8.2f} MiB ({100 * r['held_vs_dense_final']:.1f}%),"
              f" allocated peak {100 * r['allocated_peak_vs_dense']:.1f}% of dense,"
              f" step {r['step_ratio']:.3f}x dense, load {r['load_before'][0]:.2f}")
    print(f"-> {a.json}")


if __name__ == "__main__":
    main()
