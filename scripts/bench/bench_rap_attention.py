#!/usr/bin/env python3
"""Attention-module time of a RAP-pruned model against its dense source, in the same run, and
the backward pass against the forward pass (the performance goals of the KV-pruning issue).

  scripts/bench/bench_rap_attention.py --pruned out/rap/rap_070.gguf --fisher out/rap/fisher.h5 \\
      --json docs/results/rap/rap_attention_bench.json

Runs `sparsim bench --model PRUNED --baseline DENSE --batch B --prompt C` (the q, k, v, o
projections, RoPE, cache store and attention, profiled; repetitions interleaved) for each batch
size; batch sizes listed in --decode-only-batches time the decode steps only (over a cache of C
positions, without the prefill, which would dominate the run on a small machine). The backward
/ forward ratio comes from the Fisher calibration file (both passes of the same sequences).
The machine's load (os.getloadavg) is recorded before and after every run.

With --repeat R every batch size is run R times, each a fresh `sparsim bench` process, the
batch sizes taking turns (1, 8, 1, 8, …) so that a slow spell of the machine falls on both;
each run is kept (its `repeat` index) and `summary` holds, per batch size, every run's ratios
and their median over the runs.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402
from machine_info import cpu_info, require_threads  # noqa: E402


def summarise(runs):
    """Per batch size: every run's attention ratios and their median over the runs."""
    keys = ("attention_decode_ratio", "attention_prefill_ratio", "forward_decode_ratio")
    out = {}
    for b in sorted({r["batch"] for r in runs}):
        rs = [r for r in runs if r["batch"] == b]
        e = {"runs": len(rs)}
        for k in keys:
            v = [r[k] for r in rs if r.get(k) is not None]
            if v:
                e[k] = {"per_run": v, "median": statistics.median(v), "min": min(v), "max": max(v)}
        out[str(b)] = e
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--pruned", required=True)
    ap.add_argument("--dense", default="smollm2")
    ap.add_argument("--fisher", required=True)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--decode-only-batches", default="8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1,
                    help="independent sparsim bench processes per batch size (default 1)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    out = {"runs": [], "settings": vars(a), "cpu": cpu_info()}
    decode_only = {int(b) for b in a.decode_only_batches.split(",") if b}
    if a.repeat < 1:
        raise SystemExit(f"--repeat must be at least 1, got {a.repeat}")
    batches = [int(x) for x in a.batches.split(",")]
    for rep, b in ((rep, b) for rep in range(a.repeat) for b in batches):
        js = a.json + f".b{b}.tmp"
        cmd = [a.sparsim, "bench", "--model", a.pruned, "--baseline", a.dense, "--batch", str(b),
               "--prompt", str(a.prompt), "--decode", str(a.decode), "--reps", str(a.reps),
               "--threads", str(a.threads), "--json", js]
        if b in decode_only:
            cmd.append("--decode-only")
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
        j["load_before"], j["load_after"] = list(load0), list(os.getloadavg())
        j["wall_seconds"] = time.time() - t0
        j["repeat"] = rep
        out["runs"].append(j)
    out["summary"] = summarise(out["runs"])
    with h5py.File(a.fisher, "r") as f:
        g = f["fisher"]
        fw, bw = float(g.attrs["forward_seconds"]), float(g.attrs["backward_seconds"])
        n = int(g.attrs["sequences"]) * int(g.attrs["tokens"])
    out["backward"] = {"forward_seconds": fw, "backward_seconds": bw, "tokens": n,
                       "forward_ms_per_token": 1e3 * fw / n, "backward_ms_per_token": 1e3 * bw / n,
                       "backward_over_forward": bw / fw}
    write_json(a.json, out)
    print(f"-> {a.json}")


if __name__ == "__main__":
    main()
