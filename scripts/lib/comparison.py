"""Methods against dense on the same windows: the comparison `scripts/main_job.sh` prints and
the report page (scripts/report.py page) leads with.

Every number comes from the run files (HDF5, read with h5py) and, for the predicted speedup,
from `sparsim predict` on each run's ledger:

  perplexity        exp(total NLL / scored tokens); its 95% interval exp(mean ± 1.96 se) of the
                    windows' per-token NLL (the interval of `sparsim eval`)
  Δ NLL / token     paired over the windows both runs scored: mean of (method − dense) per
                    window, its 95% interval (t quantile over the windows) and the exact
                    two-sided sign-flip p-value of the mean difference
  target, realised  what each method family aims at and what it did: Token Filtering's skip ratio,
                    ThinK/GRACE's pruned K-channel fraction λ against the K-cache bytes saved,
                    RAP/KVPruner's pruned KV fraction 1 − ρ against the pruned fraction of the
                    model's channels, activation sparsity's target against its realised mean
  FLOPs, bytes      1 − realised / the dense run's realised (the ledgers' totals, same tokens)
  KV cache          the run's KV-cache bytes per token over the dense model's
  speedup           the dense run's predicted time over the run's on a hardware profile
"""
import itertools
import json
import math
import os
import subprocess

import numpy as np

# two-sided 95% t quantiles, degrees of freedom 1..30 (beyond: 1.96)
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042]


class CompareError(Exception):
    pass


def attr(g, k, default=None):
    """Attribute k of an HDF5 object as a Python value (str, int, float, array), or default."""
    v = g.attrs.get(k, default)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        return v.item()
    return v


