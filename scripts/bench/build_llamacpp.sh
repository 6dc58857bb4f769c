#!/usr/bin/env bash
# Builds llama.cpp's own command-line tools (llama-bench, llama-quantize, llama-perplexity) from
# the llama.cpp sources vendored in the llama-cpp-python source package on PyPI, with llama.cpp's
# default CMake options -- GGML_NATIVE=ON, i.e. tuned for the CPU of this machine -- into a cache
# folder outside the repository. This is the peer scripts/bench/bench_vs_llamacpp.py measures against.
#
#   scripts/bench/build_llamacpp.sh            # build (or reuse) and print the tools' folder
#   scripts/bench/build_llamacpp.sh --print    # print the tools' folder if built, exit 1 otherwise
#   scripts/bench/build_llamacpp.sh --avx2     # AVX2 + FMA + F16C only (GGML_NATIVE=OFF): what the
#                                        # native build is on an AVX2-only CPU, for measuring
#                                        # the AVX2 paths on a CPU that also has AVX-512
#
# Environment:
#   SPARSIM_DEPS     cache prefix (default ~/.cache/sparsim-deps)
#   LLAMACPP_PY_VER  llama-cpp-python version whose vendored llama.cpp is built (default 0.3.36)
#   JOBS             parallel build jobs (default: nproc)
#
# The build is per machine: a -march=native binary from another CPU is not reused. The folder
# name carries the version and a hash of the CPU's feature flags; build-info.json next to the
# tools records the CMake options, compiler flags and the CPU they were built on.
set -euo pipefail

deps="${SPARSIM_DEPS:-$HOME/.cache/sparsim-deps}"
ver="${LLAMACPP_PY_VER:-0.3.36}"
jobs="${JOBS:-$(nproc)}"
print_only=0
isa=native
for a in "$@"; do
  case "$a" in
    --print) print_only=1 ;;
    --avx2) isa=avx2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "build_llamacpp.sh: unknown option '$a'" >&2; exit 2 ;;
  esac
done

cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 | xargs)"
cpu_hash="$(printf '%s' "$cpu_flags" | sha256sum | cut -c1-12)"
prefix="$deps/llama.cpp-$ver-$isa-$cpu_hash"
if [ -f "$prefix/.complete" ]; then
  echo "$prefix/bin"
  exit 0
fi
[ "$print_only" = 1 ] && { echo "llama.cpp tools not built for this CPU: run scripts/bench/build_llamacpp.sh" >&2; exit 1; }

log() { printf '\033[1m[llama.cpp]\033[0m %s\n' "$*" >&2; }
py="$deps/venv/bin/python"
[ -x "$py" ] || py=python3
work="$prefix.work"
rm -rf "$work" "$prefix"
mkdir -p "$work"
log "downloading the llama-cpp-python $ver source package (PyPI)"
"$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
  "llama-cpp-python==$ver" -d "$work" >&2
tar xzf "$work/llama_cpp_python-$ver.tar.gz" -C "$work" "llama_cpp_python-$ver/vendor/llama.cpp"
src="$work/llama_cpp_python-$ver/vendor/llama.cpp"

# llama.cpp's defaults (Release, GGML_NATIVE=ON, OpenMP, no BLAS); only the unused parts
# (tests, examples, server, HTTP download) are switched off, none of which touches the kernels.
opts=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF)
# the AVX2 level through llama.cpp's own switches for a non-native x86 build (its docs/build.md)
[ "$isa" = avx2 ] && opts+=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
                           -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF)
# the tools find their shared libraries beside them once copied out of the build tree
link=(-DCMAKE_BUILD_RPATH='$ORIGIN')
log "configuring llama.cpp (${opts[*]})"
cmake -S "$src" -B "$work/build" -G Ninja "${opts[@]}" "${link[@]}" >"$work/configure.log" 2>&1 \
  || { tail -30 "$work/configure.log" >&2; exit 1; }
log "building llama-bench, llama-quantize, llama-perplexity (about 10-20 minutes on 2 cores)"
cmake --build "$work/build" -j "$jobs" --target llama-bench llama-quantize llama-perplexity \
  >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; exit 1; }

mkdir -p "$prefix/bin"
cp "$work/build/bin/llama-bench" "$work/build/bin/llama-quantize" "$work/build/bin/llama-perplexity" "$prefix/bin/"
# shared libraries, if the default build made any
find "$work/build/bin" -maxdepth 1 -name '*.so*' -exec cp -P {} "$prefix/bin/" \;
cache="$work/build/CMakeCache.txt"
cval() { grep -E "^$1:" "$cache" | head -1 | cut -d= -f2-; }
flags_cpu="$(grep -rhoE -- '-march=[a-z0-9-]+|-m(avx|fma|f16c|bmi)[a-z0-9_]*' \
  "$work/build/ggml/src/CMakeFiles/ggml-cpu.dir/flags.make" 2>/dev/null | sort -u | xargs || true)"
[ -n "$flags_cpu" ] || flags_cpu="$(grep -rhoE -- '-march=[a-z0-9-]+|-m(avx|fma|f16c|bmi)[a-z0-9_]*' \
  "$work/build/build.ninja" | sort -u | xargs || true)"
"$py" - "$prefix/build-info.json" <<EOF
import json, sys
json.dump({
  "source": "llama-cpp-python $ver sdist (PyPI), vendor/llama.cpp",
  "cmake_options": "${opts[*]}",
  "isa": "$isa",
  "GGML_NATIVE": "$(cval GGML_NATIVE)",
  "GGML_OPENMP": "$(cval GGML_OPENMP)",
  "GGML_BLAS": "$(cval GGML_BLAS)",
  "CMAKE_BUILD_TYPE": "$(cval CMAKE_BUILD_TYPE)",
  "CMAKE_C_COMPILER": "$(cval CMAKE_C_COMPILER)",
  "ggml_cpu_compile_flags": "$flags_cpu",
  "cpu_flags_hash": "$cpu_hash",
}, open(sys.argv[1], "w"), indent=2)
EOF
rm -rf "$work"
touch "$prefix/.complete"
log "built into $prefix/bin"
echo "$prefix/bin"
