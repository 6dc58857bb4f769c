#pragma once
/// The host kernels' lanes (kernels/host_gemv.cpp, kernels/host_attention.cpp): 16 lanes as two
/// halves (Halves), 8-float vectors (one ymm register with AVX2 or AVX-512) and the levels of
/// their transposing reduction trees. A tree reduces the partial sums of 8 items (tokens,
/// positions), 8 sums each; each level adds pairs of sums and packs the results of two vectors
/// into one, so that after three levels one vector holds the 8 items' totals. The vectors and
/// trees need GCC/Clang vector extensions; Halves takes any 8-lane type with + and *.
#include <cstring>

namespace sparsim::host::lanes {

/// 16 lanes as two 8-lane halves: lanes 0 … 7 in lo, 8 … 15 in hi. Without AVX-512 a 16-float
/// vector variable has no register to live in and the compiler keeps it in memory (which made the
/// AVX2 code about ten times slower); with two halves each lives in one ymm register. Every
/// operation is one vector expression per half, so a compiler fuses (or not, in a clone without
/// FMA) each multiply-add the same way wherever it is used, also one that fuses only within an
/// expression (Clang's default).
template <class H>
struct Halves {
  H lo, hi;
  Halves& operator+=(const Halves& o) {
    lo = lo + o.lo;
    hi = hi + o.hi;
    return *this;
  }
  Halves operator*(const Halves& o) const { return {lo * o.lo, hi * o.hi}; }
};

/// a += x · y lane by lane.
template <class H>
inline void madd(Halves<H>& a, const Halves<H>& x, const Halves<H>& y) {
  a.lo = a.lo + x.lo * y.lo;
  a.hi = a.hi + x.hi * y.hi;
}

/// The 16 floats at p (unaligned).
template <class H>
inline Halves<H> load_halves(const float* p) {
  static_assert(sizeof(H) == 8 * sizeof(float), "a half holds 8 floats");
  Halves<H> v;
  std::memcpy(&v.lo, p, sizeof v.lo);
  std::memcpy(&v.hi, p + 8, sizeof v.hi);
  return v;
}

/// Stores the 16 lanes at p (unaligned).
template <class H>
inline void store_halves(float* p, const Halves<H>& v) {
  std::memcpy(p, &v.lo, sizeof v.lo);
  std::memcpy(p + 8, &v.hi, sizeof v.hi);
}

}  // namespace sparsim::host::lanes

#if defined(__GNUC__) && !defined(__CUDACC__)
namespace sparsim::host::lanes {

using f8 = float __attribute__((vector_size(8 * sizeof(float))));

// These functions are inlined into the kernels that use them (SPARSIM_CLONES flattens them), so
// GCC's note that a baseline x86-64 build passes 8-float vectors differently from an AVX one
// concerns no call that is made.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

#define SPARSIM_SH(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
/// x, y: one item's 8 sums each → [x's sums l + (l + 4), y's], l < 4.
inline f8 fold4(f8 x, f8 y) {
  return SPARSIM_SH(x, y, 0, 1, 2, 3, 8, 9, 10, 11) + SPARSIM_SH(x, y, 4, 5, 6, 7, 12, 13, 14, 15);
}
/// x, y: two items' 4 sums each → the four items' sums l + (l + 2), l < 2, in order.
inline f8 fold2(f8 x, f8 y) {
  return SPARSIM_SH(x, y, 0, 1, 4, 5, 8, 9, 12, 13) + SPARSIM_SH(x, y, 2, 3, 6, 7, 10, 11, 14, 15);
}
/// x, y: four items' 2 sums each → the eight items' totals 0 + 1, in order.
inline f8 fold1(f8 x, f8 y) {
  return SPARSIM_SH(x, y, 0, 2, 4, 6, 8, 10, 12, 14) + SPARSIM_SH(x, y, 1, 3, 5, 7, 9, 11, 13, 15);
}
#undef SPARSIM_SH
#pragma GCC diagnostic pop

}  // namespace sparsim::host::lanes
#endif
