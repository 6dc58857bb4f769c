#!/usr/bin/env bash
# Collects a CUDA build of sparsim (scripts/tools/build_cuda.sh) and the shared libraries it needs into
# one folder that can be copied to a GPU machine without the build's dependencies: the binaries
# (stripped), h5dump, the golden test data, check.sh, and every non-glibc, non-CUDA library the
# binaries load, named by SONAME and xz-compressed (check.sh unpacks them).
#
#   scripts/gpu/bundle.sh BUILD_DIR BUNDLE_DIR      (BUILD_DIR: e.g. build-cuda)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B=$(readlink -f "$1")/bin
D=$(readlink -m "$2")
rm -rf "$D/bin" "$D/lib" "$D/data"
mkdir -p "$D/bin" "$D/lib/fallback" "$D/data"
for f in sparsim sparsim_tests sparsim_bench_kernels sparsim_bench_mask; do
  [ -x "$B/$f" ] && cp "$B/$f" "$D/bin/"
done
cp /usr/bin/h5dump "$D/bin/"
strip "$D/bin"/*
cp -r "$here/data/golden" "$D/data/"
cp "$here/scripts/gpu/check.sh" "$here/scripts/gpu/collect.py" "$D/"
# every library ldd resolves for the binaries, except glibc, the CUDA driver/toolkit and the
# C++ runtime (the latter kept in lib/fallback, used only when the machine's is too old)
for b in "$D/bin"/*; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  while read -r p; do
    name=$(basename "$p")
    case "$name" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libresolv.so.*|libutil.so.*|libmvec.so.*)
        continue ;;
      libcuda.so.*|libcublas*|libcudart*|libnvidia*|libnvJitLink*|libcusparse*|libcusolver*)
        continue ;;
    esac
    soname=$(objdump -p "$p" | awk '/SONAME/ {print $2}')
    [ -n "$soname" ] || soname="$name"
    case "$name" in
      libstdc++.so.*|libgcc_s.so.*) cp -L "$p" "$D/lib/fallback/$soname" ;;
      *) cp -L "$p" "$D/lib/$soname" ;;
    esac
  done
# the CUDA runtime is small: a fallback used only when the machine has none
mkdir -p "$D/lib/cuda-fallback"
cp -L /usr/local/cuda/lib64/libcudart.so.13 "$D/lib/cuda-fallback/" 2>/dev/null || true
chmod 644 "$D/lib"/*.so* "$D/lib/fallback"/* "$D/lib/cuda-fallback"/* 2>/dev/null || true
xz -T2 -6 -f "$D/lib"/*.so* "$D/lib/fallback"/* "$D/lib/cuda-fallback"/*
# the binaries too (about 60 MB stripped, 16 MB compressed): what travels to a GPU machine is
# limited; check.sh unpacks them
xz -T2 -6 -f "$D/bin"/*
du -sh "$D"
