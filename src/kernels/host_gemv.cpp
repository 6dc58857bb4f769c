#include "kernels/host_gemv.hpp"

#include "kernels/host_clones.hpp"

#include <cstddef>
#include <cstdint>

namespace sparsim::host {
namespace {

constexpr int kLanes = kDotLanes;
constexpr int kGroup = kSparseGroup;
constexpr std::ptrdiff_t kAhead = 4096;  // bytes the short-row stream prefetches ahead

inline float wide(float v) {
  return v;
}
template <class Half>
inline float wide(Half v) {
  return v.to_float();
}

/// `more`: the matrix has a row after the block's last one (w[R · ld …] may be read).
template <int R, class T>
inline void dot_block(const float* x, const T* w, std::size_t ld, int n, float* y, std::size_t ys,
                      bool more) {
  float a[R][kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    // 16-bit rows: ask for the next block's rows, a cache line at a time. Eight short rows
    // (SmolLM2's 1 KiB) are eight streams too short for the hardware prefetcher; this took its
    // cold bf16 GEMVs from 12-14 to 16-20 GB/s on a 2-core Xeon. It made fp32 slower (fp32 rows
    // are twice as long and were already near the copy bandwidth), hence 16-bit only.
    if constexpr (R > 1 && sizeof(T) == 2)
      if ((i * sizeof(T)) % 64 == 0)
        for (int r = 0; r < R; ++r) __builtin_prefetch(&w[(r + R) * ld + i]);
    for (int l = 0; l < kLanes; ++l) {
      const float xv = x[i + l];
      for (int r = 0; r < R; ++r) a[r][l] += xv * wide(w[r * ld + i + l]);
    }
  }
  if (i < n) {
    // The last n − i < 16 columns into the same lanes as whole vectors: a row's tail is read
    // together with the first columns of the row after it, whose products are weighted 0 (x is
    // 0 there); with n ≥ 16 (so ld ≥ 16) the read ends inside that row. A row with no row after
    // it, or a row shorter than 16, reads its tail from a zero-padded copy, through the same
    // vector statement, so that every row's sum is the same arithmetic.
    float xt[kLanes];
    for (int l = 0; l < kLanes; ++l) xt[l] = i + l < n ? x[i + l] : 0.0f;
    for (int r = 0; r < R; ++r) {
      const T* tail = w + r * ld + i;
      T pad[kLanes];
      if (n < kLanes || (r + 1 == R && !more)) {
        for (int l = 0; l < kLanes; ++l) pad[l] = i + l < n ? tail[l] : T{};
        tail = pad;
      }
      for (int l = 0; l < kLanes; ++l) a[r][l] += xt[l] * wide(tail[l]);
    }
  }
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l)
      for (int r = 0; r < R; ++r) a[r][l] += a[r][l + h];
  for (int r = 0; r < R; ++r) y[r * ys] = a[r][0];
}

template <class T>
inline void dot_rows_impl(const float* x, const T* w, std::size_t ld, int n, int rows, float* y,
                          std::size_t ys, bool more, bool ahead_too) {
  int r = 0;
  if (n <= kShortRow) {
    // Short rows one after another: x stays in the first-level cache, and the block's rows are
    // read as one forward stream, where eight interleaved streams of a few hundred bytes each
    // are a pattern the hardware prefetchers follow poorly.
    // The stream is also asked for kAhead bytes ahead of the row being summed (into the
    // second-level cache): the hardware prefetchers stop at every 4 KiB page and rows of a few
    // hundred bytes give them little to learn from between pages.
    const char* ahead = reinterpret_cast<const char*>(w) + kAhead;
    ahead -= reinterpret_cast<std::uintptr_t>(ahead) % 64;
    for (; r < rows; ++r) {
      if (ahead_too) {
        const char* until = reinterpret_cast<const char*>(w + (r + 1) * ld) + kAhead;
        for (; ahead < until; ahead += 64) __builtin_prefetch(ahead, 0, 1);
      }
      dot_block<1>(x, w + r * ld, ld, n, y + r * ys, ys, r + 1 < rows || more);
    }
    return;
  }
  for (; r + kRowBlock <= rows; r += kRowBlock)
    dot_block<kRowBlock>(x, w + r * ld, ld, n, y + r * ys, ys, r + kRowBlock < rows || more);
  for (; r < rows; ++r) dot_block<1>(x, w + r * ld, ld, n, y + r * ys, ys, r + 1 < rows || more);
}

/// Kept-row groups of the fixed order summed per sweep of the tile: y's partial sums are loaded
/// and stored once per kSweepGroups groups. a = (a + g₀) + g₁ is what two sweeps would compute,
/// so this changes no bit.
constexpr int kSweepGroups = 2;
constexpr int kSweepRows = kSweepGroups * kGroup;

/// a[j] = (a[j] + g₀) + g₁ … over the sweep's groups, for j in [j0, j1).
template <class T>
inline void sweep_columns(float* a, int j0, int j1, const float* xs, const T* const* r) {
  for (int j = j0; j < j1; ++j) {
    float acc = a[j];
    for (int g = 0; g < kSweepRows; g += kGroup)
      acc += (xs[g] * wide(r[g][j]) + xs[g + 1] * wide(r[g + 1][j])) +
             (xs[g + 2] * wide(r[g + 2][j]) + xs[g + 3] * wide(r[g + 3][j]));
    a[j] = acc;
  }
}

template <class T>
inline void sparse_tile_impl(float* a, int n, const float* x, const int* idx, int nnz, const T* wt,
                             std::size_t ld) {
  constexpr int kLine = 64 / static_cast<int>(sizeof(T));  // weights per cache line
  int k = 0;
  for (; k + kSweepRows <= nnz; k += kSweepRows) {
    float xs[kSweepRows];
    const T* r[kSweepRows];
    const T* next[kSweepRows];  // the next sweep's rows, prefetched at the same columns
    const bool more = k + 2 * kSweepRows <= nnz;
    for (int q = 0; q < kSweepRows; ++q) {
      xs[q] = x[idx[k + q]];
      r[q] = wt + idx[k + q] * ld;
      next[q] = more ? wt + idx[k + kSweepRows + q] * ld : r[q];
    }
    // Each kept row is a run of a few KiB at a random place: too short for the hardware
    // prefetcher to ramp up on. Asking for the next sweep's rows a line at a time, as this sweep
    // passes the same columns, took the cold bf16 Llama-2-7B shapes at s = 0.7 from 16-17 to
    // 21-23 GB/s on a 2-core Xeon.
    int j0 = 0;
    for (; j0 + kLine <= n; j0 += kLine) {
      for (int q = 0; q < kSweepRows; ++q) __builtin_prefetch(next[q] + j0);
      sweep_columns(a, j0, j0 + kLine, xs, r);
    }
    sweep_columns(a, j0, n, xs, r);
  }
  for (; k + kGroup <= nnz; k += kGroup) {
    const int i0 = idx[k], i1 = idx[k + 1], i2 = idx[k + 2], i3 = idx[k + 3];
    const float x0 = x[i0], x1 = x[i1], x2 = x[i2], x3 = x[i3];
    const T* r0 = wt + i0 * ld;
    const T* r1 = wt + i1 * ld;
    const T* r2 = wt + i2 * ld;
    const T* r3 = wt + i3 * ld;
    for (int j = 0; j < n; ++j)
      a[j] += (x0 * wide(r0[j]) + x1 * wide(r1[j])) + (x2 * wide(r2[j]) + x3 * wide(r3[j]));
  }
  for (; k < nnz; ++k) {
    const float xi = x[idx[k]];
    const T* r = wt + idx[k] * ld;
    for (int j = 0; j < n; ++j) a[j] += xi * wide(r[j]);
  }
}

}  // namespace

