#!/usr/bin/env python3
"""K-cache channel pruning study on one model: dense vs ThinK vs GRACE at several pruning ratios
λ, in perplexity (per window, with the spread) and the generated passkey retrieval task, with
the per-run K-cache bytes and attention-matrix reconstruction errors; plus the decode-attention
benchmark (`sparsim bench --method think|grace`, compacted cache against dense in the same run).

Every configuration is one `sparsim eval` (or `sparsim bench`) run whose JSON summary (and run
file) is kept in --outdir. A run whose JSON exists is not repeated (resumable); a run in
progress holds a lock file, so several copies of this script can share the work. The queue is
ordered so that a partial study is still a comparison (dense first, then both methods at one λ,
then the benchmark, then the other λ). Then the script reads what finished and writes a JSON
summary and a Markdown results page that lists what did not run.

  scripts/studies/kv_prune_study.py --outdir runs/kv --json docs/results/kv_prune/kv_prune_smollm2.json \\
      --page docs/kv-prune-results.md

  --collect-only: only read what finished and write the page.
  --max-minutes M: start no new run after M minutes (what did not run is listed on the page).
  --only PREFIXES: run only some entries of the queue (e.g. --only bench_).
Needs h5py (the scripts venv made by scripts/setup.sh has it).
"""
import argparse
import json
import os
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json  # noqa: E402
from study_steps import run_locked, window_ppl  # noqa: E402

LAMBDAS_DEFAULT = "0.5,0.3,0.6,0.4"
METHODS = ("think", "grace")


def lambdas(args):
    return [float(x) for x in args.lambdas.split(",")]


def name_of(method, lam):
    return "dense" if method == "dense" else f"{method}_l{lam}"


def method_args(method, lam, window):
    if method == "dense":
        return ["--method", "dense"]
    return ["--method", method, "--kv-prune", str(lam), "--kv-window", str(window)]


def bench_cells(args):
    """(name, bench arguments): synthetic-cache decode attention at each context and batch (a
    prompt of ctx − 1 tokens: the decode row attends to ctx positions), and one real prefill
    (selection time against the prefill time)."""
    out = []
    for ctx in [int(x) for x in args.bench_contexts.split(",")]:
        for b in [int(x) for x in args.bench_batches.split(",")]:
            out.append((f"bench_grace_l{args.bench_lambda}_ctx{ctx}_b{b}",
                        ["--method", "grace", "--kv-prune", str(args.bench_lambda),
                         "--kv-synthetic-cache", "--prompt", str(ctx - 1), "--batch", str(b),
                         "--reps", str(args.bench_reps)]))
    out.append((f"bench_grace_l{args.bench_lambda}_prefill{args.bench_prefill}",
                ["--method", "grace", "--kv-prune", str(args.bench_lambda), "--prompt",
                 str(args.bench_prefill), "--decode", "16", "--batch", "1", "--reps", "3"]))
    return out


def queue(args):
    """Every run, in the order it is started: (name, kind, arguments)."""
    lams = lambdas(args)
    ppl = ["--corpus", args.corpus, "--context", str(args.context), "--stride", str(args.context),
           "--score", str(args.score), "--max-windows", str(args.windows), "--batch", "1"]
    pk = ["--corpus", args.corpus, "--no-perplexity", "--task", "passkey",
          "--retrieval-lengths", args.retrieval_lengths, "--retrieval-depths",
          args.retrieval_depths, "--retrieval-samples", str(args.retrieval_samples)]
    q = [("dense", "eval", ppl + method_args("dense", 0, 0))]
    for m in METHODS:
        q.append((name_of(m, lams[0]), "eval", ppl + method_args(m, lams[0], args.window)))
    q.append(("dense_passkey", "eval", pk + method_args("dense", 0, 0)))
    for m in METHODS:
        q.append((name_of(m, lams[0]) + "_passkey", "eval",
                  pk + method_args(m, lams[0], args.window)))
    for n, a in bench_cells(args):
        q.append((n, "bench", a))
    for lam in lams[1:]:
        for m in METHODS:
            q.append((name_of(m, lam), "eval", ppl + method_args(m, lam, args.window)))
    for lam in lams[1:]:
        for m in METHODS:
            q.append((name_of(m, lam) + "_passkey", "eval",
                      pk + method_args(m, lam, args.window)))
    return q


