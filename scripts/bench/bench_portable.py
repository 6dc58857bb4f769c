#!/usr/bin/env python3
"""A portable build (SPARSIM_NATIVE=OFF) against the native one, on this machine.

Runs `sparsim bench` of both builds on the same model, weights and prompt, interleaved (the order
alternates per repetition), and writes the medians, every repetition, the load, each build's
CMake settings and the decode GEMV clone each one ran (`host_kernels` of bench's JSON) to a JSON
file. Standard library only.

    cmake --preset openmp -B build-portable -DSPARSIM_NATIVE=OFF
    cmake --build build-portable -j2 --target sparsim
    scripts/bench/bench_portable.py --portable build-portable/bin/sparsim --json docs/results/performance/portable_build.json
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402
from bench_vs_llamacpp import cpu_info, run, sparsim_build  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--native", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--portable", required=True, help="sparsim of a SPARSIM_NATIVE=OFF build")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--weights", default="f32,bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if min(a.reps, a.threads, a.prompt, a.decode) < 1:
        raise SystemExit("--reps, --threads, --prompt and --decode must be positive")
    builds = {"native": a.native, "portable": a.portable}
    for name, b in builds.items():
        if not os.access(b, os.X_OK):
            raise SystemExit(f"--{name}: {b} is not an executable")
    weights = [w.strip() for w in a.weights.split(",") if w.strip()]
    for w in weights:
        if w not in ("f32", "bf16", "f16"):
            raise SystemExit(f"--weights: f32, bf16 or f16, got '{w}'")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in weights:
            reps = []
            for rep in range(a.reps):
                order = list(builds) if rep % 2 == 0 else list(reversed(builds))
                row = {}
                for name in order:
                    out = os.path.join(tmp, f"{name}.json")
                    _, info = run([builds[name], "bench", "--model", a.model, "--storage", w, "--prompt",
                                   str(a.prompt), "--decode", str(a.decode), "--reps", "1", "--threads",
                                   str(a.threads), "--json", out, "--log-level", "error"], f"{name} bench")
                    j = json.load(open(out))
                    row[name] = {"prefill_tokens_per_s": j["prefill_tokens_per_s"],
                                 "decode_tokens_per_s": j["decode_tokens_per_s"],
                                 "host_kernels": j.get("host_kernels"), "run": info}
                reps.append(row)
                print(f"{w} rep {rep + 1}/{a.reps}: " + ", ".join(
                    f"{n} {row[n]['prefill_tokens_per_s']:.0f}/{row[n]['decode_tokens_per_s']:.1f}" for n in builds),
                    file=sys.stderr)
            med = {n: {k: statistics.median(r[n][k] for r in reps)
                       for k in ("prefill_tokens_per_s", "decode_tokens_per_s")} for n in builds}
            loads = [r[n]["run"][k] for r in reps for n in builds for k in ("load_before", "load_after")]
            runs[w] = {"reps": reps, "median": med,
                       "ratio_prefill": med["portable"]["prefill_tokens_per_s"] / med["native"]["prefill_tokens_per_s"],
                       "ratio_decode": med["portable"]["decode_tokens_per_s"] / med["native"]["decode_tokens_per_s"],
                       "load_min": min(loads), "load_max": max(loads),
                       "host_kernels": {n: reps[0][n]["host_kernels"] for n in builds}}
    doc = {"command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "started_utc": started,
           "settings": {"model": a.model, "threads": a.threads, "prompt": a.prompt, "decode": a.decode,
                        "reps": a.reps},
           "cpu": cpu_info(), "builds": {n: sparsim_build(b) for n, b in builds.items()}, "runs": runs}
    write_json(a.json, doc)
    for w, r in runs.items():
        print(f"{w}: portable / native prefill {r['ratio_prefill']:.3f}, decode {r['ratio_decode']:.3f}")


if __name__ == "__main__":
    main()
