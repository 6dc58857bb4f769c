"""The step runner of the study scripts (rap_study.py, recovery_study.py, rap_ablation_study.py):
one command with its output in a log file, its time printed, the log's tail shown on failure."""
import subprocess
import sys
import time


def sh(cmd, log):
    """Runs cmd with stdout and stderr to `log`; exits with the log's tail if it fails."""
    print("+", " ".join(cmd), flush=True)
    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.stdout.write(open(log).read()[-3000:])
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}")
    print(f"  {time.time() - t0:.0f} s", flush=True)
