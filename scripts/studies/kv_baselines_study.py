#!/usr/bin/env python3
"""RAP against its baselines on one model, without recovery (the RAP paper's Table 2 and the
quality side of its Figure 2): RAP, KVPruner as the paper's main table runs it (kvpruner-naive),
the index-aware KVPruner, PaLU and SVD-LLM at one KV-cache budget ρ (perplexity, a generated cloze
task, passkey retrieval, KV bytes, parameters, attention FLOPs of prefill and of one decode step
including the low-rank methods' reconstruction), and the perplexity curve over other ρ.

  scripts/studies/kv_baselines_study.py --calib-text valid.txt --eval-text test.txt \\
      --outdir out/kv-baselines --json docs/results/kv_baselines/kv_baselines_smollm2.json \\
      --page docs/kv-baselines.md

The texts are public evaluation text read at run time (e.g. WikiText-2's valid.txt for the Fisher
scores and the whitening statistics, test.txt for perplexity, the cloze task and the passkey
filler); nothing of them is written to the page. Every output is a file in --outdir; a step whose
file exists is skipped (stop and resume freely); --page-only rebuilds the page from --json.
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
from atomic_file import atomic_write, write_json  # noqa: E402
from study_steps import sh  # noqa: E402

METHODS = {
    "rap": "RAP: whole RoPE pairs of K and single V channels by Fisher score, adaptive budgets",
    "kvpruner-naive": "KVPruner as the paper's main table runs it: single K channels re-packed "
                      "as a smaller head, rotated as its consecutive pairs",
    "kvpruner": "index-aware KVPruner: single K channels, each rotated at its own frequency",
    "palu": "PaLU: whitened low-rank W_k, W_v per group of 3 KV heads, ranks by Fisher score; "
            "K and V rebuilt from the cached latents",
    "svd-llm": "SVD-LLM: whitened low-rank W_k, W_v over all KV heads, equal ranks; K and V "
               "rebuilt from the cached latents",
}


def name(m, r):
    return f"{m}_{int(round(r * 100)):03d}"


def run(a):
    os.makedirs(a.outdir, exist_ok=True)
    o = lambda n: os.path.join(a.outdir, n)
    thr = ["--threads", str(a.threads), "--progress", "never"]
    fisher, tasks = o("fisher.h5"), o("cloze_tasks.jsonl")
    if not os.path.exists(fisher):
        sh([a.sparsim, "calibrate", "--fisher", "--model", a.model, "--corpus", a.calib_text,
            "--fisher-seqs", str(a.fisher_seqs), "--fisher-tokens", str(a.fisher_tokens),
            "--out", fisher] + thr, o("fisher.log"))
    if not os.path.exists(tasks):
        sh([sys.executable, os.path.join(ROOT, "scripts", "tools", "make_cloze_tasks.py"), a.eval_text, "--out", tasks,
            "--items", str(a.task_items), "--context-lines", "3", "--seed", "1"], tasks + ".log")
    models = [("dense", "dense", 1.0, a.model)]
    for r in [a.retain] + a.curve:
        for m in a.methods:
            n = name(m, r)
            gg, js = o(n + ".gguf"), o(n + ".prune.json")
            if not (os.path.exists(gg) and os.path.exists(js)):
                cmd = [a.sparsim, "prune", "--model", a.model, "--method", m, "--retain", str(r),
                       "--out", gg, "--json", js, "--threads", str(a.threads)]
                if m != "svd-llm":
                    cmd += ["--calibration", fisher]
                if m in ("palu", "svd-llm"):
                    cmd += ["--corpus", a.calib_text, "--whiten-seqs", str(a.whiten_seqs),
                            "--whiten-tokens", str(a.whiten_tokens)]
                else:
                    cmd += ["--flops-context", str(a.context)]
                sh(cmd, js + ".log")
            models.append((n, m, r, gg))
    ev = ["--corpus", a.eval_text, "--context", str(a.context), "--stride", str(a.context),
          "--score", str(a.context - 1), "--max-windows", str(a.windows)]
    # perplexity of every model (the ρ of the table first), then the cloze task and passkey at ρ
    for phase in ("ppl", "tasks", "passkey"):
        for n, m, r, path in models:
            if phase != "ppl" and m != "dense" and abs(r - a.retain) > 1e-9:
                continue
            out = o(f"{n}.{phase}.h5")
            if os.path.exists(out):
                continue
            cmd = [a.sparsim, "eval", "--model", path, "--out", out, "--json", o(f"{n}.{phase}.json")] + thr
            if phase == "ppl":
                cmd += ev
            elif phase == "tasks":
                cmd += ["--no-perplexity", "--tasks", tasks]
            else:
                cmd += ["--no-perplexity", "--corpus", a.eval_text, "--task", "passkey",
                        "--retrieval-lengths", a.passkey_lengths, "--retrieval-depths", a.passkey_depths,
                        "--retrieval-samples", str(a.passkey_samples)]
            sh(cmd, out + ".log")
    return models


def passkey_items(js):
    """Per-prompt correctness (0/1) in a fixed order, from an eval JSON with --task passkey."""
    rt = json.load(open(js))["retrieval"]
    return [int(c) for c in rt["correct"]], rt["accuracy"]


def summarise(a, models):
    o = lambda n: os.path.join(a.outdir, n)
    e = {n: comparison.Entry(o(f"{n}.ppl.h5")) for n, *_ in models}
    dense = e["dense"]
    rows = []
    for n, m, r, path in models:
        x = e[n]
        lo, hi = x.ppl_interval()
        row = {"name": n, "method": m, "retain": r, "perplexity": x.perplexity(),
               "perplexity_ci95": [lo, hi],
               "window_perplexity": [float(v) for v in np.exp(x.window_nll / x.window_tokens)],
               "flops_realised_fraction": x.flops / dense.flops if x.flops and dense.flops else None,
               "bytes_realised_fraction": x.bytes / dense.bytes if x.bytes and dense.bytes else None}
        if m == "dense":
            row.update({"kv_bytes_fraction": 1.0, "attn_params_fraction": 1.0,
                        "attn_flops_fraction": 1.0, "attn_decode_flops_fraction": 1.0,
                        "retain_realised": 1.0})
        else:
            pj = json.load(open(o(n + ".prune.json")))
            for k in ("retain_realised", "kv_bytes_fraction", "attn_params_fraction",
                      "attn_flops_fraction", "attn_decode_flops_fraction", "recipe", "n_params",
                      "n_params_full", "orphan_ratio"):
                if k in pj:
                    row[k] = pj[k]
            d = x.nll_per_token() - dense.nll_per_token()
            mean, ci, p = comparison.paired(d)
            row.update({"delta_vs_dense": mean, "delta_vs_dense_ci95": list(ci), "delta_vs_dense_p": p})
            if m != "rap":
                d = x.nll_per_token() - e[name("rap", r)].nll_per_token()
                mean, ci, p = comparison.paired(d)
                row.update({"delta_vs_rap": mean, "delta_vs_rap_ci95": list(ci), "delta_vs_rap_p": p,
                            "per_window_delta_vs_rap": [float(v) for v in d]})
        tk = o(f"{n}.tasks.json")
        if os.path.exists(tk):
            t = json.load(open(tk)).get("tasks", {})
            row["cloze_acc"], row["cloze_acc_norm"] = t.get("acc"), t.get("acc_norm")
            row["cloze_items"] = t.get("items")
        pk = o(f"{n}.passkey.json")
        if os.path.exists(pk):
            row["passkey_correct"], row["passkey_accuracy"] = passkey_items(pk)
        rows.append(row)
    by = {r["name"]: r for r in rows}
    rap = by[name("rap", a.retain)]
    for r in rows:  # per-prompt paired passkey difference against RAP at the table's ρ
        if r["name"] != rap["name"] and r.get("passkey_correct") and rap.get("passkey_correct"):
            d = np.array(r["passkey_correct"], float) - np.array(rap["passkey_correct"], float)
            mean, ci, p = comparison.paired(d)
            r.update({"passkey_delta_vs_rap": mean, "passkey_delta_vs_rap_ci95": list(ci),
                      "passkey_delta_vs_rap_p": p})
    return {
        "settings": {"model": a.model, "retain": a.retain, "curve": a.curve, "methods": a.methods,
                     "calib_text": os.path.basename(a.calib_text), "eval_text": os.path.basename(a.eval_text),
                     "fisher_seqs": a.fisher_seqs, "fisher_tokens": a.fisher_tokens,
                     "whiten_seqs": a.whiten_seqs, "whiten_tokens": a.whiten_tokens,
                     "context": a.context, "windows": a.windows, "scored_per_window": a.context - 1,
                     "task_items": a.task_items, "passkey_lengths": a.passkey_lengths,
                     "passkey_depths": a.passkey_depths, "passkey_samples": a.passkey_samples,
                     "threads": a.threads, "eval_corpus_fingerprint": dense.corpus},
        "rows": rows,
        "command": "scripts/studies/kv_baselines_study.py " + " ".join(sys.argv[1:]),
    }


def f4(x):
    return f"{x:+.4f}"


def fmt_opt(x, f="{:.3f}"):
    return f.format(x) if x is not None else "not run"


def bench_files(a):
    """The attention-module benchmarks of scripts/bench/bench_rap_attention.py, one file per method."""
    out = {}
    for m in ["rap"] + [m for m in a.methods if m != "rap"]:
        p = a.bench_json.format(method=m)
        if os.path.exists(p):
            out[m] = p
    return out


def bench_section(a, st):
    """Attention-module time against dense in the same run (medians of the runs, their range)."""
    files = bench_files(a)
    if not files:
        return []
    L = [f"\n## Attention-module time at ρ = {st['retain']} (CPU)\n"]
    first = json.load(open(next(iter(files.values()))))
    se, cpu = first["settings"], first.get("cpu", {})
    L.append(f"`sparsim bench --model PRUNED --baseline {se['dense']} --prompt {se['prompt']} "
             f"--decode {se['decode']} --reps {se['reps']} --threads {se['threads']}` through "
             f"`scripts/bench/bench_rap_attention.py` ({se['repeat']} independent runs per batch size, batch sizes "
             "taking turns); the q, k, v, o projections, RoPE, the cache store, the low-rank methods' "
             "rebuilding of K and V, and attention, profiled, pruned against dense with their repetitions "
             "interleaved in the same process. Batch 8 times the decode steps only (over a cache of "
             f"{se['prompt']} positions). CPU: {cpu.get('model', 'unknown')}. Ratios below 1: faster than dense. "
             + ("A single run per batch size (its ratio the median of the repetitions inside it): no spread "
                "over runs is shown. " if se["repeat"] == 1 else "")
             + "The load average is read just before each run and includes nothing of the run itself. "
             "Median over the runs [min, max]; the files: "
             + ", ".join(f"[{os.path.basename(p)}]({os.path.relpath(p, os.path.dirname(a.page))})"
                         for p in files.values()) + ".\n")
    L.append("| method | batch | attention prefill / dense | attention decode / dense | whole decode step / dense | "
             "load average before (1 min) |")
    L.append("|---|---|---|---|---|---|")

    def cell(e, k):
        if k not in e:
            return "-"
        return f"{e[k]['median']:.3f} [{e[k]['min']:.3f}, {e[k]['max']:.3f}]"

    for m, p in files.items():
        j = json.load(open(p))
        for b, e in sorted(j["summary"].items(), key=lambda kv: int(kv[0])):
            loads = [r["load_before"][0] for r in j["runs"] if str(r.get("batch")) == b]
            ld = f"{min(loads):.2f}–{max(loads):.2f}" if loads else "-"
            L.append(f"| {m} | {b} | {cell(e, 'attention_prefill_ratio')} | {cell(e, 'attention_decode_ratio')} | "
                     f"{cell(e, 'forward_decode_ratio')} | {ld} |")
    return L


def write_page(a, s):
    st = s["settings"]
    rel = os.path.relpath(a.json, os.path.dirname(a.page))
    L = ["# RAP against PaLU, SVD-LLM and KVPruner on SmolLM2 (no recovery)\n",
         f"Generated by `{s['command']}` from [{os.path.basename(a.json)}]({rel}); do not edit by hand. "
         "Methods: [kv-weight-pruning.md](kv-weight-pruning.md) (RAP, both KVPruners), [low-rank.md](low-rank.md) "
         "(PaLU, SVD-LLM). RAP's own design ablations (Fisher vs magnitude, adaptive vs uniform, "
         "pooled vs split, the K/V split): [rap-ablations.md](rap-ablations.md).\n",
         "## Settings\n",
         f"- model: {st['model']} (SmolLM2-135M-Instruct, Q4_1 GGUF: 30 layers, 3 KV heads of width 64);",
         f"- every method at the same KV-cache budget ρ = {st['retain']} (fraction of the dense K and V cache "
         "widths kept) in the main table; perplexity also at ρ = " + ", ".join(str(r) for r in st["curve"]) + ";",
         f"- Fisher scores (RAP, both KVPruners, PaLU's ranks): {st['fisher_seqs']} sequences of "
         f"{st['fisher_tokens']} tokens of `{st['calib_text']}`; whitening statistics (PaLU, SVD-LLM): "
         f"{st['whiten_seqs']} sequences of {st['whiten_tokens']} tokens of the same text;",
         f"- perplexity: {st['windows']} non-overlapping windows of {st['context']} tokens of `{st['eval_text']}`, "
         f"{st['scored_per_window']} scored per window; Δ NLL/token per window against dense and against RAP at "
         "the same ρ, mean, 95% t interval, exact sign-flip p (scripts/lib/comparison.py);",
         f"- cloze: {st['task_items']} generated four-way items from `{st['eval_text']}` "
         "(scripts/tools/make_cloze_tasks.py, seed 1); passkey: lengths "
         f"{st['passkey_lengths']}, depths {st['passkey_depths']}, {st['passkey_samples']} prompts per cell, "
         "paired per prompt against RAP;",
         "- attention cost from `sparsim prune --json`: parameters of W_q, W_k, W_v, W_o (and the low-rank "
         f"up-projections), FLOPs of a {st['context']}-token prefill and of one decode step at that context, the "
         "low-rank methods' rebuilding of K and V included (the engine rebuilds every cached position at each "
         "step, as the ledger's `kv_reconstruct` counts); realised FLOPs and bytes of the whole perplexity run "
         "from the ledger, against dense;",
         f"- {st['threads']} threads. Public evaluation text read at run time, never committed.\n"]
    rows = s["rows"]
    main = [r for r in rows if r["method"] == "dense" or abs(r["retain"] - st["retain"]) < 1e-9]
    L.append(f"## At ρ = {st['retain']}\n")
    L.append("| method | perplexity [95% CI] | Δ NLL/token vs dense [CI], p | Δ vs RAP [CI], p | cloze acc | "
             "passkey | passkey Δ vs RAP, p | KV bytes | attn params | attn FLOPs prefill | attn FLOPs decode | "
             "run FLOPs (ledger) |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in main:
        dd = "-" if r["method"] == "dense" else (
            f"{f4(r['delta_vs_dense'])} [{f4(r['delta_vs_dense_ci95'][0])}, {f4(r['delta_vs_dense_ci95'][1])}], "
            f"p={r['delta_vs_dense_p']:.3g}")
        dr = "-" if r["method"] in ("dense", "rap") else (
            f"{f4(r['delta_vs_rap'])} [{f4(r['delta_vs_rap_ci95'][0])}, {f4(r['delta_vs_rap_ci95'][1])}], "
            f"p={r['delta_vs_rap_p']:.3g}")
        pk = "-" if "passkey_delta_vs_rap" not in r else (
            f"{r['passkey_delta_vs_rap']:+.2f}, p={r['passkey_delta_vs_rap_p']:.3g}")
        L.append(f"| {r['method']} | {r['perplexity']:.3f} [{r['perplexity_ci95'][0]:.2f}, "
                 f"{r['perplexity_ci95'][1]:.2f}] | {dd} | {dr} | {fmt_opt(r.get('cloze_acc'))} | "
                 f"{fmt_opt(r.get('passkey_accuracy'), '{:.2f}')} | {pk} | {r['kv_bytes_fraction']:.3f} | "
                 f"{r['attn_params_fraction']:.3f} | {r['attn_flops_fraction']:.3f} | "
                 f"{r['attn_decode_flops_fraction']:.3f} | {fmt_opt(r.get('flops_realised_fraction'))} |")
    L.append("")
    L.append("## Perplexity over ρ\n")
    rs = sorted({r["retain"] for r in rows if r["method"] != "dense"})
    L.append("| method | " + " | ".join(f"ρ = {x}" for x in rs) + " |")
    L.append("|---|" + "---|" * len(rs))
    for m in st["methods"]:
        cells = []
        for x in rs:
            r = next((r for r in rows if r["method"] == m and abs(r["retain"] - x) < 1e-9), None)
            cells.append("not run" if r is None else f"{r['perplexity']:.2f}")
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    dense = next(r for r in rows if r["method"] == "dense")
    L.append(f"\nDense: {dense['perplexity']:.3f}. Attention decode FLOPs at ρ (fraction of dense, one step at "
             f"context {st['context']}):\n")
    L.append("| method | " + " | ".join(f"ρ = {x}" for x in rs) + " |")
    L.append("|---|" + "---|" * len(rs))
    for m in st["methods"]:
        cells = []
        for x in rs:
            r = next((r for r in rows if r["method"] == m and abs(r["retain"] - x) < 1e-9), None)
            cells.append("not run" if r is None else f"{r['attn_decode_flops_fraction']:.3f}")
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    L.extend(bench_section(a, st))
    L.append("")
    L.append("## Against the paper\n")
    L.append("This page compares the methods without recovery; the paper's numbers are after LoRA-KD. "
             "The same methods at ρ = 0.7 after `sparsim recover` are in "
             "[recovery-results.md](recovery-results.md).\n")
    words = []
    for m in ("palu", "svd-llm", "kvpruner-naive", "kvpruner"):
        r = next((r for r in main if r["method"] == m), None)
        if r is None or "delta_vs_rap" not in r:
            continue
        better = r["delta_vs_rap"] < 0
        sig = r["delta_vs_rap_p"] < 0.05
        words.append(f"- {m} is {'better' if better else 'worse'} than RAP on perplexity at ρ = {st['retain']} "
                     f"(Δ NLL/token {f4(r['delta_vs_rap'])}, p = {r['delta_vs_rap_p']:.3g}"
                     f"{'' if sig else ', not significant at 0.05'}), with attention decode FLOPs "
                     f"{r['attn_decode_flops_fraction']:.3f} of dense against RAP's "
                     f"{next(x for x in main if x['method'] == 'rap')['attn_decode_flops_fraction']:.3f}.")
    L.append("The paper (Section 6, Llama-3-8B and Mistral-7B after LoRA-KD recovery) states: RAP stays close to "
             "PaLU on quality, PaLU being slightly stronger at iso-KV; KVPruner collapses; the low-rank methods' "
             "attention parameters and FLOPs stay above ρ times dense and they pay a reconstruction on every "
             "decode step. On SmolLM2 without recovery:\n")
    L.extend(words)
    L.append("\nSmolLM2 has 3 KV heads of width 64 per layer and no recovery here; where it disagrees with the "
             "paper's ordering, these rows say what this model does before recovery, not that the paper is wrong.\n")
    atomic_write(a.page, "\n".join(L))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--calib-text", help="text for the Fisher scores and whitening (e.g. WikiText-2 valid.txt)")
    ap.add_argument("--eval-text", help="text for perplexity, cloze and passkey (e.g. WikiText-2 test.txt)")
    ap.add_argument("--outdir", default=os.path.join(ROOT, "out", "kv-baselines"))
    ap.add_argument("--methods", default="rap,kvpruner-naive,kvpruner,palu,svd-llm")
    ap.add_argument("--retain", type=float, default=0.7)
    ap.add_argument("--curve", default="0.5,0.9", help="other ρ, perplexity only (comma separated)")
    ap.add_argument("--fisher-seqs", type=int, default=16)
    ap.add_argument("--fisher-tokens", type=int, default=512)
    ap.add_argument("--whiten-seqs", type=int, default=16)
    ap.add_argument("--whiten-tokens", type=int, default=1024)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--task-items", type=int, default=60)
    ap.add_argument("--passkey-lengths", default="1024")
    ap.add_argument("--passkey-depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--passkey-samples", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=os.path.join(ROOT, "docs", "results", "kv_baselines", "kv_baselines_smollm2.json"))
    ap.add_argument("--page", default=os.path.join(ROOT, "docs", "kv-baselines.md"))
    ap.add_argument("--page-only", action="store_true", help="rebuild the page from --json")
    ap.add_argument("--bench-json",
                    default=os.path.join(ROOT, "docs", "results", "kv_baselines",
                                         "kv_baselines_attention_{method}.json"),
                    help="attention-module benchmarks per method (scripts/bench/bench_rap_attention.py "
                         "--json), shown on the page where they exist")
    a = ap.parse_args()
    a.methods = a.methods.split(",")
    a.curve = [float(x) for x in a.curve.split(",") if x]
    if a.page_only:
        s = json.load(open(a.json))
    else:
        for t in (a.calib_text, a.eval_text):
            if not t or not os.path.exists(t):
                ap.error(f"--calib-text and --eval-text must name existing files (got {t!r})")
        if "rap" not in a.methods:
            ap.error("--methods must include rap (the reference of every paired comparison)")
        s = summarise(a, run(a))
        write_json(a.json, s)
    write_page(a, s)
    print(f"wrote {a.json} and {a.page}")


if __name__ == "__main__":
    main()
