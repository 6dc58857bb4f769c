#!/usr/bin/env python3
"""Decode tokens/s of the activation-sparsity methods against dense, end to end.

Runs `sparsim bench --method M` for M in teal, wina, topk-guided at one target sparsity, for each
weight storage type. Every bench invocation times dense and the method in the same process,
alternating within each repetition, with the same prompt and decode steps; `--runs` invocations
per (storage, method). Reports medians over the invocations and writes
docs/results/performance/decode_methods.json and a markdown table to stdout:

    storage, method, dense tok/s, method tok/s, speedup (median of the per-invocation ratios),
    realised projection sparsity, ideal speedup (projections alone: 1/(1-s_realised); whole
    decode step: dense profile with the projection times scaled by their realised FLOP fraction,
    plus WINA's online rotation at the projections' rate), mask-selection and rotation shares of
    the method's profiled decode time.

Standard library only.

    scripts/bench/bench_decode_methods.py --calibration cal.h5 --runs 3
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402
from bench_vs_llamacpp import add_sparsim_build_arg, sparsim_build_of  # noqa: E402
from machine_info import cpu_info, require_threads  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def calibration_for(args, method):
    if method in ("wina", "topk-guided") and args.calibration_rotated:
        return args.calibration_rotated
    return args.calibration


def split_method(spec):
    """"topk-guided" or "LABEL=METHOD OPTIONS…" (e.g. "tkg-rot16=topk-guided --rotation-storage
    bf16") -> (label, method, extra options)."""
    if "=" in spec:
        label, rest = spec.split("=", 1)
        parts = rest.split()
        return label, parts[0], parts[1:]
    return spec, spec, []


def run_bench(args, storage, spec):
    label, method, extra = split_method(spec)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [
            args.sparsim, "bench", "--model", args.model, "--storage", storage,
            "--threads", str(args.threads), "--prompt", str(args.prompt), "--decode",
            str(args.decode), "--reps", str(args.reps), "--method", method, "--sparsity",
            str(args.sparsity), "--calibration", calibration_for(args, method), "--column-skipping",
            args.column_skipping, "--json", out, "--log-level", "warn",
        ] + (["--no-rotation"] if args.no_rotation and method != "teal" else []) + extra
        print("running:", " ".join(cmd), file=sys.stderr)
        env = dict(os.environ)
        env.setdefault("OMP_PROC_BIND", "false")
        load_before = load_average()
        subprocess.run(cmd, env=env, check=True, stdout=sys.stderr)
        with open(out) as f:
            j = json.load(f)
        require_threads(j, args.threads)
        j["load_average_before"] = load_before
        return cmd, j


def summarize(runs):
    med = statistics.median
    s = [r["sparse"] for r in runs]
    return {
        "runs": len(runs),
        "dense_decode_tokens_per_s": med(r["decode_tokens_per_s"] for r in runs),
        "decode_tokens_per_s": med(x["decode_tokens_per_s"] for x in s),
        "speedup": med(x["decode_tokens_per_s"] / r["decode_tokens_per_s"]
                       for x, r in zip(s, runs)),
        "realised_projection_sparsity": med(x["realised_projection_sparsity"] for x in s),
        "ideal_speedup_projections": med(x["ideal_speedup_projections"] for x in s),
        "ideal_speedup_decode_step": med(x["ideal_speedup_decode_step"] for x in s),
        "dense_projection_time_share": med(x["dense_projection_time_share"] for x in s),
        "mask_select_time_share": med(x["mask_select_time_share"] for x in s),
        "rotation_time_share": med(x["rotation_time_share"] for x in s),
        "step_bytes_over_dense": med(x["per_step"]["bytes_realised"] / x["per_step"]["bytes_dense"]
                                     for x in s),
        "step_rotation_bytes_over_dense": med(x["per_step"]["bytes_rotation"] /
                                              x["per_step"]["bytes_dense"] for x in s),
        "dense_decode_fraction_of_ideal": med(r["decode_fraction_of_ideal"] for r in runs),
        "load_average_before": [r.get("load_average_before") for r in runs],
        "prefill_tokens_per_s": med(x["prefill_tokens_per_s"] for x in s),
        "dense_prefill_tokens_per_s": med(r["prefill_tokens_per_s"] for r in runs),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    add_sparsim_build_arg(ap)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--calibration", required=True, help="from sparsim calibrate --model M")
    ap.add_argument("--calibration-rotated",
                    help="calibration for wina and topk-guided when --calibration holds only the "
                    "plain variant (calibrate --variants rotated)")
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--methods", default="teal,wina,topk-guided",
                    help="comma-separated: a method, or LABEL=METHOD OPTIONS (e.g. "
                    "'tkg-rot16=topk-guided --rotation-storage bf16')")
    ap.add_argument("--storages", default="bf16,f32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3, help="bench invocations per storage x method")
    ap.add_argument("--reps", type=int, default=1, help="repetitions inside each invocation")
    ap.add_argument("--column-skipping", default="on", choices=["on", "off"])
    ap.add_argument("--no-rotation", action="store_true",
                    help="wina and topk-guided on the unrotated model (plain calibration)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "performance", "decode_methods.json"))
    args = ap.parse_args()
    if args.runs < 1 or args.reps < 1:
        ap.error("--runs and --reps must be >= 1")

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    raw, table = [], []
    storages = args.storages.split(",")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for storage in storages:
        per = {m: [] for m in methods}
        # methods interleaved run by run, so that a busy spell hits all of them
        for _ in range(args.runs):
            for m in methods:
                cmd, j = run_bench(args, storage, m)
                per[m].append(j)
                raw.append({"storage": storage, "method": split_method(m)[0], "command": cmd,
                            "result": j})
        for m in methods:
            row = {"storage": storage, "method": split_method(m)[0], "spec": m}
            row.update(summarize(per[m]))
            table.append(row)

    doc = {
        "what": "sparsim bench --method: decode tokens/s of each method against dense, same run",
        "started_utc": started,
        "model": args.model,
        "calibration": args.calibration,
        "calibration_rotated": args.calibration_rotated,
        "sparsity_target": args.sparsity,
        "threads": args.threads,
        "prompt_tokens": args.prompt,
        "decode_tokens": args.decode,
        "runs": args.runs,
        "reps_per_run": args.reps,
        "column_skipping": args.column_skipping,
        "no_rotation": args.no_rotation,
        "load_average_end": load_average(),
        "command": "scripts/bench/bench_decode_methods.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_info(),
        "sparsim_build": sparsim_build_of(args),
        "table": table,
        "raw": raw,
    }
    write_json(args.out, doc, indent=2)

    print("| storage | method | dense tok/s | method tok/s | speedup | realised s | ideal (proj) "
          "| ideal (step) | bytes / dense | mask select | rotation |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['storage']} | {r['method']} | {r['dense_decode_tokens_per_s']:.1f} "
              f"| {r['decode_tokens_per_s']:.1f} | {r['speedup']:.2f} "
              f"| {r['realised_projection_sparsity']:.3f} | {r['ideal_speedup_projections']:.2f} "
              f"| {r['ideal_speedup_decode_step']:.2f} | {r['step_bytes_over_dense']:.3f} "
              f"| {100 * r['mask_select_time_share']:.1f}% "
              f"| {100 * r['rotation_time_share']:.1f}% |")


if __name__ == "__main__":
    main()
