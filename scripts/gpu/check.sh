#!/usr/bin/env bash
# The GPU checks of a CUDA build, run from a bundle made by scripts/gpu/bundle.sh, in one go:
#   OUT=DIR SPARSIM_SRC=<source path compiled into the tests> bash BUNDLE/check.sh
# Parts (SPARSIM_GPU_PARTS, comma separated; default all but ncu):
#   tests    the test suite on CUDA (typed tests on Kokkos::Cuda, the CLI tests with CUDA as the
#            default backend, the rest), three groups side by side
#   agree    CUDA vs OpenMP (perplexity, logits, greedy tokens) on a SmolLM2-shaped model
#   smollm2  bench on the SmolLM2 shape: decode (fused, graph, op by op, batch 8, bf16 and f32),
#            the 2,048-token prefill profiled, the OpenMP backend of the same machine
#   predict  `sparsim probe` on the GPU, then `sparsim predict` on bench run files against
#            what they measured (decode and prefill)
#   methods  SmolLM2 shape: TEAL / WINA / TopK-Guided decode at s = 0.5, Token Filtering
#            r = 0.5 at batch 8, GRACE lambda = 0.5 at an 8K context
#   7b       a Llama-2-7B-shaped bf16 model made here by `sparsim synth`: decode (graph and
#            fused), the 2,048-token prefill with --bf16-compute, TEAL at s = 0.5; RAP rho = 0.7
#            attention against dense on a 7B-shaped model of 4 layers
#   kernels  kernel micro-benchmarks
#   ncu      Nsight Compute: the time of every kernel of two SmolLM2 decode steps
# Every step runs under `timeout` within SPARSIM_GPU_BUDGET seconds (default 450); a failing
# step never stops the rest. Files in $OUT: summary.txt, env.log, tests.log, agree.log,
# bench.log, kernels.log, results.json (every bench JSON, the agreement figures, predictions).
set -u
G="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$G/out}"
mkdir -p "$OUT"
T0=$(date +%s)
BUDGET="${SPARSIM_GPU_BUDGET:-450}"
PARTS=",${SPARSIM_GPU_PARTS:-tests,agree,smollm2,predict,methods,7b,kernels},"
want() { case "$PARTS" in *",$1,"*) return 0 ;; esac; return 1; }
THREADS="${SPARSIM_GPU_THREADS:-$(nproc)}"
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
# binaries: compressed by bundle.sh, unpacked into the work folder
BIN="$W/bin"
mkdir -p "$BIN"
for f in "$G"/bin/*; do
  case "$f" in
    *.xz) if command -v xz >/dev/null 2>&1; then xz -dc "$f" >"$BIN/$(basename "${f%.xz}")"
          else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$BIN/$(basename "${f%.xz}")"; fi ;;
    *) cp "$f" "$BIN/" ;;
  esac
done
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

# ------------------------------------------------------------------ tests
SRC="${SPARSIM_SRC:?set SPARSIM_SRC to the source path compiled into sparsim_tests}"
if mkdir -p "$SRC/build-cuda/bin" 2>/dev/null; then
  { [ -L "$SRC/data" ] || [ ! -e "$SRC/data" ]; } && ln -sfn "$G/data" "$SRC/data"
  { [ -L "$SRC/build-cuda/bin/sparsim" ] || [ ! -e "$SRC/build-cuda/bin/sparsim" ]; } &&
    ln -sfn "$BIN/sparsim" "$SRC/build-cuda/bin/sparsim"
fi
if want tests; then
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
fi

# ------------------------------------------------------------------ models and corpus
M="$SHM/smollm2-f32.gguf"
C="$W/corpus.txt"
step "synth smollm2-135m f32" 60 "$AGR" "${S[@]}" synth --preset smollm2-135m --type f32 --seed 1 \
  --out "$M"
awk 'BEGIN { srand(7); for (i = 0; i < 20000; i++) { l = 1 + int(rand() * 7); w = "";
  for (k = 0; k < l; k++) w = w sprintf("%c", 97 + int(rand() * 26));
  printf "%s%s", w, (i % 11 == 10 ? ".\n" : " ") } }' >"$C"

# ------------------------------------------------------------------ bench, SmolLM2 shape
B=("${S[@]}" bench --backend cuda)
if want smollm2; then
  step "bench smollm2 bf16 fused graph" 45 "$BENCH" "${B[@]}" --model "$M" --storage bf16 \
    --prompt 512 --decode 128 --reps 3 --graph --json "$W/bench_smollm2_bf16_graph.json"
  step "bench smollm2 bf16 fused" 45 "$BENCH" "${B[@]}" --model "$M" --storage bf16 --prompt 512 \
    --decode 64 --reps 2 --out "$W/run_smollm2_bf16.h5" --json "$W/bench_smollm2_bf16_fused.json"
  step "bench smollm2 f32 fused graph" 45 "$BENCH" "${B[@]}" --model "$M" --storage f32 \
    --prompt 512 --decode 128 --reps 3 --graph --json "$W/bench_smollm2_f32_graph.json"
  step "bench smollm2 f32 batch 8" 45 "$BENCH" "${B[@]}" --model "$M" --storage f32 --prompt 512 \
    --decode 64 --reps 2 --batch 8 --json "$W/bench_smollm2_f32_batch8.json"
  step "bench smollm2 f32 profile prefill 2048" 45 "$BENCH" "${B[@]}" --model "$M" --storage f32 \
    --prompt 2048 --decode 8 --reps 2 --profile --out "$W/run_smollm2_f32_p2048.h5" \
    --json "$W/bench_smollm2_f32_profile2048.json"
fi
# ------------------------------------------------------------------ Nsight Compute (diagnosis)
if want ncu; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$NCU" ]; then
    # every kernel of a few decode steps after a 64-token prompt (the launches before skipped)
    step "ncu: kernels of decode steps (SmolLM2 bf16, fused)" 90 "$W/ncu.log" "${SP[@]}" \
      "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 600 \
      --launch-count 340 "$BIN/sparsim" bench --model "$M" --backend cuda --storage bf16 \
      --prompt 64 --decode 6 --reps 1
    python3 - "$W/ncu.log" >"$OUT/ncu_kernels.txt" 2>&1 <<'EOF'
import csv, sys, collections
rows = []
lines = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") == "gpu__time_duration.sum":
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "")
        v *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1.0)
        rows.append((r["Kernel Name"][:90], v))
tot = collections.defaultdict(lambda: [0, 0.0])
for k, v in rows:
    tot[k][0] += 1
    tot[k][1] += v
print(f"{len(rows)} kernels, {sum(v for _, v in rows):.1f} us in all")
for k, (n, v) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print(f"{v:10.1f} us {n:5d} x {v / n:8.2f} us  {k}")
EOF
    head -30 "$OUT/ncu_kernels.txt" | sed 's/^/    /' >>"$SUM"
  fi
fi

# ------------------------------------------------------------------ probe
if want predict; then
  PROF="$W/probe_gpu.json"
  step "probe (cuda)" 45 "$BENCH" "${S[@]}" probe --backend cuda --reps 5 --name h200-probe \
    --out "$PROF"
  [ -s "$PROF" ] && cp "$PROF" "$OUT/probe_gpu.json"
fi
# ------------------------------------------------------------------ Llama-2-7B shape, bf16
M7="$SHM/llama2-7b-bf16.gguf"
if want 7b; then
  step "synth llama2-7b bf16" 120 "$BENCH" "${S[@]}" synth --preset llama2-7b --type bf16 --seed 1 \
    --out "$M7"
  if [ -s "$M7" ]; then
    step "bench llama2-7b bf16 fused graph" 60 "$BENCH" "${B[@]}" --model "$M7" --storage bf16 \
      --prompt 512 --decode 64 --reps 2 --graph --out "$W/run_llama7b_bf16.h5" \
      --json "$W/bench_llama7b_bf16_graph.json"
    step "bench llama2-7b bf16 prefill 2048 --bf16-compute" 60 "$BENCH" "${B[@]}" --model "$M7" \
      --storage bf16 --bf16-compute --prompt 2048 --decode 4 --reps 2 \
      --out "$W/run_llama7b_bf16c_p2048.h5" --json "$W/bench_llama7b_bf16_prefill2048.json"
  fi
fi
# ------------------------------------------------------------------ predictions
if want predict && [ -s "$W/probe_gpu.json" ]; then
  for run in "$W"/run_*.h5; do
    [ -s "$run" ] || continue
    b=$(basename "$run" .h5)
    prec=fp32
    case "$b" in *bf16c*) prec=bf16 ;; esac  # prefill products in bf16 (--bf16-compute)
    step "predict ${b#run_}" 30 "$BENCH" "${S[@]}" predict "$run" --hardware "$W/probe_gpu.json" \
      --precision "$prec" --json --out "$W/predict_${b#run_}.json"
  done
fi

# ------------------------------------------------------------------ methods, SmolLM2 shape
if want methods; then
  CAL="$W/cal_smollm2.h5"
  step "calibrate smollm2 (cuda)" 60 "$BENCH" "${S[@]}" calibrate --model "$M" --corpus "$C" \
    --out "$CAL" --context 256 --max-windows 2 --greedy-seqs 1 --greedy-tokens 32 --alpha 0.05 \
    --backend cuda --progress never
  [ -s "$CAL" ] && step "bench smollm2 bf16 --method teal 0.5" 45 "$BENCH" "${B[@]}" --model "$M" \
    --storage bf16 --method teal --sparsity 0.5 --calibration "$CAL" --prompt 512 --decode 64 \
    --reps 3 --json "$W/bench_smollm2_bf16_teal.json"
  step "bench smollm2 f32 token-filter r 0.5 batch 8" 60 "$BENCH" "${B[@]}" --model "$M" \
    --storage f32 --method token-filter --tf-ratio 0.5 --batch 8 --prompt 16 --decode 512 \
    --reps 3 --json "$W/bench_smollm2_f32_tf05_b8.json"
  step "bench smollm2 f32 grace 0.5 at 8K" 60 "$BENCH" "${B[@]}" --model "$M" --storage f32 \
    --method grace --kv-prune 0.5 --prompt 8000 --decode 16 --reps 3 \
    --json "$W/bench_smollm2_f32_grace05_8k.json"
fi
# ------------------------------------------------------------------ CUDA vs OpenMP
if want agree; then
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
fi

# ------------------------------------------------------------------ RAP on a 7B-shaped model
# rho = 0.7 on a Llama-2-7B-shaped model of 4 layers: Fisher scores, the pruned model, its
# attention module against the dense one's (decode steps at position 2,048)
if want 7b; then
  M74="$SHM/llama7b-4l-f32.gguf"
  step "synth llama2-7b shape, 4 layers" 60 "$BENCH" "${S[@]}" synth --preset llama2-7b --layers 4 \
    --type f32 --seed 1 --out "$M74"
  F74="$W/fisher_7b4.h5"
  [ -s "$M74" ] && step "calibrate --fisher (7B shape, 4 layers)" 90 "$BENCH" "${S[@]}" calibrate \
    --fisher --model "$M74" --corpus "$C" --out "$F74" --context 128 --max-windows 2 \
    --backend cuda --progress never
  R74="$SHM/llama7b-4l-rap070.gguf"
  [ -s "$F74" ] && step "prune rap 0.7 (7B shape, 4 layers)" 60 "$BENCH" "${S[@]}" prune \
    --method rap --retain 0.7 --model "$M74" --calibration "$F74" --out "$R74"
  [ -s "$R74" ] && step "bench rap 0.7 attention vs dense (7B shape)" 60 "$BENCH" "${B[@]}" \
    --model "$R74" --baseline "$M74" --storage bf16 --prompt 2048 --decode 32 --reps 3 \
    --decode-only --json "$W/bench_llama7b4_rap070_attention.json"
  rm -f "$M74" "$R74"
fi
# ------------------------------------------------------------------ TEAL on the 7B shape
if want 7b && [ -s "$M7" ]; then
  CAL7="$W/cal_llama7b.h5"
  step "calibrate llama2-7b plain (cuda)" 120 "$BENCH" "${S[@]}" calibrate --model "$M7" \
    --corpus "$C" --out "$CAL7" --variants plain --storage bf16 --context 64 --max-windows 1 \
    --greedy-seqs 1 --greedy-tokens 16 --alpha 0.1 --probes 0.4 --backend cuda --progress never
  [ -s "$CAL7" ] && step "bench llama2-7b bf16 --method teal 0.5" 90 "$BENCH" "${B[@]}" \
    --model "$M7" --storage bf16 --method teal --sparsity 0.5 --calibration "$CAL7" --prompt 256 \
    --decode 32 --reps 2 --json "$W/bench_llama7b_bf16_teal.json"
fi
rm -f "$M7"
# ------------------------------------------------------------------ more activation methods
if want methods && [ -s "$W/cal_smollm2.h5" ]; then
  for m in wina topk-guided; do
    step "bench smollm2 bf16 --method $m 0.5" 45 "$BENCH" "${B[@]}" --model "$M" --storage bf16 \
      --method "$m" --sparsity 0.5 --calibration "$W/cal_smollm2.h5" --prompt 512 --decode 64 \
      --reps 2 --json "$W/bench_smollm2_bf16_$m.json"
  done
fi
# ------------------------------------------------------------------ kernels
if want kernels; then
  step "sparsim_bench_kernels" 40 "$KER" "${SP[@]}" "$BIN/sparsim_bench_kernels" \
    --benchmark_min_time=0.05 --benchmark_color=false
fi

# ------------------------------------------------------------------ results.json
python3 "$G/collect.py" "$OUT" --work "$W" --gpu "$GPU_NAME" --seconds "$(now)" \
  --commit "${SPARSIM_COMMIT:-unknown}" >>"$SUM" 2>&1
note "done in $(now)s; files: $(cd "$OUT" && ls | tr '\n' ' ')"
exit 0
