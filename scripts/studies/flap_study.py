#!/usr/bin/env python3
"""FLAP against dense and Token Filtering (and SlimGPT, with --slimgpt-ratios) on one model:
perplexity with its spread over windows, and the realised FLOPs, bytes and parameters each
configuration ran with.

Steps (every output is a file in --outdir; a step whose file exists is skipped):

  1. split the corpus by file: the first --calib-files files (sorted) are FLAP's calibration
     text, the rest the evaluation text (directories of symbolic links in --outdir);
  2. `sparsim prune --method flap` at each --ratios value and `--method slimgpt` at each
     --slimgpt-ratios value, on the same calibration text (GGUF + JSON summary);
  3. `sparsim eval` over non-overlapping windows of the evaluation text: dense, every FLAP model,
     and Token Filtering at each --tf-ratios value on the dense model;
  4. a JSON summary (--json) and a generated table between the markers of a Markdown page
     (--page), relative figures against the dense run of the same windows.

  scripts/studies/flap_study.py --outdir out/flap --json docs/results/flap/flap_smollm2.json \\
      --page docs/flap.md
  scripts/studies/flap_study.py --outdir out/slimgpt --ratios 0.2,0.5 --slimgpt-ratios 0.2,0.5 \\
      --tf-ratios '' --json docs/results/slimgpt/slimgpt_smollm2.json --page docs/slimgpt.md

Needs h5py (the scripts venv of scripts/setup.sh has it).
"""
import argparse
import json
import math
import os
import statistics
import sys

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from study_steps import sh  # noqa: E402

BEGIN = "<!-- flap_study table: begin -->"  # the same markers on every page it writes
END = "<!-- flap_study table: end -->"


def split_corpus(src, outdir, n_calib):
    files = sorted(f for f in os.listdir(src) if not f.startswith("."))
    dirs = {}
    for k, names in (("calib", files[:n_calib]), ("eval", files[n_calib:])):
        d = os.path.join(outdir, "corpus_" + k)
        os.makedirs(d, exist_ok=True)
        for n in names:
            link = os.path.join(d, n)
            if not os.path.lexists(link):
                os.symlink(os.path.join(os.path.abspath(src), n), link)
        dirs[k] = d
    return dirs


def read_eval(path, run):
    j = json.load(open(path))
    with h5py.File(run, "r") as f:
        p = f["results/perplexity"]
        nll = [float(a / b) for a, b in zip(p["window_nll"][...], p["window_tokens"][...])]
    win = [math.exp(x) for x in nll]
    return {"perplexity": j["perplexity"],
            "tokens_scored": j["tokens_scored"],
            "windows": len(win),
            "window_ppl_mean": statistics.mean(win),
            "window_ppl_stdev": statistics.stdev(win) if len(win) > 1 else 0.0,
            "window_nll": nll,
            "flops": j["flops"]["realised"],
            "bytes": j["bytes"]["realised"],
            "n_params": j["n_params"],
            "wall_seconds": j["wall_seconds"]}


