"""What the study scripts share to run their commands: sh (one step, its output in a log file,
its time printed, the log's tail shown on failure), run_locked (one result of a study folder,
skipped when done or run by another process) and window_ppl (per-window perplexities of a run
file)."""
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


def run_locked(outdir, name, cmd, log=None):
    """Runs `cmd` for the result `name` of a study folder unless outdir/name.json exists or
    another process holds outdir/name.lock (several machines or shells may work through one
    study). The output goes to `log` (written as log.tmp, renamed when the command ends) or is
    discarded. Returns the exit status: 0 also when the result exists, None when another process
    holds the lock."""
    import os
    import subprocess
    if os.path.exists(os.path.join(outdir, name + ".json")):
        return 0
    lock = os.path.join(outdir, name + ".lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        print(f"  {name}: running elsewhere (lock {lock})", flush=True)
        return None
    try:
        os.write(fd, str(os.getpid()).encode())
        print("+", " ".join(cmd), flush=True)
        t0 = time.time()
        if log is None:
            rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
        else:
            with open(log + ".tmp", "w") as fh:
                rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT).returncode
            os.replace(log + ".tmp", log)
        if rc != 0:
            print(f"  {name}: FAILED (exit {rc}" + (f", see {log})" if log else ")"), flush=True)
        else:
            print(f"  {name}: {time.time() - t0:.0f} s", flush=True)
        return rc
    finally:
        os.close(fd)
        os.unlink(lock)


def window_ppl(h5):
    """Per-window perplexities of an eval run file (/results/perplexity)."""
    import math
    import h5py
    with h5py.File(h5, "r") as f:
        p = f["results/perplexity"]
        nll = p["window_nll"][...]
        tok = p["window_tokens"][...]
    return [float(math.exp(a / b)) for a, b in zip(nll, tok)]
