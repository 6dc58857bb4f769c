#!/usr/bin/env python3
"""Times the README's first command on a fresh checkout: clones this repository's HEAD into a
temporary folder and runs `scripts/setup.sh` there with an empty dependency prefix
(SPARSIM_DEPS) and the compiler cache disabled, then, with --tests, the README's test command.
Writes the total and the time of each setup stage (from the setup's own log lines) to JSON, with
the main job's own step times (out/main_job.json) and its comparison table (out/comparison.json).

    scripts/bench/time_fresh_setup.py --json docs/results/setup/fresh_setup.json [--tests]

Debian packages already installed are not reinstalled (apt is the machine's business); the
Python packages, the Trilinos source package (Kokkos 3.4.1), the model and the corpus are
downloaded again. The machine's load is recorded before and after.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STAGE = re.compile(r"\[setup\]\x1b\[0m (.*)$|^\[setup\] (.*)$")


def timed(cmd, cwd, env, log_path):
    """Runs cmd, copying its output to log_path; returns (seconds, [(t, stage line)])."""
    t0 = time.time()
    stages = []
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, bufsize=1)
        for line in p.stdout:
            log.write(line)
            m = STAGE.search(line.rstrip("\n"))
            if m:
                stages.append((time.time() - t0, m.group(1) or m.group(2)))
        rc = p.wait()
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}); log: {log_path}")
    return time.time() - t0, stages


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--tests", action="store_true", help="also run the README's test command")
    ap.add_argument("--keep", action="store_true", help="keep the temporary checkout and prefix")
    a = ap.parse_args()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="sparsim-fresh-")
    src, deps = os.path.join(work, "sparsim"), os.path.join(work, "deps")
    subprocess.run(["git", "clone", "-q", ROOT, src], check=True)
    subprocess.run(["git", "checkout", "-q", head], cwd=src, check=True)
    env = dict(os.environ, SPARSIM_DEPS=deps, CCACHE_DISABLE="1")
    for k in ("Kokkos_ROOT", "KokkosKernels_ROOT"):
        env.pop(k, None)
    out = {"commit": head, "cpus": os.cpu_count(), "load_before": os.getloadavg()[0],
           "command": "scripts/bench/time_fresh_setup.py " + " ".join(sys.argv[1:])}
    secs, stages = timed(["bash", "scripts/setup.sh"], src, env, os.path.join(work, "setup.log"))
    out["setup_seconds"] = secs
    ends = [t for t, _ in stages[1:]] + [secs]
    out["stages"] = [{"stage": name, "start_seconds": t, "seconds": e - t}
                     for (t, name), e in zip(stages, ends)]
    # what the fresh main job measured and compared (scripts/main_job.sh writes both)
    for key, name in (("main_job", "main_job.json"), ("comparison", "comparison.json")):
        path = os.path.join(src, "out", name)
        if os.path.exists(path):
            with open(path) as f:
                out[key] = json.load(f)
    # the checks a new user's first look makes: table against summaries, figures, a real browser
    chk = subprocess.run([os.path.join(deps, "venv", "bin", "python"), os.path.join(src, "scripts", "tools", "check_main_job.py"),
                          os.path.join(src, "out"), "--json", os.path.join(work, "check.json")],
                         capture_output=True, text=True)
    print(chk.stdout + chk.stderr, end="")
    if os.path.exists(os.path.join(work, "check.json")):
        with open(os.path.join(work, "check.json")) as f:
            out["main_job_check"] = json.load(f)
            out["main_job_check"].pop("out", None)
    if a.tests:
        tsecs, _ = timed(["ctest", "--preset", "openmp", "-j2", "--timeout", "900"], src, env,
                         os.path.join(work, "ctest.log"))
        out["tests_seconds"] = tsecs
    out["load_after"] = os.getloadavg()[0]
    tmp = a.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
    os.replace(tmp, a.json)
    print(json.dumps({k: v for k, v in out.items() if k != "stages"}, indent=1))
    for s in out["stages"]:
        print(f"{s['seconds']:7.0f} s  {s['stage']}")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
