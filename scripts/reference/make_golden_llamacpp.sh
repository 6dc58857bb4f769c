#!/usr/bin/env bash
# Regenerates the llama.cpp golden logits the test suite compares the forward pass against.
# The models are re-created from their seeds by `sparsim synth`; only the small HDF5 files of
# llama.cpp's logits are committed (data/golden/llamacpp_*.h5).
#
#   scripts/reference/make_golden_llamacpp.sh   (needs build/bin/sparsim and llama-cpp-python in the
#                                      scripts venv: $SPARSIM_DEPS/venv)
# The synth arguments below must match tests/test_golden_llamacpp.cpp.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="${SPARSIM_DEPS:-$HOME/.cache/sparsim-deps}/venv/bin/python"
bin="$here/build/bin/sparsim"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
gen() {  # name, prompt tokens, synth args...
  local name="$1" tokens="$2"
  shift 2
  "$bin" synth --out "$tmp/$name.gguf" "$@" >/dev/null
  "$py" "$here/scripts/reference/llamacpp_reference.py" --model "$tmp/$name.gguf" --tokens "$tokens" \
    --n-greedy 32 --threads 2 --out "$here/data/golden/llamacpp_$name.h5"
}
prompt="1,300,17,42,260,99,7,511,128,64,3,200,450,11,321,77"
gen tiny_gqa_tied "$prompt" --preset tiny --seed 1234
gen tiny_mha_untied_llama3 "$prompt" --preset tiny --seed 99 --kv-heads 4 --untied --llama3-rope
gen small_gqa "$prompt" --preset tiny --seed 5 --layers 4 --d-model 128 --heads 8 --kv-heads 2 --ff 320 --vocab 1000 --context 512
echo "golden files written to $here/data/golden"
