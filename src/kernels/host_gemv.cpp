#include "kernels/host_gemv.hpp"

#include "kernels/host_clones.hpp"
#include "kernels/host_lanes.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>

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

#if defined(__GNUC__) && !defined(__CUDACC__)
/// 8 lanes: one ymm register with AVX2 and with AVX-512.
using half_t = lanes::f8;
#else
struct half_t {
  float v[kLanes / 2];
  float& operator[](int l) { return v[l]; }
  float operator[](int l) const { return v[l]; }
};
inline half_t operator+(half_t a, const half_t& b) {
  for (int l = 0; l < kLanes / 2; ++l) a.v[l] += b.v[l];
  return a;
}
inline half_t operator*(half_t a, const half_t& b) {
  for (int l = 0; l < kLanes / 2; ++l) a.v[l] *= b.v[l];
  return a;
}
#endif

/// 16 lanes as two 8-lane halves (lanes::Halves): the products and sums of dot_block and
/// dot_row_tokens are vector statements, which the compiler fuses (or not, in a clone without FMA)
/// the same way for every NT (on arrays of lanes its choice between fused and separate
/// multiply-adds in the tail differed between instantiations, and with it the last bits of a
/// token's sum).
using lanes_t = lanes::Halves<half_t>;
using lanes::madd;

inline lanes_t load_lanes(const float* p) {
  return lanes::load_halves<half_t>(p);
}
template <class T>
inline lanes_t load_lanes(const T* p) {
  float f[kLanes];
  for (int l = 0; l < kLanes; ++l) f[l] = wide(p[l]);
  return load_lanes(f);
}

/// The lanes added pairwise at distances 8, 4, 2, 1 (detail::dot_lanes' tree): the halves, then
/// halves of halves.
inline float tree_sum(const lanes_t& a) {
  const half_t b = a.lo + a.hi;
#if defined(__GNUC__) && !defined(__CUDACC__)
  using f4 = float __attribute__((vector_size(4 * sizeof(float))));
  using f2 = float __attribute__((vector_size(2 * sizeof(float))));
  const f4 c =
      __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
  const f2 d = __builtin_shufflevector(c, c, 0, 1) + __builtin_shufflevector(c, c, 2, 3);
  return d[0] + d[1];
#else
  float s[kLanes / 2];
  for (int l = 0; l < kLanes / 2; ++l) s[l] = b[l];
  for (int h = kLanes / 4; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) s[l] += s[l + h];
  return s[0];
#endif
}

/// tree_sum of a[0 … 7] at once, into y[t · yt]: the same pairwise additions (distances 8, 4, 2,
/// 1), each level after the first halving the partial sums per vector and doubling the tokens
/// per vector.
inline void tree_sum8(const lanes_t* a, float* y, std::size_t yt) {
#if defined(__GNUC__) && !defined(__CUDACC__)
  half_t b[8], c[4], d[2];
  for (int t = 0; t < 8; ++t) b[t] = a[t].lo + a[t].hi;
  for (int j = 0; j < 4; ++j) c[j] = lanes::fold4(b[2 * j], b[2 * j + 1]);
  for (int j = 0; j < 2; ++j) d[j] = lanes::fold2(c[2 * j], c[2 * j + 1]);
  const half_t r = lanes::fold1(d[0], d[1]);
  for (int t = 0; t < 8; ++t) y[t * yt] = r[t];
#else
  for (int t = 0; t < 8; ++t) y[t * yt] = tree_sum(a[t]);
#endif
}

