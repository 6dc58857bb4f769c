#!/usr/bin/env python3
"""Turn the output of scripts/tools/probe_gpu.sh into a sparsim hardware profile (kind "measured").

    scripts/tools/gpu_profile.py docs/results/cuda/h200_probe.log --name h200-measured \\
        --out data/hardware/h200-measured.json

Roofs: peak_flops per precision from the matrix products; memory_bandwidth the faster of the
device copy and the streaming sum; launch_overhead_s the median of the back-to-back launches;
l2_bytes and memory_bytes as the driver reports them. Every number's source names the log.
"""
import argparse
import json
import os
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="output of scripts/tools/probe_gpu.sh")
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    lines = open(a.log).read().split("\n")
    asy, syn, v = [], [], {}
    dev = None
    for ln in lines:
        t = ln.split()
        if not t:
            continue
        if t[0] == "launch_async_us":
            asy.append(float(t[1]))
            syn.append(float(t[3]))
        elif t[0] in ("copy_GBs",):
            v["copy"], v["read"] = float(t[1]) * 1e9, float(t[3]) * 1e9
        elif t[0] in ("fp32_TF", "tf32_TF", "bf16_TF"):
            v[t[0][:4]] = float(t[1]) * 1e12
        elif t[0] == "gemv_GBs":
            v["gemv"] = float(t[1]) * 1e9
        elif "L2" in t:
            i = t.index("L2")
            dev = {"name": " ".join(t[: i - 1]), "memory": float(t[i - 1]), "l2": float(t[i + 1]),
                   "sm": int(t[i + 3]), "torch": t[i + 4], "cuda": t[i + 5]}
        elif len(t) == 1 and t[0].endswith("Z"):
            v["date"] = t[0]
    need = ["copy", "read", "fp32", "tf32", "bf16", "gemv", "date"]
    missing = [k for k in need if k not in v] + ([] if dev else ["device line"]) + ([] if asy else ["launch lines"])
    if missing:
        raise SystemExit(f"gpu_profile.py: {a.log} lacks {', '.join(missing)}")
    log = os.path.relpath(a.log)
    who = (f"measured by scripts/tools/probe_gpu.sh on an {dev['name']} at {v['date']} (PyTorch {dev['torch']}, "
           f"CUDA {dev['cuda']}; output in {log})")
    prof = {
        "format": "sparsim-hardware", "version": 1, "name": a.name,
        "description": f"{dev['name']}, {dev['memory'] / 1e9:.0f} GB, {dev['sm']} SMs (measured)",
        "kind": "measured",
        "peak_flops": {"fp32": v["fp32"], "tf32": v["tf32"], "bf16": v["bf16"]},
        "memory_bandwidth": max(v["copy"], v["read"]),
        "memory_bytes": dev["memory"],
        "l2_bytes": dev["l2"],
        "launch_overhead_s": statistics.median(asy) * 1e-6,
        "sources": {
            "peak_flops.fp32": f"{who}: torch.matmul 8192^3 fp32, TF32 off (cuBLAS), median of 9",
            "peak_flops.tf32": f"{who}: torch.matmul 8192^3 fp32, TF32 on (cuBLAS), median of 9",
            "peak_flops.bf16": f"{who}: torch.matmul 8192^3 bf16 (cuBLAS), median of 9",
            "memory_bandwidth": f"{who}: the faster of a 1 GiB device copy (read + write) and a streaming sum, median of 9",
            "memory_bytes": f"{who}: torch.cuda.get_device_properties().total_memory",
            "l2_bytes": f"{who}: torch.cuda.get_device_properties().L2_cache_size",
            "launch_overhead_s": f"{who}: an empty CUDA C++ kernel launched 20000 times back to back on one stream, median of 5 runs",
        },
        "measured": {"copy_bandwidth": v["copy"], "read_bandwidth": v["read"], "gemv_bandwidth": v["gemv"],
                     "launch_overhead_sync_s": statistics.median(syn) * 1e-6, "sm_count": dev["sm"]},
    }
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(prof, f, indent=2)
        f.write("\n")
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
