#!/usr/bin/env bash
# The main job: a seeded synthetic model of SmolLM2-135M's shape through the forward pass,
# recorded in a run file, then the prefill / decode benchmark against memory bandwidth.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$here/build/bin/sparsim"
out="${SPARSIM_OUT:-$here/out}"
mkdir -p "$out"
model="$out/synth-smollm2-135m-f32.gguf"
[ -f "$model" ] || "$bin" synth --preset smollm2-135m --type f32 --seed 1 --out "$model"
"$bin" inspect "$model" | tail -6
"$bin" forward --model "$model" --tokens 1,200,3000,45,9,77,1024,5 --greedy 8 --out "$out/forward.h5"
"$bin" bench --model "$model" --prompt 128 --decode 32 --reps 3 --json "$out/bench.json"
echo "run file: $out/forward.h5; benchmark: $out/bench.json"
