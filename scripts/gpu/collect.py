#!/usr/bin/env python3
"""Collects what scripts/gpu/check.sh measured into one results JSON.

    collect.py OUT [--work W] [--gpu NAME] [--seconds S] [--commit C] [--out FILE]

OUT is check.sh's output folder (tests.log, agree.log, results.json of an earlier collection);
W is its work folder with bench_*.json and agree.json (check.sh passes it). Without --work, the
bench figures and the agreement come from OUT/results.json, so an earlier run's results can be
collected again (with the test totals parsed from OUT/tests.log). Writes --out (default
OUT/results.json) and prints one summary line per bench run.
"""
import argparse
import glob
import json
import os
import re


def test_totals(log_path):
    tests, group = {}, None
    if not os.path.exists(log_path):
        return tests
    for line in open(log_path, errors="replace"):
        m = re.match(r"=== \[\d+s\] tests: (.*) \(timeout", line)
        if m:
            group = m.group(1)
            tests[group] = {"passed": 0, "failed": [], "skipped": [], "ran": 0}
            continue
        if group is None:
            continue
        g = tests[group]
        m = re.match(r"\[==========\] (\d+) tests? from .* ran", line)
        if m:
            g["ran"] = int(m.group(1))
        m = re.match(r"\[  PASSED  \] (\d+) test", line)
        if m:
            g["passed"] = int(m.group(1))
        m = re.match(r"\[  FAILED  \] ([\w/.]+)", line)
        if m and m.group(1) not in g["failed"]:
            g["failed"].append(m.group(1))
        m = re.match(r"\[  SKIPPED \] ([\w/.]+) \(", line)
        if m and m.group(1) not in g["skipped"]:
            g["skipped"].append(m.group(1))
        m = re.match(r"--- tests: .*: rc=(\d+)", line)
        if m:
            g["rc"] = int(m.group(1))
    return tests


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--work")
    ap.add_argument("--gpu")
    ap.add_argument("--seconds", type=int)
    ap.add_argument("--commit")
    ap.add_argument("--to", dest="dest")
    a = ap.parse_args()
    prev = {}
    prev_path = os.path.join(a.out, "results.json")
    if os.path.exists(prev_path):
        prev = json.load(open(prev_path))
    res = {"gpu": a.gpu or prev.get("gpu", "?"),
           "check_seconds": a.seconds if a.seconds is not None else prev.get("check_seconds"),
           "commit": a.commit or prev.get("commit"),
           "tests": test_totals(os.path.join(a.out, "tests.log")),
           "bench": {}}
    if a.work:
        try:
            res["agreement"] = json.load(open(os.path.join(a.work, "agree.json")))
        except Exception as e:
            res["agreement"] = {"error": str(e)}
        for p in sorted(glob.glob(os.path.join(a.work, "bench_*.json"))):
            name = os.path.basename(p)[6:-5]
            try:
                res["bench"][name] = json.load(open(p))
            except Exception as e:
                res["bench"][name] = {"error": str(e)}
        res["predict"] = {}
        for p in sorted(glob.glob(os.path.join(a.work, "predict_*.json"))):
            name = os.path.basename(p)[8:-5]
            try:
                j = json.load(open(p))
                res["predict"][name] = {k: j.get(k) for k in (
                    "prefill_tokens_per_s", "decode_tokens_per_s", "precision", "roofline",
                    "phases", "validation", "notes") if k in j}
                res["predict"][name]["per_op"] = j.get("per_op", [])
            except Exception as e:
                res["predict"][name] = {"error": str(e)}
        for p in (os.path.join(a.out, "probe_gpu.json"),):
            if os.path.exists(p):
                res["probe"] = json.load(open(p))
    else:
        res["agreement"] = prev.get("agreement", {})
        res["bench"] = prev.get("bench", {})
        res["predict"] = prev.get("predict", {})
        if "probe" in prev:
            res["probe"] = prev["probe"]
    dest = a.dest or prev_path
    json.dump(res, open(dest, "w"), indent=1)
    for k, j in res["bench"].items():
        try:
            line = (f"    {k}: prefill {j['prefill_tokens_per_s']:.0f} tok/s, decode "
                    f"{j['decode_tokens_per_s']:.1f} tok/s, bw "
                    f"{j['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s, decode/ideal "
                    f"{j['decode_fraction_of_ideal']:.3f}")
            s = j.get("sparse")
            if s:
                line += (f"; {s['method']} {s['decode_speedup']:.3f}x "
                         f"(ideal step {s['ideal_speedup_decode_step']:.3f})")
            print(line)
        except Exception as e:
            print(f"    {k}: {e}")


if __name__ == "__main__":
    main()
