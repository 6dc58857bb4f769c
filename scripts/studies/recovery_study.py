#!/usr/bin/env python3
"""Recovery after pruning on one model: RAP, KVPruner (index-aware and naive), PaLU and SVD-LLM at
one KV-cache budget ρ, before and after a LoRA fine-tune distilled from the dense model
(`sparsim recover`; on the low-rank models the K and V adapters train the down factors, so the
latent cache keeps its width), and a LoRA-rank sweep.

Steps (every output is a file in --outdir; a step whose file exists is skipped, so the study can
be stopped and resumed; --phase picks which steps run, so that training and evaluation can run
side by side):

  prune    `sparsim calibrate --fisher` on the training text, `sparsim prune` per method (PaLU
           and SVD-LLM whitened by --whiten-seqs sequences of --whiten-tokens tokens of the
           training text);
  recover  `sparsim recover` per method at --rank, and for --sweep-method at every --ranks;
  eval     `sparsim eval` of the dense, pruned and recovered models on the evaluation text:
           perplexity over non-overlapping windows, a generated multiple-choice cloze task
           (scripts/tools/make_cloze_tasks.py) and the generated passkey task;
  summary  the JSON summary (--json) and the results page (--page), from the files that exist.

The training text (Fisher scores and recovery) and the evaluation text are separate files:

  scripts/studies/recovery_study.py --train wikitext-2/valid.txt --eval wikitext-2/test.txt \\
      --outdir out/recovery --json docs/results/recovery/recovery_smollm2.json --page docs/recovery-results.md

WikiText-2 can be read from the pytorch/examples repository (word_language_model/data/
wikitext-2/); it is not part of sparsim. Needs h5py (the scripts venv of scripts/setup.sh).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from study_steps import sh  # noqa: E402


LOW_RANK = ("palu", "svd-llm")


def run_all(jobs, n):
    """Runs (command, log) pairs, up to n at a time, in order; stops at the first failure."""
    if n <= 1:
        for cmd, log in jobs:
            sh(cmd, log)
        return
    running = []
    while jobs or running:
        while jobs and len(running) < n:
            cmd, log = jobs.pop(0)
            print("+", " ".join(cmd), flush=True)
            running.append((subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT),
                            cmd, log, time.time()))
        time.sleep(2)
        for r in list(running):
            p, cmd, log, t0 = r
            if p.poll() is None:
                continue
            running.remove(r)
            if p.returncode != 0:
                sys.stdout.write(open(log).read()[-3000:])
                raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
            print(f"  {time.time() - t0:.0f} s: {log}", flush=True)


def load_average():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


def read_ppl(path):
    with h5py.File(path, "r") as f:
        p = f["results/perplexity"]
        nll = [float(x) for x in p["window_nll"][...]]
        tok = [int(x) for x in p["window_tokens"][...]]
        fp = f["model"].attrs["fingerprint"]
        return {"perplexity": float(p.attrs["perplexity"]), "window_nll": nll, "window_tokens": tok,
                "window_perplexity": [math.exp(a / b) for a, b in zip(nll, tok)],
                "model_fingerprint": fp.decode() if isinstance(fp, bytes) else str(fp),
                "wall_seconds": float(f["timings/wall_seconds"][()])}


def read_tasks(path):
    with h5py.File(path, "r") as f:
        t = f["results/tasks"]
        return {"acc": float(t.attrs["acc"]), "acc_norm": float(t.attrs["acc_norm"]),
                "items": int(len(t["pred"][...]))}


def paired(a, b):
    """Per-window differences a − b of the mean NLL per token (nats): mean, sd, t, n."""
    d = [x / n - y / m for x, n, y, m in zip(a["window_nll"], a["window_tokens"],
                                              b["window_nll"], b["window_tokens"])]
    mean = statistics.mean(d)
    sd = statistics.stdev(d) if len(d) > 1 else 0.0
    t = mean / (sd / math.sqrt(len(d))) if sd > 0 else float("inf")
    return {"mean_nll_difference": mean, "sd": sd, "t": t, "n": len(d),
            "windows_lower": sum(1 for x in d if x < 0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sparsim", default=os.path.join(ROOT, "build", "bin", "sparsim"))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--train", required=True, help="training text (Fisher scores, recovery)")
    ap.add_argument("--eval", required=True, help="evaluation text")
    ap.add_argument("--outdir", default=os.path.join(ROOT, "out", "recovery"))
    ap.add_argument("--phase", default="all", choices=["all", "prune", "recover", "eval", "summary"])
    ap.add_argument("--fisher-seqs", type=int, default=32)
    ap.add_argument("--fisher-tokens", type=int, default=1024)
    ap.add_argument("--retain", type=float, default=0.7)
    ap.add_argument("--methods", default="rap,kvpruner,kvpruner-naive,palu,svd-llm")
    ap.add_argument("--whiten-seqs", type=int, default=16)
    ap.add_argument("--whiten-tokens", type=int, default=1024)
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank of the method comparison")
    ap.add_argument("--sweep-method", default="rap")
    ap.add_argument("--ranks", default="4,8,16", help="LoRA ranks of the sweep")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--recover-extra", default="", help="more sparsim recover options")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--task-items", type=int, default=24)
    ap.add_argument("--task-context-lines", type=int, default=1)
    ap.add_argument("--passkey-length", type=int, default=1024)
    ap.add_argument("--passkey-depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--passkey-samples", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--evaluations", default="ppl,tasks,passkey",
                    help="which evaluations the eval phase runs")
    ap.add_argument("--only", default="", help="evaluate only these models (comma separated names)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="evaluations run side by side (each with --threads threads)")
    ap.add_argument("--json", default=os.path.join(ROOT, "docs", "results", "recovery", "recovery_smollm2.json"))
    ap.add_argument("--page", default=os.path.join(ROOT, "docs", "recovery-results.md"))
    ap.add_argument("--page-only", action="store_true", help="rewrite the page from --json alone")
    a = ap.parse_args()
    if a.page_only:
        write_page(a, json.load(open(a.json)))
        print(f"page -> {a.page}")
        return
    os.makedirs(a.outdir, exist_ok=True)
    thr = ["--threads", str(a.threads)]
    methods = a.methods.split(",")
    ranks = [int(x) for x in a.ranks.split(",")]
    tag = f"{int(round(a.retain * 100)):03d}"
    fisher = os.path.join(a.outdir, "fisher.h5")
    tasks = os.path.join(a.outdir, "cloze_tasks.jsonl")
    do = lambda p: a.phase in ("all", p)

    if do("prune"):
        if not os.path.exists(fisher):
            sh([a.sparsim, "calibrate", "--fisher", "--model", a.model, "--corpus", a.train,
                "--fisher-seqs", str(a.fisher_seqs), "--fisher-tokens", str(a.fisher_tokens),
                "--progress", "never", "--out", fisher] + thr, fisher + ".log")
        for m in methods:
            gg = os.path.join(a.outdir, f"{m}_{tag}.gguf")
            if not os.path.exists(gg):
                cmd = [a.sparsim, "prune", "--model", a.model, "--method", m, "--retain",
                       str(a.retain), "--out", gg, "--json", gg + ".json",
                       "--flops-context", str(a.context)] + thr
                if m != "svd-llm":  # SVD-LLM's ranks are uniform: no Fisher scores
                    cmd += ["--calibration", fisher]
                if m in LOW_RANK:
                    cmd += ["--corpus", a.train, "--whiten-seqs", str(a.whiten_seqs),
                            "--whiten-tokens", str(a.whiten_tokens)]
                sh(cmd, gg + ".log")

    # the recovered models: every method at --rank, the sweep method at every rank
    runs = [(m, a.rank) for m in methods]
    runs += [(a.sweep_method, r) for r in ranks if (a.sweep_method, r) not in runs]
    rec_name = lambda m, r: f"{m}_{tag}_rec_r{r}"
    if do("recover"):
        for m, r in runs:
            out = os.path.join(a.outdir, rec_name(m, r) + ".gguf")
            if os.path.exists(out):
                continue
            before = load_average()
            sh([a.sparsim, "recover", "--model", os.path.join(a.outdir, f"{m}_{tag}.gguf"),
                "--teacher", a.model, "--corpus", a.train, "--steps", str(a.steps),
                "--seq-len", str(a.seq_len), "--batch", str(a.batch), "--lora-rank", str(r),
                "--lora-alpha", str(2 * r), "--lr", str(a.lr), "--progress", "lines",
                "--out", out, "--run", out + ".run.h5", "--json", out + ".json"]
               + a.recover_extra.split() + thr, out + ".log")
            with open(out + ".load.json", "w") as f:
                json.dump({"before": before, "after": load_average()}, f)

    models = [("dense", a.model)] + [(f"{m}_{tag}", os.path.join(a.outdir, f"{m}_{tag}.gguf"))
                                     for m in methods]
    models += [(rec_name(m, r), os.path.join(a.outdir, rec_name(m, r) + ".gguf")) for m, r in runs]
    if do("eval"):
        if not os.path.exists(tasks):
            sh([sys.executable, os.path.join(ROOT, "scripts", "tools", "make_cloze_tasks.py"), a.eval, "--out", tasks,
                "--items", str(a.task_items), "--context-lines", str(a.task_context_lines),
                "--seed", "1"], tasks + ".log")
        jobs = []
        for phase in a.evaluations.split(","):
            for n, path in models:
                out = os.path.join(a.outdir, f"{n}.{phase}.h5")
                if os.path.exists(out) or not (n == "dense" or os.path.exists(path)):
                    continue
                if a.only and n not in a.only.split(","):
                    continue
                cmd = [a.sparsim, "eval", "--model", path, "--progress", "never", "--out", out,
                       "--json", os.path.join(a.outdir, f"{n}.{phase}.json")] + thr
                if phase == "ppl":
                    cmd += ["--corpus", a.eval, "--context", str(a.context), "--stride",
                            str(a.context), "--score", str(a.context - 1), "--max-windows",
                            str(a.windows)]
                elif phase == "tasks":
                    cmd += ["--no-perplexity", "--tasks", tasks]
                else:
                    cmd += ["--no-perplexity", "--corpus", a.eval, "--task", "passkey",
                            "--retrieval-lengths", str(a.passkey_length), "--retrieval-depths",
                            a.passkey_depths, "--retrieval-samples", str(a.passkey_samples)]
                jobs.append((cmd, out + ".log"))
        run_all(jobs, a.jobs)

    if not do("summary"):
        return
    rows = []
    for n, path in models:
        row = {"name": n}
        if n != "dense":
            base = n.split("_rec_")[0]
            row["method"] = base.rsplit("_", 1)[0]
            pj = os.path.join(a.outdir, base + ".gguf.json")
            if os.path.exists(pj):
                p = json.load(open(pj))
                row["prune"] = {k: p[k] for k in ("retain_realised", "orphan_ratio",
                                                  "kv_bytes_fraction", "attn_params_fraction",
                                                  "attn_flops_fraction",
                                                  "attn_decode_flops_fraction", "n_params")
                                if k in p}
        else:
            row["method"] = "dense"
        rj = path + ".json"
        if "_rec_" in n and os.path.exists(rj):
            r = json.load(open(rj))
            row["recovery"] = {k: r[k] for k in ("settings", "tokens", "trainable_parameters",
                                                 "loss_first", "loss_last", "timing",
                                                 "peak_rss_bytes", "merge_check_rel_error")}
            row["recovery"]["loss"] = r["loss"]
            row["recovery"]["ce"] = r["ce"]
            row["recovery"]["kl"] = r["kl"]
            lj = path + ".load.json"
            if os.path.exists(lj):
                row["recovery"]["load_average"] = json.load(open(lj))
        f = os.path.join(a.outdir, f"{n}.ppl.h5")
        if os.path.exists(f):
            row["ppl"] = read_ppl(f)
        f = os.path.join(a.outdir, f"{n}.tasks.h5")
        if os.path.exists(f):
            row["tasks"] = read_tasks(f)
        f = os.path.join(a.outdir, f"{n}.passkey.json")
        if os.path.exists(f):
            rt = json.load(open(f))["retrieval"]
            row["passkey"] = {"accuracy": rt["accuracy"], "cells": rt["cells"]}
        rows.append(row)
    byname = {r["name"]: r for r in rows}
    comparisons = []
    def compare(x, y, what):
        if "ppl" in byname.get(x, {}) and "ppl" in byname.get(y, {}):
            comparisons.append({"a": x, "b": y, "what": what,
                                **paired(byname[x]["ppl"], byname[y]["ppl"])})
    for m in methods:
        compare(rec_name(m, a.rank), f"{m}_{tag}", f"{m}: recovered − pruned")
        compare(rec_name(m, a.rank), "dense", f"{m}: recovered − dense")
    for m in methods[1:]:  # the first method against each other one
        compare(rec_name(methods[0], a.rank), rec_name(m, a.rank),
                f"recovered {methods[0]} − recovered {m}")
        compare(f"{methods[0]}_{tag}", f"{m}_{tag}", f"pruned {methods[0]} − pruned {m}")
    for r in ranks:
        if r != a.rank:
            compare(rec_name(a.sweep_method, r), rec_name(a.sweep_method, a.rank),
                    f"{a.sweep_method}: rank {r} − rank {a.rank}")
    fisher_info = {}
    if os.path.exists(fisher):
        with h5py.File(fisher, "r") as f:
            g = f["fisher"]
            fisher_info = {"sequences": int(g.attrs["sequences"]), "tokens": int(g.attrs["tokens"]),
                           "model_fingerprint": str(f.attrs["model_fingerprint"]),
                           "corpus_fingerprint": str(f.attrs["corpus_fingerprint"])}
    settings = {k: getattr(a, k) for k in ("model", "train", "eval", "fisher_seqs", "fisher_tokens",
                                           "whiten_seqs", "whiten_tokens", "retain", "methods", "rank", "sweep_method", "ranks",
                                           "steps", "seq_len", "batch", "lr", "recover_extra",
                                           "context", "windows", "task_items",
                                           "task_context_lines", "passkey_length",
                                           "passkey_depths", "passkey_samples", "threads")}
    settings["train"] = os.path.basename(a.train)
    settings["eval"] = os.path.basename(a.eval)
    settings["command"] = " ".join(os.path.relpath(x, ROOT) if x.startswith(ROOT) else x
                                   for x in sys.argv)
    summary = {"settings": settings, "fisher": fisher_info, "models": rows,
               "comparisons": comparisons,
               "missing": [n for n, _ in models if "ppl" not in byname[n]]}
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(a.json + ".tmp", a.json)
    write_page(a, summary)
    print(f"summary -> {a.json}, page -> {a.page}; missing: {summary['missing'] or 'none'}")


def write_page(a, s):
    st = s["settings"]
    rel = os.path.relpath(a.json, os.path.dirname(a.page))
    P = []
    P.append("# Recovery after pruning on SmolLM2-135M\n")
    P.append(f"Generated by `scripts/studies/recovery_study.py` (`{st['command']}`); every number below is "
             f"in [`{rel}`]({rel}). Method and choices: [recovery.md](recovery.md).\n")
    P.append("## Settings\n")
    fi = s.get("fisher", {})
    P.append(f"- model `{st['model']}` (SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to fp32), "
             f"{st['threads']} threads on a shared 2-core machine;")
    P.append(f"- training text: WikiText-2 `{st['train']}` (Fisher scores: {fi.get('sequences')} "
             f"sequences of {fi.get('tokens')} tokens; recovery: sequences of {st['seq_len']} tokens "
             f"drawn in a seeded order); evaluation text: WikiText-2 `{st['eval']}`;")
    lowr = [m for m in st["methods"].split(",") if m in LOW_RANK]
    P.append(f"- pruning: {', '.join(st['methods'].split(','))} at the KV-cache budget ρ = "
             f"{st['retain']} (`sparsim prune`; the Fisher-proportional layer budgets of the same "
             "scores for every method but SVD-LLM, whose ranks are equal"
             + (f"; {' and '.join(lowr)} whitened by {st.get('whiten_seqs')} sequences of "
                f"{st.get('whiten_tokens')} tokens of the training text" if lowr else "")
             + "; methods and choices: [kv-weight-pruning.md](kv-weight-pruning.md), "
             "[low-rank.md](low-rank.md));")
    P.append(f"- recovery (`sparsim recover`): LoRA on q, k, v, o, rank {st['rank']} (sweep: "
             f"{st['ranks']} on {st['sweep_method']}), α = 2r, dropout 0.05, loss CE + T²·KL"
             f"(student ‖ teacher) at T = 2 with the dense model as teacher, AdamW at peak "
             f"learning rate {st['lr']:g} (5 % warm-up, cosine), gradient norm clipped at 1, "
             f"{st['steps']} steps of {st['batch']} × {st['seq_len']} tokens "
             f"({st['steps'] * st['batch'] * st['seq_len']} training tokens per run)"
             + (f", extra options `{st['recover_extra']}`" if st['recover_extra'] else "")
             + ("; on the low-rank models the K and V adapters train the down factors A (x → "
                "latent), so the recovered model caches latents of the same width and its up "
                "factors B are those of the factorisation" if lowr else "") + ";")
    P.append(f"- perplexity: {st['windows']} non-overlapping windows of {st['context']} tokens from "
             "the start of the evaluation text (all but the first token of each scored), no BOS; "
             "spread over the per-window perplexities; A against B by the per-window "
             "differences of the mean NLL per token (paired);")
    P.append(f"- multiple choice: {st['task_items']} generated cloze items from the second half of "
             f"the evaluation text ({st['task_context_lines']} paragraph of context, the true next "
             "paragraph against 3 of similar length; `scripts/tools/make_cloze_tasks.py`, seed 1; chance "
             "0.25);")
    npk = len(st['passkey_depths'].split(",")) * st['passkey_samples']
    P.append(f"- passkey: the generated task (`eval --task passkey`) on the evaluation text, "
             f"prompts of {st['passkey_length']} tokens, needle depths {st['passkey_depths']}, "
             f"{st['passkey_samples']} prompts per depth ({npk} prompts per model), exact match.\n")
    P.append("## Quality before and after recovery\n")
    P.append("| model | KV bytes | attn params | attn FLOPs per decode step | perplexity | "
             "window ppl mean ± sd [min, max] | acc | acc_norm | passkey |")
    P.append("|---|---|---|---|---|---|---|---|---|")
    for r in s["models"]:
        e = r.get("ppl")
        pr = r.get("prune", {})
        kv = f"{pr['kv_bytes_fraction']:.3f}" if pr else ("1" if r["method"] == "dense" else "")
        ap_ = f"{pr['attn_params_fraction']:.3f}" if pr else ("1" if r["method"] == "dense" else "")
        df = (f"{pr['attn_decode_flops_fraction']:.3f}" if "attn_decode_flops_fraction" in pr
              else ("1" if r["method"] == "dense" else ""))
        if e:
            w = e["window_perplexity"]
            sp = (f"{statistics.mean(w):.2f} ± {statistics.stdev(w):.2f} "
                  f"[{min(w):.2f}, {max(w):.2f}]")
            ppl = f"{e['perplexity']:.2f}"
        else:
            ppl, sp = "not run", ""
        t = r.get("tasks")
        acc = f"{t['acc']:.3f}" if t else "not run"
        accn = f"{t['acc_norm']:.3f}" if t else "not run"
        pk = f"{r['passkey']['accuracy']:.2f}" if "passkey" in r else "not run"
        P.append(f"| {r['name']} | {kv} | {ap_} | {df} | {ppl} | {sp} | {acc} | {accn} | {pk} |")
    P.append("")
    P.append(f"KV bytes, attention parameters and the attention FLOPs of one decode step at "
             f"{st['context']} tokens of context (the rebuilding of K and V included for the "
             "low-rank models) are fractions of the dense model's, from `sparsim prune`'s JSON; "
             "recovery changes none of them.\n")
    if s["comparisons"]:
        P.append("## Paired per-window differences\n")
        P.append("Mean over the windows of (mean NLL per token of A − that of B), its standard "
                 "deviation, the paired t statistic and in how many windows A is lower. Negative: "
                 "A predicts the evaluation text better.\n")
        P.append("| A − B | mean Δ NLL (nats/token) | sd | t | windows A lower |")
        P.append("|---|---|---|---|---|")
        for c in s["comparisons"]:
            P.append(f"| {c['what']} | {c['mean_nll_difference']:+.4f} | {c['sd']:.4f} | "
                     f"{c['t']:+.2f} | {c['windows_lower']} / {c['n']} |")
        P.append("")
    recs = [r for r in s["models"] if "recovery" in r]
    if recs:
        P.append("## Training: loss, token budget, time, memory\n")
        P.append("| run | rank | trainable params | tokens | loss first → last (CE, KL) | median "
                 "step s | tokens/s | step / forward | teacher, forward, backward s | peak "
                 "memory MiB | threads |")
        P.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in recs:
            c = r["recovery"]
            tm = c["timing"]
            k = 10 if len(c["loss"]) >= 20 else 1
            f0 = lambda v: statistics.mean(v[:k])
            f1 = lambda v: statistics.mean(v[-k:])
            P.append(f"| {r['name']} | {c['settings']['lora_rank']} | {c['trainable_parameters']} "
                     f"| {c['tokens']} | {f0(c['loss']):.3f} → {f1(c['loss']):.3f} "
                     f"({f0(c['ce']):.3f} → {f1(c['ce']):.3f}, {f0(c['kl']):.4f} → "
                     f"{f1(c['kl']):.4f}) | {tm['median_step_seconds']:.2f} | "
                     f"{tm['tokens_per_second']:.0f} | {tm['step_over_forward']:.2f} | "
                     f"{tm['teacher_seconds']:.2f}, {tm['forward_seconds']:.2f}, "
                     f"{tm['backward_seconds']:.2f} | {c['peak_rss_bytes'] / 2**20:.0f} | {tm['threads']} |")
        P.append("")
        P.append("Loss first → last: means over the first and the last 10 steps (the steps see "
                 "different sequences, so single steps are noisy). Step / forward: the median "
                 "training step against `Engine` prefill of the same tokens on the recovered "
                 "model, measured in the same process right after training (goal ≤ 4); the "
                 "machine's two cores were shared with other builds and runs throughout, so the "
                 "seconds are slow and vary between runs, while the ratio compares times of one "
                 "process. Each "
                 "recovered model's merged weights reproduce its unmerged adapters' logits to the "
                 "relative error in `merge_check_rel_error`.\n")
    if s["missing"]:
        P.append(f"**Not evaluated yet:** {', '.join(s['missing'])} (rerun the script to resume).\n")
    P.append("## What the small model shows against the paper\n")
    P.extend(discussion(s))
    with open(a.page + ".tmp", "w") as f:
        f.write("\n".join(P) + "\n")
    os.replace(a.page + ".tmp", a.page)


def discussion(s):
    """Statements built from the numbers of the summary (nothing typed in by hand)."""
    st = s["settings"]
    by = {r["name"]: r for r in s["models"]}
    cmp_ = {c["what"]: c for c in s["comparisons"]}
    tag = f"{int(round(st['retain'] * 100)):03d}"
    ppl = lambda n: by.get(n, {}).get("ppl", {}).get("perplexity")
    out = []
    dense = ppl("dense")
    for m in st["methods"].split(","):
        p0, p1 = ppl(f"{m}_{tag}"), ppl(f"{m}_{tag}_rec_r{st['rank']}")
        c = cmp_.get(f"{m}: recovered − pruned")
        d = cmp_.get(f"{m}: recovered − dense")
        if None in (dense, p0, p1) or not c or not d:
            continue
        gap = (f"{100 * (p0 - p1) / (p0 - dense):.0f} % of the gap to dense closed" if p1 >= dense
               else "below the dense model")
        out.append(f"- **{m}**: perplexity {p0:.2f} pruned → {p1:.2f} after recovery (dense "
                   f"{dense:.2f}): {gap} with {st['steps'] * st['batch'] * st['seq_len']} training tokens; lower "
                   f"than pruned in {c['windows_lower']} of {c['n']} windows (mean Δ NLL "
                   f"{c['mean_nll_difference']:+.3f}, t = {c['t']:.1f}); against dense "
                   f"{d['mean_nll_difference']:+.3f} nats/token (lower in {d['windows_lower']} of "
                   f"{d['n']})."
                   + (" The paper reports that LoRA–KD brings RAP at ρ = 0.7 back to near the "
                      "dense perplexity on Llama-3-8B; the small model agrees in direction"
                      + (", and the recovered model stays measurably worse than dense."
                         if d["windows_lower"] == 0 else ".") if m == "rap" else ""))
    below = [m for m in st["methods"].split(",")
             if ppl(f"{m}_{tag}_rec_r{st['rank']}") is not None and dense is not None
             and ppl(f"{m}_{tag}_rec_r{st['rank']}") < dense]
    if below:
        out.append(f"- **Below the dense model**: {', '.join(below)} end with a lower perplexity "
                   "than the dense model itself. Recovery trains on WikiText-2 text (its "
                   "cross-entropy term adapts the model to the evaluation text's domain, which the "
                   "dense instruction-tuned model never saw), so 'recovered − dense' mixes the "
                   "recovery with that adaptation; the fair reference would be the dense model "
                   "given the same fine-tune, which this study does not run. The paper controls "
                   "for domain overlap with a C4 run (its Appendix E); the ranking of the "
                   "recovered models against each other is the comparison this page makes.")
    ms = st["methods"].split(",")
    a1 = ppl(f"{ms[0]}_{tag}_rec_r{st['rank']}")
    for m in ms[1:]:
        p0, b0 = ppl(f"{ms[0]}_{tag}"), ppl(f"{m}_{tag}")
        b1 = ppl(f"{m}_{tag}_rec_r{st['rank']}")
        c = cmp_.get(f"recovered {ms[0]} − recovered {m}")
        c0 = cmp_.get(f"pruned {ms[0]} − pruned {m}")
        if None in (p0, b0, a1, b1, dense) or not c or not c0:
            continue
        better = lambda x: (f"{ms[0]} lower in {x['windows_lower']} of {x['n']} windows (mean "
                            f"Δ NLL {x['mean_nll_difference']:+.3f}, t = {x['t']:.1f})")
        line = (f"- **{ms[0]} against {m}**: pruned {p0:.2f} against {b0:.2f} (excess over "
                f"dense {p0 - dense:.2f} against {b0 - dense:.2f}; {better(c0)}); recovered "
                f"{a1:.2f} against {b1:.2f} (excess {a1 - dense:.2f} against {b1 - dense:.2f}; "
                f"{better(c)}).")
        if m == "kvpruner":
            line += (" The paper finds KVPruner far behind RAP after the same recovery on "
                     "Llama-3-8B (an index-aware KVPruner still trails by 10–84× in perplexity); "
                     + ("on SmolLM2 the recovery closes most of KVPruner's gap as well, so the "
                        "difference that remains is "
                        f"{(b1 - dense) / max(a1 - dense, 1e-9):.1f}× in excess perplexity, not "
                        "orders of magnitude." if b1 - dense < 10 * (a1 - dense) else
                        "SmolLM2 agrees."))
        elif m in LOW_RANK:
            pr = by.get(f"{m}_{tag}", {}).get("prune", {})
            pa = by.get(f"{ms[0]}_{tag}", {}).get("prune", {})
            if "attn_decode_flops_fraction" in pr and "attn_decode_flops_fraction" in pa:
                line += (f" At the same KV bytes {m} keeps {pr['attn_params_fraction']:.2f} of "
                         f"the attention parameters, and a decode step at {st['context']} tokens "
                         f"costs {pr['attn_decode_flops_fraction']:.2f}× the dense attention "
                         "FLOPs, the rebuilding of every cached key and value included ("
                         f"{ms[0]}: {pa['attn_params_fraction']:.2f} and "
                         f"{pa['attn_decode_flops_fraction']:.2f}×).")
            if m == "palu":
                line += (" The paper finds PaLU slightly stronger than RAP on quality after the "
                         "shared recovery, at a higher attention cost; on SmolLM2 PaLU is "
                         + ("the stronger after recovery as well." if c["mean_nll_difference"] > 0
                            else "the weaker after recovery."))
        out.append(line)
    ranks = [int(x) for x in str(st["ranks"]).split(",")]
    sw = [(r, ppl(f"{st['sweep_method']}_{tag}_rec_r{r}")) for r in ranks]
    if all(p is not None for _, p in sw):
        out.append(f"- **LoRA rank** ({st['sweep_method']}, the same {st['steps']} steps): "
                   + ", ".join(f"r = {r}: {p:.2f}" for r, p in sw)
                   + ". The paper's sweep on Llama-3-8B (r = 4/8/16: 9.52/9.35/9.37) finds the "
                   "recovery insensitive to the rank. "
                   + " ".join(f"Rank {c['what'].split('rank ')[1].split(' ')[0]} against rank "
                              f"{st['rank']}: {c['mean_nll_difference']:+.3f} nats/token, lower in "
                              f"{c['windows_lower']} of {c['n']} windows."
                              for c in s["comparisons"] if ": rank " in c["what"])
                   + (" On SmolLM2 with this short budget the rank does matter: a larger rank "
                      "predicts better in every window, though the spread between the ranks is "
                      "small next to what recovery wins back."
                      if all(c["windows_lower"] == (c["n"] if int(c["what"].split("rank ")[1]
                                                                       .split(" ")[0]) > st["rank"]
                                                    else 0)
                             for c in s["comparisons"] if ": rank " in c["what"]) else ""))
    else:
        done = [f"r = {r}: {p:.2f}" for r, p in sw if p is not None]
        out.append("- **LoRA rank**: not all runs evaluated yet (" + (", ".join(done) or "none")
                   + ").")
    t = [(n, by[n].get("tasks", {}).get("acc"), by[n].get("passkey", {}).get("accuracy"))
         for n in by]
    if any(x[1] is not None for x in t):
        out.append("- **Multiple choice and passkey**: "
                   + "; ".join(f"{n} {a:.2f} / {k:.2f}" for n, a, k in t
                               if a is not None and k is not None)
                   + f" (cloze acc / passkey accuracy). With {st['task_items']} items and "
                   f"{len(st['passkey_depths'].split(',')) * st['passkey_samples']} prompts, one "
                   "answer moves a figure by 0.05, so these show large effects only. Recovery "
                   f"trains on {st['seq_len']}-token sequences and does not target long-range "
                   "retrieval; the paper's LongBench figures are for 8B models and much longer "
                   "inputs.")
    recs = [r for r in s["models"] if "recovery" in r]
    if recs:
        rat = sorted((r["recovery"]["timing"]["step_over_forward"], r["name"]) for r in recs)
        out.append(f"- **Cost**: one step over {st['batch']} × {st['seq_len']} tokens took "
                   f"from {rat[0][0]:.1f}× ({rat[0][1]}) to {rat[-1][0]:.1f}× ({rat[-1][1]}) the "
                   "forward pass of the same tokens. The runs shared the two cores with other "
                   "jobs, so these ratios vary with the load; a low-rank model's forward pass "
                   "rebuilds its keys and values, which makes its ratio smaller (goal ≤ 4×; "
                   "measured on its own, on a quiet machine, in "
                   "[recovery.md](recovery.md#cost-of-a-step)). A step is the teacher's "
                   "forward pass, the student's "
                   "forward pass with its "
                   "activations kept and the distillation loss over the whole vocabulary, "
                   "and the backward pass (see the table for the split). Peak memory "
                   f"{max(r['recovery']['peak_rss_bytes'] for r in recs) / 2**20:.0f} MiB.")
    return out

if __name__ == "__main__":
    main()
