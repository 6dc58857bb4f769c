#!/usr/bin/env bash
# The GPU checks of a CUDA build, run from a bundle made by scripts/gpu/bundle.sh, in one go:
#   OUT=DIR SPARSIM_SRC=<source path compiled into the tests> bash BUNDLE/check.sh
# 1. the test suite on CUDA (typed tests on Kokkos::Cuda, the CLI tests with CUDA as the default
#    backend, the rest);  2. CUDA vs OpenMP agreement (perplexity, logits, greedy tokens) on a
#    SmolLM2-shaped synthetic model, f32 and bf16;  3. bench: prefill/decode tokens/s and the
#    bandwidth ideal for SmolLM2 (f32, bf16; fused, graph, op-by-op decode; batch 8), prefill
#    profile at 2,048 tokens, sparse decode (TEAL, WINA, TopK-Guided at s = 0.5);  4. a
#    Llama-2-7B-shaped bf16 model made here by `sparsim synth`: dense decode (fused, graph) and
#    TEAL at s = 0.5;  5. kernel micro-benchmarks.
# Every step runs under `timeout` within SPARSIM_GPU_BUDGET seconds (default 420); a failing
# step never stops the rest. SPARSIM_GPU_QUICK=1 leaves out WINA, the 7B decode without graphs
# and the kernel micro-benchmarks (about 90 s less). Files in $OUT: summary.txt, env.log, tests.log, agree.log,
# bench.log, kernels.log, results.json (every bench JSON and the agreement figures).
set -u
G="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$G/out}"
mkdir -p "$OUT"
T0=$(date +%s)
BUDGET="${SPARSIM_GPU_BUDGET:-420}"
THREADS="${SPARSIM_GPU_THREADS:-$(nproc)}"
QUICK="${SPARSIM_GPU_QUICK:-0}"
W="$(mktemp -d "${TMPDIR:-/tmp}/sparsim-gpu.XXXXXX")"
# models go to /dev/shm when it has room for the 7B one (~14 GB), else next to the other files
SHM="$W"
if [ "$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')" -gt 20000000 ] 2>/dev/null; then
  SHM=/dev/shm/sparsim-gpu.$$
  mkdir -p "$SHM" 2>/dev/null || SHM="$W"