class Entry:
    """One run file's side of the comparison."""

    def __init__(self, path, label=None):
        import h5py

        if not os.path.exists(path):
            raise CompareError(f"run file '{path}' does not exist")
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise CompareError(f"cannot read run file '{path}': {e}")
        with f:
            if "run" not in f or "model" not in f:
                raise CompareError(f"'{path}' is not a sparsim run file (no /run or /model group)")
            self.path = path
            m = f["model"]
            self.fingerprint = attr(m, "fingerprint", "?")
            self.model_name = attr(m, "name", "?")
            self.pruned = None
            if "pruned" in f:
                g = f["pruned"]
                self.pruned = {k: attr(g, k) for k in ("method", "retain", "retain_realised",
                                                        "orphan_ratio", "kv_bytes_fraction",
                                                        "source_fingerprint")}
                self.pruned["pairs"] = np.asarray(g["pairs"][()])
                self.pruned["qk_head_dim"] = np.asarray(g["qk_head_dim"][()])
                self.pruned["v_head_dim"] = np.asarray(g["v_head_dim"][()])
            # the model a pruned model was cut from is the model it is compared on
            self.model_id = self.pruned["source_fingerprint"] if self.pruned else self.fingerprint
            self.n_kv_head = int(attr(m, "n_kv_head", 0) or 0)
            self.head_dim = int(attr(m, "head_dim", 0) or 0)
            cfg = f["config"] if "config" in f else None
            self.method = attr(cfg, "method", "dense") if cfg is not None else "dense"
            self.protocol = tuple(attr(cfg, k, None) for k in ("context", "stride", "score", "bos")) \
                if cfg is not None else None
            self.corpus = attr(f["corpus"], "fingerprint", None) if "corpus" in f else None
            self.windows = None
            if "results" in f and "perplexity" in f["results"]:
                g = f["results/perplexity"]
                self.window_nll = np.asarray(g["window_nll"][()], dtype=float)
                self.window_tokens = np.asarray(g["window_tokens"][()], dtype=float)
                self.window_start = np.asarray(g["window_start"][()])
                self.windows = len(self.window_nll)
            self.flops = self.bytes = None
            if "flops" in f:
                self.flops = float(attr(f["flops"], "total_flops_realised"))
                self.bytes = float(attr(f["flops"], "total_bytes_realised"))
            self.families = []
            self.tf = self.kv = self.sparsity = None
            if "token_filter" in f:
                g = f["token_filter"]
                self.tf = {k: attr(g, k) for k in ("target", "realised", "criterion", "layer_set")}
                for k in ("layers", "realised_per_layer", "target_per_layer"):
                    self.tf[k] = np.asarray(g[k][()])
                self.families.append("tf")
            if "kv_prune" in f:
                g = f["kv_prune"]
                self.kv = {k: attr(g, k) for k in ("method", "lambda", "head_dim", "recent")}
                for k in ("k_bytes", "k_bytes_dense", "kept_count", "selections"):
                    self.kv[k] = np.asarray(g[k][()], dtype=float)
                self.families.append("kv")
            if "sparsity" in f and "target" in f["sparsity"].attrs:
                g = f["sparsity"]
                self.method = attr(g, "method", self.method)
                self.sparsity = {"target": float(attr(g, "target")),
                                 "realised": float(attr(g, "realised_mean",
                                                         attr(g, "realised", float("nan"))))}
                self.families.append("sparsity")
            if self.pruned:
                self.families.append("pruned")
        self.label = label or self.default_label()

    def default_label(self):
        parts = []
        if self.pruned:
            parts.append(f"{self.pruned['method']} ρ={self.pruned['retain']:g}")
        if self.sparsity:
            parts.append(f"{self.method.split('+')[0]} s={self.sparsity['target']:g}")
        if self.tf:
            parts.append(f"token-filter r={self.tf['target']:g}")
        if self.kv:
            parts.append(f"{self.kv['method']} λ={self.kv['lambda']:g}")
        return " + ".join(parts) if parts else "dense"

    @property
    def is_dense(self):
        return not self.families

    def nll_per_token(self):
        return self.window_nll / self.window_tokens

    def perplexity(self):
        return math.exp(self.window_nll.sum() / self.window_tokens.sum())

    def ppl_interval(self):
        x = self.nll_per_token()
        se = x.std(ddof=1) / math.sqrt(len(x)) if len(x) > 1 else float("nan")
        return math.exp(x.mean() - 1.96 * se), math.exp(x.mean() + 1.96 * se)

    def target_realised(self):
        """[(what, target, realised)] of each family the run has."""
        out = []
        if self.sparsity:
            out.append(("activation sparsity", self.sparsity["target"], self.sparsity["realised"]))
        if self.tf:
            out.append(("skip ratio", self.tf["target"], self.tf["realised"]))
        if self.kv:
            out.append(("K channels pruned / K bytes saved", self.kv["lambda"],
                        1.0 - self.kv["k_bytes"].sum() / self.kv["k_bytes_dense"].sum()))
        if self.pruned:
            out.append(("KV channels pruned", 1.0 - self.pruned["retain"],
                        1.0 - self.pruned["retain_realised"]))
        return out

    def kv_fraction(self):
        """KV-cache bytes per token over the dense model's (K and V caches of equal size)."""
        frac = 1.0
        if self.pruned:
            frac = float(self.pruned["kv_bytes_fraction"])
        if self.kv:
            k = self.kv["k_bytes"].sum() / self.kv["k_bytes_dense"].sum()
            frac *= 0.5 * (k + 1.0)
        return frac


def paired(d):
    """Mean of the paired differences d, its 95% t interval and the exact sign-flip p-value."""
    n = len(d)
    mean = float(d.mean())
    if n < 2:
        return mean, (float("nan"), float("nan")), float("nan")
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * d.std(ddof=1) / math.sqrt(n)
    a = np.abs(d)
    if n <= 16:
        signs = np.array(list(itertools.product((-1.0, 1.0), repeat=n)))
    else:  # a fixed, seeded sample of sign patterns
        signs = np.random.default_rng(0).choice((-1.0, 1.0), size=(65536, n))
    stats = np.abs((signs * a).mean(axis=1))
    p = float((stats >= abs(mean) - 1e-15).mean())
    return mean, (mean - half, mean + half), p


