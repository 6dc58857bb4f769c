#!/usr/bin/env python3
"""Speed against llama.cpp at its best on this machine, in one run: SmolLM2-135M with F32 and
BF16 weights, prefill of a 512-token prompt and decode of 128 tokens after a 512-token context,
both programs at the same thread count.

    scripts/bench/build_llamacpp.sh          # once per machine: llama.cpp's tools, native CPU flags
    scripts/bench/bench_vs_llamacpp.py --reps 5 --json docs/results/performance/bench_vs_llamacpp.json

llama.cpp is measured by its own `llama-bench` (built by scripts/bench/build_llamacpp.sh from the
llama.cpp sources vendored in llama-cpp-python, GGML_NATIVE=ON): prefill `-p P -n 0`, decode
`-p 0 -n D -d P` (D tokens generated over a cache already P positions deep). sparsim is
`sparsim bench --prompt P --decode D` (prefill of P tokens, then the median of D decode steps
after it). Neither program computes more than the last position's logits in the prefill. Both
read the same GGUF, converted from the Q4_1 file by llama.cpp's own `llama-quantize`.

Repetitions are interleaved (sparsim, llama.cpp, sparsim, …; one process each), the load
average is recorded before and after every run, and the JSON carries both programs' build flags
and the CPU's model and vector features. Ratios are sparsim / llama.cpp of the medians.

With BF16 weights sparsim also runs with --bf16-compute in every repetition (its prefill
products in bf16 arithmetic, as llama.cpp computes them; `sparsim_bf16_compute` in the JSON),
unless --no-bf16-compute or the build lacks it (oneDNN).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402
from machine_info import cpu_info, require_threads  # noqa: E402
from smollm2_model import find_smollm2  # noqa: E402



def sparsim_build(binary):
    """The CMake settings of the build that made `binary` (build/bin/sparsim → build/)."""
    cache = os.path.join(os.path.dirname(os.path.dirname(binary)), "CMakeCache.txt")
    keys = ("CMAKE_BUILD_TYPE", "CMAKE_CXX_COMPILER", "CMAKE_CXX_FLAGS", "CMAKE_CXX_FLAGS_RELEASE",
            "SPARSIM_NATIVE", "SPARSIM_KERNEL_CLONES", "SPARSIM_EXEC_SPACE")
    out = {}
    if os.path.exists(cache):
        with open(cache) as f:
            for line in f:
                k = line.split(":", 1)[0]
                if k in keys and "=" in line:
                    out[k] = line.split("=", 1)[1].strip()
    if out.get("SPARSIM_NATIVE") == "ON":
        out["note"] = "sparsim's own kernels with -march=native; OpenBLAS picks its kernels at run time"
    elif out.get("SPARSIM_KERNEL_CLONES") == "OFF":
        out["note"] = (f"sparsim's own kernels compiled for CMAKE_CXX_FLAGS='{out.get('CMAKE_CXX_FLAGS', '')}' "
                       "only (no run-time dispatch); OpenBLAS as OPENBLAS_CORETYPE says")
    return out


def add_sparsim_build_arg(ap):
    ap.add_argument("--sparsim-build", help="the build folder whose CMake cache describes --sparsim "
                    "(default: the folder above the binary's; give it when timing a copy of a build)")


def sparsim_build_of(a):
    """sparsim_build of --sparsim, or of --sparsim-build's binary when given."""
    if a.sparsim_build:
        return sparsim_build(os.path.join(os.path.abspath(a.sparsim_build), "bin", "sparsim"))
    return sparsim_build(os.path.abspath(a.sparsim))


def run(cmd, what, env=None):
    """Runs cmd; returns its stdout and the load average before / after, the wall time and the
    peak RSS (from wait4)."""
    load0 = os.getloadavg()[0]
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read()
        if p.returncode != 0:
            sys.stderr.write(text + err.read())
            raise SystemExit(f"{what} failed ({p.returncode}): {' '.join(cmd)}")
    return text, {"load_before": load0, "load_after": os.getloadavg()[0],
                  "wall_seconds": time.time() - t0, "peak_rss_mib": ru.ru_maxrss / 1024.0}


