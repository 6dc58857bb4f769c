#!/usr/bin/env bash
# The main job: SmolLM2-135M-Instruct (the embedded default model) on the default corpus with
# the TEAL/WINA perplexity protocol (2048-token windows, 512 scored), a few windows; results in
# out/eval.h5 (HDF5 run file) and out/eval.json (summary); then a short chat completion, the
# run's FLOP accounting, its predicted time on an A100 and a report page (out/report/).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$here/build/bin/sparsim"
out="${SPARSIM_OUT:-$here/out}"
windows="${SPARSIM_MAIN_WINDOWS:-4}"
mkdir -p "$out"
"$bin" eval --model smollm2 --corpus default --context 2048 --stride 512 \
  --max-windows "$windows" --out "$out/eval.h5" --json "$out/eval.json"
"$bin" generate --model smollm2 --chat --prompt "Name three plays by Shakespeare." -n 40 \
  --log-level warn
# What the run's FLOP ledger says, and what it would take on an A100 (docs/cost-model.md); a
# report page with the figures (docs/reports.md).
"$bin" flops "$out/eval.h5"
"$bin" predict "$out/eval.h5" --hardware a100-80gb
py="${SPARSIM_PYTHON:-${SPARSIM_DEPS:-$HOME/.cache/sparsim-deps}/venv/bin/python}"
"$py" "$here/scripts/report.py" page "$out/eval.h5" --hardware a100-80gb --hardware h200 \
  --sparsim "$bin" --title "sparsim main job: SmolLM2-135M" --out "$out/report"
echo "run file: $out/eval.h5; summary: $out/eval.json; report: $out/report/index.html"
