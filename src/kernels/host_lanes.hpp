#pragma once
/// 8-float vectors (one ymm register with AVX2 or AVX-512) of the host kernels' lanes and the
/// levels of their transposing reduction trees (kernels/host_gemv.cpp, kernels/host_attention.cpp).
/// A tree reduces the partial sums of 8 items (tokens, positions), 8 sums each; each level adds
/// pairs of sums and packs the results of two vectors into one, so that after three levels one
/// vector holds the 8 items' totals. GCC/Clang vector extensions only.
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
