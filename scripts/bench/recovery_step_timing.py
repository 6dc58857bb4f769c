#!/usr/bin/env python3
"""The cost of one recovery step against the forward pass of the same tokens (docs/recovery.md).

Prunes the model (RAP at --retain after a short Fisher calibration, unless --student names a
pruned model), then runs `sparsim recover` --repeats times for --steps steps and records, per run,
the timing block of its JSON summary (median step, its teacher / forward / backward / update
parts, the forward pass of the same tokens on the recovered model measured in the same process,
their ratio), its peak memory and the machine's load average before and after. The medians over
the runs go to the summary; the per-run figures stay beside them.

  scripts/bench/recovery_step_timing.py --corpus wikitext-2/valid.txt \\
      --json docs/results/recovery/recovery_step_timing.json

Only the timing matters here, so the calibration is short (--fisher-seqs, --fisher-tokens) and the
recovered models are thrown away.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import atomic_write  # noqa: E402
from machine_info import cpu_info  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_average():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--model", default="smollm2", help="the dense model (teacher)")
    ap.add_argument("--student", help="a pruned model of --model (default: prune one here)")
    ap.add_argument("--corpus", required=True, help="training text")
    ap.add_argument("--retain", type=float, default=0.7)
    ap.add_argument("--fisher-seqs", type=int, default=8)
    ap.add_argument("--fisher-tokens", type=int, default=512)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.repeats < 1 or a.steps < 1:
        sys.exit("--repeats and --steps must be at least 1")
    thr = ["--threads", str(a.threads)]
    with tempfile.TemporaryDirectory(prefix="sparsim-steptime-") as tmp:
        student = a.student
        if not student:
            fisher = os.path.join(tmp, "fisher.h5")
            run([a.sparsim, "calibrate", "--fisher", "--model", a.model, "--corpus", a.corpus,
                 "--fisher-seqs", str(a.fisher_seqs), "--fisher-tokens", str(a.fisher_tokens),
                 "--progress", "never", "--out", fisher] + thr)
            student = os.path.join(tmp, "student.gguf")
            run([a.sparsim, "prune", "--model", a.model, "--method", "rap", "--retain",
                 str(a.retain), "--calibration", fisher, "--out", student] + thr)
        runs = []
        for i in range(a.repeats):
            out = os.path.join(tmp, f"recovered_{i}.gguf")
            before = load_average()
            run([a.sparsim, "recover", "--model", student, "--teacher", a.model, "--corpus",
                 a.corpus, "--steps", str(a.steps), "--seq-len", str(a.seq_len), "--batch",
                 str(a.batch), "--lora-rank", str(a.rank), "--lora-alpha", str(2 * a.rank),
                 "--progress", "never", "--out", out, "--json", out + ".json"] + thr)
            after = load_average()
            with open(out + ".json") as f:
                r = json.load(f)
            runs.append({"timing": r["timing"], "peak_rss_bytes": r["peak_rss_bytes"],
                         "tokens": r["tokens"], "load_average_before": before,
                         "load_average_after": after})
            t = r["timing"]
            print(f"run {i + 1}/{a.repeats}: step {t['median_step_seconds']:.3f} s, forward "
                  f"{t['forward_seconds_per_step_tokens']:.3f} s, ratio "
                  f"{t['step_over_forward']:.2f} (load {before[0]:.2f} -> {after[0]:.2f})")
    med = lambda k: statistics.median(x["timing"][k] for x in runs)
    summary = {
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "machine": cpu_info(),
        "settings": {"model": a.model, "student": a.student or f"rap at retain {a.retain}",
                     "steps": a.steps, "repeats": a.repeats, "seq_len": a.seq_len,
                     "batch": a.batch, "lora_rank": a.rank, "threads": a.threads},
        "median": {k: med(k) for k in ("median_step_seconds", "teacher_seconds",
                                       "forward_seconds", "backward_seconds", "update_seconds",
                                       "forward_seconds_per_step_tokens", "step_over_forward")},
        "peak_rss_bytes": max(x["peak_rss_bytes"] for x in runs),
        "runs": runs,
    }
    atomic_write(a.json, json.dumps(summary, indent=1) + "\n")
    print(f"median step / forward {summary['median']['step_over_forward']:.2f} -> {a.json}")


if __name__ == "__main__":
    main()