def predict(sparsim, path, hardware):
    cmd = [sparsim, "predict", path, "--hardware", hardware, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise CompareError(f"{' '.join(cmd)} failed: {p.stderr.strip() or p.stdout.strip()}")
    return json.loads(p.stdout)


def compare(entries, baseline=None, hardware=None, sparsim=None):
    """The comparison rows against the baseline (default: the first dense run), and the runs that
    cannot be compared with it (different model, corpus or windows), each with the reason."""
    if baseline is None:
        dense = [e for e in entries if e.is_dense]
        if not dense:
            raise CompareError("no dense run among the inputs to compare the methods with")
        baseline = dense[0]
    if baseline.windows is None or baseline.flops is None:
        raise CompareError(f"{baseline.path}: the baseline has no perplexity windows or no ledger")
    skipped, rows = [], []
    base_pred = predict(sparsim, baseline.path, hardware) if hardware else None
    for e in entries:
        why = None
        if e.model_id != baseline.model_id:
            why = (f"model {e.model_id} is not the baseline's model {baseline.model_id} "
                   f"(nor pruned from it)")
        elif e.corpus != baseline.corpus:
            why = f"corpus {e.corpus} is not the baseline's corpus {baseline.corpus}"
        elif e.windows is None:
            why = "no perplexity windows"
        elif e.protocol != baseline.protocol or not np.array_equal(e.window_start, baseline.window_start):
            why = (f"other windows (context, stride, score, bos = {e.protocol}, {e.windows} windows) "
                   f"than the baseline's ({baseline.protocol}, {baseline.windows} windows)")
        if why:
            skipped.append({"path": e.path, "label": e.label, "why": why})
            continue
        lo, hi = e.ppl_interval()
        d = e.nll_per_token() - baseline.nll_per_token()
        mean, ci, p = paired(d)
        row = {
            "label": e.label, "path": e.path, "method": e.method, "families": e.families,
            "perplexity": e.perplexity(), "perplexity_ci95": [lo, hi],
            "windows": int(e.windows), "tokens_scored": int(e.window_tokens.sum()),
            "delta_nll_per_token": mean, "delta_nll_ci95": list(ci), "delta_nll_p": p,
            "per_window_delta_nll": [float(x) for x in d],
            "target_realised": [{"what": w, "target": t, "realised": r} for w, t, r in e.target_realised()],
            "flops_saved": 1.0 - e.flops / baseline.flops,
            "bytes_saved": 1.0 - e.bytes / baseline.bytes,
            "kv_cache_fraction": e.kv_fraction(),
            "baseline": e is baseline,
        }
        if hardware:
            pr = base_pred if e is baseline else predict(sparsim, e.path, hardware)
            row["predicted_seconds"] = pr["seconds"]
            row["predicted_speedup"] = base_pred["seconds"] / pr["seconds"]
            row["hardware"] = hardware
        rows.append(row)
    return {"baseline": baseline.path, "hardware": hardware, "rows": rows, "not_compared": skipped}


def table(result):
    """The comparison as (head, rows of strings)."""
    hw = result.get("hardware")
    head = ["method", "perplexity [95% CI]", "Δ NLL/token vs dense [95% CI], p", "target → realised",
            "FLOPs saved", "bytes saved", "KV cache"]
    if hw:
        head.append(f"{hw} speedup (predicted)")
    out = []
    for r in result["rows"]:
        tr = "; ".join(f"{x['what']} {x['target']:.2f} → {x['realised']:.3f}" for x in r["target_realised"]) or "-"
        delta = "-" if r["baseline"] else (
            f"{r['delta_nll_per_token']:+.4f} [{r['delta_nll_ci95'][0]:+.4f}, {r['delta_nll_ci95'][1]:+.4f}], "
            f"p={r['delta_nll_p']:.3g}")
        cells = [r["label"], f"{r['perplexity']:.3f} [{r['perplexity_ci95'][0]:.2f}, {r['perplexity_ci95'][1]:.2f}]",
                 delta, tr, f"{100 * r['flops_saved']:.1f}%", f"{100 * r['bytes_saved']:.1f}%",
                 f"{100 * r['kv_cache_fraction']:.1f}%"]
        if hw:
            cells.append(f"{r['predicted_speedup']:.3f}×")
        out.append(cells)
    return head, out


def text_table(result):
    head, rows = table(result)
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(cells))
    return "\n".join([line(head), line(["-" * x for x in w])] + [line(r) for r in rows])