def run(args, name, kind, cmd):
    """Runs one command unless its JSON exists or another process holds its lock; a failure is
    reported and left out, and the rest of the study goes on."""
    js = os.path.join(args.outdir, name + ".json")
    full = [args.sparsim, kind, "--model", args.model, "--threads", str(args.threads),
            "--json", js]
    if kind == "eval":
        full += ["--progress", "never", "--out", os.path.join(args.outdir, name + ".h5")]
    run_locked(args.outdir, name, full + cmd, os.path.join(args.outdir, name + ".log"))


def read_json(path):
    with open(path) as fh:
        return json.load(fh)


def head_tables(h5):
    """[layer][kv head] reconstruction errors of ThinK and GRACE and the protected share."""
    with h5py.File(h5, "r") as f:
        if "kv_prune" not in f:
            return None
        g = f["kv_prune"]
        return {k: g[k][...].tolist() for k in ("recon_error_think", "recon_error_grace",
                                                "protected_share", "kept_channels",
                                                "k_bytes", "k_bytes_dense")}


def kv_fields(s):
    k = s.get("kv_prune")
    if not k:
        return {}
    return {"lambda": k["lambda"], "kept_per_head": k["kept_per_head"],
            "k_bytes_dense": k["k_bytes_dense"], "k_bytes": k["k_bytes"],
            "k_bytes_ratio": k["k_bytes"] / k["k_bytes_dense"],
            "recon_error_mean": k["recon_error_mean"],
            "recon_error_think_mean": k["recon_error_think_mean"],
            "recon_error_grace_mean": k["recon_error_grace_mean"],
            "recon_error_mies_mean": k["recon_error_mies_mean"],
            "protected_share_mean": k["protected_share_mean"],
            "selections": k["selections"], "guard_used": k["guard_used"],
            "grace_worse_than_think": k["grace_worse_than_think"],
            "select_seconds_per_head": k["select_seconds_per_head"]}


def collect(args):
    res = {"settings": {
        "model": args.model, "corpus": args.corpus, "context": args.context,
        "stride": args.context, "score": args.score, "windows": args.windows,
        "prefill_per_window": args.context - args.score - 1, "threads": args.threads,
        "kv_window": args.window, "lambdas": lambdas(args), "protect": "0.05,0.25 (default)",
        "guard": "off (default)", "recent": "32 (default)", "pruned_per_head": "⌊λd⌋",
        "retrieval_lengths": args.retrieval_lengths,
        "retrieval_depths": args.retrieval_depths, "retrieval_samples": args.retrieval_samples,
        "bench_lambda": args.bench_lambda, "bench_contexts": args.bench_contexts,
        "bench_batches": args.bench_batches, "bench_reps": args.bench_reps},
        "runs": {}, "bench": {}, "missing": []}
    for name, kind, cmd in queue(args):
        js = os.path.join(args.outdir, name + ".json")
        if not os.path.exists(js):
            res["missing"].append(name)
            continue
        s = read_json(js)
        s_cmd = " ".join(["sparsim", kind, "--model", args.model] + cmd)
        if kind == "bench":
            res["bench"][name] = {"command": s_cmd, "summary": s}
            continue
        base, _, part = name.partition("_passkey")
        r = res["runs"].setdefault(name.replace("_passkey", ""), {})
        if name.endswith("_passkey"):
            r["passkey"] = s["retrieval"]
            r["passkey_command"] = s_cmd
            r["passkey_kv"] = kv_fields(s)
        else:
            wp = window_ppl(os.path.join(args.outdir, name + ".h5"))
            r.update({"perplexity": s["perplexity"], "window_perplexity": wp,
                      "window_ppl_min": min(wp), "window_ppl_max": max(wp),
                      "window_ppl_std": float(np.std(wp)),
                      "flops_fraction": s["flops"]["realised"] / s["flops"]["dense"],
                      "command": s_cmd})
            r.update(kv_fields(s))
            t = head_tables(os.path.join(args.outdir, name + ".h5"))
            if t:
                r["per_head"] = t
    return res


