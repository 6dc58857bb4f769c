#!/usr/bin/env python3
"""Token Filtering against the structured-pruning baselines of its paper (seed 001, Tables 1, 5
and 8) on one model: dense, Token Filtering (tail layers), FLAP, SlimGPT and Probe Pruning at the
same nominal pruning ratios.

  scripts/studies/tf_baselines_study.py --calib-text valid.txt --eval-text test.txt \\
      --outdir out/tf-baselines --json docs/results/tf_baselines/tf_baselines_smollm2.json \\
      --page docs/tf-baselines.md [--bench]

What it measures, per configuration:
  - perplexity over windows of 128 tokens (the paper's protocol: WikiText-2 validation text,
    sequence length 128) of the part of --calib-text that calibration does not read, and over
    windows of 2,048 tokens of --eval-text; paired per-window ΔNLL against dense and between
    Token Filtering and each baseline at the same ratio;
  - a generated four-way cloze task (scripts/tools/make_cloze_tasks.py over --eval-text), per item;
  - passkey retrieval (a number hidden in --eval-text filler) at --passkey-length with
    --nih-depths depths from 1% to 99% (the paper's Table 8 protocol), per prompt; at the first
    ratio also at every --nih-lengths length (retrieval by context length);
  - realised FLOPs and bytes of the 2,048-token perplexity run from the ledger, parameters, and
    each method's own realised ratio (Token Filtering's skipped blocks, Probe Pruning's pruned
    heads and channels, FLAP's / SlimGPT's removed parameters);
  - with --bench: throughput (tokens/s) at --bench-batches with the paper's Figure 3 / Table 5
    workload (a 13-token prompt per sequence, then decode), dense and every method at the last
    ratio, repetitions interleaved, medians, the load average of each run.

The calibration text is split by line: the first --calib-fraction of --calib-text is FLAP's and
SlimGPT's calibration text, the rest is the 128-token perplexity text. Every output is a file in
--outdir; a step whose file exists is skipped (stop and resume freely); --page-only rebuilds the
page from --json. The texts are public evaluation text read at run time (WikiText-2's valid.txt
and test.txt); nothing of them is committed.
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
import comparison  # noqa: E402
from atomic_file import atomic_write, write_json, write_page_keeping_hand_text  # noqa: E402
from study_steps import sh  # noqa: E402

LABEL = {"dense": "dense", "token-filter": "Token Filtering (tail)", "flap": "FLAP",
         "slimgpt": "SlimGPT", "probe-pruning": "Probe Pruning"}
OFFLINE = ("flap", "slimgpt")  # methods that write a pruned model


def name(m, r):
    return "dense" if m == "dense" else f"{m}_{int(round(r * 100)):03d}"


def depths(n):
    return ",".join(f"{x:.4f}" for x in np.linspace(0.01, 0.99, n))


def split_text(src, outdir, frac):
    """The first `frac` of the lines of src (calibration) and the rest (128-token perplexity)."""
    calib, rest = os.path.join(outdir, "calib.txt"), os.path.join(outdir, "ppl128.txt")
    if not (os.path.exists(calib) and os.path.exists(rest)):
        lines = open(src, encoding="utf-8").read().splitlines(keepends=True)
        k = int(len(lines) * frac)
        atomic_write(calib, "".join(lines[:k]))
        atomic_write(rest, "".join(lines[k:]))
    return calib, rest


def configs(a):
    out = [("dense", "dense", 0.0, a.model, [])]
    for r in a.ratios:
        for m in a.methods:
            n = name(m, r)
            if m in OFFLINE:
                out.append((n, m, r, os.path.join(a.outdir, n + ".gguf"), []))
            elif m == "token-filter":
                out.append((n, m, r, a.model, ["--method", "token-filter", "--tf-ratio", str(r)]))
            elif m == "probe-pruning":
                out.append((n, m, r, a.model, ["--method", "probe-pruning", "--pp-ratio", str(r)]))
            else:
                raise SystemExit(f"unknown method {m}")
    return out


def run(a):
    os.makedirs(a.outdir, exist_ok=True)
    o = lambda n: os.path.join(a.outdir, n)
    thr = ["--threads", str(a.threads), "--progress", "never"]
    calib, ppl128 = split_text(a.calib_text, a.outdir, a.calib_fraction)
    tasks = o(f"cloze_tasks{a.task_items}.jsonl")
    if not os.path.exists(tasks):
        sh([sys.executable, os.path.join(ROOT, "scripts", "tools", "make_cloze_tasks.py"), a.eval_text, "--out", tasks,
            "--items", str(a.task_items), "--context-lines", "3", "--seed", "1"], tasks + ".log")
    cf = configs(a)
    for n, m, r, path, _ in cf:
        if m not in OFFLINE:
            continue
        js = o(n + ".prune.json")
        if not (os.path.exists(path) and os.path.exists(js)):
            sh([a.sparsim, "prune", "--model", a.model, "--method", m, "--ratio", str(r),
                "--corpus", calib, f"--{m}-windows", str(a.calib_windows), f"--{m}-tokens",
                str(a.calib_tokens), "--out", path, "--json", js, "--threads", str(a.threads)],
               js + ".log")
    ppl = {"ppl128": ["--corpus", ppl128, "--context", "128", "--stride", "128", "--score", "127",
                      "--max-windows", str(a.windows128)],
           "ppl2048": ["--corpus", a.eval_text, "--context", "2048", "--stride", "2048",
                       "--score", "2047", "--max-windows", str(a.windows2048)]}
    nih = lambda L: ["--no-perplexity", "--corpus", a.eval_text, "--task", "passkey",
                     "--retrieval-lengths", str(L), "--retrieval-depths", depths(a.nih_depths),
                     "--retrieval-samples", "1"]
    # the cheaper and more telling measures first, so that a stopped run has whole columns
    steps = []
    for phase in ("ppl128", "ppl2048"):
        for n, m, r, path, extra in cf:
            steps.append((f"{n}.{phase}", path, extra + ppl[phase]))
    for n, m, r, path, extra in cf:
        steps.append((f"{n}.nih{a.passkey_length}", path, extra + nih(a.passkey_length)))
    for n, m, r, path, extra in cf:
        steps.append((f"{n}.tasks{a.task_items}", path, extra + ["--no-perplexity", "--tasks", tasks]))
    for L in a.nih_lengths:
        if L == a.passkey_length:
            continue
        for n, m, r, path, extra in cf:
            if m == "dense" or abs(r - a.ratios[0]) < 1e-9:
                steps.append((f"{n}.nih{L}", path, extra + nih(L)))
    for stem, path, args in steps:
        out = o(stem + ".h5")
        if os.path.exists(out):
            continue
        sh([a.sparsim, "eval", "--model", path, "--out", out, "--json", o(stem + ".json")] + args + thr,
           out + ".log")
    if a.bench:
        run_bench(a, cf)
    return cf


def run_bench(a, cf):
    """Throughput at each batch: dense alone, then every method at the last ratio, in an order
    that rotates with the repetition; `bench --reps 1` per run, so each run is one repetition."""
    o = lambda n: os.path.join(a.outdir, "bench", n)
    os.makedirs(os.path.join(a.outdir, "bench"), exist_ok=True)
    r = a.ratios[-1]
    arms = [c for c in cf if c[1] == "dense" or abs(c[2] - r) < 1e-9 and c[1] in a.bench_methods]
    for b in a.bench_batches:
        for rep in range(a.bench_reps):
            for i in range(len(arms)):
                n, m, _, path, extra = arms[(i + rep) % len(arms)]
                js = o(f"{n}.b{b}.rep{rep}.json")
                if os.path.exists(js):
                    continue
                sh([a.sparsim, "bench", "--model", path, "--prompt", str(a.bench_prompt), "--decode",
                    str(a.bench_decode), "--batch", str(b), "--reps", "1", "--json", js,
                    "--threads", str(a.bench_threads)] + extra, js + ".log")


def per_item(js, kind):
    """Per-item correctness (0/1) of an eval JSON: passkey prompts or cloze items."""
    j = json.load(open(js))
    if kind == "passkey":
        return np.array(j["retrieval"]["correct"], float), j["retrieval"]["accuracy"]
    raise ValueError(kind)


def cloze_items(h5, tasks):
    import h5py

    gold = [json.loads(ln)["gold"] for ln in open(tasks)]
    with h5py.File(h5, "r") as f:
        pred = f["results/tasks/pred"][...]
        pred_norm = f["results/tasks/pred_norm"][...]
    return (np.array(pred == np.array(gold), float), np.array(pred_norm == np.array(gold), float))


def paired_cell(d):
    mean, ci, p = comparison.paired(np.asarray(d, float))
    return {"mean": mean, "ci95": list(ci), "p": p}


def summarise(a, cf):
    o = lambda n: os.path.join(a.outdir, n)
    rows = []
    ent = {}
    for n, m, r, path, _ in cf:
        row = {"name": n, "method": m, "ratio": r}
        for ph in ("ppl128", "ppl2048"):
            h5 = o(f"{n}.{ph}.h5")
            if not os.path.exists(h5):
                continue
            e = comparison.Entry(h5)
            ent[(n, ph)] = e
            lo, hi = e.ppl_interval()
            win = np.exp(e.nll_per_token())
            row[ph] = {"perplexity": e.perplexity(), "ci95": [lo, hi], "windows": len(win),
                       "window_ppl_median": float(np.median(win)),
                       "window_ppl_iqr": [float(np.percentile(win, 25)), float(np.percentile(win, 75))],
                       "nll_per_window": [float(x) for x in e.nll_per_token()]}
        js = o(f"{n}.ppl2048.json")
        if os.path.exists(js):
            j = json.load(open(js))
            row["flops_realised"] = j["flops"]["realised"]
            row["bytes_realised"] = j["bytes"]["realised"]
            row["n_params"] = j["n_params"]
            if "token_filter" in j:
                row["tf_realised"] = j["token_filter"]["realised"]
                row["tf_layers"] = j["token_filter"]["layers"]
            if "probe_pruning" in j:
                pp = j["probe_pruning"]
                row["pp_head_ratio"], row["pp_channel_ratio"] = pp["head_ratio"], pp["channel_ratio"]
                row["pp_probe"] = pp["probe"]
        if m in OFFLINE:
            pj = json.load(open(o(n + ".prune.json")))
            for k in ("ratio_realised", "kv_bytes_fraction", "wall_seconds"):
                if k in pj:
                    row["prune_" + k] = pj[k]
        h5 = o(f"{n}.tasks{a.task_items}.h5")
        if os.path.exists(h5):
            acc, accn = cloze_items(h5, o(f"cloze_tasks{a.task_items}.jsonl"))
            row["cloze"] = {"acc": float(acc.mean()), "acc_norm": float(accn.mean()), "items": len(acc),
                            "correct": acc.astype(int).tolist(), "correct_norm": accn.astype(int).tolist()}
        nih = {}
        for L in sorted(set(a.nih_lengths + [a.passkey_length])):
            js = o(f"{n}.nih{L}.json")
            if os.path.exists(js):
                c, acc = per_item(js, "passkey")
                nih[str(L)] = {"accuracy": acc, "prompts": len(c), "correct": c.astype(int).tolist()}
        if nih:
            row["passkey"] = nih
        rows.append(row)
    by = {r["name"]: r for r in rows}
    dense = by["dense"]
    for r in rows:
        if r["method"] == "dense":
            continue
        for ph in ("ppl128", "ppl2048"):
            if ph in r and ph in dense:
                d = np.array(r[ph]["nll_per_window"]) - np.array(dense[ph]["nll_per_window"])
                r[ph]["delta_vs_dense"] = paired_cell(d)
        for key in ("flops_realised", "bytes_realised", "n_params"):
            if key in r and key in dense:
                r[key.replace("_realised", "") + "_fraction"] = r[key] / dense[key]
    # Token Filtering against each baseline at the same ratio, per window / item / prompt
    for r in rows:
        if r["method"] in ("dense", "token-filter"):
            continue
        tf = by.get(name("token-filter", r["ratio"]))
        if tf is None:
            continue
        cmp = {}
        for ph in ("ppl128", "ppl2048"):
            if ph in r and ph in tf:
                cmp[ph + "_nll"] = paired_cell(np.array(tf[ph]["nll_per_window"]) -
                                               np.array(r[ph]["nll_per_window"]))
        if "cloze" in r and "cloze" in tf:
            cmp["cloze_acc"] = paired_cell(np.array(tf["cloze"]["correct"]) - np.array(r["cloze"]["correct"]))
        for L, c in r.get("passkey", {}).items():
            if L in tf.get("passkey", {}):
                cmp[f"passkey_{L}"] = paired_cell(np.array(tf["passkey"][L]["correct"]) - np.array(c["correct"]))
        r["token_filter_minus_this"] = cmp
    bench = summarise_bench(a, cf) if os.path.isdir(os.path.join(a.outdir, "bench")) else None
    return {
        "settings": {"model": a.model, "ratios": a.ratios, "methods": a.methods,
                     "calib_text": os.path.basename(a.calib_text), "calib_fraction": a.calib_fraction,
                     "eval_text": os.path.basename(a.eval_text),
                     "calib_windows": a.calib_windows, "calib_tokens": a.calib_tokens,
                     "windows128": a.windows128, "windows2048": a.windows2048,
                     "task_items": a.task_items, "passkey_length": a.passkey_length,
                     "nih_lengths": a.nih_lengths, "nih_depths": a.nih_depths, "threads": a.threads,
                     "bench_threads": a.bench_threads,
                     "bench_batches": a.bench_batches, "bench_prompt": a.bench_prompt,
                     "bench_decode": a.bench_decode, "bench_reps": a.bench_reps,
                     "bench_methods": a.bench_methods},
        "rows": rows,
        "bench": bench,
        "command": "scripts/studies/tf_baselines_study.py " + " ".join(sys.argv[1:]),
    }


def summarise_bench(a, cf):
    o = lambda n: os.path.join(a.outdir, "bench", n)
    r = a.ratios[-1]
    arms = [c for c in cf if c[1] == "dense" or abs(c[2] - r) < 1e-9 and c[1] in a.bench_methods]
    out = []
    for b in a.bench_batches:
        for n, m, _, _, _ in arms:
            runs = [json.load(open(o(f"{n}.b{b}.rep{k}.json"))) for k in range(a.bench_reps)
                    if os.path.exists(o(f"{n}.b{b}.rep{k}.json"))]
            if not runs:
                continue
            # a method run of `bench --method` also times dense in the same process; a model
            # (FLAP) and dense itself are timed alone
            # Token Filtering's bench times profiled decode steps of both engines (no prefill)
            def tps(j, which):
                if m == "token-filter":
                    step = j["method_step_seconds" if which == "method" else "dense_step_seconds"]
                    return j["batch"] / step, None
                if m == "probe-pruning" and which == "method":
                    pp = j["probe_pruning"]
                    return pp["decode_tokens_per_s"], pp["prefill_tokens_per_s"]
                return j["decode_tokens_per_s"], j["prefill_tokens_per_s"]
            dec = [tps(j, "method")[0] for j in runs]
            pre = [tps(j, "method")[1] for j in runs]
            row = {"name": n, "method": m, "batch": b, "reps": len(runs),
                   "decode_tokens_per_s": float(np.median(dec)), "decode_tokens_per_s_all": dec,
                   "prefill_tokens_per_s": None if None in pre else float(np.median(pre)),
                   "load_average_start": [j.get("load_average_start", j.get("load_average_before"))
                                          for j in runs]}
            if m in ("dense", "flap"):  # weights read per decode step (all sequences)
                row["decode_weight_bytes_per_step"] = float(np.median(
                    [j["decode_weight_bytes_per_step"] for j in runs]))
            if m == "probe-pruning":  # the probe's own time over the prefill step it runs in
                row["probe_share_of_prefill"] = float(np.median(
                    [j["probe_pruning"]["probe_share_of_prefill"] for j in runs]))
            if m in ("token-filter", "probe-pruning"):
                row["dense_same_run_decode_tokens_per_s"] = float(np.median([tps(j, "dense")[0] for j in runs]))
            out.append(row)
    for row in out:
        d = next((x for x in out if x["method"] == "dense" and x["batch"] == row["batch"]), None)
        if d:
            row["decode_vs_dense"] = row["decode_tokens_per_s"] / d["decode_tokens_per_s"]
            if row["method"] == "flap" and "decode_weight_bytes_per_step" in d:
                # the speed-up the bytes allow (dense bytes over the pruned model's) and the
                # share of that gain realised: (measured - 1) / (allowed - 1)
                allowed = d["decode_weight_bytes_per_step"] / row["decode_weight_bytes_per_step"]
                row["bytes_allowed_speedup"] = allowed
                row["share_of_bytes_gain"] = (row["decode_vs_dense"] - 1) / (allowed - 1)
        if "dense_same_run_decode_tokens_per_s" in row:
            row["decode_vs_dense_same_run"] = row["decode_tokens_per_s"] / row["dense_same_run_decode_tokens_per_s"]
    return out


def bench_cells(x, ratio):
    """A throughput row's label, same-process ratio, prefill rate and load averages as the tables
    print them (summarise_bench's rows; `ratio` the methods' ratio)."""
    lab = LABEL[x["method"]] + ("" if x["method"] == "dense" else f" {ratio:.0%}")
    sr = f"{x['decode_vs_dense_same_run']:.3f}" if "decode_vs_dense_same_run" in x else "-"
    pre = "-" if x["prefill_tokens_per_s"] is None else f"{x['prefill_tokens_per_s']:.1f}"
    ld = ", ".join(f"{v:.2f}" for v in x["load_average_start"] if v is not None)
    return lab, sr, pre, ld


def f4(x):
    return f"{x:+.4f}"


def pc(c, f=f4):
    # the sign-flip p of more than 16 pairs comes from 65,536 seeded sign patterns
    p = "p<2e-05" if c["p"] == 0 else f"p={c['p']:.3g}"
    return f"{f(c['mean'])} [{f(c['ci95'][0])}, {f(c['ci95'][1])}], {p}"


def write_page(a, s):
    st = s["settings"]
    rel = os.path.relpath(a.json, os.path.dirname(a.page))
    rows = s["rows"]
    L = ["# Token Filtering against FLAP, SlimGPT and Probe Pruning on SmolLM2\n",
         f"Generated by `{s['command']}` from [{os.path.basename(a.json)}]({rel}); do not edit by hand "
         "(the text between the generated sections is the script's). The analogue of the Token Filtering "
         "paper's Tables 1, 5 and 8 (seed 001). Methods: [token-filter.md](token-filter.md), "
         "[flap.md](flap.md), [slimgpt.md](slimgpt.md), [probe-pruning.md](probe-pruning.md).\n",
         "## Settings\n",
         f"- model: {st['model']} (SmolLM2-135M-Instruct, Q4_1 GGUF, 30 layers, 9 query heads in 3 KV groups, "
         "FFN 1,536); every method at the nominal pruning ratios " + ", ".join(f"{r:g}" for r in st["ratios"]) + ";",
         f"- FLAP and SlimGPT calibrated on the first {st['calib_fraction']:.0%} of the lines of "
         f"`{st['calib_text']}` ({st['calib_windows']} windows of {st['calib_tokens']} tokens); Token Filtering "
         "(tail layers, sparsim's default count of 3/4 of the layers) and Probe Pruning (probe 5% of a call's "
         "rows, no calibration history) need no calibration;",
         f"- perplexity at 128 tokens (the paper's protocol): {st['windows128']} non-overlapping windows of the "
         f"rest of `{st['calib_text']}`, 127 tokens scored per window, one window per forward call (so Probe "
         f"Pruning selects per window); at 2,048 tokens: {st['windows2048']} windows of `{st['eval_text']}`, "
         "2,047 scored per window; spread: median and interquartile range of the window perplexities, and "
         "the paired per-window Δ NLL/token (mean, 95% t interval, exact sign-flip p; scripts/lib/comparison.py);",
         f"- cloze: {st['task_items']} generated four-way items from `{st['eval_text']}` "
         "(scripts/tools/make_cloze_tasks.py, seed 1, 3 context lines), accuracy by summed log-likelihood;",
         f"- passkey: {st['nih_depths']} prompts per length, needle depths evenly from 1% to 99% (the paper's "
         f"Table 8 protocol), at {st['passkey_length']} tokens for every configuration and at "
         + ", ".join(str(x) for x in st["nih_lengths"]) + f" tokens at ratio {st['ratios'][0]:g};",
         "- cost: realised FLOPs and bytes of the 2,048-token perplexity run from the ledger and the "
         "parameter count, against dense. Probe Pruning masks the pruned columns of W_o / W_down and runs "
         "the full products, so its ledger counts dense work; its realised pruned fractions of heads and "
         "channels are listed beside it;",
         f"- {st['threads']} threads. Public evaluation text is read at run time, never committed.\n"]
    L.append("## Quality at equal nominal ratio (Table 1)\n")
    L.append("| configuration | ppl@128 [95% CI] | window ppl@128 median [IQR] | ppl@2048 [95% CI] | "
             "Δ NLL@2048 vs dense [CI], p | cloze acc | passkey@" + str(st["passkey_length"]) +
             " | FLOPs | bytes | params | realised ratio |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def ppl(ph):
            if ph not in r:
                return "not run"
            x = r[ph]
            return f"{x['perplexity']:.2f} [{x['ci95'][0]:.2f}, {x['ci95'][1]:.2f}]"
        med = "not run" if "ppl128" not in r else (
            f"{r['ppl128']['window_ppl_median']:.1f} [{r['ppl128']['window_ppl_iqr'][0]:.1f}, "
            f"{r['ppl128']['window_ppl_iqr'][1]:.1f}]")
        dd = "-" if r["method"] == "dense" or "delta_vs_dense" not in r.get("ppl2048", {}) else \
            pc(r["ppl2048"]["delta_vs_dense"])
        cl = f"{r['cloze']['acc']:.3f}" if "cloze" in r else "not run"
        pk = r.get("passkey", {}).get(str(st["passkey_length"]))
        pk = f"{pk['accuracy']:.2f} ({pk['prompts']})" if pk else "not run"
        fr = lambda k: f"{r[k]:.3f}" if k in r else ("1.000" if r["method"] == "dense" else "-")
        if r["method"] == "token-filter" and "tf_realised" in r:
            rr = f"{r['tf_realised']:.3f} of (token, layer) blocks skipped"
        elif r["method"] == "probe-pruning" and "pp_head_ratio" in r:
            rr = f"heads {r['pp_head_ratio']:.3f}, channels {r['pp_channel_ratio']:.3f}"
        elif "prune_ratio_realised" in r:
            rr = f"{r['prune_ratio_realised']:.3f} of the block parameters"
        else:
            rr = "-"
        lab = LABEL[r["method"]] + ("" if r["method"] == "dense" else f" {r['ratio']:.0%}")
        L.append(f"| {lab} | {ppl('ppl128')} | {med} | {ppl('ppl2048')} | {dd} | {cl} | {pk} | "
                 f"{fr('flops_fraction')} | {fr('bytes_fraction')} | {fr('n_params_fraction')} | {rr} |")
    L.append("")
    L.append("## Token Filtering against each baseline, paired\n")
    L.append("Differences are Token Filtering minus the baseline at the same ratio: per window for Δ NLL/token "
             "(negative: Token Filtering better), per item for cloze accuracy and per prompt for passkey "
             "(positive: Token Filtering better); mean [95% CI], exact sign-flip p.\n")
    L.append("| ratio | baseline | Δ NLL@128 | Δ NLL@2048 | Δ cloze acc | Δ passkey@" + str(st["passkey_length"]) + " |")
    L.append("|---|---|---|---|---|---|")
    for r in rows:
        c = r.get("token_filter_minus_this")
        if not c:
            continue
        g = lambda k, f=f4: pc(c[k], f) if k in c else "not run"
        L.append(f"| {r['ratio']:.0%} | {LABEL[r['method']]} | {g('ppl128_nll')} | {g('ppl2048_nll')} | "
                 f"{g('cloze_acc', lambda x: f'{x:+.3f}')} | "
                 f"{g('passkey_' + str(st['passkey_length']), lambda x: f'{x:+.2f}')} |")
    L.append("")
    r0 = st["ratios"][0]
    lens = sorted(set(st["nih_lengths"] + [st["passkey_length"]]))
    L.append(f"## Retrieval by context length at {r0:.0%} (Table 8)\n")
    L.append(f"Passkey accuracy, {st['nih_depths']} prompts per cell (depths 1%–99%).\n")
    L.append("| configuration | " + " | ".join(f"{x} tokens" for x in lens) + " |")
    L.append("|---|" + "---|" * len(lens))
    for r in rows:
        if r["method"] != "dense" and abs(r["ratio"] - r0) > 1e-9:
            continue
        cells = []
        for x in lens:
            c = r.get("passkey", {}).get(str(x))
            cells.append(f"{c['accuracy']:.2f}" if c else "not run")
        lab = LABEL[r["method"]] + ("" if r["method"] == "dense" else f" {r['ratio']:.0%}")
        L.append(f"| {lab} | " + " | ".join(cells) + " |")
    L.append("")
    L.append(f"## Throughput at {st['ratios'][-1]:.0%} (Table 5)\n")
    if not s.get("bench"):
        L.append("Not run in this summary (`--bench`).\n")
    else:
        L.append(f"`sparsim bench --prompt {st['bench_prompt']} --decode {st['bench_decode']} --batch B --reps 1 "
                 f"--threads {st.get('bench_threads', st['threads'])}`, "
                 f"{st['bench_reps']} runs per arm interleaved, medians; decode tokens/s count every sequence. "
                 "Token Filtering and Probe Pruning runs also time dense in the same process "
                 "(`vs dense, same process`); Token Filtering's bench times profiled decode steps (each "
                 "operation fenced, so that its attention stage can be reported) and no prefill, so its "
                 "same-process ratio is the fair one; FLAP is a model and is set against the dense runs "
                 "of the same batch.\n")
        L.append("FLAP's row also gives the speed-up its weight bytes allow (dense decode bytes per "
                 "step over FLAP's) and the share of that gain it realises, (measured − 1) / "
                 "(allowed − 1).\n")
        L.append("| batch | configuration | decode tokens/s | vs dense | vs dense, same process | "
                 "bytes allow | share of the bytes' gain | prefill tokens/s | load average at start |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for x in s["bench"]:
            lab, sr, pre, ld = bench_cells(x, st["ratios"][-1])
            L.append(f"| {x['batch']} | {lab} | {x['decode_tokens_per_s']:.1f} | {x.get('decode_vs_dense', 1.0):.3f} | "
                     f"{sr} | {format(x['bytes_allowed_speedup'], '.3f') if 'bytes_allowed_speedup' in x else '-'} | "
                     f"{format(x['share_of_bytes_gain'], '.2f') if 'share_of_bytes_gain' in x else '-'} | "
                     f"{pre} | {ld} |")
        pp = [x for x in s["bench"] if "probe_share_of_prefill" in x]
        if pp:
            L.append("\nProbe Pruning's probe (selected and run once per batch, in the prefill step) "
                     "takes " + ", ".join(f"{x['probe_share_of_prefill']:.1%} at batch {x['batch']}"
                                          for x in pp) + " of that step (median of the runs).")
        L.append("")
    # (the hand-written reading below the generated part is kept)
    write_page_keeping_hand_text(a.page, "\n".join(L) + "\n",
                                 "<!-- tf_baselines_study: generated above, written by hand below -->")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--calib-text", help="calibration + 128-token perplexity text (e.g. WikiText-2 valid.txt)")
    ap.add_argument("--eval-text", help="2,048-token perplexity, cloze and passkey text (e.g. WikiText-2 test.txt)")
    ap.add_argument("--outdir", default=os.path.join(ROOT, "out", "tf-baselines"))
    ap.add_argument("--methods", default="token-filter,flap,slimgpt,probe-pruning")
    ap.add_argument("--ratios", default="0.2,0.5")
    ap.add_argument("--calib-fraction", type=float, default=0.4)
    ap.add_argument("--calib-windows", type=int, default=64)
    ap.add_argument("--calib-tokens", type=int, default=128)
    ap.add_argument("--windows128", type=int, default=160)
    ap.add_argument("--windows2048", type=int, default=8)
    ap.add_argument("--task-items", type=int, default=30)
    ap.add_argument("--passkey-length", type=int, default=1024)
    ap.add_argument("--nih-lengths", default="512,1024,2048,2560,3072")
    ap.add_argument("--nih-depths", type=int, default=20)
    ap.add_argument("--bench", action="store_true", help="also run the throughput benchmark")
    ap.add_argument("--bench-methods", default="token-filter,flap,probe-pruning")
    ap.add_argument("--bench-batches", default="1,8,32,128")
    ap.add_argument("--bench-prompt", type=int, default=13)
    ap.add_argument("--bench-decode", type=int, default=64)
    ap.add_argument("--bench-reps", type=int, default=3)
    ap.add_argument("--bench-threads", type=int, default=None,
                    help="threads of the throughput runs (default: --threads)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=os.path.join(ROOT, "docs", "results", "tf_baselines", "tf_baselines_smollm2.json"))
    ap.add_argument("--page", default=os.path.join(ROOT, "docs", "tf-baselines.md"))
    ap.add_argument("--page-only", action="store_true", help="rebuild the page from --json")
    ap.add_argument("--summarise-only", action="store_true",
                    help="run nothing: summarise the outputs already in --outdir")
    a = ap.parse_args()
    a.methods = [m for m in a.methods.split(",") if m]
    a.bench_methods = [m for m in a.bench_methods.split(",") if m]
    a.ratios = [float(x) for x in a.ratios.split(",") if x]
    a.nih_lengths = [int(x) for x in a.nih_lengths.split(",") if x]
    a.bench_batches = [int(x) for x in a.bench_batches.split(",") if x]
    if a.bench_threads is None:
        a.bench_threads = a.threads
    if a.page_only:
        write_page(a, json.load(open(a.json)))
        return
    if not (a.calib_text and a.eval_text):
        ap.error("--calib-text and --eval-text are required (e.g. WikiText-2 valid.txt and test.txt)")
    cf = configs(a) if a.summarise_only else run(a)
    s = summarise(a, cf)
    write_json(a.json, s)
    write_page(a, s)
    print(f"wrote {a.json} and {a.page}")


if __name__ == "__main__":
    main()
