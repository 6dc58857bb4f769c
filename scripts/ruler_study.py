#!/usr/bin/env python3
"""The generated long-context suite (`sparsim eval --task ruler`) on SmolLM2: dense, ThinK and
GRACE on the same seeded prompts; per-task exact-match accuracy with its 95% Wilson interval and
paired comparisons (exact McNemar test on the items one method gets right and the other wrong).

    scripts/ruler_study.py --outdir /tmp/ruler --json docs/results/ruler_smollm2.json \\
        --page docs/ruler-results.md

Each run's JSON summary goes to --outdir (an existing one is reused, so an interrupted study
continues); the committed JSON keeps the settings, the commands, the per-task numbers, the
paired tests and every item's correctness per method (enough to redo the tests).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time


def methods(args):
    out = [("dense", [])]
    for m in ("think", "grace"):
        out.append((f"{m}_l{args.kv_prune}", ["--method", m, "--kv-prune", str(args.kv_prune)]))
    return out


def command(args, extra, js):
    return (["nice", "-n", "10", args.sparsim, "eval", "--model", args.model, "--corpus",
             args.corpus, "--no-perplexity", "--task", "ruler", "--ruler-lengths", args.lengths,
             "--ruler-samples", str(args.samples), "--ruler-seed", str(args.seed),
             "--threads", str(args.threads), "--progress", "never", "--json", js] + extra)


def wilson(k, n, z=1.959963984540054):
    """95% Wilson score interval of k successes in n."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, c - h), min(1.0, c + h)]


