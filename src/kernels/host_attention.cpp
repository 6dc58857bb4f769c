#include "kernels/host_attention.hpp"

#include "kernels/attention.hpp"
#include "kernels/host_clones.hpp"
#include "kernels/host_lanes.hpp"

#include <cstdint>
#include <cstring>

namespace sparsim::host {
namespace {

constexpr int kL = 16;                // lanes of a score's partial sums and of a value block
constexpr std::ptrdiff_t kLine = 64;  // bytes of a cache line (the prefetch granule)
/// __builtin_prefetch locality of Ahead's prefetches: 1 (prefetcht2) lands in the second-level
/// cache. On the 2-core Zen 4 a cold SmolLM2-shaped layer at 2,048 positions took about 150 µs
/// with it against 175-210 µs with locality 3 (prefetcht0) or none.
constexpr int kAheadLocality = 1;
#if defined(__GNUC__) && !defined(__CUDACC__)
#define SPARSIM_VECTOR_LANES 1
// GCC/Clang vector extensions. The loops below are written once for a 16-lane type V and compiled
// for two: Wide, one 16-float vector (one zmm register with AVX-512), and Pair, two 8-float halves
// (two ymm registers). Without AVX-512 a 16-float vector variable has no register to live in and
// the compiler keeps it in memory, which made the AVX2 clone about ten times slower than the
// AVX-512 one; with AVX-512 two halves would leave half of each register unused. Both give the
// same bits (the same operations in the same lanes).
using v8 = lanes::f8;
// Wide values cross no call boundary that another translation unit sees (everything here is
// inlined into the exported kernels), so GCC's note on their calling convention without AVX-512
// does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
using Wide = float __attribute__((vector_size(kL * sizeof(float))));
using Pair = lanes::Halves<v8>;
/// a += x · y lane by lane, one multiply-add expression per register (as lanes::madd does for
/// Pair), so a compiler that fuses only within an expression (Clang's default) fuses both types
/// alike.
inline void madd(Wide& a, const Wide& x, const Wide& y) {
  a += x * y;
}
using lanes::madd;
/// Half blocks (8 floats: one ymm with AVX-512 or AVX2) for the value mix's short tails.
constexpr bool kHasHalf = true;
template <class V>
inline V load_as(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
inline void store_as(float* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}
inline v8 ld8(const float* p) {
  return load_as<v8>(p);
}
inline void st8(float* p, v8 v) {
  store_as(p, v);
}
inline v8 splat8(float x) {
  return v8{x, x, x, x, x, x, x, x};
}
template <class V>
V ld(const float* p);
template <>
inline Wide ld<Wide>(const float* p) {
  return load_as<Wide>(p);
}
template <>
inline Pair ld<Pair>(const float* p) {
  return lanes::load_halves<v8>(p);
}
inline void st(float* p, const Wide& v) {
  store_as(p, v);
}
inline void st(float* p, const Pair& v) {
  lanes::store_halves(p, v);
}
template <class V>
V splat(float x);
template <>
inline Wide splat<Wide>(float x) {
  return Wide{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};  // one broadcast (Wide{} + x adds 0)
}
template <>
inline Pair splat<Pair>(float x) {
  return {splat8(x), splat8(x)};
}
/// Per lane x > m ? x : m (detail::max_lanes' comparison).
inline Wide vmax(const Wide& x, const Wide& m) {
  return x > m ? x : m;
}
inline Pair vmax(const Pair& x, const Pair& m) {
  return {x.lo > m.lo ? x.lo : m.lo, x.hi > m.hi ? x.hi : m.hi};
}
#define SPARSIM_SH(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
/// 16 lanes of two half blocks: lanes 0 … 7 from a, 8 … 15 from b.
template <class V>
V cat(const float* a, const float* b);
template <>
inline Wide cat<Wide>(const float* a, const float* b) {
  return SPARSIM_SH(ld8(a), ld8(b), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
template <>
inline Pair cat<Pair>(const float* a, const float* b) {
  return {ld8(a), ld8(b)};
}

/// How the loops use the registers: positions whose scores one tree reduces (a vector of partial
/// sums holds two of them), query heads scored together (each key block loaded once for all),
/// query heads whose value mixes share one pass over the value rows, and blocks of 16 channels per
/// value slab. Wide fills AVX-512's 32 registers of 16 floats; Pair AVX2's 16 of 8.
template <class V>
struct Tiling;
template <>
struct Tiling<Wide> {
  static constexpr int kPos = 16, kHeads = 3, kValueHeads = 4, kSlabBlocks = 4;
};
template <>
struct Tiling<Pair> {
  static constexpr int kPos = 8, kHeads = 3, kValueHeads = 2, kSlabBlocks = 2;
};

/// r[p] (p < 16) = scale · (the 8 partial sums of position p added pairwise at distances 4, 2, 1),
/// where a[j] holds position 2j's partial sums in lanes 0 … 7 and position 2j + 1's in lanes
/// 8 … 15: each level halves the partial sums per position and doubles the positions per vector.
inline void tree(const Wide* a, float scale, float* r) {
  Wide b[4], c[2];
  for (int j = 0; j < 4; ++j)
    b[j] = SPARSIM_SH(a[2 * j], a[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26,
                      27) +
           SPARSIM_SH(a[2 * j], a[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29,
                      30, 31);
  for (int j = 0; j < 2; ++j)
    c[j] = SPARSIM_SH(b[2 * j], b[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28,
                      29) +
           SPARSIM_SH(b[2 * j], b[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27,
                      30, 31);
  st(r, (SPARSIM_SH(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         SPARSIM_SH(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31)) *
            splat<Wide>(scale));
}
/// The same tree for 8 positions (a[0 … 3]), on halves.
inline void tree(const Pair* a, float scale, float* r) {
  Pair b[2];
  for (int j = 0; j < 2; ++j)
    b[j] = {lanes::fold4(a[2 * j].lo, a[2 * j].hi), lanes::fold4(a[2 * j + 1].lo, a[2 * j + 1].hi)};
  const Pair c = {lanes::fold2(b[0].lo, b[0].hi), lanes::fold2(b[1].lo, b[1].hi)};
  st8(r, lanes::fold1(c.lo, c.hi) * splat8(scale));
}
#undef SPARSIM_SH
#else
#define SPARSIM_VECTOR_LANES 0
// Without vector extensions (e.g. a CUDA build's host pass): the same lanes and the same tree.
template <int N>
struct vecf {
  float x[N];
};
template <int N>
inline vecf<N> operator*(vecf<N> a, vecf<N> b) {
  for (int l = 0; l < N; ++l) a.x[l] *= b.x[l];
  return a;
}
template <int N>
inline vecf<N>& operator+=(vecf<N>& a, vecf<N> b) {
  for (int l = 0; l < N; ++l) a.x[l] += b.x[l];
  return a;
}
template <int N>
inline void madd(vecf<N>& a, const vecf<N>& x, const vecf<N>& y) {
  for (int l = 0; l < N; ++l) a.x[l] += x.x[l] * y.x[l];
}
template <int N>
inline vecf<N> load_vec(const float* p) {
  vecf<N> v;
  std::memcpy(v.x, p, sizeof v.x);
  return v;
}
template <int N>
inline vecf<N> splat_vec(float s) {
  vecf<N> v;
  for (float& e : v.x) e = s;
  return v;
}
using Wide = vecf<kL>;
using v8 = vecf<kL / 2>;
template <class V>
inline V ld(const float* p) {
  return load_vec<kL>(p);
}
inline void st(float* p, const Wide& v) {
  std::memcpy(p, v.x, sizeof v.x);
}
template <class V>
inline V splat(float s) {
  return splat_vec<kL>(s);
}
// No half blocks here (the value mix's tails take a whole overlapping block).
constexpr bool kHasHalf = false;
inline v8 ld8(const float* p) {
  return load_vec<kL / 2>(p);
}
inline void st8(float* p, v8 v) {
  std::memcpy(p, v.x, sizeof v.x);
}
inline v8 splat8(float s) {
  return splat_vec<kL / 2>(s);
}
inline Wide vmax(Wide x, Wide m) {
  for (int l = 0; l < kL; ++l) m.x[l] = x.x[l] > m.x[l] ? x.x[l] : m.x[l];
  return m;
}
template <class V>
inline V cat(const float* a, const float* b) {
  V v;
  std::memcpy(v.x, a, sizeof(float) * kL / 2);
  std::memcpy(v.x + kL / 2, b, sizeof(float) * kL / 2);
  return v;
}
template <class V>
struct Tiling {
  static constexpr int kPos = 16, kHeads = 3, kValueHeads = 4, kSlabBlocks = 4;
};
inline void tree(const Wide* a, float scale, float* r) {
  for (int p = 0; p < kL; ++p) {
    float t[kL / 2];
    std::memcpy(t, a[p / 2].x + (p % 2) * (kL / 2), sizeof t);
    for (int h = kL / 4; h > 0; h /= 2)
      for (int l = 0; l < h; ++l) t[l] += t[l + h];
    r[p] = t[0] * scale;
  }
}
#endif

/// Heads narrower than one half block: the same lanes (one product each) and tree.
float dot_narrow(const float* q, const float* k, int d) {
  float t[kL / 2] = {};
  for (int i = 0; i < d; ++i) t[i] = q[i] * k[i];
  for (int h = kL / 4; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) t[l] += t[l + h];
  return t[0];
}

/// Prefetches of `ahead`'s bytes spread over a loop of `ticks` steps: each tick issues the next
/// share of its cache lines, so the transfers run while the loop computes.
struct Stream {
  const char* p = nullptr;
  const char* end = nullptr;
  std::size_t step = 0;  // bytes a tick, whole lines
  Stream(const Ahead& a, std::size_t ticks) {
    if (a.bytes == 0 || a.p == nullptr) return;
    const auto at = reinterpret_cast<std::uintptr_t>(a.p);
    p = static_cast<const char*>(a.p) - (at % kLine);
    end = static_cast<const char*>(a.p) + a.bytes;
    const std::size_t lines = (static_cast<std::size_t>(end - p) + kLine - 1) / kLine;
    const std::size_t t = ticks > 0 ? ticks : 1;
    step = (lines + t - 1) / t * kLine;
  }
  void tick() {
    const char* e = end - p > static_cast<std::ptrdiff_t>(step) ? p + step : end;
    for (; p < e; p += kLine) fetch(p);
  }
  void finish() {
    for (; p < end; p += kLine) fetch(p);
  }
  static void fetch(const char* x) {
#if defined(__GNUC__)
    __builtin_prefetch(x, 0, kAheadLocality);
#else
    (void)x;
#endif
  }
};

/// Scores of kPos positions (rows k + j·ks; in a short block the missing rows repeat the last
/// one and their scores are not stored) for G query heads (q + g·qs). Half block h (8 channels
/// at c = 8h; the last, when d is not a multiple of 8, at d − 8 with its first lanes weighted 0
/// by `hmask`) of positions 2j and 2j + 1 is one vector, loaded once for all G heads.
template <class V, int G, bool kFull>
inline void scores_block(const float* q, std::size_t qs, const float* k, std::size_t ks, int m,
                         int d, int nhalf, const V& hmask, float scale, float* out,
                         std::size_t ls) {
  constexpr int kPos = Tiling<V>::kPos, kPairs = kPos / 2;
  V acc[G][kPairs];
  for (auto& ag : acc)
    for (auto& a : ag) a = splat<V>(0.0f);
  // A short block's row pointers (clamped); a full block steps one pointer down its rows.
  const float* rows[kFull ? 1 : kPos];
  if (!kFull)
    for (int j = 0; j < kPos; ++j) rows[j] = k + static_cast<std::size_t>(j < m ? j : m - 1) * ks;
  const int hb = nhalf * (kL / 2) < d ? nhalf + 1 : nhalf;
  for (int h = 0; h < hb; ++h) {
    const bool tail = h == nhalf;
    const int c = tail ? d - kL / 2 : h * (kL / 2);
    V qh[G];
    for (int g = 0; g < G; ++g) {
      qh[g] = cat<V>(q + g * qs + c, q + g * qs + c);
      if (tail) qh[g] = qh[g] * hmask;
    }
    const float* kr = k + c;
    for (int j = 0; j < kPairs; ++j) {
      const V x = kFull ? cat<V>(kr, kr + ks) : cat<V>(rows[2 * j] + c, rows[2 * j + 1] + c);
      kr += 2 * ks;
      for (int g = 0; g < G; ++g) madd(acc[g][j], x, qh[g]);
    }
  }
  for (int g = 0; g < G; ++g) {
    if (kFull) {
      tree(acc[g], scale, out + g * ls);
    } else {
      float r[kPos];
      tree(acc[g], scale, r);
      for (int j = 0; j < m; ++j) out[g * ls + j] = r[j];
    }
  }
}

template <class V, int G>
void scores_heads(const float* q, std::size_t qs, const float* k, std::size_t ks, int len, int d,
                  int nhalf, const V& hmask, float scale, float* s, std::size_t ls, Stream& pf) {
  constexpr int kPos = Tiling<V>::kPos;
  int p = 0;
  for (; p + kPos <= len; p += kPos) {
    pf.tick();
    scores_block<V, G, true>(q, qs, k + p * ks, ks, kPos, d, nhalf, hmask, scale, s + p, ls);
  }
  if (p < len)
    scores_block<V, G, false>(q, qs, k + p * ks, ks, len - p, d, nhalf, hmask, scale, s + p, ls);
}

/// The scores of `gn` (1 … Tiling<V>::kHeads) query heads together.
template <class V, int G = 1>
void scores_group(int gn, const float* q, std::size_t qs, const float* k, std::size_t ks, int len,
                  int d, int nhalf, const V& hmask, float scale, float* s, std::size_t ls,
                  Stream& pf) {
  if constexpr (G < Tiling<V>::kHeads) {
    if (gn > G) {
      scores_group<V, G + 1>(gn, q, qs, k, ks, len, d, nhalf, hmask, scale, s, ls, pf);
      return;
    }
  }
  scores_heads<V, G>(q, qs, k, ks, len, d, nhalf, hmask, scale, s, ls, pf);
}

template <class V>
void scores_impl(const float* q, std::size_t qs, int group, const float* k, std::size_t ks, int len,
                 int d, float scale, float* s, std::size_t ls, const Ahead& ahead) {
  constexpr int kHeads = Tiling<V>::kHeads;
  const int hblocks = (group + kHeads - 1) / kHeads;
  Stream pf(ahead, static_cast<std::size_t>(len / Tiling<V>::kPos) * hblocks);
  if (d < kL / 2) {
    for (int g = 0; g < group; ++g)
      for (int p = 0; p < len; ++p) s[g * ls + p] = dot_narrow(q + g * qs, k + p * ks, d) * scale;
    pf.finish();
    return;
  }
  const int nhalf = d / (kL / 2), r = d % (kL / 2);
  float mk[kL];
  for (int l = 0; l < kL; ++l) mk[l] = r == 0 || l % (kL / 2) >= kL / 2 - r ? 1.0f : 0.0f;
  const V hmask = ld<V>(mk);
  for (int g0 = 0; g0 < group; g0 += kHeads) {
    const int gn = group - g0 < kHeads ? group - g0 : kHeads;
    scores_group<V>(gn, q + g0 * qs, qs, k, ks, len, d, nhalf, hmask, scale, s + g0 * ls, ls, pf);
  }
  pf.finish();
}

/// The value mix of G query heads over one slab of at most 16 · kSlabBlocks channels: NB blocks
/// of 16, block b at channel off[b] (the last may overlap the one before it; then only its last
/// `tail` lanes are stored), then, with kHalf, one block of 8 at channel `hoff` of which the last
/// `htail` lanes are stored (a slab whose last 1 … 8 channels follow its last whole block: half
/// the work of a block of 16 on a CPU that runs 512-bit vectors as two halves). An output
/// channel's sum is the same whichever block carries it.
template <class V, int G, int NB, bool kHalf>
void values_slab(const float* w, std::size_t ws, const float* v, std::size_t vs, int len,
                 const int* off, int tail, int hoff, int htail, float* o, std::size_t os,
                 Stream& pf) {
  V acc[G][NB];
  v8 hacc[G];
  for (auto& ag : acc)
    for (auto& a : ag) a = splat<V>(0.0f);
  for (auto& h : hacc) h = splat8(0.0f);
  for (int p = 0; p < len; ++p) {
    pf.tick();
    const float* vr = v + p * vs;
    V x[NB];
    for (int b = 0; b < NB; ++b) x[b] = ld<V>(vr + off[b]);
    const v8 hx = kHalf ? ld8(vr + hoff) : splat8(0.0f);
    for (int g = 0; g < G; ++g) {
      const float wp = w[g * ws + p];
      const V wg = splat<V>(wp);
      for (int b = 0; b < NB; ++b) madd(acc[g][b], x[b], wg);
      if (kHalf) hacc[g] += hx * splat8(wp);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int b = 0; b < NB; ++b) {
      float* dst = o + g * os + off[b];
      if (b < NB - 1 || tail == kL) {
        st(dst, acc[g][b]);
      } else {
        float r[kL];
        st(r, acc[g][b]);
        for (int l = kL - tail; l < kL; ++l) dst[l] = r[l];
      }
    }
    if (kHalf) {
      float hb[kL / 2];
      st8(hb, hacc[g]);
      for (int l = kL / 2 - htail; l < kL / 2; ++l) o[g * os + hoff + l] = hb[l];
    }
  }
}

/// values_slab for nb (1 … kSlabBlocks) blocks.
template <class V, int G, bool kHalf, int NB = 1>
void values_blocks(const float* w, std::size_t ws, const float* v, std::size_t vs, int len, int nb,
                   const int* off, int tail, int hoff, int htail, float* o, std::size_t os,
                   Stream& pf) {
  if constexpr (NB < Tiling<V>::kSlabBlocks) {
    if (nb > NB) {
      values_blocks<V, G, kHalf, NB + 1>(w, ws, v, vs, len, nb, off, tail, hoff, htail, o, os, pf);
      return;
    }
  }
  values_slab<V, G, NB, kHalf>(w, ws, v, vs, len, off, tail, hoff, htail, o, os, pf);
}

/// The value mixes of gn (1 … kValueHeads) query heads in one pass over the value rows.
template <class V, int G = 1>
void values_heads(int gn, const float* w, std::size_t ws, const float* v, std::size_t vs, int len,
                  int nb, const int* off, int tail, int hoff, int htail, float* o, std::size_t os,
                  Stream& pf) {
  if constexpr (G < Tiling<V>::kValueHeads) {
    if (gn > G) {
      values_heads<V, G + 1>(gn, w, ws, v, vs, len, nb, off, tail, hoff, htail, o, os, pf);
      return;
    }
  }
  if (htail > 0)
    values_blocks<V, G, true>(w, ws, v, vs, len, nb, off, tail, hoff, htail, o, os, pf);
  else
    values_blocks<V, G, false>(w, ws, v, vs, len, nb, off, tail, hoff, htail, o, os, pf);
}

template <class V>
void values_impl(const float* w, std::size_t ws, int group, const float* v, std::size_t vs, int len,
                 int d, float* o, std::size_t os, const Ahead& ahead) {
  constexpr int kBlocks = Tiling<V>::kSlabBlocks, kHeads = Tiling<V>::kValueHeads;
  constexpr int kSlab = kBlocks * kL;  // channels whose partial sums stay in registers
  const int slabs = (d + kSlab - 1) / kSlab;
  const int gblocks = (group + kHeads - 1) / kHeads;
  Stream pf(ahead, d < kL ? 1 : static_cast<std::size_t>(slabs) * gblocks * len);
  if (d < kL) {
    for (int g = 0; g < group; ++g)
      for (int i = 0; i < d; ++i) {
        float a = 0.0f;
        for (int p = 0; p < len; ++p) a += w[g * ws + p] * v[p * vs + i];
        o[g * os + i] = a;
      }
    pf.finish();
    return;
  }
  for (int i0 = 0; i0 < d; i0 += kSlab) {
    const int n = d - i0 < kSlab ? d - i0 : kSlab;
    const int nfull = n / kL, r = n % kL;
    // The channels past the last whole block: a half block when they fit in one (and the clone
    // has half-width vectors), else one block of 16 overlapping the one before it (also when the
    // slab has no whole block: a head's last 1 … 15 channels past a multiple of the slab).
    const int htail = kHasHalf && nfull > 0 && r > 0 && r <= kL / 2 ? r : 0;
    const int nb = htail > 0 || r == 0 ? nfull : nfull + 1;
    int off[kBlocks];
    for (int b = 0; b < nb; ++b) off[b] = b < nfull ? i0 + b * kL : i0 + n - kL;
    const int tail = nb == nfull ? kL : r;
    const int hoff = i0 + n - kL / 2;
    for (int g0 = 0; g0 < group; g0 += kHeads) {
      const int gn = group - g0 < kHeads ? group - g0 : kHeads;
      values_heads<V>(gn, w + g0 * ws, ws, v, vs, len, nb, off, tail, hoff, htail, o + g0 * os, os,
                      pf);
    }
  }
  pf.finish();
}

/// The loads of touch(), folded into one value that the caller keeps alive: the n floats at p in
/// address order, every 8-float piece one load (the last piece the block's last 8 floats,
/// overlapping the one before; single floats for a block shorter than 8). The bits are combined
/// as integers (no floating-point work, so no slow path for subnormal or NaN values) in four
/// independent accumulators. Pieces of 8 (one ymm register) for the same reason as Pair.
std::uint32_t touch_impl(const float* p, std::size_t n) {
  constexpr std::size_t kH = kL / 2;
  std::uint32_t t = 0;
  const auto word = [](const float* x) {
    std::uint32_t u;
    std::memcpy(&u, x, sizeof u);
    return u;
  };
  if (n < kH) {
    for (std::size_t i = 0; i < n; ++i) t |= word(p + i);
    return t;
  }
#if SPARSIM_VECTOR_LANES
  using u8 = std::uint32_t __attribute__((vector_size(kH * sizeof(float))));
  const auto ldu = [](const float* x) {
    u8 v;
    std::memcpy(&v, x, sizeof v);
    return v;
  };
  u8 a0{}, a1{}, a2{}, a3{};
  std::size_t i = 0;
  for (; i + 4 * kH <= n; i += 4 * kH) {
    a0 |= ldu(p + i);
    a1 |= ldu(p + i + kH);
    a2 |= ldu(p + i + 2 * kH);
    a3 |= ldu(p + i + 3 * kH);
  }
  for (; i + kH <= n; i += kH) a0 |= ldu(p + i);
  if (i < n) a1 |= ldu(p + n - kH);
  const u8 a = (a0 | a1) | (a2 | a3);
  for (std::size_t l = 0; l < kH; ++l) t |= a[l];
#else
  for (std::size_t i = 0; i < n; i += kH) t |= word(p + i);
  t |= word(p + n - 1);
#endif
  return t;
}

/// detail::max_lanes, the exponentials and detail::sum_lanes with the lanes as one vector: the
/// same comparisons and additions in the same lanes and order (so the same bits), without the
/// scalar loop the compiler makes of max_lanes' per-lane arrays.
template <class V>
void chunk_softmax_impl(float* sc, int len, int group, float* part, int pstride) {
  const int nb = len / kL * kL;
  for (int g = 0; g < group; ++g) {
    float* w = sc + static_cast<std::ptrdiff_t>(g) * len;
    V m = splat<V>(-3.0e38f);
    for (int i = 0; i < nb; i += kL) m = vmax(ld<V>(w + i), m);
    float ml[kL];
    st(ml, m);
    for (int l = 0; nb + l < len; ++l) ml[l] = w[nb + l] > ml[l] ? w[nb + l] : ml[l];
    for (int h = kL / 2; h > 0; h /= 2)
      for (int l = 0; l < h; ++l) ml[l] = ml[l + h] > ml[l] ? ml[l + h] : ml[l];
    const float mx = ml[0];
    V a = splat<V>(0.0f);
    for (int i = 0; i < nb; i += kL) {
      for (int l = 0; l < kL; ++l) w[i + l] = detail::exp_nonpos(w[i + l] - mx);
      a += ld<V>(w + i);
    }
    float al[kL];
    st(al, a);
    for (int l = 0; nb + l < len; ++l) {
      w[nb + l] = detail::exp_nonpos(w[nb + l] - mx);
      al[l] += w[nb + l];
    }
    for (int h = kL / 2; h > 0; h /= 2)
      for (int l = 0; l < h; ++l) al[l] += al[l + h];
    part[static_cast<std::ptrdiff_t>(g) * pstride] = mx;
    part[static_cast<std::ptrdiff_t>(g) * pstride + 1] = al[0];
  }
}

/// Whether this code runs the 16-lane vectors: in a clone, whether the CPU runs AVX-512
/// (x86-64-v4, the level of the clone chosen); without clones, the build's flags (an x86-64-v3
/// build on an AVX-512 CPU runs Pair).
inline bool wide_lanes() {
#if SPARSIM_HAS_CLONES
  return __builtin_cpu_supports("x86-64-v4");
#elif defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

/// A lane type as an empty value (a 16-float vector passed by value would be an ABI question).
template <class V>
struct LaneType {
  using type = V;
};

/// f(LaneType<Wide>) or f(LaneType<Pair>) as wide_lanes() says; the caller is a SPARSIM_CLONES
/// function, so each clone has both inlined and runs the one its CPU level has (without clones the
/// test is a constant and the other branch is dropped).
template <class F>
inline void with_lanes(F&& f) {
#if SPARSIM_VECTOR_LANES
  if (wide_lanes())
    f(LaneType<Wide>{});
  else
    f(LaneType<Pair>{});
#else
  f(LaneType<Wide>{});
#endif
}

}  // namespace

SPARSIM_CLONES void chunk_softmax(float* sc, int len, int group, float* part, int pstride) {
  with_lanes([&](auto t) {
    chunk_softmax_impl<typename decltype(t)::type>(sc, len, group, part, pstride);
  });
}

void prefetch(Ahead ahead) {
  Stream(ahead, 1).finish();
}

SPARSIM_CLONES void touch(Ahead block) {
  const std::uint32_t bits =
      touch_impl(static_cast<const float*>(block.p), block.p ? block.bytes / sizeof(float) : 0);
#if defined(__GNUC__)
  asm volatile("" : : "g"(bits));  // the value is "used": its loads stay
#else
  static thread_local volatile std::uint32_t sink;
  sink = bits;
#endif
}

SPARSIM_CLONES void attn_scores(const float* q, std::size_t qs, int group, const float* k,
                                std::size_t ks, int len, int d, float scale, float* s,
                                std::size_t ls, Ahead ahead) {
  with_lanes([&](auto t) {
    scores_impl<typename decltype(t)::type>(q, qs, group, k, ks, len, d, scale, s, ls, ahead);
  });
}

SPARSIM_CLONES void attn_values(const float* w, std::size_t ws, int group, const float* v,
                                std::size_t vs, int len, int d, float* o, std::size_t os,
                                Ahead ahead) {
  with_lanes([&](auto t) {
    values_impl<typename decltype(t)::type>(w, ws, group, v, vs, len, d, o, os, ahead);
  });
}

}  // namespace sparsim::host
