#!/usr/bin/env python3
"""A fixed list of commands whose numbers must not move when code is reorganised.

  check_behaviour.py run --sparsim BIN --out DIR    runs the list, writes DIR/fingerprint.json
  check_behaviour.py run --sparsim BIN --out DIR --fingerprint-only   only rewrites the file
  check_behaviour.py compare A.json B.json          exits 1 and lists every value that differs

The list (SmolLM2-135M on the default corpus, 3 windows of 512 tokens (256 scored), 1 thread):
  eval dense; eval teal (s = 0.5, after a calibration of 2 windows of 512 tokens); eval token-filter (r = 0.3);
  eval grace (λ = 0.5); eval topk-guided+token-filter+grace (s = 0.5, r = 0.3, λ = 0.5);
  calibrate --fisher, prune rap (ρ = 0.7), eval of the pruned model; bench --method teal
  (64-token prompt, 8 decode steps); sweep + collect of data/sweeps/demo.toml.
A fingerprint holds, per command, every number and string of its JSON summary (the sweep: its
results.csv), except what measures the machine rather than the computation (times, rates,
loads, host, paths), with floats written exactly (repr). Two builds that compute the same thing
give identical fingerprints; a reorganisation is checked by running the list with the binary of
the commit before and after it and comparing.
"""
import argparse
import csv
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import atomic_write  # noqa: E402
from study_steps import sh  # noqa: E402

# Keys whose values describe the machine or the moment, not the computation.
VOLATILE = re.compile(r"(second|time|wall|_per_s|per_second|throughput|speedup|elapsed|load|"
                      r"host|date|utc|commit|version|threads|cpu|machine|command|path|^file$|ideal|"
                      r"^out$|^json$|^sparsim$|bandwidth|gflops|gbps|gib_s|tok_s|_ms$|_ns$)",
                      re.I)


def flatten(obj, prefix, out):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if VOLATILE.search(str(k)):
                continue
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            flatten(v, f"{prefix}[{i}]", out)
    elif isinstance(obj, float):
        out[prefix] = repr(obj)
    else:
        out[prefix] = obj


def run_list(args):
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    b = os.path.abspath(args.sparsim)
    th = ["--threads", "1"]
    common = ["--model", "smollm2", "--corpus", "default", "--context", "512", "--stride", "256",
              "--max-windows", "3", "--progress", "never"] + th
    f = lambda name: os.path.join(out, name)
    steps = []  # (name, command, summary file)

    def ev(name, *opts, model="smollm2"):
        c = list(common)
        c[1] = model
        steps.append((name, [b, "eval", *c, *opts, "--out", f(name + ".h5"), "--json",
                             f(name + ".json")], f(name + ".json")))

    ev("dense")
    steps.append(("teal-calibration", [b, "calibrate", "--model", "smollm2", "--corpus", "default",
                                       "--variants", "plain,rotated", "--context", "512",
                                       "--max-windows", "2", "--greedy-seqs", "2", "--greedy-tokens", "64", "--progress", "never", *th,
                                       "--out", f("teal-cal.h5")], None))
    ev("teal", "--method", "teal", "--sparsity", "0.5", "--calibration", f("teal-cal.h5"))
    ev("token-filter", "--method", "token-filter", "--tf-ratio", "0.3")
    ev("grace", "--method", "grace", "--kv-prune", "0.5")
    ev("topk-tf-grace", "--method", "topk-guided+token-filter+grace", "--sparsity", "0.5",
       "--calibration", f("teal-cal.h5"), "--tf-ratio", "0.3", "--kv-prune", "0.5")
    steps.append(("fisher", [b, "calibrate", "--fisher", "--fisher-seqs", "2", "--fisher-tokens",
                             "256", "--progress", "never", *th, "--out", f("fisher.h5")], None))
    steps.append(("prune-rap", [b, "prune", "--method", "rap", "--retain", "0.7", "--calibration",
                                f("fisher.h5"), "--out", f("rap.gguf"), "--json",
                                f("prune-rap.json")], f("prune-rap.json")))
    ev("rap", model=f("rap.gguf"))
    steps.append(("bench-teal", [b, "bench", "--model", "smollm2", "--method", "teal",
                                 "--sparsity", "0.5", "--calibration", f("teal-cal.h5"),
                                 "--prompt", "64", "--decode", "8", "--reps", "1", *th, "--json", f("bench-teal.json")],
                  f("bench-teal.json")))
    spec = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "sweeps",
                             "demo.toml")).read()
    spec = re.sub(r'(?m)^output = .*$', 'output = "sweep"', spec)
    with open(f("demo.toml"), "w") as fh:
        fh.write(spec)
    steps.append(("sweep", [b, "sweep", f("demo.toml"), *th], None))
    steps.append(("collect", [b, "collect", f("demo.toml")], f("sweep/results.csv")))

    if not args.fingerprint_only:
        for name, cmd, _ in steps:
            sh(cmd, f(name + ".log"))
    fp = {}
    for name, cmd, summary in steps:
        if summary is None:
            continue
        flat = {}
        if summary.endswith(".csv"):
            with open(summary) as fh:
                for i, row in enumerate(csv.DictReader(fh)):
                    flatten({k: v for k, v in row.items() if not VOLATILE.search(k)},
                            f"[{i}]", flat)
        else:
            with open(summary) as fh:
                flatten(json.load(fh), "", flat)
        fp[name] = {k: (v.replace(out, "<out>") if isinstance(v, str) else v)
                    for k, v in flat.items()}
    atomic_write(f("fingerprint.json"), json.dumps(fp, indent=1, sort_keys=True) + "\n")
    print(f"wrote {f('fingerprint.json')}: {sum(len(v) for v in fp.values())} values")


def compare(args):
    a, b = (json.load(open(p)) for p in (args.a, args.b))
    diffs = []
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name, {}), b.get(name, {})
        for k in sorted(set(x) | set(y)):
            if any(VOLATILE.search(part) for part in re.split(r"[.\[\]]", k) if part):
                continue  # (a fingerprint from an older list of volatile keys)
            if x.get(k, "<absent>") != y.get(k, "<absent>"):
                diffs.append(f"{name}: {k}: {x.get(k, '<absent>')!r} != {y.get(k, '<absent>')!r}")
    n = sum(len(v) for v in a.values())
    if diffs:
        print("\n".join(diffs[:200]))
        sys.exit(f"{len(diffs)} of {n} values differ")
    print(f"identical: {len(a)} commands, {n} values")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--sparsim", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--fingerprint-only", action="store_true",
                   help="rewrite DIR/fingerprint.json from the outputs a run left there")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    run_list(args) if args.cmd == "run" else compare(args)


if __name__ == "__main__":
    main()