def mcnemar_exact(b, c):
    """Two-sided exact McNemar p-value: b, c the discordant counts (binomial, p = 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2 * tail)


def key(it):
    return (it["task"], it["length"], it["sample"])


def collect(args):
    res = {"settings": {"model": args.model, "corpus": args.corpus, "lengths": args.lengths,
                        "samples": args.samples, "seed": args.seed, "threads": args.threads,
                        "kv_prune": args.kv_prune,
                        "kv_defaults": "--kv-window 32, --kv-recent 32, --kv-guard off, "
                                       "--kv-protect 0.05,0.25"},
           "runs": {}, "missing": [], "paired": []}
    items = {}
    for name, extra in methods(args):
        js = os.path.join(args.outdir, name + ".json")
        if not os.path.exists(js):
            res["missing"].append(name)
            continue
        with open(js) as fh:
            s = json.load(fh)
        r = s["ruler"]
        by = {}
        for t, v in r["by_task"].items():
            by[t] = {"items": v["items"], "correct": v["correct"], "accuracy": v["accuracy"],
                     "ci95": wilson(v["correct"], v["items"]), "recall": v["recall"]}
        cells = [c for c in r["cells"] if c["depth"] is None]
        res["runs"][name] = {
            "command": " ".join(["sparsim"] + command(args, extra, "OUT.json")[4:]),
            "accuracy": r["accuracy"], "items": r["items_total"],
            "ci95": wilson(sum(i["correct"] for i in r["items"]), r["items_total"]),
            "by_task": by,
            "by_task_length": [{k: c[k] for k in ("task", "length", "items", "correct",
                                                  "accuracy", "recall")} for c in cells],
            "wall_seconds": s["wall_seconds"],
            "k_bytes_ratio": (s["kv_prune"]["k_bytes"] / s["kv_prune"]["k_bytes_dense"]
                              if "kv_prune" in s else 1.0),
            "correct": [i["correct"] for i in r["items"]]}
        items[name] = {key(i): i["correct"] for i in r["items"]}
        res["item_keys"] = [list(key(i)) for i in r["items"]]
    names = [n for n, _ in methods(args) if n in items]
    tasks = sorted({k[0] for n in names for k in items[n]},
                   key=lambda t: ["niah_single", "niah_multikey", "niah_multivalue",
                                  "niah_multiquery", "vt", "cwe", "fwe"].index(t))
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = sorted(set(items[a]) & set(items[b]))
            for t in tasks + ["all"]:
                ks = [k for k in common if t == "all" or k[0] == t]
                ab = sum(1 for k in ks if items[a][k] and not items[b][k])
                ba = sum(1 for k in ks if items[b][k] and not items[a][k])
                res["paired"].append({"a": a, "b": b, "task": t, "items": len(ks),
                                      "a_only": ab, "b_only": ba,
                                      "p_mcnemar_exact": mcnemar_exact(ab, ba)})
    res["tasks"] = tasks
    return res


def pct(x):
    return f"{100 * x:.0f}%"


def page(args, res):
    s = res["settings"]
    names = [n for n, _ in methods(args) if n in res["runs"]]
    L = ["# The generated long-context suite on SmolLM2-135M: dense, ThinK and GRACE", "",
         "Generated by `scripts/ruler_study.py` from the run summaries in its `--outdir`; every "
         "number below is in `docs/results/ruler_smollm2.json`. The suite: "
         "[eval.md](eval.md#generated-long-context-suite---task-rulersubset); ThinK and GRACE: "
         "[kv-prune.md](kv-prune.md).", "",
         "## Settings", "",
         f"- model `{s['model']}` (SmolLM2-135M-Instruct, Q4_1 dequantized to f32), corpus "
         f"`{s['corpus']}`, {s['threads']} threads;",
         f"- suite: all seven tasks at length(s) {s['lengths']}, {s['samples']} samples per "
         f"(task, length) cell, seed {s['seed']}: every method sees the same prompts;",
         f"- ThinK / GRACE: λ = {s['kv_prune']} of the key channels pruned per head after each "
         f"prompt's prefill; {s['kv_defaults']} (the defaults).", "",
         "Command: `scripts/ruler_study.py --outdir DIR --json docs/results/ruler_smollm2.json "
         "--page docs/ruler-results.md` (each run's `sparsim` command line is in the JSON, "
         "`command`).", ""]
    if res["missing"]:
        L += ["**Did not run**: " + ", ".join(f"`{m}`" for m in res["missing"]), ""]
    L += ["## Accuracy per task", "",
          "Exact match (every answer of an item in the greedy continuation, as a whole word); "
          "in brackets the 95% Wilson interval of the item count.", "",
          "| task | items | " + " | ".join(names) + " |",
          "|---|---|" + "---|" * len(names)]
    for t in res["tasks"] + ["all"]:
        row = []
        n = None
        for m in names:
            r = res["runs"][m]
            if t == "all":
                k, n, ci = sum(r["correct"]), r["items"], r["ci95"]
            else:
                b = r["by_task"][t]
                k, n, ci = b["correct"], b["items"], b["ci95"]
            row.append(f"{k / n:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]")
        L.append(f"| {t} | {n} | " + " | ".join(row) + " |")
    L += ["", "Recall (mean share of an item's answers found):", "",
          "| task | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for t in res["tasks"]:
        L.append(f"| {t} | " + " | ".join(f"{res['runs'][m]['by_task'][t]['recall']:.2f}"
                                           for m in names) + " |")
    L += ["", "K-cache bytes at the end of the run over the dense layout: " +
          ", ".join(f"{m} {res['runs'][m]['k_bytes_ratio']:.3f}" for m in names) +
          "; wall seconds: " + ", ".join(f"{m} {res['runs'][m]['wall_seconds']:.0f}"
                                         for m in names) + ".", ""]
    L += ["## Paired comparisons", "",
          "For each pair, the items only the first method gets right, those only the second "
          "gets right, and the two-sided exact McNemar p-value (binomial on the discordant "
          "items).", "",
          "| pair | task | items | first only | second only | p |", "|---|---|---|---|---|---|"]
    for p in res["paired"]:
        L.append(f"| {p['a']} vs {p['b']} | {p['task']} | {p['items']} | {p['a_only']} | "
                 f"{p['b_only']} | {p['p_mcnemar_exact']:.3f} |")
    L += ["", "## What the numbers show", ""] + discussion(res) + [""]
    tmp = args.page + ".tmp"
    with open(tmp, "w") as fh:
        fh.write("\n".join(L))
    os.replace(tmp, args.page)


def discussion(res):
    out = []
    for p in res["paired"]:
        if p["task"] != "all":
            continue
        d = p["a_only"] + p["b_only"]
        sig = p["p_mcnemar_exact"] < 0.05
        out.append(f"- {p['a']} vs {p['b']}, all {p['items']} items: {p['a_only']} right only "
                   f"with {p['a']}, {p['b_only']} only with {p['b']} (exact McNemar p = "
                   f"{p['p_mcnemar_exact']:.3f}): "
                   + (f"{p['a'] if p['a_only'] > p['b_only'] else p['b']} is ahead at the 5% "
                      "level." if sig else
                      "no difference at the 5% level" + (" (no discordant item)." if d == 0
                                                          else ".")))
    sig_tasks = [p for p in res["paired"] if p["task"] != "all" and p["p_mcnemar_exact"] < 0.05]
    if sig_tasks:
        out.append("- Per task, a difference at the 5% level (not corrected for the "
                   f"{len([p for p in res['paired'] if p['task'] != 'all'])} tests): " +
                   "; ".join(f"{p['task']} {p['a']} vs {p['b']} ({p['a_only']}:{p['b_only']}, "
                             f"p = {p['p_mcnemar_exact']:.3f})" for p in sig_tasks) + ".")
    else:
        out.append("- No single task shows a difference at the 5% level between any two "
                   "methods.")
    dense = next((r for n, r in res["runs"].items() if n == "dense"), None)
    if dense:
        zero = [t for t in res["tasks"] if dense["by_task"][t]["correct"] == 0]
        if zero:
            out.append("- The dense model solves no item of " + ", ".join(zero) + " at these "
                       "lengths: those tasks cannot rank the methods on this model.")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--sparsim", default=os.path.join(here, "..", "build", "bin", "sparsim"))
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--corpus", default="default")
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--page", required=True)
    ap.add_argument("--lengths", default="1024")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-prune", type=float, default=0.5)
    ap.add_argument("--collect-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    if not args.collect_only:
        for name, extra in methods(args):
            js = os.path.join(args.outdir, name + ".json")
            if os.path.exists(js):
                continue
            cmd = command(args, extra, js)
            print(" ".join(cmd), flush=True)
            t0 = time.time()
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                sys.exit(f"{name} failed ({r.returncode}):\n{r.stdout[-3000:]}")
            print(f"{name}: {time.time() - t0:.0f} s", flush=True)
    res = collect(args)
    res["discussion"] = discussion(res)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    tmp = args.json + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(res, fh, indent=1)
    os.replace(tmp, args.json)
    page(args, res)
    print(f"wrote {args.json} and {args.page}; missing: {len(res['missing'])}")


if __name__ == "__main__":
    main()
