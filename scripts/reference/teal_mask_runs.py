#!/usr/bin/env python3
"""How TEAL's kept channels lie along each projection's input: the mean run length of kept
channels per token, in the model's channel order and after a static permutation that sorts the
channels by how often they were kept on other text (opt-in; not run by CI).

The column-skipping GEMV reads one row of the transposed weights per kept channel; on machines
where reading a scattered half of the rows costs nearly as much as reading them all, the
speedup depends on how long the runs of consecutive kept rows are (scripts/bench/bench_sparse_gemv.py
--kept-runs measures that cost per run length). This script measures the run lengths TEAL
produces: sparsim picks the thresholds (`sparsim eval --method teal` with the calibration file,
read back from its run file), transformers (PyTorch, CPU; the same GGUF dequantized) produces
the projection inputs of consecutive windows of the evaluation text, and every masked input
|x| >= tau is recorded per token. The first half of the windows gives each channel's keep
frequency (the permutation); the second half is measured in both orders.

  ~/.cache/sparsim-deps/venv/bin/pip install torch transformers accelerate   # not installed by setup.sh
  scripts/reference/teal_mask_runs.py --calibration cal.h5 --windows 8 --json docs/results/performance/teal_mask_runs.json
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402
from hf_teal_check import PROJ, add_teal_run_args, projection_modules  # noqa: E402


def mean_run(m):
    """Kept entries per maximal run of consecutive kept entries, over all rows of m [T, D]."""
    edge = np.diff(np.concatenate([np.zeros((m.shape[0], 1), np.int8), m.astype(np.int8)], 1), axis=1)
    runs = int((edge == 1).sum())
    return float(m.sum()) / runs if runs else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_teal_run_args(ap)
    ap.add_argument("--context", type=int, default=512, help="tokens per window")
    ap.add_argument("--windows", type=int, default=8, help="windows (half for the permutation)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.windows < 2 or a.windows % 2:
        ap.error("--windows must be even and at least 2")
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"this study needs torch and transformers ({e}); "
                 "install them into the scripts venv: pip install torch transformers accelerate")
    torch.set_num_threads(a.threads)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="sparsim-runs-") as tmp:
        h5 = os.path.join(tmp, "teal.h5")
        cmd = [a.sparsim, "eval", "--model", a.model, "--corpus", a.corpus, "--method", "teal",
               "--sparsity", str(a.sparsity), "--calibration", a.calibration,
               "--context", str(a.context), "--stride", str(a.context // 2),
               "--max-windows", str(a.windows), "--threads", str(a.threads), "--progress", "never",
               "--save-tokens", "--out", h5]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with h5py.File(h5, "r") as f:
            th, rule = f["sparsity/threshold"][...], f["sparsity/rule"][...]
            tokens = f["corpus/tokens"][...].astype(np.int64)
            path = f["model"].attrs["path"]
            path = path.decode() if isinstance(path, bytes) else str(path)
    if len(tokens) < a.windows * a.context:
        sys.exit(f"the corpus has {len(tokens)} tokens, fewer than {a.windows} windows of {a.context}")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
    masks, hooks = {}, []
    for l, layer in enumerate(model.model.layers):
        for i, m in enumerate(projection_modules(layer)):
            if rule[l, i] != 1:  # 1: threshold (TEAL); 0: not masked
                continue
            tau = float(np.float32(th[l, i]))

            def pre(mod, args, tau=tau, key=(l, i)):
                masks.setdefault(key, []).append((args[0][0].abs() >= tau).numpy())
            hooks.append(m.register_forward_pre_hook(pre))
    with torch.no_grad():
        for w in range(a.windows):
            model(torch.tensor([tokens[w * a.context:(w + 1) * a.context].tolist()]))
    for h in hooks:
        h.remove()
    half = a.windows // 2 * a.context
    per_proj = []
    for i, name in enumerate(PROJ):
        layers = []
        for l in range(len(model.model.layers)):
            if (l, i) not in masks:
                continue
            m = np.concatenate(masks[(l, i)], 0)
            ref, test = m[:half], m[half:]
            freq = ref.mean(0)
            perm = np.argsort(-freq, kind="stable")
            layers.append({"layer": l, "kept": float(test.mean()), "mean_run": mean_run(test),
                           "mean_run_permuted": mean_run(test[:, perm]),
                           "keep_frequency_p10_p50_p90": [float(x) for x in np.percentile(freq, [10, 50, 90])]})
        if layers:
            per_proj.append({
                "projection": name, "input_width": int(masks[(layers[0]["layer"], i)][0].shape[1]),
                "kept": float(np.mean([x["kept"] for x in layers])),
                "mean_run": float(np.mean([x["mean_run"] for x in layers])),
                "mean_run_permuted": float(np.mean([x["mean_run_permuted"] for x in layers])),
                "mean_run_permuted_max_layer": float(max(x["mean_run_permuted"] for x in layers)),
                "keep_frequency_p10_p50_p90": [float(np.mean([x["keep_frequency_p10_p50_p90"][k] for x in layers]))
                                               for k in range(3)],
                "layers": layers})
    out = {"model": path, "corpus": a.corpus, "calibration": a.calibration, "sparsity": a.sparsity,
           "context": a.context, "windows": a.windows, "permutation_windows": a.windows // 2,
           "tokens_measured": int(len(tokens[half:a.windows * a.context])),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "seconds": time.time() - t0, "projections": per_proj}
    write_json(a.json, out)
    for p in per_proj:
        print(f"{p['projection']:9s} kept {p['kept']:.3f}  mean run {p['mean_run']:.2f}  "
              f"permuted {p['mean_run_permuted']:.2f}  keep frequency p10/p50/p90 "
              + "/".join(f"{x:.2f}" for x in p["keep_frequency_p10_p50_p90"]))


if __name__ == "__main__":
    main()
