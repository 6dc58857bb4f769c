#pragma once
/// The decode GEMV kernels of host backends, compiled once per x86-64 level and chosen at run
/// time by the CPU's features (GCC's target_clones: x86-64-v4 = AVX-512, x86-64-v3 = AVX2 + FMA,
/// and the build's own baseline). A binary built without -march=native (SPARSIM_NATIVE=OFF, the
/// portable cluster build) thus still runs these loops with the widest vectors the node has.
///
/// Arithmetic: the dense rows sum in the order of the inline detail::dot_lanes, the sparse tile in
/// the order documented in kernels/sparse_gemv.hpp; the same per-output summation order, so results
/// never depend on the thread count or on how the outputs are blocked. Whether a multiply and an
/// add are fused depends on the clone (FMA from x86-64-v3 on), so two CPUs of different levels may
/// differ in the last bits; one CPU always runs the same clone.
#include "core/half.hpp"

#include <cstddef>

namespace sparsim::host {

/// Lanes of the fixed-order dense dot product (detail::dot_lanes uses the same).
inline constexpr int kDotLanes = 16;
/// Output rows dot_rows computes together (one load of x serves them all) when rows are longer
/// than kShortRow; shorter rows are summed one after another.
inline constexpr int kRowBlock = 8;
/// Row length (columns) up to which dot_rows sums rows one by one: x (8 KiB) stays in the
/// first-level cache and the rows stream in address order. Longer rows share each load of x
/// among kRowBlock rows, since x no longer fits beside them.
inline constexpr int kShortRow = 2048;
/// Kept rows per step of the sparse tile's fixed summation order (sparsim::kGroup).
inline constexpr int kSparseGroup = 4;

/// y[r · ys] = Σ_i x[i] · w[r · ld + i] for r in [0, rows), i in [0, n): each row's dot product
/// in the fixed 16-lane order of detail::dot_lanes. Rows longer than kShortRow are processed eight
/// at a time so that one load of x serves eight weight rows; shorter ones one by one. Either way
/// a row's sum is the same.
///
/// `more`: w holds another row after the last one (its first columns may be read). A row of at
/// least 16 columns with a row after it reads its last n mod 16 columns as one vector with the
/// next row's first ones, weighted 0; the others read theirs from a zero-padded copy; the sums are
/// the same.
///
/// `ahead`: rows up to kShortRow long also prefetch the matrix 4 KiB ahead of the row they sum
/// (pass false when the same rows were just summed against another x: they are in the caches).
void dot_rows(const float* x, const float* w, std::size_t ld, int n, int rows, float* y,
              std::size_t ys, bool more = false, bool ahead = true);
void dot_rows(const float* x, const bf16_t* w, std::size_t ld, int n, int rows, float* y,
              std::size_t ys, bool more = false, bool ahead = true);
void dot_rows(const float* x, const f16_t* w, std::size_t ld, int n, int rows, float* y,
              std::size_t ys, bool more = false, bool ahead = true);

/// y[t · yt + r · ys] = Σ_i x[t · xs + i] · w[r · ld + i] for tokens t in [0, nt) and rows r in
/// [0, rows): every (token, row) the sum dot_rows computes. Rows up to kShortRow long are read
/// once for all tokens, kTokenBlock tokens at a time, each token its own chain of multiply-adds
/// (summing the tokens one after another re-read the rows from the caches and left each row's
/// sum bound by the latency of its one chain); longer rows go through dot_rows token by token.
void dot_rows_batch(const float* x, std::size_t xs, int nt, const float* w, std::size_t ld, int n,
                    int rows, float* y, std::size_t yt, std::size_t ys, bool more = false);
void dot_rows_batch(const float* x, std::size_t xs, int nt, const bf16_t* w, std::size_t ld, int n,
                    int rows, float* y, std::size_t yt, std::size_t ys, bool more = false);
void dot_rows_batch(const float* x, std::size_t xs, int nt, const f16_t* w, std::size_t ld, int n,
                    int rows, float* y, std::size_t yt, std::size_t ys, bool more = false);

/// a[0:n] += Σ_k x[idx[k]] · wt[idx[k] · ld + j] (j in [0, n)) over the kept indices k in
/// [0, nnz), in the fixed order of kernels/sparse_gemv.hpp (groups of four, then singles). `wt`
/// points at the tile's first output column of row 0.
void sparse_tile(float* a, int n, const float* x, const int* idx, int nnz, const float* wt,
                 std::size_t ld);
void sparse_tile(float* a, int n, const float* x, const int* idx, int nnz, const bf16_t* wt,
                 std::size_t ld);
void sparse_tile(float* a, int n, const float* x, const int* idx, int nnz, const f16_t* wt,
                 std::size_t ld);

/// The clone the running CPU uses: "x86-64-v4", "x86-64-v3" or "baseline"; without run-time
/// dispatch the build's own level, marked "(build)".
const char* gemv_isa();

}  // namespace sparsim::host
