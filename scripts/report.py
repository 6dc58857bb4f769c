#!/usr/bin/env python3
"""sparsim's report generator: run files, sweep tables and validation summaries into pages with
figures (HTML for people, Markdown for docs/), and the plot of `sparsim profile --plot`.

    scripts/report.py page RUN.h5 [RUN2.h5 ...] [--table results.csv] [--validation V.json]
                      [--hardware h200 --sparsim build/bin/sparsim] --out DIR [--title T]
    scripts/report.py sensitivity-plot PROFILE.h5 --png OUT.png
    scripts/report.py validation-page V.json --page docs/cost-validation.md --figures docs/figures

`page` writes DIR/index.html and its figures (DIR/*.png), a folder that is complete on its own:
  - FLOP accounting of every run with a ledger (/flops): stacked bars per op, dense against
    realised, FLOPs and bytes per token of each phase;
  - realised against target sparsity per layer and projection (/sparsity): the distribution over
    tokens from the run's histograms (median, quartiles, 5-95%), the target beside it;
  - per-token realised sparsity traces (/sparsity/token_sparsity);
  - sensitivity profiles e_i and the block budgets (run files of `sparsim profile`);
  - predicted against measured time (run files of `sparsim bench --out`, or --validation);
  - a sweep's results table (--table CSV or JSON): each numeric column against --x, one line per
    --group.
With --hardware NAME (repeatable) every run with a ledger is also predicted on that profile by
`sparsim predict` (--sparsim gives the binary).

Every file is written to a temporary name and renamed into place. Inputs that are not what a
figure needs (no ledger, an older schema) are reported and skipped; a run file that cannot be
read at all is an error.
"""
import argparse
import json
import math
import os
import shlex
import sys
import tempfile
from datetime import datetime, timezone

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from atomic_file import atomic_write, umask_mode  # noqa: E402
import comparison  # noqa: E402
from comparison import attr  # noqa: E402

try:
    import h5py
    import jinja2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
except ImportError as e:  # pragma: no cover - what the user sees without the venv
    sys.exit(f"report.py: {e}; run it with the Python environment scripts/setup.sh makes "
             f"(~/.cache/sparsim-deps/venv/bin/python)")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PROJ = ["q", "k", "v", "o", "gate", "up", "down"]


class InputError(Exception):
    pass


# ----------------------------------------------------------------------------- small helpers
def s(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def save_fig(fig, path):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".png", dir=d)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", metadata={"Software": "sparsim report.py"})
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def command_line():
    return " ".join(shlex.quote(a) for a in ["scripts/report.py"] + sys.argv[1:])


def op_colors(names):
    cmap = plt.get_cmap("tab20")
    return {n: cmap(i % 20) for i, n in enumerate(names)}


def fmt_num(v, digits=4):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, (int, np.integer)):
        return f"{v:,}"
    a = abs(v)
    if a != 0 and (a >= 1e5 or a < 1e-3):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}"


# ----------------------------------------------------------------------------- run files
class Run:
    """What a run file holds, read with h5py (independently of sparsim's own reader)."""

    def __init__(self, path, label):
        self.path, self.label = path, label
        if not os.path.exists(path):
            raise InputError(f"run file '{path}' does not exist")
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise InputError(f"cannot read run file '{path}': {e}")
        with f:
            if "run" not in f:
                raise InputError(f"'{path}' is not a sparsim run file (no /run group)")
            run = f["run"]
            self.schema = int(run.attrs["schema_version"]) if "schema_version" in run.attrs else 1
            self.command = attr(run, "command", "")
            self.model = attr(f["model"], "name", "?") if "model" in f else "?"
            self.storage = attr(f["model"], "storage", "") if "model" in f else ""
            self.method = "dense"
            if "config" in f and "method" in f["config"].attrs:
                self.method = attr(f["config"], "method")
            if "sparsity" in f and "method" in f["sparsity"].attrs:
                self.method = attr(f["sparsity"], "method")
            self.ledger = self._ledger(f) if "flops" in f else None
            self.sparsity = self._sparsity(f["sparsity"]) if "sparsity" in f else None
            self.profile = self._profile(f["profile"]) if "profile" in f and "sensitivity" in f["profile"] else None
            self.op_times = self._op_times(f["op_times"]) if "op_times" in f else None

    def _ledger(self, f):
        g = f["flops"]
        L = {
            "phases": [s(x) for x in g["phases"][()]],
            "ops": [s(x) for x in g["ops"][()]],
            "layers": [int(x) for x in g["layer_index"][()]],
        }
        for k in ("flops_dense", "flops_realised", "bytes_dense", "bytes_realised", "launches"):
            L[k] = np.asarray(g[k][()], dtype=float)
        L["tokens"] = {p: int(g.attrs.get(f"{p}_tokens", 0)) for p in L["phases"]}
        L["calls"] = {p: int(g.attrs.get(f"{p}_calls", 0)) for p in L["phases"]}
        return L

    def _sparsity(self, g):
        out = {"target_overall": float(g.attrs.get("target", float("nan")))}
        for k in ("target", "realised_mean", "histogram", "token_sparsity", "tokens"):
            if k in g:
                out[k] = np.asarray(g[k][()])
        out["projections"] = [s(x) for x in g["projections"][()]] if "projections" in g else PROJ
        return out

    def _profile(self, g):
        return {
            "probe_levels": np.asarray(g["probe_levels"][()]),
            "sensitivity": np.asarray(g["sensitivity"][()]),
            "sparsity": np.asarray(g["sparsity"][()]) if "sparsity" in g else np.zeros(0),
            "budgets": np.asarray(g["budgets"][()]) if "budgets" in g else np.zeros((0, 0)),
            "variant": attr(g, "variant", ""),
            "lambda": float(g["budgets"].attrs.get("lambda", float("nan"))) if "budgets" in g else float("nan"),
        }

    def _op_times(self, g):
        return {
            "phases": [s(x) for x in g["phases"][()]],
            "ops": [s(x) for x in g["ops"][()]],
            "op_seconds": np.asarray(g["op_seconds"][()]),
            "timer": [s(x) for x in g["timer"][()]],
            "calls": np.asarray(g["calls"][()]),
            "call_seconds_median": np.asarray(g["call_seconds_median"][()]),
        }


def ledger_by_op(L, phase):
    """Per op of one phase: summed over layers."""
    p = L["phases"].index(phase)
    rows = []
    for o, name in enumerate(L["ops"]):
        v = {k: float(L[k][p, o].sum()) for k in ("flops_dense", "flops_realised", "bytes_dense", "bytes_realised", "launches")}
        if any(v.values()):
            v["op"] = name
            v["overhead"] = v["flops_dense"] == 0 and v["bytes_dense"] == 0
            rows.append(v)
    return rows


# ----------------------------------------------------------------------------- figures
def fig_flops(runs, outdir, key):
    """Stacked bars per op, dense against realised, per token of each phase."""
    with_ledger = [r for r in runs if r.ledger]
    if not with_ledger:
        return None
    phases = []
    for r in with_ledger:
        for p in r.ledger["phases"]:
            if r.ledger["tokens"].get(p, 0) > 0 and p not in phases:
                phases.append(p)
    if not phases:
        return None
    ops = []
    for r in with_ledger:
        for p in phases:
            if p in r.ledger["phases"]:
                for row in ledger_by_op(r.ledger, p):
                    if row["op"] not in ops:
                        ops.append(row["op"])
    colors = op_colors(ops)
    unit, scale = ("GFLOP per token", 1e-9) if key == "flops" else ("MB per token", 1e-6)
    fig, axes = plt.subplots(1, len(phases), figsize=(max(6, 2.2 * len(with_ledger) + 3) * len(phases) * 0.8, 4.8),
                             squeeze=False, layout="constrained")
    for ax, phase in zip(axes[0], phases):
        labels, x = [], 0
        for r in with_ledger:
            if phase not in r.ledger["phases"] or r.ledger["tokens"].get(phase, 0) == 0:
                continue
            tok = r.ledger["tokens"][phase]
            rows = {row["op"]: row for row in ledger_by_op(r.ledger, phase)}
            for which in ("dense", "realised"):
                bottom = 0.0
                for op in ops:
                    v = rows.get(op, {}).get(f"{key}_{which}", 0.0) * scale / tok
                    if v > 0:
                        ax.bar(x, v, bottom=bottom, color=colors[op], edgecolor="white", linewidth=0.3,
                               hatch="//" if rows.get(op, {}).get("overhead") else None)
                        bottom += v
                labels.append(f"{r.label} {which}")
                x += 1
            x += 0.5
        ticks = []
        xx = 0
        for r in with_ledger:
            if phase not in r.ledger["phases"] or r.ledger["tokens"].get(phase, 0) == 0:
                continue
            ticks += [xx, xx + 1]
            xx += 2.5
        ax.set_xticks(ticks)
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(unit)
        ax.set_title(f"{phase}: {'FLOPs' if key == 'flops' else 'memory traffic'} per token")
        ax.grid(axis="y", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[o]) for o in ops]
    fig.legend(handles, ops, loc="outside right center", fontsize=8,
               title="op (hatched: added by the method)", title_fontsize=8)
    name = f"flops_{key}.png"
    save_fig(fig, os.path.join(outdir, name))
    return name


def hist_quantiles(h, qs):
    """Quantiles of a 100-bin histogram over [0, 1] (mass spread evenly in each bin)."""
    h = np.asarray(h, dtype=float)
    tot = h.sum()
    if tot <= 0:
        return [float("nan")] * len(qs)
    c = np.concatenate([[0.0], np.cumsum(h)]) / tot
    edges = np.linspace(0.0, 1.0, len(h) + 1)
    return [float(np.interp(q, c, edges)) for q in qs]