fi
trap 'rm -rf "$W" "$SHM"' EXIT
SUM="$OUT/summary.txt"; ENV="$OUT/env.log"; TESTS="$OUT/tests.log"; AGR="$OUT/agree.log"
BENCH="$OUT/bench.log"; KER="$OUT/kernels.log"
for f in "$SUM" "$ENV" "$TESTS" "$AGR" "$BENCH" "$KER"; do : >"$f"; done
BIN="$G/bin"
chmod +x "$BIN"/* 2>/dev/null
export OMP_PROC_BIND=false

now() { echo $(($(date +%s) - T0)); }
note() { echo "[$(now)s] $*" | tee -a "$SUM"; }
# step NAME MAX_SECONDS LOG CMD...: CMD under `timeout`, never past the budget
step() {
  local name="$1" max="$2" log="$3"
  shift 3
  local left=$((BUDGET - $(now) - 5))
  local t=$((max < left ? max : left))
  if [ "$t" -lt 5 ]; then
    note "SKIP    $name (budget spent)"
    return 124
  fi
  { echo; echo "=== [$(now)s] $name (timeout ${t}s)"; echo "+ $*"; } >>"$log"
  local s rc d
  s=$(date +%s)
  timeout -k 5 "$t" "$@" >>"$log" 2>&1
  rc=$?
  d=$(($(date +%s) - s))
  echo "--- $name: rc=$rc, ${d}s" >>"$log"
  if [ "$rc" = 0 ]; then note "OK      $name (${d}s)"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then note "TIMEOUT $name after ${d}s (limit ${t}s)"
  else note "FAIL    $name rc=$rc (${d}s)"; fi
  return "$rc"
}

# ------------------------------------------------------------------ machine and libraries
{
  echo "sparsim GPU check, $(date -u +%FT%TZ), host $(hostname)"
  uname -a; head -2 /etc/os-release 2>/dev/null; echo "cpus: $(nproc)"
  timeout 20 nvidia-smi 2>&1
  timeout 20 nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,clocks.max.sm \
    --format=csv 2>&1
} >>"$ENV" 2>&1
timeout 20 nvidia-smi -L 2>&1 | head -2 | tee -a "$SUM"
GPU_NAME=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
LIB="$W/lib"
mkdir -p "$LIB/fallback" "$LIB/cuda-fallback"
unxz_to() {
  if command -v xz >/dev/null 2>&1; then xz -dc "$1" >"$2"
  else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; fi
}
for f in "$G"/lib/* "$G"/lib/fallback/* "$G"/lib/cuda-fallback/*; do
  [ -f "$f" ] || continue
  sub=""
  case "$f" in */cuda-fallback/*) sub="cuda-fallback/" ;; */fallback/*) sub="fallback/" ;; esac
  case "$f" in *.xz) unxz_to "$f" "$LIB/$sub$(basename "${f%.xz}")" ;; *) cp "$f" "$LIB/$sub" ;; esac
done
LDP="$LIB"
add_dir() { case ":$LDP:" in *":$1:"*) ;; *) LDP="$LDP:$1" ;; esac; }
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  found=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
    /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$lib" ] && { found="$d"; break; }
  done
  if [ -z "$found" ]; then
    found=$(timeout 40 find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -name "$lib" \
      -print 2>/dev/null | grep -v /stubs/ | head -1)
    found="${found%/*}"
  fi
  echo "$lib: ${found:-not found}" >>"$ENV"
  [ -n "$found" ] && add_dir "$found"
done
add_dir "$LIB/cuda-fallback"
if LD_LIBRARY_PATH="$LDP" ldd "$BIN/sparsim" 2>&1 | grep -q "GLIBCXX\|CXXABI\|GCC_[0-9]"; then
  add_dir "$LIB/fallback"
fi
SP=(env "LD_LIBRARY_PATH=$LDP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
{
  for b in "$BIN"/*; do echo "--- ldd $b"; "${SP[@]}" ldd "$b" 2>&1 | grep "not found"; done
  "${SP[@]}" "$BIN/sparsim" --version 2>&1
} >>"$ENV"
S=("${SP[@]}" "$BIN/sparsim")

# ------------------------------------------------------------------ 1. tests
SRC="${SPARSIM_SRC:?set SPARSIM_SRC to the source path compiled into sparsim_tests}"
if mkdir -p "$SRC/build-cuda/bin" 2>/dev/null; then
  { [ -L "$SRC/data" ] || [ ! -e "$SRC/data" ]; } && ln -sfn "$G/data" "$SRC/data"
  { [ -L "$SRC/build-cuda/bin/sparsim" ] || [ ! -e "$SRC/build-cuda/bin/sparsim" ]; } &&
    ln -sfn "$BIN/sparsim" "$SRC/build-cuda/bin/sparsim"
fi
CUDA_FILTER='*/Cuda.*'
CLI_FILTER='Cli*.*:EvalCli.*:SafetensorsCli.*'
step "tests: typed tests on Kokkos::Cuda" 150 "$W/t1.log" "${SP[@]}" OMP_NUM_THREADS=2 \
  "$BIN/sparsim_tests" --gtest_filter="$CUDA_FILTER" --gtest_color=no &
step "tests: CLI (default backend cuda)" 150 "$W/t2.log" "${SP[@]}" OMP_NUM_THREADS=2 \
  "$BIN/sparsim_tests" --gtest_filter="$CLI_FILTER" --gtest_color=no &
step "tests: the rest (host backends)" 150 "$W/t3.log" "${SP[@]}" OMP_NUM_THREADS=4 \
  "$BIN/sparsim_tests" --gtest_filter="-$CUDA_FILTER:$CLI_FILTER" --gtest_color=no &
wait
for i in 1 2 3; do cat "$W/t$i.log" >>"$TESTS" 2>/dev/null; done
grep -E "^=== |tests? ran|^\[  PASSED  \]|^\[  FAILED  \]|^--- " "$TESTS" | grep -v "listed below" |
  awk '!seen[$0]++' | sed 's/^/    /' | head -60 >>"$SUM"

# ------------------------------------------------------------------ 2. CUDA vs OpenMP
M="$SHM/smollm2-f32.gguf"
C="$W/corpus.txt"
step "synth smollm2-135m f32" 60 "$AGR" "${S[@]}" synth --preset smollm2-135m --type f32 --seed 1 \
  --out "$M"
awk 'BEGIN { srand(7); for (i = 0; i < 20000; i++) { l = 1 + int(rand() * 7); w = "";
  for (k = 0; k < l; k++) w = w sprintf("%c", 97 + int(rand() * 26));
  printf "%s%s", w, (i % 11 == 10 ? ".\n" : " ") } }' >"$C"