def fmt(x, d=2):
    return "–" if x is None else f"{x:.{d}f}"


def discussion(res):
    R = res["runs"]
    out = []
    for lam in res["settings"]["lambdas"]:
        t, g = R.get(name_of("think", lam), {}), R.get(name_of("grace", lam), {})
        if "perplexity" in t and "perplexity" in g:
            et, eg = g["recon_error_think_mean"], g["recon_error_grace_mean"]
            better = "lower" if g["perplexity"] < t["perplexity"] else "higher"
            out.append(
                f"- λ = {lam}: GRACE's perplexity {g['perplexity']:.2f} is {better} than ThinK's "
                f"{t['perplexity']:.2f} (dense {fmt(R.get('dense', {}).get('perplexity'))}); on "
                f"the observation window GRACE's mean relative reconstruction error is {eg:.4f} "
                f"against ThinK's {et:.4f} (same Grams), and GRACE exceeded ThinK's error in "
                f"{g['grace_worse_than_think']} of {g['selections']} head selections (protected "
                f"channels ThinK would prune; the guard took ThinK's choice among GRACE's "
                f"candidates in {g['guard_used']}). The paper reports GRACE ahead of ThinK at every "
                "ratio; " + ("this run agrees." if better == "lower" else
                             "this small model disagrees here."))
    pk = [(n, r["passkey"]["accuracy"]) for n, r in R.items() if "passkey" in r]
    if pk:
        out.append("- Passkey accuracy: " + ", ".join(f"{n} {a:.2f}" for n, a in pk) + ".")
    return out


