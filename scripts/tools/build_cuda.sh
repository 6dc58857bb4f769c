#!/usr/bin/env bash
# Configures and builds sparsim's CUDA preset against a Kokkos (>= 4.7 with CUDA) install, so
# that every change to the kernels is compile-checked for CUDA (no GPU needed to build).
#
#   scripts/tools/build_cuda.sh --kokkos PREFIX [--kokkos-kernels PREFIX] [--arch AMPERE80|HOPPER90]
#                         [--build-dir DIR] [--jobs N] [--target T ...] [--fresh]
#
#   --kokkos          Kokkos install built with -DKokkos_ENABLE_CUDA=ON (and OpenMP + Serial, so
#                     that the CUDA binaries can also run the host backends), e.g. from Spack
#                     (`spack install kokkos+cuda+openmp+serial cuda_arch=80` and
#                     `kokkos-kernels+cublas+blas`) or a cluster module. Also: $KOKKOS_CUDA_ROOT.
#   --kokkos-kernels  Kokkos Kernels install (default: the same prefix as --kokkos).
#   --arch            the Kokkos architecture the install must have been built for
#                     (default AMPERE80, the A100 preset; HOPPER90 for H100/H200; "" = any).
#   --build-dir       build directory (default build-cuda, the preset's).
#   --target          build only these targets (default: all).
#   --fresh           remove the build directory first.
# The compiler is Kokkos' nvcc_wrapper, which Kokkos >= 4 selects for every file that uses
# Kokkos. Exit status: 0 when everything compiled and linked.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
kokkos="${KOKKOS_CUDA_ROOT:-}"
kk=""
arch="AMPERE80"
bdir="$here/build-cuda"
jobs="${JOBS:-$(nproc)}"
targets=()
fresh=0
while [ $# -gt 0 ]; do
  case "$1" in
    --kokkos) kokkos="$2"; shift 2 ;;
    --kokkos-kernels) kk="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --build-dir) bdir="$(readlink -m "$2")"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --target) targets+=("$2"); shift 2 ;;
    --fresh) fresh=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "build_cuda.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$kokkos" ]; then
  echo "build_cuda.sh: give the Kokkos (CUDA) install with --kokkos PREFIX or KOKKOS_CUDA_ROOT" >&2
  exit 2
fi
if [ ! -d "$kokkos" ]; then
  echo "build_cuda.sh: --kokkos $kokkos is not a directory" >&2
  exit 2
fi
kk="${kk:-$kokkos}"
cfg=$(find "$kokkos" -name KokkosConfig.cmake -path '*cmake*' 2>/dev/null | head -1)
if [ -z "$cfg" ]; then
  echo "build_cuda.sh: no KokkosConfig.cmake under $kokkos (not a Kokkos install?)" >&2
  exit 2
fi
if ! grep -rqs "Kokkos_ENABLE_CUDA.*ON\|KOKKOS_ENABLE_CUDA" "$(dirname "$cfg")"; then
  echo "build_cuda.sh: the Kokkos at $kokkos was not built with CUDA" >&2
  exit 2
fi
export PATH="/usr/local/cuda/bin:$PATH"
[ "$fresh" = 1 ] && rm -rf "$bdir"
cd "$here"
cmake --preset cuda-a100 -B "$bdir" -DKokkos_ROOT="$kokkos" -DKokkosKernels_ROOT="$kk" \
  -DSPARSIM_REQUIRE_ARCH="$arch"
if [ ${#targets[@]} -gt 0 ]; then
  cmake --build "$bdir" -j "$jobs" --target "${targets[@]}"
else
  cmake --build "$bdir" -j "$jobs"
fi
echo "build_cuda.sh: built $bdir/bin (Kokkos $kokkos, arch ${arch:-any})"