def fig_sparsity(run, outdir, idx):
    sp = run.sparsity
    if sp is None or "histogram" not in sp:
        return None
    H = sp["histogram"]  # [L][P][bins]
    T = sp.get("target")
    Lyr, P = H.shape[0], H.shape[1]
    fig, axes = plt.subplots(2, 4, figsize=(15, 6.5), sharex=True, sharey=True)
    layers = np.arange(Lyr)
    for i in range(P):
        ax = axes.flat[i]
        q = np.array([hist_quantiles(H[l, i], [0.05, 0.25, 0.5, 0.75, 0.95]) for l in range(Lyr)])
        ax.fill_between(layers, q[:, 0], q[:, 4], color="tab:blue", alpha=0.15, label="5-95%")
        ax.fill_between(layers, q[:, 1], q[:, 3], color="tab:blue", alpha=0.35, label="quartiles")
        ax.plot(layers, q[:, 2], color="tab:blue", lw=1.4, label="median (realised)")
        if T is not None:
            ax.plot(layers, T[:, i], "o", color="tab:red", ms=3, label="target p_i")
        ax.set_title(sp["projections"][i] if i < len(sp["projections"]) else str(i))
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    ax = axes.flat[7]
    ax.axis("off")
    h, l = axes.flat[0].get_legend_handles_labels()
    ax.legend(h, l, loc="center", fontsize=9)
    for a in axes[1]:
        a.set_xlabel("layer")
    for a in axes[:, 0]:
        a.set_ylabel("realised sparsity")
    fig.suptitle(f"{run.label}: realised sparsity over tokens per layer and projection ({run.method}, "
                 f"target {sp['target_overall']:.2f})")
    name = f"sparsity_{idx}.png"
    save_fig(fig, os.path.join(outdir, name))
    return name