/// `more`: the matrix has a row after the block's last one (w[R · ld …] may be read).
template <int R, class T>
inline void dot_block(const float* x, const T* w, std::size_t ld, int n, float* y, std::size_t ys,
                      bool more) {
  lanes_t a[R]{};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    // 16-bit rows: ask for the next block's rows, a cache line at a time. Eight short rows
    // (SmolLM2's 1 KiB) are eight streams too short for the hardware prefetcher; this took its
    // cold bf16 GEMVs from 12-14 to 16-20 GB/s on a 2-core Xeon. It made fp32 slower (fp32 rows
    // are twice as long and were already near the copy bandwidth), hence 16-bit only.
    if constexpr (R > 1 && sizeof(T) == 2)
      if ((i * sizeof(T)) % 64 == 0)
        for (int r = 0; r < R; ++r) __builtin_prefetch(&w[(r + R) * ld + i]);
    const lanes_t xv = load_lanes(x + i);
    for (int r = 0; r < R; ++r) madd(a[r], xv, load_lanes(w + r * ld + i));
  }
  if (i < n) {
    // The last n − i < 16 columns into the same lanes as whole vectors: a row's tail is read
    // together with the first columns of the row after it, whose products are weighted 0 (x is
    // 0 there); with n ≥ 16 (so ld ≥ 16) the read ends inside that row. A row with no row after
    // it, or a row shorter than 16, reads its tail from a zero-padded copy, through the same
    // vector statement, so that every row's sum is the same arithmetic.
    float xt[kLanes];
    for (int l = 0; l < kLanes; ++l) xt[l] = i + l < n ? x[i + l] : 0.0f;
    const lanes_t xv = load_lanes(xt);
    for (int r = 0; r < R; ++r) {
      const T* tail = w + r * ld + i;
      T pad[kLanes];
      if (n < kLanes || (r + 1 == R && !more)) {
        for (int l = 0; l < kLanes; ++l) pad[l] = i + l < n ? tail[l] : T{};
        tail = pad;
      }
      madd(a[r], xv, load_lanes(tail));
    }
  }
  for (int r = 0; r < R; ++r) y[r * ys] = tree_sum(a[r]);
}

/// xtail[t · 16 + l] = x[t · xs + i0 + l] for i0 + l < n, else 0 (i0 = n rounded down to 16):
/// the tokens' last columns as dot_row_tokens multiplies them with a row's tail.
inline void x_tails(const float* x, std::size_t xs, int nt, int n, float* xtail) {
  const int i0 = n / kLanes * kLanes;
  for (int t = 0; t < nt; ++t)
    for (int l = 0; l < kLanes; ++l) xtail[t * kLanes + l] = i0 + l < n ? x[t * xs + i0 + l] : 0.0f;
}

/// One row against NT tokens (x + t·xs, their last columns in xtail: x_tails): y[t · yt] = the
/// row's sum for token t, in the lanes, tail and tree of dot_block (a row of at least 16 columns
/// with a row after it reads its last n mod 16 columns with the next row's first ones, weighted 0;
/// otherwise from a zero-padded copy), each weight read once for all NT tokens, each token its own
/// chain of multiply-adds. The short rows of dot_rows (NT = 1) and of dot_rows_batch go through it,
/// so a token's sums are the same whatever tokens are summed beside it.
template <int NT, class T>
inline void dot_row_tokens(const float* x, std::size_t xs, const float* xtail, const T* w, int n,
                           float* y, std::size_t yt, bool more) {
  lanes_t a[NT]{};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const lanes_t wv = load_lanes(w + i);
    for (int t = 0; t < NT; ++t) madd(a[t], load_lanes(x + t * xs + i), wv);
  }
  if (i < n) {
    const T* tail = w + i;
    T pad[kLanes];
    if (n < kLanes || !more) {
      for (int l = 0; l < kLanes; ++l) pad[l] = i + l < n ? tail[l] : T{};
      tail = pad;
    }
    const lanes_t wv = load_lanes(tail);
    for (int t = 0; t < NT; ++t) madd(a[t], load_lanes(xtail + t * kLanes), wv);
  }
  if constexpr (NT == 8) {
    tree_sum8(a, y, yt);
  } else {
    for (int t = 0; t < NT; ++t) y[t * yt] = tree_sum(a[t]);
  }
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
    float xtail[kLanes];
    x_tails(x, 0, 1, n, xtail);
    for (; r < rows; ++r) {
      if (ahead_too) {
        const char* until = reinterpret_cast<const char*>(w + (r + 1) * ld) + kAhead;
        for (; ahead < until; ahead += 64) __builtin_prefetch(ahead, 0, 1);
      }
      dot_row_tokens<1>(x, 0, xtail, w + r * ld, n, y + r * ys, 0, r + 1 < rows || more);
    }
    return;
  }
  for (; r + kRowBlock <= rows; r += kRowBlock)
    dot_block<kRowBlock>(x, w + r * ld, ld, n, y + r * ys, ys, r + kRowBlock < rows || more);
  for (; r < rows; ++r) dot_block<1>(x, w + r * ld, ld, n, y + r * ys, ys, r + 1 < rows || more);
}

