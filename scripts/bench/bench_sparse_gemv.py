#!/usr/bin/env python3
"""Sparse decode GEMV against the dense decode GEMV: speedup per projection shape and sparsity.

Runs BM_DenseGemv and BM_SparseGemv of sparsim_bench_kernels (bf16, every projection shape of
SmolLM2-135M and Llama-2-7B, s in {0, 0.3, 0.5, 0.7, 0.9}) with repetitions, takes the medians,
and writes a table to docs/results/performance/sparse_gemv.json and a markdown table to stdout:

    shape, weights, s, dense time, sparse time, speedup (dense / sparse), speedup against the
    sparse kernel at s = 0, ideal 1/(1-s), speedup / ideal, GB/s of kept weights read;
    with cold weights also the plain read of the kept rows (BM_KeptRowRead): the time to read only
    the kept rows, with no arithmetic and no software prefetch, split as the kernel splits them
    (tiles of outputs) and by whole rows, and dense time / the faster of the two. It is not a
    strict bound (the kernel prefetches the next rows and can beat it on long rows); it shows
    what reading a scattered subset of the rows costs on the machine against the dense kernel.

--kept-runs: instead, the plain read by whole rows when the kept rows come in runs of R = 1, 2,
4, 8, 16 consecutive rows (BM_KeptRunRead, cold weights, s = 0 and 0.5), against the dense
kernel: how the cost of reading half of each matrix depends on how scattered that half is.

"cold" weights rotate through copies larger than the last-level cache (every projection comes
from memory once per token, as in decode); "hot" reuse one copy. The goal is speedup >=
0.9/(1-s) up to s = 0.7. Standard library only.

    scripts/bench/bench_sparse_gemv.py --bin build/bin/sparsim_bench_kernels --reps 5
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402
from bench_vs_llamacpp import sparsim_build  # noqa: E402
from machine_info import cpu_info  # noqa: E402

GOAL = 0.9  # speedup >= GOAL / (1 - s) ...
GOAL_MAX_S = 0.7  # ... up to this sparsity


def parse_label(label):
    return dict(kv.split("=", 1) for kv in label.split())


def run_benchmark(args):
    weights = {"cold": "1", "hot": "0", "both": "[01]"}[args.weights]
    flt = f"BM_DenseGemv/[0-9]+/{weights}/|BM_SparseGemv/[0-9]+/[0-9]+/{weights}/"
    if args.weights != "hot":  # the plain read of the kept rows: cold weights only
        flt += "|BM_KeptRowRead/"
    if args.kept_runs:
        flt = "BM_DenseGemv/[0-9]+/1/|BM_KeptRunRead/"
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.threads)
    env.setdefault("OMP_PROC_BIND", "spread")
    env.setdefault("OMP_PLACES", "threads")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [
            args.bin,
            f"--benchmark_filter={flt}",
            f"--benchmark_repetitions={args.reps}",
            "--benchmark_report_aggregates_only=true",
            f"--benchmark_min_time={args.min_time}",
            f"--benchmark_out={out}",
            "--benchmark_out_format=json",
        ]
        print("running:", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, env=env, check=True, stdout=sys.stderr)
        with open(out) as f:
            return cmd, json.load(f)


def medians_of(raw):
    medians = [b for b in raw["benchmarks"] if b.get("aggregate_name") == "median"]
    if not medians:  # one repetition: no aggregates
        medians = [b for b in raw["benchmarks"] if b.get("run_type") == "iteration"]
    return medians


def time_us(b):
    """A benchmark entry's real time in microseconds."""
    return b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b["time_unit"]]


