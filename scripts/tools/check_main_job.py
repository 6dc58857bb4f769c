#!/usr/bin/env python3
"""Checks what the main job (scripts/main_job.sh) left in its output folder, as a new user would
see it: the comparison table agrees with the JSON summaries `sparsim eval` wrote for each run, the
report page names only figures that exist as PNG files, and the page opens in headless Chromium
(Debian's `chromium`, when installed) without a resource failing to load.

    scripts/tools/check_main_job.py [OUT]   (default out/)  [--json RESULT.json]

Exit status 0 when every check passes; 1 with one line per failure otherwise.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

METHODS = ["dense", "token-filter", "grace", "rap", "teal"]


def close(a, b, rel=1e-12):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


def check_comparison(out, fails):
    cmp = json.load(open(os.path.join(out, "comparison.json")))
    rows = {os.path.splitext(os.path.basename(r["path"]))[0]: r for r in cmp["rows"]}
    dense = json.load(open(os.path.join(out, "dense.json")))
    for m in METHODS:
        if m not in rows:
            fails.append(f"comparison.json has no row for {m}")
            continue
        r, s = rows[m], json.load(open(os.path.join(out, m + ".json")))
        checks = {
            "perplexity": (r["perplexity"], s["perplexity"]),
            "interval low": (r["perplexity_ci95"][0], s["perplexity_spread"]["ci95"][0]),
            "interval high": (r["perplexity_ci95"][1], s["perplexity_spread"]["ci95"][1]),
            "FLOPs saved": (r["flops_saved"], 1 - s["flops"]["realised"] / dense["flops"]["realised"]),
            "bytes saved": (r["bytes_saved"], 1 - s["bytes"]["realised"] / dense["bytes"]["realised"]),
            "mean paired difference": (r["delta_nll_per_token"], s["perplexity_spread"]["mean_nll_per_window"]
                                       - dense["perplexity_spread"]["mean_nll_per_window"]),
        }
        for what, (a, b) in checks.items():
            if not close(a, b, 1e-9):
                fails.append(f"{m}: {what} {a} in the comparison, {b} from {m}.json")
    return len(cmp["rows"])


def check_page(out, fails):
    page = os.path.join(out, "report", "index.html")
    html = open(page).read()
    imgs = re.findall(r'<img src="([^"]+)"', html)
    for i in imgs:
        p = os.path.join(out, "report", i)
        if not os.path.exists(p):
            fails.append(f"the page names {i}, which is missing")
        elif open(p, "rb").read(8) != b"\x89PNG\r\n\x1a\n" or os.path.getsize(p) < 5000:
            fails.append(f"{i} is not a PNG of some size")
    if "<h2>Methods against dense" not in html:
        fails.append("the page has no comparison section")
    for m in ["token-filter", "grace", "rap", "teal"]:
        if f"{m}" not in html:
            fails.append(f"the page does not name {m}")
    return page, len(imgs)


def check_browser(page, fails):
    chromium = shutil.which("chromium")
    if not chromium:
        return "skipped: chromium not installed (scripts/setup.sh --with-chromium)"
    before = len(fails)
    with tempfile.TemporaryDirectory() as d:
        shot = os.path.join(d, "shot.png")
        p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                            "--enable-logging=stderr", "--v=0", "--window-size=1280,8000",
                            f"--screenshot={shot}", "file://" + os.path.abspath(page)],
                           capture_output=True, text=True, timeout=180)
        log = p.stdout + p.stderr
        if p.returncode != 0 or not os.path.exists(shot) or os.path.getsize(shot) < 20000:
            fails.append(f"chromium did not render the page (exit {p.returncode})")
        for bad in ("Failed to load resource", "ERR_FILE_NOT_FOUND", "Uncaught", "status of 404"):
            if bad in log:
                fails.append(f"chromium: {bad}")
    return "passed" if len(fails) == before else "failed"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "out"))
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args()
    fails = []
    try:
        rows = check_comparison(a.out, fails)
        page, figures = check_page(a.out, fails)
    except (OSError, KeyError, ValueError) as e:
        sys.exit(f"check_main_job.py: {a.out} is not a finished main job's output: {e}")
    browser = check_browser(page, fails)
    res = {"out": a.out, "rows": rows, "figures": figures, "browser": browser, "failures": fails}
    print(f"comparison rows {rows}, page figures {figures}, browser {browser}")
    for f in fails:
        print("FAIL:", f)
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(a.json + ".tmp", a.json)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