/// Tokens dot_rows_batch takes through one row together.
constexpr int kTokenBlock = 8;

/// dot_row_tokens<m> for a run-time token count m in [1, NT].
template <int NT, class T>
inline void dot_row_tokens_n(int m, const float* x, std::size_t xs, const float* xtail, const T* w,
                             int n, float* y, std::size_t yt, bool more) {
  if constexpr (NT > 1)
    if (m < NT) return dot_row_tokens_n<NT - 1>(m, x, xs, xtail, w, n, y, yt, more);
  dot_row_tokens<NT>(x, xs, xtail, w, n, y, yt, more);
}

template <class T>
inline void dot_rows_batch_impl(const float* x, std::size_t xs, int nt, const T* w, std::size_t ld,
                                int n, int rows, float* y, std::size_t yt, std::size_t ys,
                                bool more) {
  if (nt == 1 || n > kShortRow) {
    for (int t = 0; t < nt; ++t)
      dot_rows_impl(x + t * xs, w, ld, n, rows, y + t * yt, ys, more, t == 0);
    return;
  }
  // Short rows one after another, as dot_rows_impl, each row read once for every kTokenBlock
  // tokens.
  for (int t0 = 0; t0 < nt; t0 += kTokenBlock) {
    const int m = nt - t0 < kTokenBlock ? nt - t0 : kTokenBlock;
    const float* xb = x + t0 * xs;
    float xtail[kTokenBlock * kLanes];
    x_tails(xb, xs, m, n, xtail);
    const char* ahead = reinterpret_cast<const char*>(w) + kAhead;
    ahead -= reinterpret_cast<std::uintptr_t>(ahead) % 64;
    for (int r = 0; r < rows; ++r) {
      if (t0 == 0) {  // the first pass streams the rows from memory
        const char* until = reinterpret_cast<const char*>(w + (r + 1) * ld) + kAhead;
        for (; ahead < until; ahead += 64) __builtin_prefetch(ahead, 0, 1);
      }
      const T* wr = w + r * ld;
      float* yr = y + t0 * yt + r * ys;
      dot_row_tokens_n<kTokenBlock>(m, xb, xs, xtail, wr, n, yr, yt, r + 1 < rows || more);
    }
  }
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

SPARSIM_CLONES void dot_rows_batch(const float* x, std::size_t xs, int nt, const float* w,
                                   std::size_t ld, int n, int rows, float* y, std::size_t yt,
                                   std::size_t ys, bool more) {
  dot_rows_batch_impl(x, xs, nt, w, ld, n, rows, y, yt, ys, more);
}
SPARSIM_CLONES void dot_rows_batch(const float* x, std::size_t xs, int nt, const bf16_t* w,
                                   std::size_t ld, int n, int rows, float* y, std::size_t yt,
                                   std::size_t ys, bool more) {
  dot_rows_batch_impl(x, xs, nt, w, ld, n, rows, y, yt, ys, more);
}
SPARSIM_CLONES void dot_rows_batch(const float* x, std::size_t xs, int nt, const f16_t* w,
                                   std::size_t ld, int n, int rows, float* y, std::size_t yt,
                                   std::size_t ys, bool more) {
  dot_rows_batch_impl(x, xs, nt, w, ld, n, rows, y, yt, ys, more);
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