# ----------------------------------------------------------------------------- figures
def fig_quality_cost(result, outdir, save_fig, plt):
    """Perplexity (95% interval over windows) against the cost that remains, one point per run."""
    rows = result["rows"]
    if len(rows) < 2:
        return None
    use_time = bool(result.get("hardware"))
    fig, ax = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    for i, r in enumerate(rows):
        x = 1.0 / r["predicted_speedup"] if use_time else 1.0 - r["flops_saved"]
        y, (lo, hi) = r["perplexity"], r["perplexity_ci95"]
        ax.errorbar([x], [y], yerr=[[y - lo], [hi - y]], fmt="o", capsize=4, color=f"C{i}", label=r["label"])
        ax.annotate(r["label"], (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xlabel(f"predicted time on {result['hardware']} / dense" if use_time else "realised FLOPs / dense")
    ax.set_ylabel("perplexity (95% interval over windows)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    name = "compare_quality_cost.png"
    save_fig(fig, os.path.join(outdir, name))
    return name


def fig_families(entries, result, outdir, save_fig, plt):
    """Realised against target per layer, one panel per method family a compared run has.
    Returns [(file, caption)]."""
    compared = {r["path"] for r in result["rows"]}
    out = []
    for i, e in enumerate(x for x in entries if x.path in compared):
        if e.tf:
            fig, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
            ax.plot(e.tf["layers"], e.tf["realised_per_layer"], "o-", label="realised skip ratio")
            ax.plot(e.tf["layers"], e.tf["target_per_layer"], "r--", label="target per gated layer")
            ax.set_xlabel("layer")
            ax.set_ylabel("tokens whose attention is skipped")
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            ax.set_title(f"{e.label}: skip ratio per gated layer")
            name = f"compare_tf_{i}.png"
            save_fig(fig, os.path.join(outdir, name))
            out.append((name, f"{e.label}: the share of tokens whose attention Token Filtering skipped in "
                              f"each gated layer (dots) against the per-layer target that gives the overall "
                              f"ratio {e.tf['target']:g} (dashed); layers not shown run dense."))
        if e.kv:
            kc, sel = e.kv["kept_count"], np.maximum(e.kv["selections"], 1)
            freq = kc / sel[:, :, None]
            L, H, D = freq.shape
            fig, (a0, a1) = plt.subplots(1, 2, figsize=(12, 4), layout="constrained",
                                         gridspec_kw={"width_ratios": [3, 1]})
            im = a0.imshow(freq.reshape(L, H * D), aspect="auto", cmap="viridis", vmin=0, vmax=1,
                           interpolation="nearest")
            for h in range(1, H):
                a0.axvline(h * D - 0.5, color="white", lw=0.8)
            a0.set_xlabel(f"K channel (KV heads side by side, {D} each)")
            a0.set_ylabel("layer")
            fig.colorbar(im, ax=a0, label="share of selections that kept it")
            kf = e.kv["k_bytes"] / np.maximum(e.kv["k_bytes_dense"], 1)
            a1.plot(kf, np.arange(L), "o-", ms=3, label="K bytes kept (realised)")
            a1.axvline(1 - e.kv["lambda"], color="r", ls="--", label=f"1 − λ = {1 - e.kv['lambda']:g}")
            a1.invert_yaxis()
            a1.set_xlim(0, 1.05)
            a1.set_xlabel("K-cache bytes / dense")
            a1.legend(fontsize=7)
            a1.grid(alpha=0.3)
            fig.suptitle(f"{e.label}: kept K channels per layer and head")
            name = f"compare_kv_{i}.png"
            save_fig(fig, os.path.join(outdir, name))
            out.append((name, f"{e.label}: left, how often each K channel of each layer and KV head was kept "
                              f"over the run's prefills (bright: always); right, the K-cache bytes kept per "
                              f"layer against 1 − λ (the last {e.kv['recent']} prompt keys stay at full width, "
                              f"so the realised saving is below λ)."))
        if e.pruned:
            p = e.pruned
            kept = p["qk_head_dim"] * e.n_kv_head
            L, full = len(kept), e.n_kv_head * e.head_dim
            fig, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
            ax.bar(np.arange(L), kept, color="C0", label="K channels kept (all KV heads)")
            ax.plot(np.arange(L), p["v_head_dim"] * e.n_kv_head, "k_", ms=10, label="V channels kept")
            ax.axhline(p["retain"] * full, color="r", ls="--", label=f"ρ × full = {p['retain']:g} × {full}")
            ax.set_ylim(0, full * 1.05)
            ax.set_xlabel("layer")
            ax.set_ylabel("channels kept")
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=8)
            ax.set_title(f"{e.label}: kept K and V channels per layer (full: {full})")
            name = f"compare_pruned_{i}.png"
            save_fig(fig, os.path.join(outdir, name))
            out.append((name, f"{e.label}: K channels (bars; {p['method']} keeps "
                              f"{'whole RoPE pairs' if p['method'] == 'rap' else 'single channels'}) and V "
                              f"channels (ticks) kept per layer over all KV heads, against the share ρ of the "
                              f"full model (dashed): the budgets follow the Fisher scores, so layers differ "
                              f"while the model keeps ρ overall."))
    return out
