#!/usr/bin/env python3
"""Activation-sparsity study on one model: target vs realised sparsity of TEAL, WINA and
TopK-Guided on several corpora (the pattern of the TopK-Guided paper's Table 3) and the
contribution ablation (its Table 6) at several targets.

Runs `sparsim eval` for every configuration (run files are kept and reused), reads the HDF5
run files, and writes a JSON summary and a Markdown results page.

  scripts/sparsity_study.py --calibration cal.h5 --outdir runs/ \
      --json docs/results/sparsity_smollm2.json --page docs/sparsity-results.md

Needs h5py (the scripts venv made by scripts/setup.sh has it).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import h5py

ABLATION = [
    ("WINA (baseline)", ["--method", "wina"]),
    ("+ sensitivity-aware budgets", ["--method", "topk-guided", "--masking", "topk"]),
    ("+ TopK-Guided masking", ["--method", "topk-guided", "--budget", "uniform"]),
    ("+ both (TopK-Guided)", ["--method", "topk-guided"]),
]


def run_eval(args, name, corpus, extra):
    out = os.path.join(args.outdir, name + ".h5")
    if os.path.exists(out) and not args.rerun:
        return out
    cmd = [args.sparsim, "eval", "--model", args.model, "--corpus", corpus,
           "--context", str(args.context), "--stride", str(args.stride),
           "--max-windows", str(args.max_windows), "--storage", args.storage,
           "--progress", "never", "--threads", str(args.threads), "--out", out] + extra
    if "teal" in extra:
        cmd += ["--calibration", args.calibration_plain or args.calibration]
    elif any(e in extra for e in ("wina", "topk-guided")):
        cmd += ["--calibration", args.calibration]
    t0 = time.time()
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    print(f"  {time.time() - t0:.0f} s", flush=True)
    return out


def read_run(path):
    with h5py.File(path, "r") as f:
        r = {"run_file": os.path.basename(path),
             "perplexity": float(f["results/perplexity"].attrs["perplexity"]),
             "tokens_scored": int(f["results/perplexity"].attrs["tokens_scored"]),
             "model_fingerprint": f["model"].attrs["fingerprint"].decode()
             if isinstance(f["model"].attrs["fingerprint"], bytes)
             else str(f["model"].attrs["fingerprint"]),
             "corpus_fingerprint": str(f["corpus"].attrs["fingerprint"])}
        fl = f["flops"]
        dense = fl["flops_dense"][...]
        real = fl["flops_realised"][...]
        ops = [o.decode() if isinstance(o, bytes) else str(o) for o in fl["ops"][...]]
        proj = [i for i, o in enumerate(ops) if o.endswith("_proj")]
        r["proj_flops_fraction"] = float(real[:, proj, :].sum() / dense[:, proj, :].sum())
        r["flops_fraction"] = float(real.sum() / dense.sum())
        rot = ops.index("rotation")
        r["rotation_flops_share"] = float(real[:, rot, :].sum() / real.sum())
        if "sparsity" in f:
            s = f["sparsity"]
            for k in ("target", "realised_mean", "realised_min", "realised_max",
                      "block_budget_mean"):
                r[k] = float(s.attrs[k])
            r["method"] = str(s.attrs["method"])
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in s["projections"][...]]
            tgt, mean = s["target"][...], s["realised_mean"][...]
            mn, mx = s["realised_min"][...], s["realised_max"][...]
            r["per_projection"] = {
                n: {"target_mean": float(tgt[:, i].mean()), "realised_mean": float(mean[:, i].mean()),
                    "realised_min": float(mn[:, i].min()), "realised_max": float(mx[:, i].max())}
                for i, n in enumerate(names)}
            tok = s["token_sparsity"][...]
            r["token_sparsity_std"] = float(tok.std())
        return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparsim", default="build/bin/sparsim")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--calibration", required=True,
                    help="calibration file (rotated variant for WINA / TopK-Guided, and the plain "
                         "one for TEAL unless --calibration-plain is given)")
    ap.add_argument("--calibration-plain", help="calibration file for TEAL (plain variant)")
    ap.add_argument("--corpus", action="append", default=[],
                    help="NAME=PATH (repeatable); the first is the ablation corpus. "
                         "Default: shakespeare=default, licenses=/usr/share/common-licenses")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--stride", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=4)
    ap.add_argument("--storage", default="f32")
    ap.add_argument("--threads", type=int, default=2, help="OpenMP threads (results do not depend on it)")
    ap.add_argument("--targets", default="0.3,0.5,0.7")
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--page")
    ap.add_argument("--ablation-teal", action="store_true",
                    help="also run TEAL at every ablation target (s = 0.5 always)")
    ap.add_argument("--rerun", action="store_true", help="rerun configurations whose run file exists")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    corpora = [c.split("=", 1) for c in args.corpus] or [
        ["shakespeare", "default"], ["licenses", "/usr/share/common-licenses"]]
    targets = [float(t) for t in args.targets.split(",")]

    res = {"model": args.model, "calibration": os.path.abspath(args.calibration),
           "protocol": {"context": args.context, "stride": args.stride,
                        "max_windows": args.max_windows, "storage": args.storage},
           "corpora": {n: p for n, p in corpora}, "table3": {}, "ablation": {}}
    with h5py.File(args.calibration, "r") as f:
        a = dict(f.attrs)
        txt = lambda v: v.decode() if isinstance(v, bytes) else str(v)
        res["calibration_corpus"] = txt(a.get("corpus_path", ""))
        res["calibration_tokens"] = int(a.get("tokens", 0))
        res["calibration_settings"] = {k: (txt(a[k]) if isinstance(a[k], (bytes, str)) else float(a[k]))
                                       for k in ("alpha", "greedy_tokens", "greedy_score_fraction",
                                                 "context", "windows", "command") if k in a}
    if args.calibration_plain:
        res["calibration_plain"] = os.path.abspath(args.calibration_plain)
    # Table 3: dense and the three methods at s = 0.5 on every corpus
    for cname, cpath in corpora:
        rows = {"dense": read_run(run_eval(args, f"{cname}_dense", cpath, []))}
        for m in ("teal", "wina", "topk-guided"):
            rows[m] = read_run(run_eval(args, f"{cname}_{m}_0.5", cpath,
                                        ["--method", m, "--sparsity", "0.5"]))
        res["table3"][cname] = rows
    # Table 6: ablation on the first corpus, plus TEAL for reference
    cname, cpath = corpora[0]
    for s in targets:
        rows = {}
        if args.ablation_teal or s == 0.5:
            rows["TEAL"] = read_run(run_eval(args, f"{cname}_teal_{s}", cpath,
                                             ["--method", "teal", "--sparsity", str(s)]))
        for label, extra in ABLATION:
            tag = "_".join(e.lstrip("-") for e in extra)
            rows[label] = read_run(run_eval(args, f"{cname}_{tag}_{s}", cpath,
                                            extra + ["--sparsity", str(s)]))
        res["ablation"][str(s)] = rows
    with open(args.json, "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    if args.page:
        write_page(args, res, targets, corpora)


def pct(x):
    return f"{100 * x:.2f}%"


def write_page(args, res, targets, corpora):
    p = res["protocol"]
    L = []
    L.append("# Activation sparsity on SmolLM2-135M: target vs realised, and the ablation\n")
    L.append("Generated by `scripts/sparsity_study.py` from the HDF5 run files of `sparsim eval`; "
             f"the numbers are in `{os.path.relpath(args.json, os.path.dirname(args.page) or '.')}`.\n")
    L.append(f"Protocol: windows of {p['context']} tokens every {p['stride']}, the last "
             f"{p['stride']} of each scored and sparsified (the context prefix stays dense), "
             f"{p['max_windows']} windows per corpus, {p['storage']} weights. Calibration: "
             f"`{os.path.basename(res['calibration_corpus'])}` ({res['calibration_tokens']} tokens; "
             f"greedy step α = {res['calibration_settings'].get('alpha')}, "
             f"{int(res['calibration_settings'].get('greedy_tokens', 0))} greedy tokens), which is not "
             "among the evaluated windows. Realised sparsity is per token, FLOP-weighted over the "
             "seven projections of every block (mean, min and max over the scored tokens).\n")
    L.append("## Target vs realised sparsity at s = 0.5 (the pattern of the paper's Table 3)\n")
    L.append("| method | corpus | target | realised mean | min | max | PPL | dense PPL |")
    L.append("|---|---|---|---|---|---|---|---|")
    for m in ("teal", "wina", "topk-guided"):
        for cname, _ in corpora:
            r = res["table3"][cname][m]
            d = res["table3"][cname]["dense"]
            L.append(f"| {m} | {cname} | {pct(r['target'])} | {pct(r['realised_mean'])} | "
                     f"{pct(r['realised_min'])} | {pct(r['realised_max'])} | "
                     f"{r['perplexity']:.3f} | {d['perplexity']:.3f} |")
    L.append("")
    L.append("Per projection at s = 0.5 on the first corpus (mean target p_i over blocks from the "
             "greedy tables, realised mean / min / max over tokens and blocks):\n")
    L.append("| method | " + " | ".join(res["table3"][corpora[0][0]]["teal"]["per_projection"]) + " |")
    L.append("|---|" + "---|" * 7)
    for m in ("teal", "wina", "topk-guided"):
        pp = res["table3"][corpora[0][0]][m]["per_projection"]
        L.append(f"| {m} | " + " | ".join(
            f"{v['target_mean']:.3f} → {v['realised_mean']:.3f} [{v['realised_min']:.3f}, {v['realised_max']:.3f}]"
            for v in pp.values()) + " |")
    L.append("")
    L.append("## Ablation (the paper's Table 6 configurations), perplexity\n")
    head = "| configuration | " + " | ".join(f"s = {s}" for s in targets) + " |"
    L.append(head)
    L.append("|---|" + "---|" * len(targets))
    labels = ["TEAL"] + [a for a, _ in ABLATION]
    for lab in labels:
        cells = []
        for s in targets:
            r = res["ablation"][str(s)].get(lab)
            cells.append(f"{r['perplexity']:.3f} ({pct(r['realised_mean'])})" if r else "–")
        L.append(f"| {lab} | " + " | ".join(cells) + " |")
    L.append("")
    L.append("Each cell: perplexity (realised mean sparsity). Dense perplexity on this corpus: "
             f"{res['table3'][corpora[0][0]]['dense']['perplexity']:.3f}.\n")
    L.append("Mean block budget of the sensitivity-aware configurations (the clamp to "
             "[0.05, 0.95] can move it away from s), and the share of realised FLOPs spent on "
             "WINA's online re-rotation:\n")
    L.append("| s | budget mean (+ sensitivity) | budget mean (+ both) | rotation share of FLOPs |")
    L.append("|---|---|---|---|")
    for s in targets:
        a = res["ablation"][str(s)]
        L.append(f"| {s} | {a['+ sensitivity-aware budgets']['block_budget_mean']:.4f} | "
                 f"{a['+ both (TopK-Guided)']['block_budget_mean']:.4f} | "
                 f"{pct(a['WINA (baseline)']['rotation_flops_share'])} |")
    L.append("")
    L.append("Reproduce (the calibration command is the one stored in the calibration file):\n")
    L.append("```")
    cmds = [res["calibration_settings"].get("command", "")]
    if args.calibration_plain:
        with h5py.File(args.calibration_plain, "r") as f:
            c = f.attrs.get("command", "")
            cmds.append(c.decode() if isinstance(c, bytes) else str(c))
    for c in cmds:
        L.append(f"build/bin/sparsim {c}")
    extra = f" --calibration-plain {os.path.basename(args.calibration_plain)}" if args.calibration_plain else ""
    L.append(f"scripts/sparsity_study.py --calibration {os.path.basename(args.calibration)}{extra} \\\n"
             f"    --outdir runs --max-windows {p['max_windows']}"
             f"{' --ablation-teal' if args.ablation_teal else ''} --json {args.json} --page {args.page}")
    L.append("```\n")
    with open(args.page, "w") as f:
        f.write("\n".join(L))


if __name__ == "__main__":
    sys.exit(main())