TOK=$(awk 'BEGIN { for (i = 0; i < 96; i++) printf "%s%d", (i ? "," : ""), (i * 7919 + 13) % 49152 }')
for st in f32 bf16; do
  for be in cuda openmp; do
    extra=()
    [ "$be" = openmp ] && extra=(--threads "$THREADS")
    step "eval $st $be" 60 "$AGR" "${S[@]}" eval --model "$M" --corpus "$C" --context 512 \
      --stride 256 --max-windows 4 --storage "$st" --backend "$be" "${extra[@]}" --progress never \
      --json "$W/eval_${st}_${be}.json"
    step "forward $st $be" 40 "$AGR" "${S[@]}" forward --model "$M" --tokens "$TOK" --greedy 16 \
      --storage "$st" --backend "$be" "${extra[@]}" --out "$W/fwd_${st}_${be}.h5"
    for ds in prompt_logits greedy_logits greedy_tokens; do
      "${SP[@]}" timeout 30 "$BIN/h5dump" -b LE -d "/results/$ds" -o "$W/fwd_${st}_${be}.$ds.bin" \
        "$W/fwd_${st}_${be}.h5" >/dev/null 2>&1
    done
  done
done
python3 - "$W" "$W/agree.json" >>"$AGR" 2>&1 <<'EOF'
import json, os, sys
w, out = sys.argv[1], sys.argv[2]
try:
    import numpy as np
except Exception:
    np = None
res = {}
for st in ("f32", "bf16"):
    r = {}
    try:
        a, b = (json.load(open(f"{w}/eval_{st}_{be}.json")) for be in ("cuda", "openmp"))
        r["perplexity_cuda"], r["perplexity_openmp"] = a["perplexity"], b["perplexity"]
        r["perplexity_rel_diff"] = abs(a["perplexity"] - b["perplexity"]) / b["perplexity"]
    except Exception as e:
        r["eval_error"] = str(e)
    if np is not None:
        for ds in ("prompt_logits", "greedy_logits"):
            try:
                x, y = (np.fromfile(f"{w}/fwd_{st}_{be}.{ds}.bin", "<f4") for be in ("cuda", "openmp"))
                d = np.abs(x.astype(np.float64) - y)
                r[f"{ds}_max_abs_diff"] = float(d.max())
                r[f"{ds}_max_diff_over_max_logit"] = float(d.max() / np.abs(y).max())
            except Exception as e:
                r[f"{ds}_error"] = str(e)
        try:
            gx, gy = (np.fromfile(f"{w}/fwd_{st}_{be}.greedy_tokens.bin", "<i4") for be in ("cuda", "openmp"))
            r["greedy_tokens_identical"] = bool(gx.size == gy.size and (gx == gy).all())
            r["greedy_tokens"] = int(gx.size)
        except Exception as e:
            r["greedy_error"] = str(e)
    res[st] = r
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res, indent=1))
EOF
sed 's/^/    /' "$W/agree.json" >>"$SUM" 2>/dev/null

# ------------------------------------------------------------------ 3. bench, SmolLM2 shape
B=("${S[@]}" bench --backend cuda)
step "bench smollm2 f32 fused" 60 "$BENCH" "${B[@]}" --model "$M" --storage f32 --prompt 512 \
  --decode 128 --reps 3 --json "$W/bench_smollm2_f32_fused.json"
step "bench smollm2 bf16 fused" 60 "$BENCH" "${B[@]}" --model "$M" --storage bf16 --prompt 512 \
  --decode 128 --reps 3 --json "$W/bench_smollm2_bf16_fused.json"
step "bench smollm2 f32 ops" 60 "$BENCH" "${B[@]}" --model "$M" --storage f32 --prompt 512 \
  --decode 128 --reps 3 --decode-path ops --json "$W/bench_smollm2_f32_ops.json"
step "bench smollm2 f32 fused graph" 60 "$BENCH" "${B[@]}" --model "$M" --storage f32 --prompt 512 \
  --decode 128 --reps 3 --graph --json "$W/bench_smollm2_f32_graph.json"
step "bench smollm2 bf16 fused graph" 60 "$BENCH" "${B[@]}" --model "$M" --storage bf16 \
  --prompt 512 --decode 128 --reps 3 --graph --json "$W/bench_smollm2_bf16_graph.json"
step "bench smollm2 f32 batch 8" 60 "$BENCH" "${B[@]}" --model "$M" --storage f32 --prompt 512 \
  --decode 64 --reps 2 --batch 8 --json "$W/bench_smollm2_f32_batch8.json"