SPARSIM_CLONES void dot_rows(const float* x, const float* w, std::size_t ld, int n, int rows,
                             float* y, std::size_t ys, bool more, bool ahead) {
  dot_rows_impl(x, w, ld, n, rows, y, ys, more, ahead);
}
SPARSIM_CLONES void dot_rows(const float* x, const bf16_t* w, std::size_t ld, int n, int rows,
                             float* y, std::size_t ys, bool more, bool ahead) {
  dot_rows_impl(x, w, ld, n, rows, y, ys, more, ahead);
}
SPARSIM_CLONES void dot_rows(const float* x, const f16_t* w, std::size_t ld, int n, int rows,
                             float* y, std::size_t ys, bool more, bool ahead) {
  dot_rows_impl(x, w, ld, n, rows, y, ys, more, ahead);
}

SPARSIM_CLONES void sparse_tile(float* a, int n, const float* x, const int* idx, int nnz,
                                const float* wt, std::size_t ld) {
  sparse_tile_impl(a, n, x, idx, nnz, wt, ld);
}
SPARSIM_CLONES void sparse_tile(float* a, int n, const float* x, const int* idx, int nnz,
                                const bf16_t* wt, std::size_t ld) {
  sparse_tile_impl(a, n, x, idx, nnz, wt, ld);
}
SPARSIM_CLONES void sparse_tile(float* a, int n, const float* x, const int* idx, int nnz,
                                const f16_t* wt, std::size_t ld) {
  sparse_tile_impl(a, n, x, idx, nnz, wt, ld);
}

const char* gemv_isa() {
#if SPARSIM_HAS_CLONES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3";
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  return "x86-64-v4 (build)";
#elif defined(__AVX2__) && defined(__FMA__)
  return "x86-64-v3 (build)";
#endif
  return "baseline";
}

}  // namespace sparsim::host
