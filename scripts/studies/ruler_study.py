#!/usr/bin/env python3
"""The generated long-context suite (`sparsim eval --task ruler`) on SmolLM2, every
configuration on the same seeded prompts; per-task exact-match accuracy with its 95% Wilson
interval, the prompt's KV bytes held against dense, and paired comparisons (exact McNemar test on
the items one configuration gets right and the other wrong).

    # dense, ThinK and GRACE at λ = 0.5 on all seven tasks
    scripts/studies/ruler_study.py --outdir /tmp/ruler --json docs/results/ruler/ruler_smollm2.json \\
        --page docs/ruler-results.md
    # matched budgets: ThinK, GRACE, StreamingLLM, H2O, SnapKV, PyramidKV, SnapKV ∘ GRACE at
    # 50% and 25% of the prompt's cache, Token Filtering and FLAP at 20% and 50%
    scripts/studies/ruler_study.py --study budgets --task ruler:niah --samples 30 --jobs 2 --threads 1 \\
        --models flap_r0.2=flap_020.gguf,flap_r0.5=flap_050.gguf --outdir /tmp/ruler-budgets \\
        --json docs/results/ruler_budgets/ruler_budgets_smollm2.json --page docs/ruler-budgets.md

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
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from atomic_file import write_json, write_page_keeping_hand_text  # noqa: E402


def methods(args):
    """Every configuration of the study: name, extra `sparsim eval` arguments, model (None: the
    study's --model) and group (configurations compared with each other: one budget or ratio)."""
    def cf(name, extra, group, model=None):
        return {"name": name, "extra": extra, "model": model, "group": group}
    out = [cf("dense", [], "dense")]
    if args.study == "kv":
        for m in ("think", "grace"):
            out.append(cf(f"{m}_l{args.kv_prune}", ["--method", m, "--kv-prune", str(args.kv_prune)],
                          "kv"))
        return out
    # budgets: every method at the same budgets of the prompt's cache. ThinK / GRACE prune key
    # channels (λ = 1 - b of the K cache: K at the budget, V whole); the evictors keep a share b
    # of the prompt's tokens (K and V); SnapKV ∘ GRACE is SnapKV at b with GRACE λ = 0.5 on the
    # kept tokens, the composition of the ThinK paper (channels pruned on top of a token budget)
    def budget(b):
        lam, g = round(1 - b, 4), f"budget {b}"
        out = [cf(f"think_l{lam}", ["--method", "think", "--kv-prune", str(lam)], g),
               cf(f"grace_l{lam}", ["--method", "grace", "--kv-prune", str(lam)], g)]
        for e in ("streaming", "h2o", "snapkv", "pyramidkv"):
            out.append(cf(f"{e}_b{b}", ["--evict", e, "--evict-budget", str(b)], g))
        out.append(cf(f"snapkv_b{b}+grace_l0.5", ["--evict", "snapkv", "--evict-budget", str(b),
                                                   "--method", "grace", "--kv-prune", "0.5"], g))
        return out
    # the first budget, then Token Filtering and the models, then the other budgets: a study
    # stopped early has whole comparisons
    out += budget(args.budgets[0])
    for k in args.snapkv_kernels:  # SnapKV's pooling kernel, at the first budget
        b = args.budgets[0]
        out.append(cf(f"snapkv_b{b}_k{k}", ["--evict", "snapkv", "--evict-budget", str(b),
                                            "--evict-kernel", str(k)], f"snapkv kernel, budget {b}"))
    for r in args.tf_ratios:
        out.append(cf(f"tf_r{r}", ["--method", "token-filter", "--tf-ratio", str(r),
                                   "--tf-drop-skipped"], f"ratio {r}"))
    for spec in args.models:  # NAME=PATH, NAME ending in _r<ratio> joins that ratio's group
        name, path = spec.split("=", 1)
        r = name.rsplit("_r", 1)[1] if "_r" in name else name
        out.append(cf(name, [], f"ratio {r}", model=path))
    for b in args.budgets[1:]:
        out += budget(b)
    return out


def command(args, c, js):
    return (["nice", "-n", "10", args.sparsim, "eval", "--model", c["model"] or args.model,
             "--corpus", args.corpus, "--no-perplexity", "--task", args.task, "--ruler-lengths", args.lengths,
             "--ruler-samples", str(args.samples), "--ruler-seed", str(args.seed),
             "--threads", str(args.threads), "--progress", "never", "--json", js] + c["extra"])


def kv_fraction(s):
    """Bytes of the prompt's keys and values held at the end of the run over the dense cache's:
    eviction (with channel pruning on the kept keys), channel pruning alone (K shrinks, V whole),
    Token Filtering's dropped tokens, a structurally pruned model's removed KV heads."""
    if "evict" in s:
        return s["evict"]["kv_bytes_fraction"]
    if "kv_prune" in s:
        return 0.5 * (1 + s["kv_prune"]["k_bytes"] / s["kv_prune"]["k_bytes_dense"])
    if "token_filter" in s and "kv_cache" in s["token_filter"]:
        return s["token_filter"]["kv_cache"]["held_peak_vs_dense_peak"]
    if "structured" in s:
        return s["structured"]["kv_bytes_fraction"]
    return 1.0


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


TASK_ORDER = ["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe",
              "fwe"]


def pairs(args, names, groups):
    """The pairs the study tests: every configuration against dense, and the configurations of
    one group (budget or ratio) against each other; in the kv study every pair. The SnapKV
    kernel arms are set against every configuration of their budget (SnapKV with its default
    kernel first)."""
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if args.study == "kv" or a == "dense" or groups[a] == groups[b]:
                out.append((a, b))
    for n in names:
        if groups[n].startswith("snapkv kernel"):
            base = f"snapkv_b{args.budgets[0]}"
            if base in names:
                out.append((base, n))
                out += [(m, n) for m in names if m != base and groups[m] == groups[base]]
    return out


def collect(args):
    res = {"settings": {"study": args.study, "model": args.model, "corpus": args.corpus,
                        "task": args.task, "lengths": args.lengths, "samples": args.samples,
                        "seed": args.seed, "threads": args.threads, "kv_prune": args.kv_prune,
                        "budgets": args.budgets, "tf_ratios": args.tf_ratios,
                        "snapkv_kernels": args.snapkv_kernels, "models": args.models,
                        "kv_defaults": "--kv-window 32, --kv-recent 32, --kv-guard off, "
                                       "--kv-protect 0.05,0.25",
                        "evict_defaults": "--evict-window 32, --evict-kernel 5, --evict-pool avg, "
                                          "--evict-sinks 4"},
           "runs": {}, "missing": [], "paired": []}
    items, groups = {}, {}
    for c in methods(args):
        name = c["name"]
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
        cells = [x for x in r["cells"] if x["depth"] is None]
        res["runs"][name] = {
            "command": " ".join(["sparsim"] + command(args, c, "OUT.json")[4:]),
            "group": c["group"],
            "accuracy": r["accuracy"], "items": r["items_total"],
            "ci95": wilson(sum(i["correct"] for i in r["items"]), r["items_total"]),
            "recall": sum(i["recall"] for i in r["items"]) / max(1, r["items_total"]),
            "by_task": by,
            "by_task_length": [{k: x[k] for k in ("task", "length", "items", "correct",
                                                  "accuracy", "recall")} for x in cells],
            "wall_seconds": s["wall_seconds"],
            "k_bytes_ratio": (s["kv_prune"]["k_bytes"] / s["kv_prune"]["k_bytes_dense"]
                              if "kv_prune" in s else 1.0),
            "kv_bytes_fraction": kv_fraction(s),
            "correct": [i["correct"] for i in r["items"]]}
        items[name] = {key(i): i["correct"] for i in r["items"]}
        groups[name] = c["group"]
        res["item_keys"] = [list(key(i)) for i in r["items"]]
    names = [c["name"] for c in methods(args) if c["name"] in items]
    tasks = sorted({k[0] for n in names for k in items[n]}, key=TASK_ORDER.index)
    for a, b in pairs(args, names, groups):
        common = sorted(set(items[a]) & set(items[b]))
        for t in tasks + ["all"]:
            ks = [k for k in common if t == "all" or k[0] == t]
            ab = sum(1 for k in ks if items[a][k] and not items[b][k])
            ba = sum(1 for k in ks if items[b][k] and not items[a][k])
            res["paired"].append({"a": a, "b": b, "task": t, "items": len(ks), "a_only": ab,
                                  "b_only": ba, "p_mcnemar_exact": mcnemar_exact(ab, ba)})
    res["tasks"] = tasks
    return res


def page(args, res):
    s = res["settings"]
    names = [c["name"] for c in methods(args) if c["name"] in res["runs"]]
    title = ("dense, ThinK and GRACE" if s["study"] == "kv" else
             "KV-cache methods at matched budgets, Token Filtering and FLAP")
    cmd = ("scripts/studies/ruler_study.py " + " ".join(
        [f"--study {s['study']}", f"--task {s['task']}", f"--lengths {s['lengths']}",
         f"--samples {s['samples']}", f"--seed {s['seed']}"] +
        ([f"--budgets {','.join(map(str, s['budgets']))}",
          f"--tf-ratios {','.join(map(str, s['tf_ratios']))}",
          f"--snapkv-kernels {','.join(map(str, s['snapkv_kernels']))}"] +
         ([f"--models {','.join(s['models'])}"] if s["models"] else [])
         if s["study"] == "budgets" else [f"--kv-prune {s['kv_prune']}"]) +
        [f"--outdir DIR --json {os.path.relpath(args.json)} --page {os.path.relpath(args.page)}"]))
    L = [f"# The generated long-context suite on SmolLM2-135M: {title}", "",
         f"Generated by `scripts/studies/ruler_study.py` from the run summaries in its `--outdir`; every "
         f"number below is in `{os.path.relpath(args.json)}`. The suite: "
         "[eval.md](eval.md#generated-long-context-suite---task-rulersubset); ThinK and GRACE: "
         "[k-channel-pruning.md](k-channel-pruning.md); eviction: [eviction.md](eviction.md); Token Filtering: "
         "[token-filter.md](token-filter.md); FLAP: [flap.md](flap.md).", "",
         "## Settings", "",
         f"- model `{s['model']}` (SmolLM2-135M-Instruct, Q4_1 dequantized to f32), corpus "
         f"`{s['corpus']}`, {s['threads']} thread(s) per run (results are the same for any "
         "thread count);",
         f"- suite `--task {s['task']}` at length(s) {s['lengths']}, {s['samples']} samples per "
         f"(task, length) cell, seed {s['seed']}: every configuration sees the same prompts;"]
    if s["study"] == "kv":
        L.append(f"- ThinK / GRACE: λ = {s['kv_prune']} of the key channels pruned per head after "
                 f"each prompt's prefill; {s['kv_defaults']} (the defaults).")
    else:
        L += [f"- budgets {', '.join(pct(b) for b in s['budgets'])} of the prompt's cache: ThinK "
              "and GRACE `think_l<λ>` / `grace_l<λ>` prune λ = 1 − budget of the key channels of "
              f"every head ({s['kv_defaults']}: the last 32 prompt keys stay whole), so the K cache "
              "is at the budget and V is whole; the evictors `<policy>_b<budget>` keep that share "
              f"of the prompt's tokens in every KV head ({s['evict_defaults']}); "
              "`snapkv_b<budget>+grace_l0.5` is SnapKV at the budget with GRACE λ = 0.5 on the "
              "kept keys, as the ThinK paper stacks channel pruning on a token budget;",
              "- `snapkv_b<budget>_k<k>`: SnapKV with pooling kernel k instead of 5;",
              "- `tf_r<r>`: Token Filtering at ratio r (tail layers, its defaults) with "
              "`--tf-drop-skipped`, so skipped tokens leave the gated layers' caches; "
              "`flap_r<r>`: the FLAP model pruned at ratio r (`--models`: NAME=PATH, made by "
              "`sparsim prune --method flap --ratio r`, as in [tf-baselines.md](tf-baselines.md)).",
              "- KV bytes: the prompt's keys and values held at the end over the dense cache "
              "(eviction: kept tokens, keys at their pruned width; ThinK/GRACE: (K share + 1)/2; "
              "Token Filtering: held peak over dense peak; FLAP: its KV heads over the dense "
              "model's)."]
    L += ["", f"Command: `{cmd}` (each run's `sparsim` command line is in the JSON, `command`).",
          ""]
    if res["missing"]:
        L += ["**Did not run**: " + ", ".join(f"`{m}`" for m in res["missing"]), ""]
    tasks = res["tasks"]
    L += ["## Accuracy per task", "",
          "Exact match (every answer of an item in the greedy continuation, as a whole word); "
          "for all items, in brackets the 95% Wilson interval; recall is the mean share of an "
          "item's answers found.", "",
          "| configuration | " + " | ".join(tasks) + " | all | recall | KV bytes | wall s |",
          "|---|" + "---|" * (len(tasks) + 4)]
    for m in names:
        r = res["runs"][m]
        ci = r["ci95"]
        L.append(f"| {m} | " + " | ".join(f"{r['by_task'][t]['accuracy']:.2f}" for t in tasks) +
                 f" | {sum(r['correct']) / r['items']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] | "
                 f"{r['recall']:.2f} | {r['kv_bytes_fraction']:.3f} | {r['wall_seconds']:.0f} |")
    n_items = res["runs"][names[0]]["items"] if names else 0
    L += ["", f"Items per task: {n_items // max(1, len(tasks))}; all: {n_items}.", "",
          "## Paired comparisons", "",
          "For each pair, over all items: the items only the first configuration gets right, "
          "those only the second gets right, and the two-sided exact McNemar p-value (binomial "
          "on the discordant items). Per-task counts are in the JSON (`paired`).", "",
          "| pair | items | first only | second only | p |", "|---|---|---|---|---|"]
    for p in res["paired"]:
        if p["task"] == "all":
            L.append(f"| {p['a']} vs {p['b']} | {p['items']} | {p['a_only']} | {p['b_only']} | "
                     f"{p['p_mcnemar_exact']:.3f} |")
    L += ["", "## What the numbers show", ""] + res["discussion"] + [""]
    write_page_keeping_hand_text(args.page, "\n".join(L),
                                 "<!-- ruler_study: generated above, written by hand below -->")


def discussion(res):
    out = []
    sig = [p for p in res["paired"] if p["task"] == "all" and p["p_mcnemar_exact"] < 0.05]
    n_all = len([p for p in res["paired"] if p["task"] == "all"])
    if sig:
        out.append(f"- Over all items, {len(sig)} of the {n_all} tested pairs differ at the 5% "
                   "level (not corrected for the number of tests): " +
                   "; ".join(f"{p['a'] if p['a_only'] > p['b_only'] else p['b']} ahead of "
                             f"{p['b'] if p['a_only'] > p['b_only'] else p['a']} "
                             f"({max(p['a_only'], p['b_only'])}:{min(p['a_only'], p['b_only'])}, "
                             f"p = {p['p_mcnemar_exact']:.3g})" for p in sig) + ".")
    else:
        out.append(f"- Over all items, none of the {n_all} tested pairs differs at the 5% level.")
    st = [p for p in res["paired"] if p["task"] != "all" and p["p_mcnemar_exact"] < 0.05]
    if st:
        out.append("- Per task, a difference at the 5% level (not corrected for the "
                   f"{len([p for p in res['paired'] if p['task'] != 'all'])} tests): " +
                   "; ".join(f"{p['task']} {p['a']} vs {p['b']} ({p['a_only']}:{p['b_only']}, "
                             f"p = {p['p_mcnemar_exact']:.3g})" for p in st) + ".")
    else:
        out.append("- No single task shows a difference at the 5% level between any tested "
                   "pair.")
    dense = res["runs"].get("dense")
    if dense:
        zero = [t for t in res["tasks"] if dense["by_task"][t]["correct"] == 0]
        if zero:
            out.append("- The dense model solves no item of " + ", ".join(zero) + " at these "
                       "lengths: those tasks cannot rank the configurations on this model by "
                       "exact match (recall still can).")
    return out


def pct(x):
    return f"{100 * x:.0f}%"


def run_one(args, c):
    js = os.path.join(args.outdir, c["name"] + ".json")
    cmd = command(args, c, js)
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(js + ".log", "w") as fh:
        fh.write(" ".join(cmd) + "\n" + r.stdout)
    return c["name"], r.returncode, time.time() - t0, r.stdout[-3000:]


def floats(x):
    return [float(v) for v in x.split(",") if v]


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
    ap.add_argument("--study", choices=("kv", "budgets"), default="kv",
                    help="kv: dense, ThinK and GRACE at --kv-prune; budgets: every KV-cache "
                         "method at --budgets, Token Filtering at --tf-ratios, --models")
    ap.add_argument("--task", default="ruler", help="the eval task: ruler or ruler:<subset>")
    ap.add_argument("--lengths", default="1024")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="threads of each sparsim run")
    ap.add_argument("--jobs", type=int, default=1, help="sparsim runs at once")
    ap.add_argument("--kv-prune", type=float, default=0.5, help="kv study: ThinK/GRACE λ")
    ap.add_argument("--budgets", default="0.5,0.25", help="budgets study: shares of the cache")
    ap.add_argument("--tf-ratios", default="0.2,0.5", help="budgets study: Token Filtering r")
    ap.add_argument("--snapkv-kernels", default="9", help="budgets study: SnapKV pooling kernels "
                    "besides the default 5, at the first budget")
    ap.add_argument("--models", default="", help="budgets study: NAME=PATH,... pruned models "
                    "(a NAME ending in _r<ratio> is compared with Token Filtering at that ratio)")
    ap.add_argument("--collect-only", action="store_true")
    args = ap.parse_args()
    args.budgets, args.tf_ratios = floats(args.budgets), floats(args.tf_ratios)
    args.snapkv_kernels = [int(k) for k in args.snapkv_kernels.split(",") if k]
    args.models = [m for m in args.models.split(",") if m]
    for b in args.budgets + args.tf_ratios:
        if not 0 < b <= 1:
            sys.exit(f"budgets and ratios must be in (0, 1], got {b}")
    for m in args.models:
        if "=" not in m or not os.path.exists(m.split("=", 1)[1]):
            sys.exit(f"--models: '{m}' is not NAME=PATH of an existing model file")
    if not args.task.startswith("ruler"):
        sys.exit(f"--task must be ruler or ruler:<subset>, got '{args.task}'")
    os.makedirs(args.outdir, exist_ok=True)
    if not args.collect_only:
        todo = [c for c in methods(args)
                if not os.path.exists(os.path.join(args.outdir, c["name"] + ".json"))]
        failed = []
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
            for name, rc, sec, tail in ex.map(lambda c: run_one(args, c), todo):
                print(f"{name}: {sec:.0f} s" + ("" if rc == 0 else f", failed ({rc})"), flush=True)
                if rc != 0:
                    failed.append(f"{name} failed ({rc}):\n{tail}")
        if failed:
            sys.exit("\n".join(failed))
    res = collect(args)
    res["discussion"] = discussion(res)
    write_json(args.json, res)
    page(args, res)
    print(f"wrote {args.json} and {args.page}; missing: {len(res['missing'])}")


if __name__ == "__main__":
    main()
