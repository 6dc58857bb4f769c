#!/usr/bin/env python3
"""The settings and the wall / CPU time per stage of a calibration file made by
`sparsim calibrate`, as JSON (the calibration-cost figures in docs/sparsity.md).

    sparsim calibrate --out cal.h5 --threads 2          # the defaults are the paper's settings
    scripts/bench/calibration_timing.py cal.h5 --json docs/results/sparsity/calibration_time.json
"""
import argparse
import json
import os
import sys

import h5py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402

KEYS = ("alpha", "greedy_cap", "greedy_seqs", "greedy_seq_tokens", "greedy_score_fraction", "greedy_step_cap",
        "context", "windows", "command", "sparsim_version")


def plain(v):
    if hasattr(v, "item"):
        return v.item()
    return v.decode() if isinstance(v, bytes) else v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("calibration")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    with h5py.File(a.calibration, "r") as f:
        if "timings" not in f:
            raise SystemExit(f"{a.calibration}: no /timings group (not a sparsim calibration file?)")
        t = f["timings"]
        stages = [plain(s) for s in t["stage"][()]]
        out = {"settings": {k: plain(f.attrs[k]) for k in KEYS if k in f.attrs},
               "stages": [{"stage": s, "wall_seconds": float(w), "cpu_seconds": float(c)}
                          for s, w, c in zip(stages, t["wall_seconds"][()], t["cpu_seconds"][()])],
               "cpus": os.cpu_count()}
    out["wall_seconds"] = sum(s["wall_seconds"] for s in out["stages"])
    out["cpu_seconds"] = sum(s["cpu_seconds"] for s in out["stages"])
    write_json(a.json, out)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