def tabulate(raw):
    dense, sparse, shapes, read = {}, {}, {}, {}
    for b in medians_of(raw):
        lab = parse_label(b["label"])
        key = (lab["shape"], lab["weights"])
        shapes[key] = (int(lab["in"]), int(lab["out"]))
        t_us = time_us(b)
        entry = {"time_us": t_us, "gb_s": b["GB/s"]}
        if b["name"].startswith("BM_DenseGemv"):
            dense[key] = entry
        elif b["name"].startswith("BM_KeptRowRead"):
            read[key + (float(lab["s"]), lab["split"])] = entry
        else:
            sparse[key + (float(lab["s"]),)] = entry
    rows = []
    for (shape, weights, s), sp in sorted(sparse.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        d = dense.get((shape, weights))
        s0 = sparse.get((shape, weights, 0.0))
        if d is None:
            continue
        ideal = 1.0 / (1.0 - s)
        speedup = d["time_us"] / sp["time_us"]
        rt, rr = read.get((shape, weights, s, "tiles")), read.get((shape, weights, s, "rows"))
        plain = {}
        if rt and rr:
            best = min(rt["time_us"], rr["time_us"])
            plain = {
                "read_tiles_us": round(rt["time_us"], 2),
                "read_rows_us": round(rr["time_us"], 2),
                # dense time / the faster plain read of the kept rows
                "plain_read_speedup": round(d["time_us"] / best, 3),
                # the kernel's time over the read of its own split
                "kernel_over_read": round(sp["time_us"] / rt["time_us"], 3),
            }
        rows.append({
            "shape": shape,
            "wt_in": shapes[(shape, weights)][0],
            "wt_out": shapes[(shape, weights)][1],
            "weights": weights,
            "s": s,
            "dense_us": round(d["time_us"], 2),
            "sparse_us": round(sp["time_us"], 2),
            "speedup": round(speedup, 3),
            "speedup_vs_sparse_s0": round(s0["time_us"] / sp["time_us"], 3) if s0 else None,
            "ideal": round(ideal, 3),
            "speedup_over_ideal": round(speedup / ideal, 3),
            "dense_gb_s": round(d["gb_s"], 2),
            "sparse_gb_s": round(sp["gb_s"], 2),
            "goal_met": (speedup >= GOAL * ideal) if 0 < s <= GOAL_MAX_S + 1e-9 else None,
            **plain,
        })
    return rows


def tabulate_runs(raw):
    """Rows of the --kept-runs study: per shape and run length, the plain read of all rows (s = 0)
    and of half of them (s = 0.5), and the dense kernel's time."""
    dense, read, shapes = {}, {}, {}
    for b in medians_of(raw):
        lab = parse_label(b["label"])
        shapes[lab["shape"]] = (int(lab["in"]), int(lab["out"]))
        t_us = time_us(b)
        if b["name"].startswith("BM_DenseGemv"):
            dense[lab["shape"]] = t_us
        else:
            read[(lab["shape"], int(lab["run"]), float(lab["s"]))] = t_us
    rows = []
    for (shape, run, s), t in sorted(read.items()):
        if s == 0.0 or (shape, run, 0.0) not in read:
            continue
        full = read[(shape, run, 0.0)]
        rows.append({"shape": shape, "wt_in": shapes[shape][0], "wt_out": shapes[shape][1],
                     "row_bytes": shapes[shape][1] * 2, "run": run, "s": s,
                     "read_all_us": round(full, 2), "read_kept_us": round(t, 2),
                     "dense_us": round(dense[shape], 2) if shape in dense else None,
                     "read_speedup": round(full / t, 3), "ideal": round(1.0 / (1.0 - s), 3)})
    return rows


def markdown(rows):
    lines = [
        "| shape (Wt in×out) | weights | s | dense µs | sparse µs | speedup | vs sparse@0 | ideal "
        "| speedup/ideal | sparse GB/s | goal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        goal = {True: "yes", False: "**no**", None: ""}[r["goal_met"]]
        lines.append(
            f"| {r['shape']} {r['wt_in']}×{r['wt_out']} | {r['weights']} | {r['s']:.1f} "
            f"| {r['dense_us']:.1f} | {r['sparse_us']:.1f} | {r['speedup']:.2f} "
            f"| {r['speedup_vs_sparse_s0']:.2f} | {r['ideal']:.2f} | {r['speedup_over_ideal']:.2f} "
            f"| {r['sparse_gb_s']:.1f} | {goal} |")
    return "\n".join(lines)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(root, "build", "bin", "sparsim_bench_kernels"))
    ap.add_argument("--reps", type=int, default=5, help="repetitions per benchmark (median taken)")
    ap.add_argument("--min-time", default="0.2", help="seconds per repetition")
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS")
    ap.add_argument("--weights", choices=["cold", "hot", "both"], default="both")
    ap.add_argument("--out", default=os.path.join(root, "docs", "results", "performance", "sparse_gemv.json"))
    ap.add_argument("--kept-runs", action="store_true",
                    help="the plain read of kept rows in runs of R consecutive rows (BM_KeptRunRead)")
    args = ap.parse_args()
    if args.kept_runs and args.weights == "hot":
        ap.error("--kept-runs reads cold weights")

    cmd, raw = run_benchmark(args)
    rows = tabulate_runs(raw) if args.kept_runs else tabulate(raw)
    ctx = raw.get("context", {})
    ran = ctx.get("kokkos_host_threads", ctx.get("kokkos_concurrency"))
    if ran is not None and int(ran) != args.threads:
        raise SystemExit(f"the benchmark ran on {ran} threads, not the {args.threads} asked for")
    result = {
        "what": ("plain read (no arithmetic, no prefetch) of half of the rows of a bf16 Wt[in][out] "
                 "in runs of R consecutive rows, against reading all rows; medians of repetitions"
                 if args.kept_runs else
                 "bf16 decode GEMV: sparse (column-skipping, Wt[in][out]) vs dense "
                 "(linear_direct, W[out][in]); medians of repetitions"),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(cmd),
        "threads": args.threads,
        "kokkos_concurrency": None if ran is None else int(ran),
        "repetitions": args.reps,
        "goal": f"speedup >= {GOAL}/(1-s) for 0 < s <= {GOAL_MAX_S}",
        "machine": {k: ctx.get(k) for k in ("host_name", "num_cpus", "mhz_per_cpu", "caches",
                                            "load_avg", "library_build_type")},
        "cpu": cpu_info(),
        "sparsim_build": sparsim_build(os.path.abspath(args.bin)),
        "rows": rows,
    }
    write_json(args.out, result)
    if not args.kept_runs:
        print(markdown(rows))
    print(f"\nwritten: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
