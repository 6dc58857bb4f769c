#!/usr/bin/env bash
# The main job: what a sparsity or pruning method costs and saves on the embedded default model
# (SmolLM2-135M-Instruct, Q4_1) on the default corpus. Dense against one method of each family
# that needs no long calibration, on the same perplexity windows (2048-token context, the last 512
# tokens of each window scored, SPARSIM_MAIN_WINDOWS windows, default 6):
#   token-filter  Token Filtering, skip ratio 0.3 (online, no calibration)
#   grace         GRACE K-channel pruning after prefill, λ = 0.5 (no calibration)
#   rap           RAP at ρ = 0.7 after a short Fisher calibration (4 sequences of 512 tokens),
#                 written as a smaller GGUF and evaluated as a model
#   teal          TEAL at 50% activation sparsity after a short calibration (2 windows)
# Then one comparison table on stdout (perplexity with its interval, the paired per-window
# difference to dense, target against realised, FLOPs and bytes saved, KV-cache bytes, predicted
# A100 speedup), a short chat completion and the report page out/report/index.html.
# Outputs (out/, or SPARSIM_OUT): <method>.h5 run files, <method>.json summaries, the logs of each
# command in logs/, comparison.json, main_job.json (the time of each step), report/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$here/build/bin/sparsim"
out="${SPARSIM_OUT:-$here/out}"
windows="${SPARSIM_MAIN_WINDOWS:-6}"
py="${SPARSIM_PYTHON:-${SPARSIM_DEPS:-$HOME/.cache/sparsim-deps}/venv/bin/python}"
mkdir -p "$out/logs"
common=(--model smollm2 --corpus default --context 2048 --stride 512 --max-windows "$windows")

t0=$SECONDS
load0=$(cut -d' ' -f1 /proc/loadavg)
steps=()
# step NAME DESCRIPTION COMMAND...: runs a command with its output in logs/NAME.txt, one line here
step() {
  local name="$1" what="$2"
  shift 2
  local t=$SECONDS
  if ! "$@" >"$out/logs/$name.txt" 2>&1; then
    echo "main job: $what failed; its output:" >&2
    tail -n 20 "$out/logs/$name.txt" >&2
    exit 1
  fi
  printf '  %-44s %4d s\n' "$what" $((SECONDS - t))
  steps+=("{\"step\": \"$what\", \"seconds\": $((SECONDS - t))}")
}
ev() {  # ev NAME [method options...]: one evaluation on the shared windows
  local name="$1"
  shift
  step "$name" "eval $name" "$bin" eval "${common[@]}" "$@" --out "$out/$name.h5" \
    --json "$out/$name.json"
}

echo "main job: SmolLM2-135M on the default corpus, $windows windows of 2048 tokens (512 scored)"
ev dense
ev token-filter --method token-filter --tf-ratio 0.3
ev grace --method grace --kv-prune 0.5
step fisher "calibrate --fisher (4 x 512 tokens)" "$bin" calibrate --fisher --fisher-seqs 4 \
  --fisher-tokens 512 --out "$out/fisher.h5" --progress never
step prune "prune rap --retain 0.7" "$bin" prune --method rap --retain 0.7 \
  --calibration "$out/fisher.h5" --out "$out/rap-0.7.gguf" --json "$out/prune-rap.json"
common[1]="$out/rap-0.7.gguf"
ev rap
common[1]=smollm2
step teal-calibration "calibrate (TEAL, 2 windows)" "$bin" calibrate --variants plain \
  --max-windows 2 --greedy-seqs 2 --out "$out/teal-calibration.h5" --progress never
ev teal --method teal --sparsity 0.5 --calibration "$out/teal-calibration.h5"
echo "  methods part: $((SECONDS - t0)) s"
# the times of this run, with the machine's load (1-minute average) before and after
printf '{"windows": %d, "methods_seconds": %d, "load_before": %s, "load_after": %s, "cpus": %d,\n "steps": [%s]}\n' \
  "$windows" $((SECONDS - t0)) "$load0" "$(cut -d' ' -f1 /proc/loadavg)" "$(nproc)" \
  "$(IFS=,; echo "${steps[*]}")" >"$out/main_job.json.tmp"
mv "$out/main_job.json.tmp" "$out/main_job.json"
echo
"$py" "$here/scripts/report.py" compare "$out"/{dense,token-filter,grace,rap,teal}.h5 \
  --hardware a100-80gb --sparsim "$bin" --json "$out/comparison.json"
echo
"$bin" generate --model smollm2 --chat --prompt "Name three plays by Shakespeare." -n 40 \
  --log-level warn
# The report page: the comparison first, then realised against target per family, FLOP and byte
# bars per method and the predicted time on an A100 and an H200 (docs/reports.md).
"$py" "$here/scripts/report.py" page "$out"/{dense,token-filter,grace,rap,teal}.h5 \
  --hardware a100-80gb --hardware h200 --sparsim "$bin" \
  --title "sparsim main job: methods against dense on SmolLM2-135M" --out "$out/report"
echo "run files and summaries: $out/{dense,token-filter,grace,rap,teal}.{h5,json}"
echo "comparison: $out/comparison.json; report: $out/report/index.html"