def paired(a, b):
    """Mean and standard error of the per-window NLL difference b − a."""
    d = [y - x for x, y in zip(a, b)]
    if len(d) < 2:
        return d[0] if d else 0.0, 0.0
    return statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--corpus", default=os.path.expanduser("~/.cache/sparsim-deps/corpus/shakespeare"))
    ap.add_argument("--calib-files", type=int, default=4)
    ap.add_argument("--outdir", default=os.path.join(ROOT, "out", "flap"))
    ap.add_argument("--ratios", default="0.2,0.5")
    ap.add_argument("--tf-ratios", default="0.2,0.5")
    ap.add_argument("--slimgpt-ratios", default="", help="SlimGPT arms (none by default)")
    ap.add_argument("--slimgpt-windows", type=int, default=64)
    ap.add_argument("--slimgpt-tokens", type=int, default=128)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--flap-windows", type=int, default=64)
    ap.add_argument("--flap-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="--threads of every command (0: default)")
    ap.add_argument("--json")
    ap.add_argument("--page")
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    thr = ["--threads", str(a.threads)] if a.threads else []
    dirs = split_corpus(a.corpus, a.outdir, a.calib_files)
    ratios = [float(x) for x in a.ratios.split(",") if x]
    tf_ratios = [float(x) for x in a.tf_ratios.split(",") if x]
    slim_ratios = [float(x) for x in a.slimgpt_ratios.split(",") if x]

    configs = [("dense", a.model, [], None)]
    prune = {}
    for r in ratios:
        n = f"flap-{r:g}"
        gg, js = os.path.join(a.outdir, n + ".gguf"), os.path.join(a.outdir, n + ".prune.json")
        if not (os.path.exists(gg) and os.path.exists(js)):
            sh([a.sparsim, "prune", "--method", "flap", "--model", a.model, "--ratio", str(r),
                "--corpus", dirs["calib"], "--flap-windows", str(a.flap_windows),
                "--flap-tokens", str(a.flap_tokens), "--out", gg, "--json", js] + thr, js + ".log")
        prune[n] = json.load(open(js))
        configs.append((n, gg, [], r))
    for r in slim_ratios:
        n = f"slimgpt-{r:g}"
        gg, js = os.path.join(a.outdir, n + ".gguf"), os.path.join(a.outdir, n + ".prune.json")
        if not (os.path.exists(gg) and os.path.exists(js)):
            sh([a.sparsim, "prune", "--method", "slimgpt", "--model", a.model, "--ratio", str(r),
                "--corpus", dirs["calib"], "--slimgpt-windows", str(a.slimgpt_windows),
                "--slimgpt-tokens", str(a.slimgpt_tokens), "--out", gg, "--json", js] + thr,
               js + ".log")
        prune[n] = json.load(open(js))
        configs.append((n, gg, [], r))
    for r in tf_ratios:
        configs.append((f"token-filter-{r:g}", a.model, ["--method", "token-filter", "--tf-ratio", str(r)], r))

    rows = {}
    for n, model, extra, ratio in configs:
        js, run = (os.path.join(a.outdir, n + ".eval" + x) for x in (".json", ".h5"))
        if not (os.path.exists(js) and os.path.exists(run)):
            sh([a.sparsim, "eval", "--model", model, "--corpus", dirs["eval"], "--context",
                str(a.context), "--stride", str(a.context), "--score", str(a.context - 1),
                "--max-windows", str(a.windows), "--progress", "never", "--json", js, "--out",
                run] + extra + thr, js + ".log")
        rows[n] = read_eval(js, run)
        rows[n]["ratio"] = ratio
        if n in prune:
            rows[n]["prune_seconds"] = prune[n]["wall_seconds"]
            rows[n]["ratio_realised"] = prune[n]["ratio_realised"]
            rows[n]["kv_bytes_fraction"] = prune[n]["kv_bytes_fraction"]

    d = rows["dense"]
    for n, r in rows.items():
        r["flops_fraction"] = r["flops"] / d["flops"]
        r["bytes_fraction"] = r["bytes"] / d["bytes"]
        r["params_fraction"] = r["n_params"] / d["n_params"]
        r["dnll_mean"], r["dnll_se"] = paired(d["window_nll"], r["window_nll"])

    summary = {"model": a.model, "corpus": a.corpus, "calib_files": a.calib_files,
               "context": a.context, "windows": a.windows, "flap_windows": a.flap_windows,
               "flap_tokens": a.flap_tokens, "configs": rows}
    if slim_ratios:
        summary["slimgpt_windows"], summary["slimgpt_tokens"] = a.slimgpt_windows, a.slimgpt_tokens
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json + ".tmp", "w") as f:
            json.dump(summary, f, indent=1)
        os.replace(a.json + ".tmp", a.json)

    lines = [f"{a.windows} windows of {a.context} tokens of the evaluation text (scored: the last "
             f"{a.context - 1} of each), FLAP calibrated on the first {a.calib_files} files "
             f"({a.flap_windows} windows of {a.flap_tokens} tokens)"
             + (f", SlimGPT on the same files ({a.slimgpt_windows} windows of {a.slimgpt_tokens} "
                "tokens)" if slim_ratios else "") + ". Fractions are against the "
             "dense run of the same windows; ΔNLL is the paired per-window difference "
             "(mean ± standard error).", "",
             "| configuration | perplexity | window ppl (mean ± sd) | ΔNLL vs dense | FLOPs | bytes | parameters |",
             "|---|---|---|---|---|---|---|"]
    for n, r in rows.items():
        lines.append(f"| {n} | {r['perplexity']:.2f} | {r['window_ppl_mean']:.2f} ± "
                     f"{r['window_ppl_stdev']:.2f} | {r['dnll_mean']:+.4f} ± {r['dnll_se']:.4f} | "
                     f"{r['flops_fraction']:.3f} | {r['bytes_fraction']:.3f} | "
                     f"{r['params_fraction']:.3f} |")
    table = "\n".join(lines)
    print(table)
    if a.page:
        text = open(a.page).read()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            text = head + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1]
        else:
            text = text.rstrip("\n") + "\n\n" + BEGIN + "\n" + table + "\n" + END + "\n"
        with open(a.page + ".tmp", "w") as f:
            f.write(text)
        os.replace(a.page + ".tmp", a.page)


if __name__ == "__main__":
    main()
