"""The CPU a benchmark ran on, as benchmark scripts record it (standard library only)."""
import os
import platform

FEATURES = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
            "avx512_bf16", "avx512_vnni", "amx_tile")


def cpu_info():
    """Model name, logical CPUs and the vector features of interest, from /proc/cpuinfo."""
    model, flags = "", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    return {"model": model, "logical_cpus": os.cpu_count(),
            "features": [x for x in FEATURES if x in flags], "machine": platform.machine()}


def require_threads(result, asked):
    """Stops the benchmark when sparsim's JSON reports another thread count than it was given."""
    ran = result.get("threads", asked)
    if ran != asked:
        raise SystemExit(f"sparsim ran on {ran} threads, not {asked}")
