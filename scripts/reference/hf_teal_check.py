#!/usr/bin/env python3
"""Independent check of sparsim's TEAL against Hugging Face transformers (opt-in; not run by CI).

sparsim evaluates TEAL on a GGUF model with its calibrated thresholds; this script loads the same
GGUF file in transformers (PyTorch, CPU; transformers dequantizes GGUF to float32), applies the
thresholds sparsim used — read from sparsim's run file, per layer and projection — through
forward pre-hooks on the inputs of the seven projections of every block, to the same rows
sparsim sparsifies (the scored rows of each window and the one before them), and scores the same
windows of the same token stream. The two perplexities must agree within --tolerance (0.5 %),
dense and TEAL alike.

  ~/.cache/sparsim-deps/venv/bin/pip install torch transformers accelerate   # not installed by setup.sh
  scripts/reference/hf_teal_check.py --calibration cal.h5 --windows 16 --threads 2 \\
      --threshold-jitter 1e-6,-1e-6 --json docs/results/sparsity/hf_teal_check.json

Exit status 1 when a perplexity differs by more than the tolerance.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402

PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # sparsim's order


def sparsim_eval(a, out_h5, out_json, method):
    cmd = [a.sparsim, "eval", "--model", a.model, "--corpus", a.corpus, "--context", str(a.context),
           "--stride", str(a.stride), "--max-windows", str(a.windows), "--threads", str(a.threads),
           "--progress", "never", "--save-tokens", "--out", out_h5, "--json", out_json]
    if method != "dense":
        cmd += ["--method", method, "--sparsity", str(a.sparsity), "--calibration", a.calibration]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out_json) as f:
        return json.load(f)


def read_run(path):
    with h5py.File(path, "r") as f:
        txt = lambda v: v.decode() if isinstance(v, bytes) else str(v)
        r = {"tokens": f["corpus/tokens"][...].astype(np.int64),
             "starts": f["results/perplexity/window_start"][...].astype(np.int64),
             "window_nll": f["results/perplexity/window_nll"][...],
             "context": int(f["config"].attrs["context"]), "score": int(f["config"].attrs["score"]),
             "bos": int(f["config"].attrs["bos"]), "model_path": txt(f["model"].attrs["path"])}
        if "sparsity" in f:
            r["threshold"] = f["sparsity/threshold"][...]
            r["rule"] = f["sparsity/rule"][...]
        return r


def projection_modules(layer):
    """A transformers Llama block's seven projections, in sparsim's order (PROJ)."""
    return [getattr(layer.self_attn if i < 4 else layer.mlp, p) for i, p in enumerate(PROJ)]


def hf_perplexity(model, torch, run, bos_id, thresholds=None, rules=None):
    """Sums the NLL of the scored tokens of every window, masking the projection inputs of the
    sparsified rows (|x| < τ → 0) when thresholds are given."""
    C, S = run["context"], run["score"]
    tail = S + 1
    first = C - tail  # sparsim masks rows C − tail … C − 1
    hooks = []
    if thresholds is not None:
        layers = model.model.layers
        for l, layer in enumerate(layers):
            for i, m in enumerate(projection_modules(layer)):
                if rules[l, i] != 1:  # 1: threshold (TEAL); 0: not masked
                    continue
                tau = float(np.float32(thresholds[l, i]))

                def pre(mod, args, tau=tau):
                    x = args[0].clone()
                    rows = x[:, first:, :]
                    rows[rows.abs() < tau] = 0.0
                    return (x,) + tuple(args[1:])
                hooks.append(m.register_forward_pre_hook(pre))
    nll, per_window = 0.0, []
    try:
        with torch.no_grad():
            for st in run["starts"]:
                toks = run["tokens"][st:st + C - (1 if run["bos"] else 0)].tolist()
                if run["bos"]:
                    toks = [bos_id] + toks
                ids = torch.tensor([toks], dtype=torch.long)
                logits = model(ids).logits[0].double()
                lp = torch.log_softmax(logits[first:first + S], dim=-1)
                tgt = ids[0, first + 1:first + S + 1]
                w = float(-lp[torch.arange(S), tgt].sum())
                per_window.append(w)
                nll += w
    finally:
        for h in hooks:
            h.remove()
    n = S * len(run["starts"])
    return math.exp(nll / n), per_window


def add_teal_run_args(ap):
    """The options of the sparsim TEAL run whose thresholds a transformers study applies."""
    ap.add_argument("--sparsim", default="build/bin/sparsim")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--corpus", default="default")
    ap.add_argument("--calibration", required=True, help="calibration file with a plain variant")
    ap.add_argument("--sparsity", type=float, default=0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_teal_run_args(ap)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--stride", type=int, default=512)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.005, help="relative perplexity difference allowed")
    ap.add_argument("--json", help="write the comparison here")
    ap.add_argument("--threshold-jitter", default="",
                    help="comma-separated relative changes ε: TEAL is also run in transformers with "
                         "every threshold times (1 + ε), to show how far threshold rounding alone "
                         "moves the perplexity (recorded, not compared)")
    a = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"this check needs torch and transformers ({e}); "
                 "install them into the scripts venv: pip install torch transformers accelerate")
    torch.set_num_threads(a.threads)

    tmp = tempfile.mkdtemp(prefix="sparsim-hf-")
    res = {}
    for method in ("dense", "teal"):
        h5, js = os.path.join(tmp, method + ".h5"), os.path.join(tmp, method + ".json")
        res[method] = {"sparsim": sparsim_eval(a, h5, js, method), "run": read_run(h5)}
    path = res["dense"]["run"]["model_path"]
    t0 = time.time()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), torch_dtype=torch.float32)
    model.eval()
    bos_id = model.config.bos_token_id
    out = {"model": path, "corpus": a.corpus, "windows": a.windows, "context": a.context,
           "stride": a.stride, "sparsity": a.sparsity, "calibration": a.calibration,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "tolerance": a.tolerance, "results": {}}
    ok = True
    for method in ("dense", "teal"):
        run = res[method]["run"]
        sp = res[method]["sparsim"]["perplexity"]
        if method == "dense":
            hp, per = hf_perplexity(model, torch, run, bos_id)
        else:
            hp, per = hf_perplexity(model, torch, run, bos_id, run["threshold"], run["rule"])
        rel = abs(hp - sp) / sp
        ok = ok and rel <= a.tolerance
        out["results"][method] = {
            "sparsim_perplexity": sp, "hf_perplexity": hp, "relative_difference": rel,
            "sparsim_window_nll": run["window_nll"].tolist(), "hf_window_nll": per,
            "tokens_scored": res[method]["sparsim"]["tokens_scored"]}
        print(f"{method}: sparsim {sp:.4f}, transformers {hp:.4f}, relative difference {rel:.2e}")
    jit = [float(x) for x in a.threshold_jitter.split(",") if x]
    if jit:
        run = res["teal"]["run"]
        out["threshold_jitter"] = []
        for eps in jit:
            hp, per = hf_perplexity(model, torch, run, bos_id, run["threshold"] * (1.0 + eps),
                                    run["rule"])
            out["threshold_jitter"].append({"epsilon": eps, "hf_perplexity": hp,
                                            "hf_window_nll": per})
            print(f"teal, thresholds × (1 {'+' if eps >= 0 else '−'} {abs(eps):g}): transformers "
                  f"{hp:.4f}")
    out["seconds"] = time.time() - t0
    out["pass"] = ok
    if a.json:
        write_json(a.json, out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