def tool_env(tools):
    """llama.cpp's tools next to their shared libraries."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = tools + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def sparsim_bench(a, model, storage, json_path, extra=()):
    """One `sparsim bench` process (prompt, decode, one repetition): its figures and run info."""
    _, info = run([a.sparsim, "bench", "--model", model, "--storage", storage, *extra,
                   "--prompt", str(a.prompt), "--decode", str(a.decode), "--reps", "1",
                   "--threads", str(a.threads), "--json", json_path, "--log-level", "error"],
                  " ".join(["sparsim bench", *extra]))
    with open(json_path) as f:
        s = json.load(f)
    require_threads(s, a.threads)
    return {"prefill_tokens_per_s": s["prefill_tokens_per_s"],
            "decode_tokens_per_s": s["decode_tokens_per_s"], "run": info,
            "host_kernels": s.get("host_kernels")}


def llama_bench(tools, model, threads, args):
    out, info = run([os.path.join(tools, "llama-bench"), "-m", model, "-t", str(threads), "-r", "1",
                     "-o", "json"] + args, "llama-bench", tool_env(tools))
    rows = json.loads(out)
    if len(rows) != 1:
        raise SystemExit(f"llama-bench printed {len(rows)} results, expected 1")
    return rows[0], info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    add_sparsim_build_arg(ap)
    ap.add_argument("--llama-tools", help="folder of llama-bench and llama-quantize "
                    "(default: scripts/bench/build_llamacpp.sh --print)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--weights", default="f32,bf16")
    ap.add_argument("--no-bf16-compute", action="store_true",
                    help="BF16: time sparsim's default fp32 arithmetic only")
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "sparsim-bench-llamacpp"))
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.reps < 1 or a.threads < 1 or a.prompt < 1 or a.decode < 1:
        raise SystemExit("--reps, --threads, --prompt and --decode must be positive")
    tools = a.llama_tools
    if not tools:
        r = subprocess.run([os.path.join(HERE, "build_llamacpp.sh"), "--print"], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("llama.cpp's tools are not built for this CPU: run scripts/bench/build_llamacpp.sh first")
        tools = r.stdout.strip()
    for t in ("llama-bench", "llama-quantize"):
        if not os.access(os.path.join(tools, t), os.X_OK):
            raise SystemExit(f"{t} not found in {tools}")
    if not os.access(a.sparsim, os.X_OK):
        raise SystemExit(f"sparsim not found at {a.sparsim} (build it first)")
    src = find_smollm2()
    os.makedirs(a.work, exist_ok=True)
    info_path = os.path.join(os.path.dirname(tools), "build-info.json")
    res = {"settings": {"threads": a.threads, "reps": a.reps, "prompt": a.prompt, "decode": a.decode,
                        "source_model": os.path.basename(src)},
           "command": "scripts/bench/bench_vs_llamacpp.py " + " ".join(sys.argv[1:]),
           "cpu": cpu_info(),
           "llama_cpp_build": json.load(open(info_path)) if os.path.exists(info_path) else {},
           "sparsim_build": sparsim_build_of(a),
           "runs": {}}
    for w in [x for x in a.weights.split(",") if x]:
        if w not in ("f32", "bf16"):
            raise SystemExit(f"--weights: f32 or bf16, got '{w}'")
        model = os.path.join(a.work, f"smollm2-{w}.gguf")
        if not os.path.exists(model):
            tmp = model + ".part"
            run([os.path.join(tools, "llama-quantize"), "--allow-requantize", src, tmp, w.upper()],
                "llama-quantize", tool_env(tools))
            os.replace(tmp, model)
        reps = []
        for i in range(a.reps):
            s = sparsim_bench(a, model, w, os.path.join(a.work, f"sparsim-{w}.json"))
            sc = None
            if w == "bf16" and not a.no_bf16_compute:
                sc = sparsim_bench(a, model, w, os.path.join(a.work, "sparsim-bf16-compute.json"),
                                   ["--bf16-compute"])
            lp, lp_info = llama_bench(tools, model, a.threads, ["-p", str(a.prompt), "-n", "0"])
            ld, ld_info = llama_bench(tools, model, a.threads,
                                      ["-p", "0", "-n", str(a.decode), "-d", str(a.prompt)])
            reps.append({
                "sparsim": s,
                "llama_cpp": {"prefill_tokens_per_s": lp["avg_ts"], "decode_tokens_per_s": ld["avg_ts"],
                              "run_prefill": lp_info, "run_decode": ld_info,
                              "flash_attn": lp.get("flash_attn"), "type_k": lp.get("type_k"),
                              "n_batch": lp.get("n_batch"), "n_ubatch": lp.get("n_ubatch")},
            })
            if sc:
                reps[-1]["sparsim_bf16_compute"] = sc
                print(f"{w} rep {i + 1}/{a.reps}: sparsim --bf16-compute prefill "
                      f"{sc['prefill_tokens_per_s']:.0f} tok/s", flush=True)
            print(f"{w} rep {i + 1}/{a.reps}: prefill sparsim {s['prefill_tokens_per_s']:.0f} vs llama.cpp "
                  f"{lp['avg_ts']:.0f} tok/s; decode {s['decode_tokens_per_s']:.1f} vs {ld['avg_ts']:.1f} tok/s",
                  flush=True)
        med = lambda prog, k: statistics.median(r[prog][k] for r in reps)
        progs = ("sparsim", "llama_cpp") + (("sparsim_bf16_compute",) if "sparsim_bf16_compute" in reps[0] else ())
        summary = {p: {k: med(p, k) for k in ("prefill_tokens_per_s", "decode_tokens_per_s")}
                   for p in progs}
        loads = [r["sparsim"]["run"]["load_before"] for r in reps] + \
                [r["llama_cpp"]["run_decode"]["load_after"] for r in reps]
        res["runs"][w] = {
            "reps": reps, "median": summary,
            "ratio_prefill": summary["sparsim"]["prefill_tokens_per_s"] / summary["llama_cpp"]["prefill_tokens_per_s"],
            "ratio_decode": summary["sparsim"]["decode_tokens_per_s"] / summary["llama_cpp"]["decode_tokens_per_s"],
            "load_min": min(loads), "load_max": max(loads),
            **({"ratio_prefill_bf16_compute": summary["sparsim_bf16_compute"]["prefill_tokens_per_s"] /
                summary["llama_cpp"]["prefill_tokens_per_s"],
                "ratio_decode_bf16_compute": summary["sparsim_bf16_compute"]["decode_tokens_per_s"] /
                summary["llama_cpp"]["decode_tokens_per_s"]} if "sparsim_bf16_compute" in summary else {}),
            "llama_cpp_settings": {k: reps[0]["llama_cpp"][k] for k in ("flash_attn", "type_k", "n_batch", "n_ubatch")},
            "sparsim_host_kernels": reps[0]["sparsim"]["host_kernels"],
        }
    write_json(a.json, res)
    for w, r in res["runs"].items():
        print(f"{w}: prefill {r['ratio_prefill']:.2f}x, decode {r['ratio_decode']:.2f}x llama.cpp "
              f"(load {r['load_min']:.1f}-{r['load_max']:.1f})")
        if "ratio_prefill_bf16_compute" in r:
            print(f"{w} with --bf16-compute: prefill {r['ratio_prefill_bf16_compute']:.2f}x, "
                  f"decode {r['ratio_decode_bf16_compute']:.2f}x llama.cpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