def page(args, res):
    R, s = res["runs"], res["settings"]
    L = ["# ThinK and GRACE on SmolLM2-135M: results", "",
         "Generated by `scripts/studies/kv_prune_study.py` from the run files in its `--outdir`; every "
         "number below is in `docs/results/kv_prune/kv_prune_smollm2.json`. Method and options: "
         "[k-channel-pruning.md](k-channel-pruning.md).", "",
         "## Settings", "",
         f"- model `{s['model']}` (SmolLM2-135M-Instruct, Q4_1 dequantized to f32), "
         f"{s['threads']} threads;",
         f"- perplexity: corpus `{s['corpus']}`, {s['windows']} windows of {s['context']} tokens "
         f"(stride {s['stride']}), the last {s['score']} positions of each scored. Per window "
         f"the first {s['prefill_per_window']} tokens are the prefill whose keys are pruned; the "
         "scored rows run against the compacted cache (see k-channel-pruning.md, Protocols);",
         f"- ThinK / GRACE: observation window w = {s['kv_window']}, GRACE protection "
         f"[a, b] = {s['protect']}, guard {s['guard']}; λ ∈ {s['lambdas']}; "
         + (f"last {s['recent']} prompt keys at full width, {s['pruned_per_head']} channels "
            "pruned per head;" if "recent" in s else
            "every prompt key compacted, ⌈λd⌉ channels pruned per head (the defaults of the "
            "build that made these runs; since then `--kv-recent 32`, ⌊λd⌋ and `--kv-guard off` "
            "follow ThinK's reference code and GRACE as published, see k-channel-pruning.md);"),
         f"- retrieval: `--task passkey`, lengths {s['retrieval_lengths']}, depths "
         f"{s['retrieval_depths']}, {s['retrieval_samples']} prompt(s) per cell, greedy, exact "
         "match; the prompt is the prefill, the answer decodes against the compacted cache.", "",
         "Command: `scripts/studies/kv_prune_study.py --outdir DIR --json "
         "docs/results/kv_prune/kv_prune_smollm2.json --page docs/kv-prune-results.md` (each run's "
         "`sparsim` command line is in the JSON, `command`).", ""]
    if args.note:
        L += [args.note, ""]
    if res["missing"]:
        L += ["**Did not run** (not enough machine time in this study; the script resumes "
              "them): " + ", ".join(f"`{m}`" for m in res["missing"]), ""]
    L += ["## Perplexity and passkey retrieval", "",
          "| configuration | λ | PPL | PPL per window min – max (std) | passkey acc | "
          "K bytes / dense | recon. error ThinK | recon. error GRACE | protected share |",
          "|---|---|---|---|---|---|---|---|---|"]
    rows = [("dense", "dense", None)]
    for lam in s["lambdas"]:
        for m in METHODS:
            rows.append((name_of(m, lam), "ThinK" if m == "think" else "GRACE", lam))
    for n, label, lam in rows:
        r = R.get(n, {})
        if not r:
            continue
        pk = r.get("passkey", {}).get("accuracy")
        L.append(f"| {label} | {'–' if lam is None else lam} | {fmt(r.get('perplexity'))} | "
                 f"{fmt(r.get('window_ppl_min'))} – {fmt(r.get('window_ppl_max'))} "
                 f"({fmt(r.get('window_ppl_std'))}) | {fmt(pk)} | {fmt(r.get('k_bytes_ratio'), 3)} | "
                 f"{fmt(r.get('recon_error_think_mean'), 4)} | "
                 f"{fmt(r.get('recon_error_grace_mean'), 4)} | "
                 f"{fmt(r.get('protected_share_mean'), 3)} |")
    L += ["", "`K bytes / dense`: what the cache allocated at the end of the perplexity run "
          "(the last window: the prefill compacted, the scored positions full width) over the "
          "dense layout; it tends to 1 − λ as the compacted share of the context grows. "
          "Reconstruction errors are ‖Q_P K_Pᵀ‖_F / ‖Q Kᵀ‖_F on the observation window, mean "
          "over every (window, layer, KV head); both methods are scored on the same Grams in "
          "every run.", ""]
    pk = [(n, r) for n, r in R.items() if "passkey" in r]
    if pk:
        L += ["### Passkey cells", "", "| configuration | " +
              " | ".join(f"len {c['length']}, depth {c['depth']}"
                         for c in pk[0][1]["passkey"]["cells"]) + " |",
              "|---|" + "---|" * len(pk[0][1]["passkey"]["cells"])]
        for n, r in pk:
            L.append(f"| {n} | " + " | ".join(fmt(c["accuracy"])
                                             for c in r["passkey"]["cells"]) + " |")
        L.append("")
    if res["bench"]:
        L += ["## Decode attention: compacted cache against dense (`sparsim bench`)", "",
              "Each row is one `sparsim bench` run (command in the JSON). Kernel level, every "
              "layer's attention of one decode row per sequence, alternating dense / method / "
              "no-K floor in every repetition; medians. K-side time = time − the no-K floor "
              "(the compacted cache read with zero key channels). The issue asks the K-side "
              "saving to be ≥ 0.8·λ.", "",
              "| run | positions attended | batch | layers timed | reps | dense ms | GRACE ms | no-K ms | "
              "K-side saved | ≥ 0.8·λ | K bytes / dense | load before / after |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for n, b in res["bench"].items():
            j = b["summary"]
            a = j["attention"]
            ctx = j['prompt_tokens'] + 1  # the decode row attends to the prompt and itself
            L.append(f"| `{n}` | {ctx} | {j['batch']} | {a['layers']} | "
                     f"{j['reps']} | {1e3 * a['dense_seconds']:.3f} | "
                     f"{1e3 * a['method_seconds']:.3f} | {1e3 * a['no_k_seconds']:.3f} | "
                     f"{a['k_side_saved_fraction']:.3f} | "
                     f"{'yes' if a['meets_requirement'] else 'no'} | "
                     f"{j['k_bytes'] / j['k_bytes_dense']:.3f} | "
                     f"{j['load_average_before']:.1f} / {j['load_average_after']:.1f} |")
        L.append("")
        for n, b in res["bench"].items():
            j = b["summary"]
            if "prefill" in j:
                sel = j["selection"]
                L += [f"Selection cost (`{n}`, real prefill of {j['prompt_tokens']} tokens): "
                      f"{1e6 * sel['select_seconds_per_head']:.1f} µs per head on the host "
                      f"(ThinK, protection, MIES: O(d²)), {1e6 * sel['gram_seconds_per_head']:.1f}"
                      f" µs per head for the Grams, together {100 * sel['share_of_prefill']:.2f}% "
                      f"of the prefill ({j['prefill']['method_seconds']:.2f} s with selection, "
                      f"{j['prefill']['dense_seconds']:.2f} s dense). Profiled decode step: "
                      f"{1e3 * j['decode']['dense_step_seconds']:.2f} ms dense, "
                      f"{1e3 * j['decode']['method_step_seconds']:.2f} ms GRACE.", ""]
        loads = [x for b in res["bench"].values()
                 for x in (b["summary"]["load_average_before"], b["summary"]["load_average_after"])]
        L += [f"Machine: {os.cpu_count()} cores; 1-minute load average {min(loads):.1f} to "
              f"{max(loads):.1f} during these runs (in each row; a load above the core count "
              "means other jobs shared the cores and the timings are noisy).", ""]
    L += ["## Where the small model disagrees with the paper", ""]
    L += res.get("discussion") or ["Not yet known: the comparison needs the runs listed above "
                                   "as not run."]
    L.append("")
    tmp = args.page + ".tmp"
    with open(tmp, "w") as fh:
        fh.write("\n".join(L))
    os.replace(tmp, args.page)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--sparsim", default=os.path.join(here, "..", "..", "build", "bin", "sparsim"))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--corpus", default="default")
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--page", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--score", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--window", type=int, default=32, help="--kv-window")
    ap.add_argument("--lambdas", default=LAMBDAS_DEFAULT, help="in the order they are run")
    ap.add_argument("--retrieval-lengths", default="2048")
    ap.add_argument("--retrieval-depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--retrieval-samples", type=int, default=1)
    ap.add_argument("--bench-lambda", type=float, default=0.5)
    ap.add_argument("--bench-contexts", default="2048,8192")
    ap.add_argument("--bench-batches", default="1,8")
    ap.add_argument("--bench-reps", type=int, default=7)
    ap.add_argument("--bench-prefill", type=int, default=512)
    ap.add_argument("--collect-only", action="store_true")
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="start no new run after this many minutes (0: no limit)")
    ap.add_argument("--only", default="",
                    help="run only the queue entries whose names start with one of these "
                         "comma-separated prefixes (e.g. bench_ while other copies run the rest)")
    ap.add_argument("--note", default="", help="a paragraph for the top of the page")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    if not args.collect_only:
        t0 = time.time()
        for name, kind, cmd in queue(args):
            if args.max_minutes and time.time() - t0 > 60 * args.max_minutes:
                print("time limit reached: the rest is left for a later run", flush=True)
                break
            if args.only and not any(name.startswith(p) for p in args.only.split(",")):
                continue
            run(args, name, kind, cmd)
    res = collect(args)
    res["discussion"] = discussion(res)
    write_json(args.json, res)
    page(args, res)
    print(f"wrote {args.json} and {args.page}; not run: {len(res['missing'])}")


if __name__ == "__main__":
    sys.exit(main())