step "bench smollm2 f32 profile prefill 2048" 60 "$BENCH" "${B[@]}" --model "$M" --storage f32 \
  --prompt 2048 --decode 8 --reps 1 --profile --json "$W/bench_smollm2_f32_profile2048.json"
step "bench openmp f32 ($THREADS threads, reference)" 60 "$BENCH" "${S[@]}" bench --model "$M" \
  --backend openmp --threads "$THREADS" --prompt 512 --decode 32 --reps 1 \
  --json "$W/bench_smollm2_f32_openmp.json"
CAL="$W/cal_smollm2.h5"
step "calibrate smollm2 (cuda)" 90 "$BENCH" "${S[@]}" calibrate --model "$M" --corpus "$C" \
  --out "$CAL" --context 256 --max-windows 2 --greedy-seqs 1 --greedy-tokens 32 --alpha 0.05 \
  --backend cuda --progress never
if [ -s "$CAL" ]; then
  methods="teal wina topk-guided"
  [ "$QUICK" = 1 ] && methods="teal topk-guided"
  for m in $methods; do
    step "bench smollm2 f32 --method $m 0.5" 60 "$BENCH" "${B[@]}" --model "$M" --storage f32 \
      --method "$m" --sparsity 0.5 --calibration "$CAL" --prompt 512 --decode 64 --reps 3 \
      --json "$W/bench_smollm2_f32_$m.json"
  done
  step "bench smollm2 bf16 --method teal 0.5" 60 "$BENCH" "${B[@]}" --model "$M" --storage bf16 \
    --method teal --sparsity 0.5 --calibration "$CAL" --prompt 512 --decode 64 --reps 3 \
    --json "$W/bench_smollm2_bf16_teal.json"
fi

# ------------------------------------------------------------------ 4. Llama-2-7B shape, bf16
M7="$SHM/llama2-7b-bf16.gguf"
step "synth llama2-7b bf16" 120 "$BENCH" "${S[@]}" synth --preset llama2-7b --type bf16 --seed 1 \
  --out "$M7"
if [ -s "$M7" ]; then
  step "bench llama2-7b bf16 fused graph" 90 "$BENCH" "${B[@]}" --model "$M7" --storage bf16 \
    --prompt 512 --decode 64 --reps 2 --graph --json "$W/bench_llama7b_bf16_graph.json"
  [ "$QUICK" = 1 ] || step "bench llama2-7b bf16 fused" 90 "$BENCH" "${B[@]}" --model "$M7" \
    --storage bf16 --prompt 512 --decode 64 --reps 2 --json "$W/bench_llama7b_bf16_fused.json"
  CAL7="$W/cal_llama7b.h5"
  step "calibrate llama2-7b plain (cuda)" 120 "$BENCH" "${S[@]}" calibrate --model "$M7" \
    --corpus "$C" --out "$CAL7" --variants plain --storage bf16 --context 64 --max-windows 1 \
    --greedy-seqs 1 --greedy-tokens 16 --alpha 0.1 --probes 0.4 --backend cuda --progress never
  [ -s "$CAL7" ] && step "bench llama2-7b bf16 --method teal 0.5" 90 "$BENCH" "${B[@]}" \
    --model "$M7" --storage bf16 --method teal --sparsity 0.5 --calibration "$CAL7" --prompt 256 \
    --decode 32 --reps 2 --json "$W/bench_llama7b_bf16_teal.json"
  rm -f "$M7"
fi

# ------------------------------------------------------------------ 5. kernels
[ "$QUICK" = 1 ] || step "sparsim_bench_kernels" 40 "$KER" "${SP[@]}" "$BIN/sparsim_bench_kernels" \
  --benchmark_min_time=0.05 --benchmark_color=false
[ "$QUICK" = 1 ] || step "sparsim_bench_mask" 40 "$KER" "${SP[@]}" "$BIN/sparsim_bench_mask" \
  --benchmark_min_time=0.05 --benchmark_color=false --benchmark_filter='BM_MaskSelect|BM_MaskRows'

# ------------------------------------------------------------------ results.json
python3 "$G/collect.py" "$OUT" --work "$W" --gpu "$GPU_NAME" --seconds "$(now)" \
  --commit "${SPARSIM_COMMIT:-unknown}" >>"$SUM" 2>&1
note "done in $(now)s; files: $(cd "$OUT" && ls | tr '\n' ' ')"
exit 0