def fig_token_trace(run, outdir, idx):
    sp = run.sparsity
    if sp is None or "token_sparsity" not in sp or len(sp["token_sparsity"]) == 0:
        return None
    t = np.asarray(sp["token_sparsity"], dtype=float)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 3.8), gridspec_kw={"width_ratios": [3, 1]})
    a1.plot(np.arange(len(t)), t, lw=0.6, color="tab:blue", label="per token")
    w = max(1, len(t) // 50)
    if w > 1:
        r = np.convolve(t, np.ones(w) / w, mode="valid")
        a1.plot(np.arange(w - 1, len(t)), r, color="black", lw=1.2, label=f"mean of {w}")
    if math.isfinite(sp["target_overall"]):
        a1.axhline(sp["target_overall"], color="tab:red", ls="--", lw=1, label="target")
    a1.set_xlabel("masked token (order of the run)")
    a1.set_ylabel("realised sparsity (FLOP-weighted)")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    a2.hist(t, bins=40, color="tab:blue", alpha=0.8, orientation="horizontal")
    a2.set_xlabel("tokens")
    a2.grid(alpha=0.3)
    fig.suptitle(f"{run.label}: realised sparsity per token ({run.method})")
    name = f"tokens_{idx}.png"
    save_fig(fig, os.path.join(outdir, name))
    return name


def sensitivity_figure(profile, title):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    L = profile["sensitivity"].shape[1]
    layers = np.arange(L)
    for i, lv in enumerate(profile["probe_levels"]):
        a1.plot(layers, profile["sensitivity"][i], marker="o", ms=3, label=f"s̄ = {lv:g}")
    a1.set_xlabel("layer")
    a1.set_ylabel("sensitivity e_i")
    a1.set_title("block sensitivity")
    a1.grid(alpha=0.3)
    if len(profile["probe_levels"]):
        a1.legend(fontsize=8)
    B = profile["budgets"]
    for j, sv in enumerate(profile["sparsity"]):
        a2.plot(layers, B[j], marker="s", ms=3, label=f"s = {sv:g}")
        a2.axhline(sv, color="gray", lw=0.6, ls=":")
    a2.set_xlabel("layer")
    a2.set_ylabel("block budget s_i")
    a2.set_title(f"budgets (λ = {profile['lambda']:g})" if math.isfinite(profile["lambda"]) else "budgets")
    a2.set_ylim(0, 1)
    a2.grid(alpha=0.3)
    if len(profile["sparsity"]):
        a2.legend(fontsize=8)
    fig.suptitle(title)
    return fig


def fig_measured(run, outdir, idx, prediction):
    """Predicted (from sparsim predict's validation) against measured per timer."""
    if prediction is None or "validation" not in prediction:
        return None
    v = prediction["validation"]["per_op"]
    phases = [p for p in ("prefill", "decode") if any(e["phase"] == p for e in v)]
    fig, axes = plt.subplots(1, len(phases), figsize=(7 * len(phases), 4.2), squeeze=False)
    for ax, phase in zip(axes[0], phases):
        rows = [e for e in v if e["phase"] == phase and (e["measured_seconds_per_call"] > 0 or e["predicted_seconds_per_call"] > 0)]
        names = ["+".join(e["ops"]) if len(e["ops"]) < 3 else e["timer"] + " (+)" for e in rows]
        x = np.arange(len(rows))
        ax.bar(x - 0.2, [e["predicted_seconds_per_call"] * 1e3 for e in rows], 0.4, label="predicted")
        ax.bar(x + 0.2, [e["measured_seconds_per_call"] * 1e3 for e in rows], 0.4, label="measured")
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
        ax.set_ylabel("ms per call")
        ax.set_title(f"{phase}")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{run.label}: predicted ({prediction['hardware']['name']}) against measured per op")
    name = f"measured_{idx}.png"
    save_fig(fig, os.path.join(outdir, name))
    return name


def fig_validation(val, outdir, name="validation.png"):
    rows = val["rows"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    mk = {"prefill": "o", "decode": "s"}
    for r in rows:
        for ph in ("prefill", "decode"):
            e = r["phases"].get(ph)
            if not e:
                continue
            ax.loglog(e["measured_seconds_per_call"] * 1e3, e["predicted_seconds_per_call"] * 1e3, mk[ph],
                      label=f"{r['label']} {ph}")
    lo = min(min(r["phases"][p]["measured_seconds_per_call"] for p in r["phases"]) for r in rows) * 1e3 * 0.7
    hi = max(max(r["phases"][p]["measured_seconds_per_call"] for p in r["phases"]) for r in rows) * 1e3 * 1.4
    xs = np.array([lo, hi])
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs * 0.75, xs * 1.25, color="gray", alpha=0.2, label="±25%")
    ax.set_xlabel("measured ms per call (median)")
    ax.set_ylabel("predicted ms per call")
    from matplotlib.ticker import NullFormatter
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("whole call: predicted against measured")
    save_fig(fig, os.path.join(outdir, name))
    return name


def fig_table(df, x, group, outdir, source):
    num = [c for c in df.columns if c not in (x, group) and pd.api.types.is_numeric_dtype(df[c])]
    if x not in df.columns or not num:
        return None
    n = len(num)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, c in zip(axes.flat, num):
        groups = df.groupby(group) if group in df.columns else [("all", df)]
        for g, d in groups:
            d = d.sort_values(x)
            ax.plot(d[x], d[c], marker="o", ms=3, label=str(g))
        ax.set_xlabel(x)
        ax.set_title(c, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"{os.path.basename(source)}: each column against {x}")
    name = f"table_{abs(hash(source)) % 10**8}.png"
    save_fig(fig, os.path.join(outdir, name))
    return name


# ----------------------------------------------------------------------------- predictions
def run_predict(sparsim, path, hardware):
    try:
        return comparison.predict(sparsim, path, hardware)
    except comparison.CompareError as e:
        raise InputError(str(e))


def default_sparsim():
    for c in (os.environ.get("SPARSIM_BINARY"), os.path.join(REPO, "build", "bin", "sparsim")):
        if c and os.path.exists(c):
            return c
    return "sparsim"


# ----------------------------------------------------------------------------- pages
PAGE = jinja2.Template(r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title|e }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f3f3f3; } figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #eee; }
code { font-size: 0.85em; background: #f6f6f6; padding: 0 0.2em; } .note { color: #555; font-size: 0.9em; }
</style></head><body>
<h1>{{ title|e }}</h1>
<p class="note">Made by <code>{{ command|e }}</code> at {{ when }}. Inputs:</p>
<ul>{% for r in runs %}<li><b>{{ r.label|e }}</b> <code>{{ r.path|e }}</code>: {{ r.model|e }}, {{ r.storage|e }} weights, method {{ r.method|e }}; <code>{{ r.command|e }}</code></li>{% endfor %}
{% for t in tables %}<li>table <code>{{ t.path|e }}</code> ({{ t.rows }} rows)</li>{% endfor %}
{% if validation %}<li>validation summary <code>{{ validation_path|e }}</code></li>{% endif %}</ul>
{% for w in warnings %}<p class="note">skipped: {{ w|e }}</p>{% endfor %}
{% for sec in sections %}
<h2>{{ sec.title|e }}</h2>
{% if sec.text %}<p class="note">{{ sec.text|e }}</p>{% endif %}
{% for tbl in sec.tables %}<table><tr>{% for h in tbl.head %}<th>{{ h|e }}</th>{% endfor %}</tr>
{% for row in tbl.rows %}<tr>{% for c in row %}<td{% if loop.index > tbl.left %} class="n"{% endif %}>{{ c|e }}</td>{% endfor %}</tr>{% endfor %}</table>{% endfor %}
{% for f in sec.figures %}<figure><img src="{{ f.file|e }}" alt="{{ f.caption|e }}"><figcaption class="note">{{ f.caption|e }}</figcaption></figure>{% endfor %}
{% endfor %}
</body></html>
""")


def flops_table(runs):
    head = ["run", "phase", "tokens", "GFLOP dense", "GFLOP realised", "saved", "MB dense", "MB realised",
            "overhead GFLOP"]
    rows = []
    for r in runs:
        if not r.ledger:
            continue
        for p in r.ledger["phases"]:
            ops = ledger_by_op(r.ledger, p)
            if not ops:
                continue
            fd = sum(o["flops_dense"] for o in ops)
            fr = sum(o["flops_realised"] for o in ops)
            bd = sum(o["bytes_dense"] for o in ops)
            br = sum(o["bytes_realised"] for o in ops)
            ov = sum(o["flops_realised"] for o in ops if o["overhead"])
            rows.append([r.label, p, fmt_num(r.ledger["tokens"].get(p, 0)), fmt_num(fd * 1e-9), fmt_num(fr * 1e-9),
                         f"{100 * (1 - fr / fd):.1f}%" if fd else "-", fmt_num(bd * 1e-6), fmt_num(br * 1e-6),
                         fmt_num(ov * 1e-9)])
    return {"head": head, "rows": rows, "left": 2}


def prediction_table(preds):
    head = ["run", "hardware", "prefill tok/s", "decode tok/s", "speedup prefill", "speedup decode"]
    rows = []
    for label, p in preds:
        sp = p["speedup_vs_dense"]
        rows.append([label, p["hardware"]["name"], fmt_num(p["prefill_tokens_per_s"]), fmt_num(p["decode_tokens_per_s"]),
                     fmt_num(sp.get("prefill")), fmt_num(sp.get("decode"))])
    return {"head": head, "rows": rows, "left": 2}


def validation_tables(val):
    head = ["configuration", "phase", "predicted ms/call", "measured ms/call", "error"]
    rows = []
    for r in val["rows"]:
        for ph in ("prefill", "decode"):
            e = r["phases"].get(ph)
            if e:
                rows.append([r["label"], ph, fmt_num(e["predicted_seconds_per_call"] * 1e3),
                             fmt_num(e["measured_seconds_per_call"] * 1e3), f"{100 * e['error']:+.1f}%"])
    return [{"head": head, "rows": rows, "left": 2}]


def cmd_page(a):
    outdir = a.out
    os.makedirs(outdir, exist_ok=True)
    runs, warnings = [], []
    for i, p in enumerate(a.runs):
        label = chr(ord("A") + i) if i < 26 else f"R{i}"
        r = Run(p, label)
        if r.schema < 2:
            warnings.append(f"{p}: run-file schema {r.schema} (older than 2); its ledger has no token counts")
        runs.append(r)
    sections = []
    comparison_section(a, runs, outdir, sections, warnings)
    # FLOP accounting
    figs = []
    for key in ("flops", "bytes"):
        f = fig_flops(runs, outdir, key)
        if f:
            figs.append({"file": f, "caption": f"{'FLOPs' if key == 'flops' else 'Bytes'} per token of each phase, "
                                                 f"dense against realised, stacked by op (hatched: ops a dense run does not have)."})
    if figs:
        sections.append({"title": "FLOP accounting", "text": "From each run's /flops ledger (sums over layers).",
                         "tables": [flops_table(runs)], "figures": figs})
    for r in runs:
        if r.ledger is None and r.profile is None:
            warnings.append(f"{r.path}: no FLOP ledger (/flops) and no sensitivity profile")
    # predictions
    preds = []
    sparsim = a.sparsim or default_sparsim()
    for hw in a.hardware or []:
        for r in runs:
            if r.ledger is not None and r.schema >= 2:
                preds.append((r.label, run_predict(sparsim, r.path, hw)))
    if preds:
        sections.append({"title": "Predicted time", "text": f"sparsim predict ({sparsim}) on each run's ledger.",
                         "tables": [prediction_table(preds)], "figures": []})
    # measured against predicted (bench --out runs) on --measured-hardware
    if a.measured_hardware:
        figs, tabs = [], []
        for i, r in enumerate(runs):
            if r.op_times is None:
                continue
            pred = run_predict(sparsim, r.path, a.measured_hardware)
            f = fig_measured(r, outdir, i, pred)
            if f:
                figs.append({"file": f, "caption": f"{r.label}: predicted on {a.measured_hardware} against the per-op times of the same run (bench --out)."})
        if figs:
            sections.append({"title": "Predicted against measured", "text": "", "tables": tabs, "figures": figs})
    # sparsity
    for i, r in enumerate(runs):
        figs = []
        f = fig_sparsity(r, outdir, i)
        if f:
            figs.append({"file": f, "caption": f"{r.label}: median, quartiles and 5-95% of the realised sparsity over tokens (from /sparsity/histogram) per layer, target p_i in red."})
        f = fig_token_trace(r, outdir, i)
        if f:
            figs.append({"file": f, "caption": f"{r.label}: realised sparsity of every masked token in the order of the run, and its distribution."})
        if figs:
            sections.append({"title": f"Sparsity: {r.label} ({r.method})", "text": "", "tables": [], "figures": figs})
    # sensitivity profiles
    for i, r in enumerate(runs):
        if r.profile is not None:
            name = f"sensitivity_{i}.png"
            save_fig(sensitivity_figure(r.profile, f"{r.label}: block sensitivity ({r.profile['variant']} model)"),
                     os.path.join(outdir, name))
            sections.append({"title": f"Sensitivity profile: {r.label}", "text": "e_i per layer at each probe level, and the block budgets it implies.",
                             "tables": [], "figures": [{"file": name, "caption": f"{r.label}: sensitivity e_i and budgets s_i"}]})
    # tables
    tables = []
    for t in a.table or []:
        try:
            df = pd.read_csv(t) if t.endswith(".csv") else pd.json_normalize(json.load(open(t)), record_path=a.record_path) if a.record_path else pd.DataFrame(json.load(open(t)))
        except Exception as e:
            raise InputError(f"cannot read table '{t}': {e}")
        tables.append({"path": t, "rows": len(df)})
        f = fig_table(df, a.x, a.group, outdir, t)
        head = list(df.columns)
        rows = [[fmt_num(v) if isinstance(v, (float, int, np.floating, np.integer)) else str(v) for v in row] for row in df.itertuples(index=False)]
        sections.append({"title": f"Table {os.path.basename(t)}", "text": "",
                         "tables": [{"head": head, "rows": rows[:200], "left": 0}],
                         "figures": [{"file": f, "caption": f"{t}: each numeric column against {a.x}"}] if f else []})
    # validation summary
    val = None
    if a.validation:
        val = json.load(open(a.validation))
        f = fig_validation(val, outdir)
        sections.append({"title": "Cost model: predicted against measured", "text": val.get("what", ""),
                         "tables": validation_tables(val), "figures": [{"file": f, "caption": "whole call, ±25% band"}] if f else []})
    if not sections:
        raise InputError("nothing to report: no input holds a ledger, sparsity records, a sensitivity profile, a table or a validation summary")
    page = PAGE.render(title=a.title, command=command_line(), when=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                       runs=runs, tables=tables, validation=val, validation_path=a.validation, warnings=warnings,
                       sections=sections)
    atomic_write(os.path.join(outdir, "index.html"), page)
    nfig = sum(len(sec["figures"]) for sec in sections)
    print(f"wrote {os.path.join(outdir, 'index.html')} with {nfig} figures")


def comparison_section(a, runs, outdir, sections, warnings):
    """The page's first section when it has a dense run and at least one method on the same model
    and windows: the comparison table, quality against cost, realised against target per family."""
    # eval runs: a ledger and perplexity windows (forward, bench and profile runs are not compared)
    entries = [e for e in (comparison.Entry(r.path) for r in runs if r.ledger is not None)
               if e.windows is not None]
    for r in runs:
        for e in entries:
            if e.path == r.path:
                e.label = f"{r.label}: {e.label}"
    if len(entries) < 2:
        return None
    models = sorted({e.model_id for e in entries})
    corpora = sorted({str(e.corpus) for e in entries})
    if len(models) > 1:
        warnings.append("the runs are of different models (fingerprints " + ", ".join(models) +
                        "; a pruned model counts as the model it was cut from): only runs of the baseline's "
                        "model are compared")
    if len(corpora) > 1:
        warnings.append("the runs scored different corpora (fingerprints " + ", ".join(corpora) +
                        "): only runs on the baseline's corpus and windows are compared")
    base = None
    if a.baseline:
        base = next((e for e in entries if os.path.samefile(e.path, a.baseline)), None)
        if base is None:
            raise InputError(f"--baseline {a.baseline} is not one of the run files")
    elif not any(e.is_dense for e in entries):
        return None
    hw = (a.hardware or [None])[0]
    try:
        res = comparison.compare(entries, base, hw, a.sparsim or default_sparsim())
    except comparison.CompareError as e:
        raise InputError(str(e))
    for sk in res["not_compared"]:
        warnings.append(f"not compared with the baseline: {sk['label']} ({sk['path']}): {sk['why']}")
    if len(res["rows"]) < 2:
        return res
    head, rows = comparison.table(res)
    figs = []
    f = comparison.fig_quality_cost(res, outdir, save_fig, plt)
    if f:
        figs.append({"file": f, "caption": "Quality against cost: each run's perplexity with its 95% interval over "
                                           "windows, against " + (f"its predicted time on {hw}" if hw else "its realised FLOPs") +
                                           " relative to dense (1.0). Lower and further left is better."})
    for name, cap in comparison.fig_families(entries, res, outdir, save_fig, plt):
        figs.append({"file": name, "caption": cap})
    base_label = next(r["label"] for r in res["rows"] if r["baseline"])
    sections.append({"title": "Methods against dense",
                     "text": f"Every run against {base_label} on the same windows "
                             f"({res['rows'][0]['windows']} windows, {res['rows'][0]['tokens_scored']} scored tokens each run). "
                             "Δ NLL/token: paired over windows (t interval, exact sign-flip p). "
                             "Target → realised: what each family aims at and what it did. FLOPs and bytes saved: "
                             "against the dense run's ledger. KV cache: bytes per token over dense. "
                             + (f"Speedup: sparsim predict on {hw} (prefill of these windows)." if hw else ""),
                     "tables": [{"head": head, "rows": rows, "left": 1}], "figures": figs})
    if a.comparison_json:
        atomic_write(a.comparison_json, json.dumps(res, indent=1) + "\n")
    return res


def cmd_compare(a):
    try:
        entries = [comparison.Entry(p) for p in a.runs]
        base = comparison.Entry(a.baseline) if a.baseline else None
        if base is not None:
            entries = [base] + [e for e in entries if not os.path.samefile(e.path, base.path)]
        res = comparison.compare(entries, base, a.hardware, a.sparsim or default_sparsim())
    except comparison.CompareError as e:
        raise InputError(str(e))
    print(comparison.text_table(res))
    for sk in res["not_compared"]:
        print(f"not compared: {sk['label']} ({sk['path']}): {sk['why']}")
    if a.json:
        atomic_write(a.json, json.dumps(res, indent=1) + "\n")


def cmd_sensitivity_plot(a):
    r = Run(a.run, "")
    if r.profile is None:
        raise InputError(f"'{a.run}' holds no sensitivity profile (/profile/sensitivity): it is not a run file of sparsim profile")
    fig = sensitivity_figure(r.profile, f"Block sensitivity ({r.profile['variant']} model)")
    save_fig(fig, a.png)


def md_table(head, rows):
    out = "| " + " | ".join(head) + " |\n|" + "|".join("---" for _ in head) + "|\n"
    for r in rows:
        out += "| " + " | ".join(str(c) for c in r) + " |\n"
    return out


def config_loads(val, row):
    """The 1-minute load averages before and after each bench invocation of one configuration
    (validate_cost_model.py records them in order, two per invocation)."""
    i = val["rows"].index(row)
    n = 2 * val["runs"]
    la = val.get("loads", [])[i * n:(i + 1) * n]
    return _span(la) if la else "-"


def validation_findings(val):
    """Figures behind the discussion, computed from the summary: what profiling adds to a call, and
    the streaming rates the roofline assumes against those the probe measured for sparsim's GEMV."""
    out = []
    ov = {}
    for ph in ("prefill", "decode"):
        ov[ph] = [e["profiled_seconds_per_call"] / e["measured_seconds_per_call"] - 1 for r in val["rows"]
                  for p, e in r["phases"].items() if p == ph and e.get("profiled_seconds_per_call")
                  and e.get("measured_seconds_per_call")]
    if ov["prefill"] or ov["decode"]:
        out.append(f"- Profiling itself: a profiled call (a fence and a clock read after every kernel) takes "
                   f"{_span(ov['prefill'], '{:+.0f}', 100)}% (prefill) and {_span(ov['decode'], '{:+.0f}', 100)}% "
                   f"(decode) of the unprofiled call's time, within the run-to-run noise for prefill. In decode "
                   f"the fences and clock reads fall on several hundred short kernels a step and are charged to "
                   f"the small elementwise ops (norms, RoPE, SwiGLU, residual updates, the embedding), which take "
                   f"microseconds each: their large per-op errors say more about the timing than about the model, "
                   f"and together they are a few percent of a step.")
    m = val["machine"]
    if m.get("gemv_bandwidth") and m.get("memory_bandwidth"):
        out.append(f"- Streaming roof: decode projections are predicted at W = "
                   f"{m['memory_bandwidth'] / 1e9:.3g} GB/s (the faster of the probe's copy and read bandwidth); "
                   f"the probe's run of sparsim's own decode GEMV over weights of the same size reached "
                   f"{m['gemv_bandwidth'] / 1e9:.3g} GB/s ({m['gemv_bandwidth'] / m['memory_bandwidth']:.2f} of W), "
                   f"so the model is optimistic by about that factor on every weight stream before any other "
                   f"effect.")
    # the same kernel in every configuration: how far the machine's state alone moves an error
    lm = [(r["label"], e["error"]) for r in val["rows"] for e in r["per_op"]
          if e["phase"] == "decode" and e["timer"] == "lm_head" and e["error"] is not None]
    if len(lm) > 1:
        out.append(f"- The machine's state: the LM head runs the same kernel on the same weights in every "
                   f"configuration, and its decode error still ranges {_span([x for _, x in lm], '{:+.0f}', 100)}% "
                   f"across them. The probe ran at the lowest load of the session "
                   f"({val['loads'][0]:.1f}), the runs at up to {val['load_max']:.1f}: CPU time leaves out waiting "
                   f"for a core but not the memory bandwidth other jobs take, so memory-bound ops run slower than "
                   f"the probe's roofs as the load rises. The whole-call misses of the rotated methods' decode "
                   f"(their runs came last, at the highest load) are of this size plus the rotation's and mask "
                   f"selection's own shortfall below.")
    dense = next((r for r in val["rows"] if r["method"] == "dense"), None)
    if dense:
        sp = []
        for r in val["rows"]:
            if r is dense or "decode" not in r["phases"] or "decode" not in dense["phases"]:
                continue
            meas = dense["phases"]["decode"]["measured_seconds_per_call"] / r["phases"]["decode"]["measured_seconds_per_call"]
            pred = r["predicted_speedup_vs_dense"].get("decode")
            if pred:
                sp.append(f"{r['label']} {pred:.2f}× predicted, {meas:.2f}× measured")
        if sp:
            out.append("- Decode speedup over dense: " + "; ".join(sp) + ". The ledger scales each masked "
                       "projection's weight stream by its kept fraction, which is what the column-skipping GEMV "
                       "reads; the prediction misses where the sparse kernel runs below the streaming roof and where "
                       "the added ops (mask selection, the rotation) cost more than their bytes.")
    gpu = val.get("gpu")
    if gpu and gpu.get("rows"):
        h = gpu["profiles"][-1]
        dec = {e["gpu_run"]: e["predicted"][h]["decode_tokens_per_s"] / e["measured_decode_tokens_per_s"]
               for e in gpu["rows"] if h in e["predicted"]}
        pre = [e["predicted"][h]["prefill_tokens_per_s"] / e["measured_prefill_tokens_per_s"]
               for e in gpu["rows"] if h in e["predicted"] and e["measured_prefill_tokens_per_s"]]
        ops = [v for k, v in dec.items() if k.endswith("_ops")]
        meth = [v for e in gpu["rows"] for k, v in dec.items() if k == e["gpu_run"] and e["what"] not in
                ("dense, op by op", "dense, fused decode blocks", "dense, fused + CUDA graphs")]
        out.append(f"- On the {gpu['gpu']} the model is optimistic throughout (`{h}`: prefill "
                   f"{_span(pre)}×, dense op-by-op decode {_span(ops)}×, the methods' decode {_span(meth)}× the "
                   f"measured tokens/s). SmolLM2 is far too small for an H200: its decode is bound by kernel "
                   f"launches in the model, and the op-by-op path measures more than twice the profile's launch cost "
                   f"per kernel (a launch measured back to back is cheaper than one followed by a small kernel that "
                   f"must finish before the next starts). The methods' decode on the GPU adds per-token selection "
                   f"work and host synchronisation the ledger does not count as launches, hence the larger ratio. "
                   f"Prefill reaches well under half of the fp32 GEMM roof the profile assumes. These GPU numbers "
                   f"come from an older commit than this machine's runs and a longer prompt: read them as the size "
                   f"of the gap, not a precise ratio.")
    return ("\n".join(out) + "\n") if out else ""


def cmd_validation_page(a):
    """docs/ page of the cost-model validation, from the summary validate_cost_model.py wrote."""
    val = json.load(open(a.validation))
    figdir = a.figures
    if a.check:
        f = "cost_validation.png"
    else:
        os.makedirs(figdir, exist_ok=True)
        f = fig_validation(val, figdir, "cost_validation.png")
    rel = os.path.relpath(os.path.join(figdir, f), os.path.dirname(os.path.abspath(a.page)))
    # the command that makes this page, in repository-relative paths (the same from anywhere)
    made_by = " ".join(shlex.quote(x) for x in [
        "scripts/report.py", "validation-page", os.path.relpath(os.path.abspath(a.validation), REPO),
        "--page", os.path.relpath(os.path.abspath(a.page), REPO),
        "--figures", os.path.relpath(os.path.abspath(figdir), REPO)])
    m = val["machine"]
    lines = ["# Cost model validation: predicted against measured on this machine\n",
             f"Generated by `{made_by}` from `{os.path.relpath(a.validation, os.path.dirname(os.path.abspath(a.page)))}`, "
             f"which `{val['command']}` wrote. Do not edit by hand.\n",
             f"Machine: {m['cpu']}, {m['cores']} cores; profile `{val['profile']}` "
             f"(`sparsim probe`: {fmt_num(m['sgemm_flops'] / 1e9)} GFLOP/s GEMM, {fmt_num(m['memory_bandwidth'] / 1e9)} GB/s, "
             f"launch {fmt_num(m['launch_overhead_s'] * 1e6)} µs at {m['threads']} threads). Model {val['model']}, "
             f"{val['storage']} weights, prompt {val['prompt']} tokens, {val['decode']} decode steps, "
             f"{val['reps']} repetitions per run, {val['runs']} runs per configuration (medians). "
             f"Load average during the runs: {val['load_min']:.2f} to {val['load_max']:.2f} on {m['cores']} cores. "
             + ("Timings are the process's CPU time (`--clock cpu`; with one thread, the work's own time while other jobs "
                "share the cores), for the probe's roofs and the measured runs alike.\n" if val.get("clock") == "cpu"
                else "Timings are wall-clock time.\n"),
             (f"The profile: `{val['profile_command']}` (its output is `{val['profile']}`).\n"
              if val.get("profile_command") else ""),
             (f"Calibration for the methods: `sparsim {val['calibration']['command']}` (target sparsity "
              f"{val['sparsity']:g}).\n" if val.get("calibration") and val["calibration"].get("command") else ""),
             "## Whole call\n",
             "Predicted time of one prefill of the prompt and of one decode step against the median of the "
             "unprofiled timings (error = predicted / measured − 1).\n"]
    rows = []
    for r in val["rows"]:
        la = config_loads(val, r)
        for ph in ("prefill", "decode"):
            e = r["phases"].get(ph)
            if e:
                spread = e.get("measured_spread")
                rows.append([r["label"], ph, fmt_num(e["predicted_seconds_per_call"] * 1e3),
                             fmt_num(e["measured_seconds_per_call"] * 1e3)
                             + (f" ({fmt_num(spread[0] * 1e3)}–{fmt_num(spread[1] * 1e3)})" if spread else ""),
                             f"{100 * e['error']:+.1f}%", "yes" if abs(e["error"]) <= 0.25 else "**no**", la])
    lines.append(md_table(["configuration", "phase", "predicted ms", "measured ms (range over runs)", "error", "within ±25%",
                           "load average during its runs"], rows))
    lines.append(f"\n![predicted against measured]({rel})\n")
    dense = next((r for r in val["rows"] if r["method"] == "dense"), None)
    if dense and len(val["rows"]) > 1:
        lines.append("## Speedup of each method over dense\n")
        lines.append("Predicted: the method's ledger against the same ledger run densely (`speedup_vs_dense` of "
                     "`sparsim predict`). Measured: dense's median call over the method's, from the runs above.\n")
        rows = []
        for r in val["rows"]:
            if r is dense:
                continue
            for ph in ("prefill", "decode"):
                if ph in r["phases"] and ph in dense["phases"]:
                    meas = dense["phases"][ph]["measured_seconds_per_call"] / r["phases"][ph]["measured_seconds_per_call"]
                    pred = r["predicted_speedup_vs_dense"].get(ph)
                    rows.append([r["label"], ph, fmt_num(pred), fmt_num(meas)])
        lines.append(md_table(["configuration", "phase", "predicted speedup", "measured speedup"], rows))
    if any(r.get("elsewhere") for r in val["rows"]):
        lines.append("\n## The same runs predicted on GPUs\n")
        lines.append("The ledgers of the runs above (hardware-independent) on each profile of `data/hardware/`, fp32 "
                     "compute and the runs' own weight storage. Vendor profiles hold datasheet roofs, so their times "
                     "are bounds a perfect implementation would reach; `h200-measured` holds roofs measured on an "
                     "H200 (cuBLAS GEMM, device copy, empty-kernel launches).\n")
        rows = []
        for r in val["rows"]:
            for e in r.get("elsewhere", []):
                sp = e["speedup_vs_dense"]
                rows.append([r["label"], e["hardware"], e["kind"], fmt_num(e["prefill_tokens_per_s"]),
                             fmt_num(e["decode_tokens_per_s"]), e["decode_bound"], fmt_num(sp.get("decode"))])
        lines.append(md_table(["configuration", "hardware", "profile", "prefill tok/s", "decode tok/s", "decode bound",
                               "decode speedup vs dense"], rows))
    gpu = val.get("gpu")
    if gpu and gpu.get("rows"):
        lines.append(f"\n## Against a measured GPU run ({gpu['gpu']})\n")
        lines.append(f"`{gpu['file']}` (sparsim at commit {gpu['commit']}, CUDA backend) measured the same model and "
                     f"storage on an {gpu['gpu']}; the ledgers of this machine's runs predict it on "
                     + ", ".join(f"`{h}`" for h in gpu["profiles"]) +
                     " (ratio = predicted / measured tokens/s; above 1: the model is optimistic). The ledgers count "
                     "the op-by-op kernels (host backends run no other path), so the op-by-op GPU run is the like-for-"
                     "like comparison; the fused and graph paths launch fewer kernels. The GPU runs' prompt and "
                     "decode lengths are listed; this machine's runs used the ones above.\n")
        head = ["configuration", "GPU run", "prompt / decode", "measured prefill tok/s", "measured decode tok/s"]
        for h in gpu["profiles"]:
            head += [f"{h} prefill (ratio)", f"{h} decode (ratio)"]
        rows = []
        for e in gpu["rows"]:
            row = [e["configuration"], f"`{e['gpu_run']}` ({e['what']})", f"{e['prompt_tokens']} / {e['decode_tokens']}",
                   fmt_num(e["measured_prefill_tokens_per_s"]), fmt_num(e["measured_decode_tokens_per_s"])]
            for h in gpu["profiles"]:
                p = e["predicted"].get(h)
                if not p:
                    row += ["-", "-"]
                    continue
                mp, md = e["measured_prefill_tokens_per_s"], e["measured_decode_tokens_per_s"]
                row += [f"{fmt_num(p['prefill_tokens_per_s'])} ({p['prefill_tokens_per_s'] / mp:.2f})" if mp else "-",
                        f"{fmt_num(p['decode_tokens_per_s'])} ({p['decode_tokens_per_s'] / md:.2f})"]
            rows.append(row)
        lines.append(md_table(head, rows))
    lines.append("## Per op\n")
    lines.append("Predicted against the profiled per-op times (a fence after every kernel) of the same calls; "
                 "ops computed in one kernel are measured together (`attn_score` holds the KV append and the whole "
                 "attention kernel).\n")
    for r in val["rows"]:
        lines.append(f"\n### {r['label']}\n")
        rows = []
        for e in r["per_op"]:
            if e["measured_seconds_per_call"] <= 0 and e["predicted_seconds_per_call"] <= 0:
                continue
            rows.append([e["phase"], "+".join(e["ops"]), fmt_num(e["predicted_seconds_per_call"] * 1e3),
                         fmt_num(e["measured_seconds_per_call"] * 1e3),
                         "-" if e["error"] is None else f"{100 * e['error']:+.1f}%", e.get("bound", "")])
        lines.append(md_table(["phase", "ops", "predicted ms", "measured ms", "error", "bound"], rows))
    if val.get("discussion"):
        lines.append("\n## Where the model is off, and why\n")
        lines.append(val["discussion"].strip() + "\n")
        lines.append(validation_findings(val))
    lines.append("\n## Reproduce\n\n```sh\n" + val["command"] + "\n" + made_by + "\n```\n")
    text = "\n".join(lines)
    if a.check:
        if not os.path.exists(a.page) or open(a.page).read() != text:
            sys.exit(f"report.py: {a.page} is out of date with {a.validation} (run {made_by})")
        print(f"checked {a.page}")
        return
    atomic_write(a.page, text)
    print(f"wrote {a.page} and {os.path.join(figdir, f)}")


# ----------------------------------------------------------------------------- docs blocks
def block_hardware_table():
    import glob
    rows = []
    for f in sorted(glob.glob(os.path.join(REPO, "data", "hardware", "*.json"))):
        j = json.load(open(f))
        pf = j["peak_flops"]

        def tf(k):
            return f"{pf[k] / 1e12:.4g}" if k in pf else "-"

        rows.append([j["name"], j["description"], j["kind"], tf("fp32"), tf("tf32"), tf("bf16"),
                     f"{j['memory_bandwidth'] / 1e12:.4g}", f"{j['l2_bytes'] / 2**20:.4g}",
                     f"{j['launch_overhead_s'] * 1e6:.4g}"])
    return md_table(["profile", "device", "kind", "fp32 TFLOP/s", "tf32 TFLOP/s", "bf16 TFLOP/s", "memory TB/s",
                     "L2 MiB", "launch µs"], rows)


def _rel(name):
    """A committed result's path under docs/results/: NAME as given, or the one file of that name
    in a study folder (docs/results/<study>/NAME)."""
    base = os.path.join(REPO, "docs", "results")
    if os.path.exists(os.path.join(base, name)):
        return name
    import glob
    found = sorted(glob.glob(os.path.join(base, "*", name)))
    if len(found) != 1:
        raise InputError(f"docs/results: {len(found)} files named {name} in the study folders")
    return os.path.relpath(found[0], base)


def _results(name):
    return json.load(open(os.path.join(REPO, "docs", "results", _rel(name))))


def block_bench_vs_llamacpp(name="bench_vs_llamacpp.json"):
    j = _results(name)
    st, rows, ratios = j["settings"], [], []
    for w in ("f32", "bf16"):
        r = j["runs"].get(w)
        if not r:
            continue
        for prog, key in (("sparsim", "sparsim"), ("sparsim --bf16-compute", "sparsim_bf16_compute"),
                          ("llama.cpp", "llama_cpp")):
            vals = r["reps"]
            if key not in vals[0]:
                continue
            pre = [x[key]["prefill_tokens_per_s"] for x in vals]
            dec = [x[key]["decode_tokens_per_s"] for x in vals]
            run = "run_prefill" if key == "llama_cpp" else "run"
            rss = max(x[key][run]["peak_rss_mib"] for x in vals)
            rows.append([w.upper(), prog, f"{r['median'][key]['prefill_tokens_per_s']:.0f}",
                         _span(pre, "{:.0f}"), f"{r['median'][key]['decode_tokens_per_s']:.1f}",
                         _span(dec, "{:.1f}"), f"{rss:.0f}"])
        ratios.append(f"{w.upper()} prefill {r['ratio_prefill']:.2f}, decode {r['ratio_decode']:.2f}"
                      f" (load {r['load_min']:.1f}–{r['load_max']:.1f})")
        if "ratio_prefill_bf16_compute" in r:
            ratios.append(f"{w.upper()} with --bf16-compute prefill {r['ratio_prefill_bf16_compute']:.2f},"
                          f" decode {r['ratio_decode_bf16_compute']:.2f}")
    cpu, lb, sb = j["cpu"], j.get("llama_cpp_build", {}), j.get("sparsim_build", {})
    first_run = next(iter(j["runs"].values()))
    first = first_run["llama_cpp_settings"]
    return (md_table(["weights", "program", "prefill tok/s (median)", "range", "decode tok/s (median)", "range",
                      "peak RSS MiB"], rows) +
            "\nRatios sparsim / llama.cpp: " + "; ".join(ratios) + "." +
            f" {st['threads']} threads, prompt {st['prompt']}, decode {st['decode']} after a {st['prompt']}-token"
            f" context, {st['reps']} interleaved repetitions. CPU: {cpu['model']} ({cpu['logical_cpus']} logical,"
            f" {' '.join(cpu['features'])}). llama.cpp: {lb.get('source', '?')}, GGML_NATIVE={lb.get('GGML_NATIVE', '?')},"
            f" {lb.get('ggml_cpu_compile_flags', '') or _ggml_options(lb)}, flash attention {({-1: 'auto', 0: 'off', 1: 'on'}).get(first.get('flash_attn'), first.get('flash_attn'))},"
            f" K cache {first.get('type_k')}. sparsim: {sb.get('CMAKE_BUILD_TYPE', '?')},"
            f" SPARSIM_NATIVE={sb.get('SPARSIM_NATIVE', '?')}{_sparsim_kernels(sb, first_run)}. From"
            f" `results/{_rel(name)}` (`{j['command']}`).\n")


def _ggml_options(build):
    """llama.cpp's ISA switches from its CMake options, where the compile flags were not recorded."""
    opts = [o[2:] for o in build.get("cmake_options", "").split() if o.startswith("-DGGML_")]
    return " ".join(opts) if opts else "flags not recorded"


def _sparsim_kernels(build, run):
    """The kernel level a sparsim build ran: its own flags when it has no clones, and what it reported."""
    out = ""
    if build.get("SPARSIM_KERNEL_CLONES") == "OFF":
        out += f", SPARSIM_KERNEL_CLONES=OFF, CMAKE_CXX_FLAGS={build.get('CMAKE_CXX_FLAGS') or '(none)'}"
    hk = run.get("sparsim_host_kernels") or {}
    if hk:
        out += f" (decode kernels {hk.get('gemv_isa', '?')}, OpenBLAS core {hk.get('blas_core') or '?'})"
    return out


def block_decode_methods(name="decode_methods.json", caption=True):
    j = _results(name)
    rows = []
    for r in j["table"]:
        dash = lambda v: "–" if v == 0 else f"{100 * v:.1f}%"
        rows.append([r["storage"], r["method"], f"{r['dense_decode_tokens_per_s']:.1f}", f"{r['decode_tokens_per_s']:.1f}",
                     f"{r['speedup']:.2f}", f"{r['realised_projection_sparsity']:.3f}",
                     f"{r['ideal_speedup_projections']:.2f}", f"{r['ideal_speedup_decode_step']:.2f}",
                     dash(r["mask_select_time_share"]), dash(r["rotation_time_share"])])
    table = md_table(["storage", "method", "dense tok/s", "method tok/s", "speedup", "realised s", "ideal (projections)",
                      "ideal (whole step)", "mask select", "rotation"], rows)
    if "cpu" not in j or not caption:  # files from before the CPU and the build were recorded
        return table
    hk = j["raw"][0]["result"].get("host_kernels") or {}
    loads = [x for r in j["raw"] for x in (r["result"].get("load_average_before") or [])[:1]]
    ideal = [r["result"]["decode_fraction_of_ideal"] for r in j["raw"]]
    return (table + f"\n{j['model']}, s = {j['sparsity_target']:g}, prompt {j['prompt_tokens']}, {j['decode_tokens']} "
            f"decode steps, {j['threads']} threads, {j['runs']} invocation(s) of {j['reps_per_run']} alternating "
            f"dense / method repetitions per storage × method, started {j['started_utc']}; load average (1 min) "
            f"before the invocations {_span(loads)}; dense decode / copy-bandwidth ideal {_span(ideal)}." +
            _cpu_build_line(j, name, hk) + "\n")


def block_decode_methods_7b(name="decode_methods_llama2_7b_shape.json"):
    """The same table on the synthetic Llama-2-7B-shaped model, with the settings it ran at."""
    j = _results(name)
    speed = [r["result"]["decode_tokens_per_s"] for r in j["raw"]]
    loads = [x for r in j["raw"] for x in (r["result"].get("load_average_before") or [])[:1]]
    return (block_decode_methods(name, caption=False) +
            f"\nModel `{os.path.basename(j['model'])}`; s = {j['sparsity_target']:g}, prompt {j['prompt_tokens']}, "
            f"{j['decode_tokens']} decode steps, {j['threads']} threads, {j['runs']} invocation(s) of "
            f"{j['reps_per_run']} repetitions per method (tok/s: medians of the repetitions, dense and the method "
            f"alternating in one process; speedup: their ratio, median over invocations), started "
            f"{j['started_utc']}; load average (1 min) before the invocations {_span(loads)}, "
            f"{j['load_average_end'][0]:.2f} at the end. Method tok/s over the invocations: "
            f"{_span(speed, '{:.2f}')}; dense decode against the copy-bandwidth ideal (the dense side of every "
            f"invocation): {_span([r['result']['decode_fraction_of_ideal'] for r in j['raw']])}." +
            (_cpu_build_line(j, name) or f" From `results/{_rel(name)}`.") + "\n")


def block_portable_build():
    j = _results("portable_build.json")
    st, rows = j["settings"], []
    for w, r in j["runs"].items():
        for n in ("native", "portable"):
            hk = r["host_kernels"].get(n) or {}
            rows.append([w.upper(), n, f"{r['median'][n]['prefill_tokens_per_s']:.0f}",
                         _span([x[n]["prefill_tokens_per_s"] for x in r["reps"]], "{:.0f}"),
                         f"{r['median'][n]['decode_tokens_per_s']:.1f}",
                         _span([x[n]["decode_tokens_per_s"] for x in r["reps"]], "{:.1f}"),
                         hk.get("gemv_isa", "?"), hk.get("blas_core", "?")])
    ratios = "; ".join(f"{w.upper()} prefill {r['ratio_prefill']:.2f}, decode {r['ratio_decode']:.2f} "
                       f"(load {r['load_min']:.1f}–{r['load_max']:.1f})" for w, r in j["runs"].items())
    b = j["builds"]
    flags = lambda n: f"SPARSIM_NATIVE={b[n].get('SPARSIM_NATIVE', '?')}, {b[n].get('CMAKE_BUILD_TYPE', '?')}"
    cpu = j["cpu"]
    return (md_table(["weights", "build", "prefill tok/s (median)", "range", "decode tok/s (median)", "range",
                      "decode GEMV clone", "OpenBLAS core"], rows) +
            f"\nRatios portable / native: {ratios}. {st['model']}, {st['threads']} threads, prompt {st['prompt']}, "
            f"{st['decode']} decode steps, {st['reps']} interleaved repetitions ({j['started_utc']}). Builds: native "
            f"{flags('native')}; portable {flags('portable')}. CPU: {cpu['model']} ({' '.join(cpu['features'])}). "
            f"From `results/performance/portable_build.json` (`{j['command']}`).\n")


def _span(vals, fmt="{:.2f}", scale=1.0):
    vals = [v * scale for v in vals if v is not None]
    if not vals:
        return "-"
    lo, hi = fmt.format(min(vals)), fmt.format(max(vals))
    return lo if lo == hi else f"{lo}–{hi}"


def block_decode_ideal():
    """Dense decode against the copy-bandwidth ideal, from the dense side of every invocation of
    bench_decode_methods.py."""
    j = _results("decode_methods.json")
    rows = []
    for st in sorted({r["storage"] for r in j["raw"]}):
        xs = [r["result"] for r in j["raw"] if r["storage"] == st]
        rows.append([st.upper(), len(xs), f"{xs[0]['decode_weight_bytes_per_token'] / 1e6:.0f}",
                     _span([x["copy_bandwidth_bytes_per_s"] for x in xs], "{:.1f}", 1e-9),
                     _span([x["decode_ideal_tokens_per_s"] for x in xs], "{:.1f}"),
                     _span([x["decode_tokens_per_s"] for x in xs], "{:.1f}"),
                     _span([x["decode_fraction_of_ideal"] for x in xs])])
    loads = [x for r in j["raw"] for x in (r["result"].get("load_average_before") or [])[:1]]
    return (md_table(["weights", "invocations", "MB read per token", "copy GB/s", "ideal tok/s", "dense decode tok/s",
                      "decode / ideal"], rows) +
            f"\nFrom the dense runs of `results/performance/decode_methods.json` (prompt {j['prompt_tokens']}, "
            f"{j['decode_tokens']} decode steps, {j['threads']} threads, started {j['started_utc']}); load average "
            f"(1 min) before the invocations {_span(loads)}.\n")


def block_decode_methods_summary():
    """What the decode-methods table shows, computed from it."""
    j = _results("decode_methods.json")
    t = j["table"]
    plain = [r for r in t if r["rotation_time_share"] == 0]
    rot = [r for r in t if r["rotation_time_share"] > 0]
    out = [f"- Every method realises its target on the projections: "
           f"{_span([r['realised_projection_sparsity'] for r in t], '{:.3f}')} FLOP-weighted at "
           f"s = {j['sparsity_target']:g}.",
           f"- The projections are {_span([r['dense_projection_time_share'] for r in t], '{:.0f}', 100)}% of the "
           f"dense decode step here (attention over the cache, norms, RoPE, residuals and the tied LM head make the "
           f"rest), so a perfect sparse kernel would give {_span([r['ideal_speedup_decode_step'] for r in plain])}× "
           f"for the unrotated method, not {1 / (1 - j['sparsity_target']):.0f}×; it measures "
           f"{_span([r['speedup'] for r in plain])}×."]
    if rot:
        out.append(f"- The rotated methods (WINA, TopK-Guided) spend "
                   f"{_span([r['rotation_time_share'] for r in rot], '{:.0f}', 100)}% of their decode step in the "
                   f"online re-rotation (two D × D fp32 matrices per block, none of it skipped), which caps their "
                   f"whole-step ideal at {_span([r['ideal_speedup_decode_step'] for r in rot])}×; they measure "
                   f"{_span([r['speedup'] for r in rot])}×.")
    out.append(f"- Mask selection costs {_span([r['mask_select_time_share'] for r in t], '{:.1f}', 100)}% of the "
               f"decode step.")
    loads = [x for r in j["raw"] for x in (r["result"].get("load_average_before") or [])[:1]]
    out.append(f"- Dense prefill in these runs: {_span([r['dense_prefill_tokens_per_s'] for r in t], '{:.0f}')} "
               f"tokens/s; load average (1 min) before the invocations {_span(loads)}, "
               f"{j['load_average_end'][0]:.2f} at the end.")
    return "\n".join(out) + "\n"


def block_sparse_gemv_notes(name="sparse_gemv.json"):
    j = _results(name)
    la = j["machine"].get("load_avg") or []
    hot = [r for r in j["rows"] if r["weights"] == "hot" and r["goal_met"] is not None]
    cold = [r for r in j["rows"] if r["weights"] == "cold" and r["goal_met"] is not None]
    return (f"Load average (1, 5, 15 min) when the benchmark ended: {', '.join(f'{x:.2f}' for x in la)} on "
            f"{j['machine']['num_cpus']} cores; {j['repetitions']} repetitions, {j['threads']} threads. Goal met: "
            f"cold weights {sum(1 for r in cold if r['goal_met'])} of {len(cold)} (shape, s) cases" +
            (f", hot weights {sum(1 for r in hot if r['goal_met'])} of {len(hot)}" if hot else
             " (hot weights not measured)") + "." + _cpu_build_line(j, name) + "\n")


def _cpu_build_line(j, name, host_kernels=None):
    """The CPU and build a newer result file records (and the kernels the run reported), and the
    command that made it."""
    if "cpu" not in j:
        return ""
    cpu, sb = j["cpu"], j.get("sparsim_build", {})
    return (f" CPU: {cpu['model']} ({' '.join(cpu['features'])}); sparsim: SPARSIM_NATIVE="
            f"{sb.get('SPARSIM_NATIVE', '?')}{_sparsim_kernels(sb, {'sparsim_host_kernels': host_kernels})}. "
            f"From `results/{_rel(name)}` (`{j['command']}`).")


def block_cost_validation_summary():
    """Whole-call predicted against measured, from the validation summary (docs/cost-validation.md has it all)."""
    val = _results("cost_validation.json")
    rows = []
    for r in val["rows"]:
        for ph in ("prefill", "decode"):
            e = r["phases"].get(ph)
            if e:
                rows.append([r["label"], ph, fmt_num(e["predicted_seconds_per_call"] * 1e3),
                             fmt_num(e["measured_seconds_per_call"] * 1e3), f"{100 * e['error']:+.1f}%",
                             config_loads(val, r)])
    m = val["machine"]
    return (md_table(["configuration", "phase", "predicted ms", "measured ms", "error", "load average"], rows) +
            f"\n{val['model']}, {val['storage']} weights, {m['threads']} thread(s), {val['clock']} clock, prompt "
            f"{val['prompt']}, medians over {val['runs']} runs of {val['reps']} repetitions; load average "
            f"{val['load_min']:.2f}–{val['load_max']:.2f} on {m['cores']} cores ({val['date_utc']}). From "
            f"`results/cost_validation/cost_validation.json`.\n")


def block_sparse_gemv(name="sparse_gemv.json"):
    j = _results(name)
    cold = [r for r in j["rows"] if r["weights"] == "cold"]
    shapes, svals = [], sorted({r["s"] for r in cold})
    for r in cold:
        if (r["shape"], r["wt_in"], r["wt_out"]) not in shapes:
            shapes.append((r["shape"], r["wt_in"], r["wt_out"]))
    rows = []
    for sh in shapes:
        rs = {r["s"]: r for r in cold if (r["shape"], r["wt_in"], r["wt_out"]) == sh}
        first = next(iter(rs.values()))
        cells = []
        for sv in svals:
            r = rs.get(sv)
            cells.append("" if r is None else f"{r['speedup']:.2f} ({r['speedup_over_ideal']:.2f})" +
                         (" ✗" if r["goal_met"] is False else ""))
        rows.append([f"{sh[0]} {sh[1]}×{sh[2]}", f"{first['dense_us']:.0f}"] + cells)
    return md_table(["shape (Wt in×out)", "dense µs"] + [f"s={sv:g}" for sv in svals], rows)


def block_sparse_gemv_read(name="sparse_gemv.json"):
    """Cold weights: the kernel's speedup, the ideal 1/(1-s) and the plain read of the kept rows
    (dense time over the time to read only the kept rows, no arithmetic, no prefetch), per shape and s."""
    j = _results(name)
    rows = []
    for r in j["rows"]:
        if r["weights"] != "cold" or "plain_read_speedup" not in r or r["s"] == 0:
            continue
        rows.append([f"{r['shape']} {r['wt_in']}×{r['wt_out']}", f"{r['s']:g}", f"{r['speedup']:.2f}",
                     f"{r['ideal']:.2f}", f"{r['plain_read_speedup']:.2f}", f"{r['read_tiles_us']:.1f}",
                     f"{r['read_rows_us']:.1f}", f"{r['sparse_us']:.1f}", f"{r['kernel_over_read']:.2f}"])
    return md_table(["shape (Wt in×out)", "s", "kernel speedup", "ideal", "plain read speedup", "read µs (tiles)",
                     "read µs (rows)", "kernel µs", "kernel / read (tiles)"], rows)


def block_kept_runs(name="kept_runs.json"):
    """The plain read of half of each Wt's rows in runs of R consecutive rows against reading all
    of them (scripts/bench/bench_sparse_gemv.py --kept-runs), per shape and run length."""
    j = _results(name)
    runs = sorted({r["run"] for r in j["rows"]})
    by = {}
    for r in j["rows"]:
        by.setdefault((r["shape"], r["wt_in"], r["wt_out"], r["row_bytes"]), {})[r["run"]] = r
    rows = []
    for (shape, i, o, rb), rr in sorted(by.items()):
        first = next(iter(rr.values()))
        rows.append([f"{shape} {i}×{o}", f"{rb}", f"{first['dense_us']:.1f}"] +
                    [f"{rr[k]['read_speedup']:.2f}" if k in rr else "" for k in runs])
    ld = j["machine"]["load_avg"]
    return (md_table(["shape (Wt in×out)", "row bytes", "dense kernel µs"] +
                     [f"run {k}" for k in runs], rows) +
            f"\nTime to read all rows over the time to read a random half of them (ideal 2), by whole rows per "
            f"thread, cold bf16 weights, {j['threads']} threads, medians of {j['repetitions']}; load average "
            f"{ld[0]:.2f} at the start. From `results/{_rel(name)}` (`scripts/bench/bench_sparse_gemv.py --kept-runs`).\n")


def block_teal_mask_runs(name="teal_mask_runs.json"):
    """Mean run length of TEAL's kept channels per projection input, in the model's channel order
    and after sorting the channels by keep frequency (scripts/reference/teal_mask_runs.py)."""
    j = _results(name)
    rows = []
    for p in j["projections"]:
        f = p["keep_frequency_p10_p50_p90"]
        rows.append([p["projection"], f"{p['input_width']}", f"{p['kept']:.3f}", f"{1 / (1 - p['kept']):.2f}",
                     f"{p['mean_run']:.2f}", f"{p['mean_run_permuted']:.2f}",
                     f"{p['mean_run_permuted_max_layer']:.2f}", f"{f[0]:.2f} / {f[1]:.2f} / {f[2]:.2f}"])
    return (md_table(["projection", "input width", "kept", "independent channels: 1/(1−kept)",
                      "mean run", "mean run, permuted", "best layer, permuted",
                      "keep frequency p10 / p50 / p90"], rows) +
            f"\nTEAL at s = {j['sparsity']:g} with the thresholds of `{os.path.basename(j['calibration'])}`, "
            f"{j['windows']} windows of {j['context']} tokens of corpus `{j['corpus']}`: the first "
            f"{j['permutation_windows']} give the keep frequencies (the permutation), the other "
            f"{j['tokens_measured']} tokens are measured; averages over the masked layers. transformers "
            f"{j['transformers']}, torch {j['torch']} (CPU). From `results/{_rel(name)}` "
            f"(`scripts/reference/teal_mask_runs.py --calibration cal.h5 --windows {j['windows']} --json docs/results/{_rel(name)}`).\n")


def block_hf_teal_check(name="hf_teal_check.json"):
    """sparsim against Hugging Face transformers with the same thresholds (scripts/reference/hf_teal_check.py):
    both perplexities, their relative difference and the paired per-window NLL difference."""
    import statistics
    j = _results(name)
    rows = []
    for what, r in j["results"].items():
        d = [a - b for a, b in zip(r["sparsim_window_nll"], r["hf_window_nll"])]
        se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
        rows.append([what, f"{r['sparsim_perplexity']:.4f}", f"{r['hf_perplexity']:.4f}",
                     f"{100 * r['relative_difference']:.3f}%" if r["relative_difference"] >= 1e-5 else
                     f"{r['relative_difference']:.1e}", f"{statistics.mean(d):+.2f} ± {se:.2f}",
                     f"{statistics.stdev(d) if len(d) > 1 else 0:.2f}",
                     "yes" if r["relative_difference"] <= j["tolerance"] else "**no**"])
    for jt in j.get("threshold_jitter", []):
        rows.append([f"transformers, thresholds × (1 {'+' if jt['epsilon'] > 0 else '−'} {abs(jt['epsilon']):g})", "",
                     f"{jt['hf_perplexity']:.4f}", "", "", "", ""])
    tokens = j["results"]["dense"]["tokens_scored"]
    return (md_table(["run", "sparsim PPL", "transformers PPL", "relative difference",
                      "window NLL difference, mean ± se (nats)", "its sd across windows", "within tolerance"], rows) +
            f"\n{j['windows']} windows of {j['context']} tokens every {j['stride']} ({tokens} scored tokens), corpus "
            f"`{j['corpus']}`, TEAL at s = {j['sparsity']:g} with the thresholds of `{os.path.basename(j['calibration'])}`; "
            f"tolerance {100 * j['tolerance']:g}% on the perplexity; transformers {j['transformers']}, torch {j['torch']} "
            f"(CPU); {j['seconds'] / 60:.0f} min. From `results/{_rel(name)}`.\n")


def block_decode_projections(names):
    """Per projection, from `sparsim bench --method … --profile --json` files (comma-separated): the
    kept FLOP fraction (the ideal time ratio) against the profiled time ratio method / dense."""
    rows, notes = [], []
    for name in names.split(","):
        j = _results(name)
        sp = j["sparse"]
        # the profiled steps (files before the count was written: bench's rule, decode - 1)
        steps = max(1, sp.get("profiled_decode_steps", j["decode_tokens"] - 1))
        for op, e in sp["projections"].items():
            ratio = e["method_seconds"] / e["dense_seconds"]
            rows.append([j["storage"], sp["method"], op, f"{e['kept_fraction']:.3f}",
                         f"{1e3 * e['dense_seconds'] / steps:.3f}", f"{1e3 * e['method_seconds'] / steps:.3f}",
                         f"{ratio:.2f}", f"{ratio / e['kept_fraction']:.2f}"])
        notes.append(f"`results/{_rel(name)}`: {j['storage']}, {sp['method']} at s = {sp['sparsity_target']:g}, whole step "
                     f"{sp['decode_speedup']:.2f}× dense (ideal {sp['ideal_speedup_decode_step']:.2f}), load average "
                     f"{j['load_average_start']:.2f} → {j['load_average_end']:.2f}")
    return (md_table(["storage", "method", "projection", "kept fraction", "dense ms/step", "method ms/step",
                      "time ratio", "time ratio / kept"], rows) +
            "\nTimes are of the profiled decode steps (a fence after every kernel), per step. " +
            "; ".join(notes) + ".\n")


def block_llamacpp_agreement():
    out = []
    for name in ("llamacpp_smollm2_f32.json", "llamacpp_smollm2_f32_ctx2048.json"):
        j = _results(name)
        pr, pp = j["protocol"], j["perplexity"]
        g = j["greedy"]
        out.append([f"{pr['windows']} × {pr['context']} (stride {pr['stride']}, {pr['tokens_scored']} scored)",
                    f"{pp['sparsim']:.6f}", f"{pp['llama_cpp']:.6f}", f"{pp['relative_difference']:.1e}",
                    f"{j['window_nll_max_abs_difference_nats']:.1e}",
                    f"{'identical' if g['identical'] else 'differ'} ({g['n']})", f"`results/{_rel(name)}`"])
    return md_table(["windows", "sparsim PPL", "llama.cpp PPL", "relative difference", "largest window NLL difference (nats)",
                     "greedy tokens", "file"], out)


def block_recovery_step_cost():
    j = _results("recovery_step_timing.json")
    st, m = j["settings"], j["median"]
    rows = []
    for i, r in enumerate(j["runs"]):
        t = r["timing"]
        rows.append([str(i + 1), f"{t['median_step_seconds']:.3f}", f"{t['teacher_seconds']:.3f}",
                     f"{t['forward_seconds']:.3f}", f"{t['backward_seconds']:.3f}",
                     f"{t['update_seconds']:.3f}", f"{t['forward_seconds_per_step_tokens']:.3f}",
                     f"{t['step_over_forward']:.2f}",
                     f"{r['load_average_before'][0]:.2f} → {r['load_average_after'][0]:.2f}"])
    table = md_table(["run", "step s (median)", "teacher s", "student forward s", "backward s",
                      "update s", "forward of the same tokens s", "step / forward",
                      "load (1 min) before → after"], rows)
    return (table + "\n" +
            f"Median over {len(j['runs'])} runs of {st['steps']} steps ({st['batch']} × {st['seq_len']} tokens, "
            f"LoRA rank {st['lora_rank']}, {st['student']}, {st['threads']} threads, {j['machine']['model']}): "
            f"**{m['step_over_forward']:.2f}×** the forward pass (goal ≤ 4×); peak memory "
            f"{j['peak_rss_bytes'] / 2**20:.0f} MiB. `{j['command']}`, "
            "[results/recovery/recovery_step_timing.json](results/recovery/recovery_step_timing.json).\n")


def block_fresh_setup(name="fresh_setup.json"):
    """README: the fresh setup's time per stage, and the main job's comparison it ran."""
    j = _results(name)
    st = {x["stage"]: x["seconds"] for x in j["stages"]}
    build = sum(v for k, v in st.items() if k.startswith("configuring and building sparsim"))
    main = sum(v for k, v in st.items() if k.startswith("main job"))
    text = (f"A full fresh setup (a clean clone, an empty `SPARSIM_DEPS`, Debian packages already present, no "
            f"compiler cache) took **{j['setup_seconds'] / 60:.1f} minutes** on a {j['cpus']}-core machine "
            f"(load {j['load_before']:.2f} before): {build / 60:.1f} of them building sparsim, "
            f"{main / 60:.1f} the main job")
    mj = j.get("main_job")
    if mj:
        text += (f", whose methods part took {mj['methods_seconds']} s ("
                 + ", ".join(f"{x['step']} {x['seconds']} s" for x in mj["steps"]) + ")")
    text += "."
    chk = j.get("main_job_check")
    if chk:
        text += (f" Its page: {chk['figures']} figures, the comparison table equal to the runs' JSON summaries"
                 f"{'' if not chk['failures'] else ' — FAILED: ' + '; '.join(chk['failures'])}, headless Chromium "
                 f"{chk['browser']} (`scripts/tools/check_main_job.py`).")
    if "tests_seconds" in j:
        text += f" The test suite then took {j['tests_seconds'] / 60:.1f} minutes."
    text += (f" Commit {j['commit'][:7]}; `{j['command']}`, every stage in "
             f"[docs/results/{_rel(name)}](docs/results/{_rel(name)}).\n")
    cmp = j.get("comparison")
    if cmp:
        head, rows = comparison.table(cmp)
        text += ("\nThe comparison that main job printed (SmolLM2-135M-Instruct Q4_1, the default corpus, "
                 f"{cmp['rows'][0]['windows']} windows of 2048 tokens with the last 512 scored; "
                 "Δ NLL/token paired over windows with its t interval and exact sign-flip p; FLOPs, bytes and the "
                 "predicted speedup are those of the prefill of these windows, against the dense run; "
                 "`scripts/report.py compare`):\n\n"
                 + md_table(head, rows))
    return text


BLOCKS = {"fresh-setup": block_fresh_setup, "hardware-table": block_hardware_table, "bench-vs-llamacpp": block_bench_vs_llamacpp,
          "decode-methods": block_decode_methods, "sparse-gemv": block_sparse_gemv,
          "llamacpp-agreement": block_llamacpp_agreement, "decode-ideal": block_decode_ideal,
          "decode-methods-summary": block_decode_methods_summary, "sparse-gemv-notes": block_sparse_gemv_notes,
          "sparse-gemv-read": block_sparse_gemv_read, "hf-teal-check": block_hf_teal_check,
          "kept-runs": block_kept_runs, "teal-mask-runs": block_teal_mask_runs,
          "decode-projections": block_decode_projections,
          "cost-validation-summary": block_cost_validation_summary, "decode-methods-7b": block_decode_methods_7b,
          "portable-build": block_portable_build, "recovery-step-cost": block_recovery_step_cost}


def cmd_docs_blocks(a):
    """Re-render the generated blocks of Markdown pages from the committed files they name."""
    import re
    pat = re.compile(r"(<!-- generated: ([\w.:,-]+) -->\n)(.*?)(<!-- end generated[^>]*-->)", re.S)
    stale = []
    for page in a.pages:
        text = open(page).read()

        def repl(m):
            name, _, arg = m.group(2).partition(":")  # "block:results-file.json" renders another file
            if name not in BLOCKS:
                raise InputError(f"{page}: unknown generated block '{name}' (known: {', '.join(BLOCKS)})")
            end = f"<!-- end generated (scripts/report.py docs-blocks {os.path.relpath(page, REPO)}) -->"
            return m.group(1) + (BLOCKS[name](arg) if arg else BLOCKS[name]()) + end

        new = pat.sub(repl, text)
        if new != text:
            stale.append(page)
            if not a.check:
                atomic_write(page, new)
    if a.check and stale:
        sys.exit("report.py: generated blocks out of date in " + ", ".join(stale) +
                 " (run scripts/report.py docs-blocks " + " ".join(stale) + ")")
    print(("checked " if a.check else "updated ") + ", ".join(a.pages))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("page", help="an HTML page with figures from run files, tables and summaries")
    p.add_argument("runs", nargs="*", help="run files (HDF5)")
    p.add_argument("--out", required=True, help="output folder (index.html and the figures)")
    p.add_argument("--title", default="sparsim report")
    p.add_argument("--table", action="append", help="a sweep's results table (CSV, or JSON list of records)")
    p.add_argument("--record-path", default=None, help="JSON tables: the key of the list of records")
    p.add_argument("--x", default="sparsity", help="table column on the x axis (default sparsity)")
    p.add_argument("--group", default="method", help="table column naming the lines (default method)")
    p.add_argument("--validation", help="summary of scripts/studies/validate_cost_model.py (JSON)")
    p.add_argument("--hardware", action="append", help="also predict every run on this profile (repeatable)")
    p.add_argument("--measured-hardware", help="profile to set bench --out runs' measured per-op times against")
    p.add_argument("--sparsim", help="the sparsim binary for predictions (default build/bin/sparsim)")
    p.add_argument("--baseline", help="the dense run the others are compared with (default: the first dense run)")
    p.add_argument("--comparison-json", help="also write the comparison (the page's first table) as JSON")
    p.set_defaults(func=cmd_page)
    c = sub.add_parser("compare", help="methods against dense on the same windows: a table on stdout")
    c.add_argument("runs", nargs="+", help="run files of sparsim eval (HDF5), one of them dense")
    c.add_argument("--baseline", help="the dense run (default: the first dense run)")
    c.add_argument("--hardware", help="also the predicted speedup on this profile (sparsim predict)")
    c.add_argument("--sparsim", help="the sparsim binary (default build/bin/sparsim)")
    c.add_argument("--json", help="write the comparison as JSON")
    c.set_defaults(func=cmd_compare)
    q = sub.add_parser("sensitivity-plot", help="the plot of sparsim profile --plot")
    q.add_argument("run", help="run file of sparsim profile")
    q.add_argument("--png", required=True)
    q.set_defaults(func=cmd_sensitivity_plot)
    v = sub.add_parser("validation-page", help="the docs/ page of the cost-model validation")
    v.add_argument("validation", help="summary JSON of scripts/studies/validate_cost_model.py")
    v.add_argument("--page", required=True, help="Markdown page to write")
    v.add_argument("--figures", required=True, help="folder for the figure")
    v.add_argument("--check", action="store_true",
                   help="only check that the page's text is what the summary gives (writes nothing)")
    v.set_defaults(func=cmd_validation_page)
    b = sub.add_parser("docs-blocks", help="re-render the generated blocks of docs pages")
    b.add_argument("pages", nargs="+")
    b.add_argument("--check", action="store_true", help="only check that they are up to date")
    b.set_defaults(func=cmd_docs_blocks)
    a = ap.parse_args()
    if a.cmd == "page" and not (a.runs or a.table or a.validation):
        ap.error("page: give run files, --table or --validation")
    try:
        a.func(a)
    except InputError as e:
        sys.exit(f"report.py: {e}")


if __name__ == "__main__":
    main()
