#pragma once
/// y = x · Wᵀ for a batch of rows x[n][in] and a weight W[out][in] in any storage type.
///
/// Many rows (prefill) go through KokkosBlas GEMM (the vendor BLAS on the host, cuBLAS or the
/// native kernels on a GPU); fewer than kWidenRows rows (decode) use a streaming GEMV kernel in
/// which one thread owns one output row. Row-major matrices are passed to BLAS as their
/// column-major transposes, so no copy is made. bf16 / f16 weights are read directly by a kernel
/// in which one thread owns one output and sums in a fixed order; for large n they are first
/// widened to fp32 in a scratch buffer so the GEMM path can be used; or, with the opt-in bf16
/// compute (LinearScratch::bf16_compute), the rows are rounded to bf16 and multiplied by oneDNN's
/// bf16 matmul in the same fixed tiles on the host, or by cuBLAS on the tensor cores of a GPU.
#include "core/device_blas.hpp"
#include "gemm_bf16/bf16_gemm.hpp"
#include "kernels/gemv_device.hpp"
#include "kernels/host_gemv.hpp"
#include "kernels/views.hpp"

#include <KokkosBlas2_gemv.hpp>
#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>

#include <algorithm>

namespace sparsim {

/// Rows at or above which 16-bit weights are widened to fp32 and multiplied by GEMM.
inline constexpr int kWidenRows = 16;

namespace detail {

/// Lanes of the fixed-order dot product: lane l sums elements i ≡ l (mod kLanes), then the
/// lanes are added in a fixed tree. The order is part of the code, not of the schedule, so the
/// result is the same for any thread count, and the lanes vectorise.
inline constexpr int kLanes = host::kDotLanes;

template <class T>
KOKKOS_INLINE_FUNCTION float dot_lanes(const float* x, const T* w, int n) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = 0.0f;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l] * to_f32(w[i + l]);
  for (int l = 0; i + l < n; ++l) acc[l] += x[i + l] * to_f32(w[i + l]);
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
  return acc[0];
}

/// Output rows one host work item computes: one block of host::dot_rows.
inline constexpr int kDirectRows = host::kRowBlock;

template <class E, class T>
void linear_direct(const E& exec, const CMat<E>& x, const Kokkos::View<T**, Layout, DeviceOf<E>>& w,
                   const Mat<E>& y) {
  const int n = static_cast<int>(x.extent(0));
  const int out = static_cast<int>(w.extent(0));
  const int in = static_cast<int>(w.extent(1));
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    // Blocks of rows through the run-time dispatched host kernel; each row's sum is that of
    // dot_lanes, so the blocking never changes a bit.
    const std::size_t ld = w.stride(0);
    const int blocks = (out + kDirectRows - 1) / kDirectRows;
    Kokkos::parallel_for("sparsim::kernels::linear_direct", light(Kokkos::RangePolicy<E>(exec, 0, blocks)),
                         [=](const int b) {
                           const int o0 = b * kDirectRows;
                           const int rows = out - o0 < kDirectRows ? out - o0 : kDirectRows;
                           host::dot_rows_batch(x.data(), x.stride(0), n, &w(o0, 0), ld, in, rows,
                                                &y(0, o0), y.stride(0), 1, o0 + rows < out);
                         });
    return;
  }
  Kokkos::parallel_for(
      "sparsim::kernels::linear_direct", light(Kokkos::RangePolicy<E>(exec, 0, out)),
      KOKKOS_LAMBDA(const int o) {
        const T* wr = &w(o, 0);
        for (int t = 0; t < n; ++t) y(t, o) = dot_lanes(&x(t, 0), wr, in);
      });
}

template <class E, class T>
void widen(const E& exec, const Kokkos::View<T**, Layout, DeviceOf<E>>& w, const Mat<E>& dst) {
  const int cols = static_cast<int>(w.extent(1));
  Kokkos::parallel_for(
      "sparsim::kernels::widen",
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0},
                                                {static_cast<int>(w.extent(0)), cols})),
      KOKKOS_LAMBDA(const int r, const int c) { dst(r, c) = to_f32(w(r, c)); });
}

/// Output rows and tokens of one BLAS call on the host. Fixed sizes make the work of every
/// output element independent of the thread count: each tile is one single-threaded BLAS call,
/// and an element always lands in the same tile with the same shape. Token tiles start at the
/// first token of each sequence (`seg` rows) and never cross into the next one, so a token's
/// tile (and with it the kernel BLAS picks and its summation order) depends on its position in
/// its own sequence only, not on how many sequences share the call (--batch).
inline constexpr int kTileRows = 512;
inline constexpr int kTileTokens = 256;

/// A host tile grid: output rows × tokens of one single-threaded BLAS call.
struct TileGrid {
  int rows = kTileRows;
  int tokens = kTileTokens;
};

/// The host tiles of an (out × n) product whose n rows are sequences of `seg` rows: f(r0, nr, t0,
/// nt) once per tile (output rows r0 … r0+nr−1, rows t0 … t0+nt−1), tiles in parallel, then a
/// fence.
template <class E, class F>
void for_each_host_tile(const E& exec, const char* label, int out, int n, int seg, const F& f,
                        TileGrid g = {}) {
  const int n_seq = n / seg;
  const int rt = (out + g.rows - 1) / g.rows;
  const int ts = (seg + g.tokens - 1) / g.tokens;  // token tiles per sequence
  Kokkos::parallel_for(label, light(Kokkos::RangePolicy<E>(exec, 0, rt * ts * n_seq)), [=](const int i) {
    const int r0 = (i % rt) * g.rows;
    const int tile = (i / rt) % ts, s = i / (rt * ts);
    const int t0 = tile * g.tokens;
    f(r0, std::min(g.rows, out - r0), s * seg + t0, std::min(g.tokens, seg - t0));
  });
  exec.fence();
}

template <class E>
void blas_linear(const E& exec, const CMat<E>& x, const CMat<E>& w, const Mat<E>& y, int seg,
                 TileGrid grid = {}) {
  using LL = Kokkos::View<const float**, Kokkos::LayoutLeft, DeviceOf<E>,
                          Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using LLout = Kokkos::View<float**, Kokkos::LayoutLeft, DeviceOf<E>,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const int n = static_cast<int>(x.extent(0));
  const int in = static_cast<int>(w.extent(1));
  const int out = static_cast<int>(w.extent(0));
  // Row-major W[out][in] is the column-major (in, out) matrix; likewise x (in, n), y (out, n).
  // A tile of y is a LayoutLeft subview whose column stride (BLAS ldc) stays `out`.
  const LL wl(w.data(), in, out), xl(x.data(), in, n);
  const LLout yl(y.data(), out, n);
  auto call = [=](int r0, int nr, int t0, int nt) {
    const auto rows = Kokkos::make_pair(r0, r0 + nr);
    const auto toks = Kokkos::make_pair(t0, t0 + nt);
    auto wt = Kokkos::subview(wl, Kokkos::ALL, rows);
    if (nt == 1) {
      KokkosBlas::gemv("T", 1.0f, wt, Kokkos::subview(xl, Kokkos::ALL, t0), 0.0f,
                       Kokkos::subview(yl, rows, t0));
    } else {
      KokkosBlas::gemm("T", "N", 1.0f, wt, Kokkos::subview(xl, Kokkos::ALL, toks), 0.0f,
                       Kokkos::subview(yl, rows, toks));
    }
  };
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    for_each_host_tile(exec, "sparsim::kernels::linear_blas_tiles", out, n, seg, call, grid);
  } else {
    const int n_seq = n / seg;
    // One call per sequence: the vendor library picks its kernel from the call's shape, which
    // then does not depend on the number of sequences.
    for (int s = 0; s < n_seq; ++s) call(0, out, s * seg, seg);
  }
}

}  // namespace detail

/// Workspace for widening 16-bit weights (or rounding rows to bf16); grows on demand.
template <class E>
struct LinearScratch {
  Mat<E> wide;
  Kokkos::View<std::uint16_t*, DeviceOf<E>> rows16;
  /// Multi-row products with bf16 weights in bf16 arithmetic (rows rounded to bf16, fp32
  /// accumulation): oneDNN on the host (where host::bf16_gemm_available()), cuBLAS on CUDA.
  bool bf16_compute = false;
  Mat<E> get(int rows, int cols) {
    if (wide.extent(0) * wide.extent(1) < static_cast<std::size_t>(rows) * cols)
      wide = Mat<E>(Kokkos::view_alloc("sparsim::linear::wide", Kokkos::WithoutInitializing), rows,
                    cols);
    return Mat<E>(wide.data(), rows, cols);
  }
  std::uint16_t* get16(std::size_t n) {
    if (rows16.extent(0) < n)
      rows16 = Kokkos::View<std::uint16_t*, DeviceOf<E>>(
          Kokkos::view_alloc("sparsim::linear::rows_bf16", Kokkos::WithoutInitializing), n);
    return rows16.data();
  }
};

namespace detail {

/// y = x · Wᵀ with x rounded to bf16 (round to nearest even, as bf16_t::from_float) and bf16 W,
/// through oneDNN in blas_linear's fixed tiles, one single-threaded call per tile: every output
/// element's arithmetic depends on its tile alone, never on the thread count or --batch.
template <class E>
void bf16_linear(const E& exec, const CMat<E>& x,
                 const Kokkos::View<bf16_t**, Layout, DeviceOf<E>>& w, const Mat<E>& y, int seg,
                 LinearScratch<E>& scratch) {
  const int n = static_cast<int>(x.extent(0));
  const int in = static_cast<int>(w.extent(1));
  const int out = static_cast<int>(w.extent(0));
  std::uint16_t* xb = scratch.get16(static_cast<std::size_t>(n) * in);
  Kokkos::parallel_for(
      "sparsim::kernels::round_rows_bf16", light(Kokkos::RangePolicy<E>(exec, 0, n)), [=](const int t) {
        for (int k = 0; k < in; ++k)
          xb[static_cast<std::size_t>(t) * in + k] = bf16_t::from_float(x(t, k)).bits;
      });
  exec.fence();
  const auto* wb = reinterpret_cast<const std::uint16_t*>(w.data());
  const std::size_t ldw = w.stride(0), ldy = y.stride(0);
  float* yp = y.data();
  for_each_host_tile(exec, "sparsim::kernels::linear_bf16_tiles", out, n, seg,
                     [=](int r0, int nr, int t0, int nt) {
                       host::bf16_gemm_tile(
                           xb + static_cast<std::size_t>(t0) * in, static_cast<std::size_t>(in),
                           wb + static_cast<std::size_t>(r0) * ldw, ldw,
                           yp + static_cast<std::size_t>(t0) * ldy + r0, ldy, nt, nr, in);
                     });
}

#if defined(KOKKOS_ENABLE_CUDA)
/// y = x · Wᵀ on a GPU's tensor cores: x rounded to bf16 (round to nearest even) in the scratch,
/// bf16 W, fp32 accumulation (cuBLAS), one call per sequence of `seg` rows so that no row's
/// bits depend on how many sequences share the call.
inline void cuda_bf16_linear(const Kokkos::Cuda& exec, const CMat<Kokkos::Cuda>& x,
                             const Kokkos::View<bf16_t**, Layout, DeviceOf<Kokkos::Cuda>>& w,
                             const Mat<Kokkos::Cuda>& y, int seg,
                             LinearScratch<Kokkos::Cuda>& scratch) {
  const int n = static_cast<int>(x.extent(0));
  const int in = static_cast<int>(w.extent(1));
  const int out = static_cast<int>(w.extent(0));
  std::uint16_t* xb = scratch.get16(static_cast<std::size_t>(n) * in);
  const float* xp = x.data();
  const std::size_t ldx = x.stride(0);
  Kokkos::parallel_for(
      "sparsim::kernels::round_rows_bf16",
      light(Kokkos::RangePolicy<Kokkos::Cuda>(exec, 0, static_cast<std::size_t>(n) * in)),
      KOKKOS_LAMBDA(const std::size_t i) {
        xb[i] = bf16_t::from_float(xp[(i / in) * ldx + i % in]).bits;
      });
  const auto* wb = reinterpret_cast<const std::uint16_t*>(w.data());
  const int ldw = static_cast<int>(w.stride(0)), ldy = static_cast<int>(y.stride(0));
  for (int t0 = 0; t0 < n; t0 += seg)
    device_blas::gemm_bf16_rows(exec, seg, out, in, xb + static_cast<std::size_t>(t0) * in, in,
                                wb, ldw, y.data() + static_cast<std::size_t>(t0) * ldy, ldy);
}
#endif

}  // namespace detail

/// y[n][out] = x[n][in] · W[out][in]ᵀ. Extents must agree (checked on the host).
///
/// `seg`: the rows form n / seg sequences of `seg` rows each (0: one sequence of n rows). The
/// kernel and the tiling are chosen per sequence, so every output row is bitwise the same
/// whatever the number of sequences in the call.
template <class E>
void linear(const E& exec, const CMat<E>& x, const Matrix<E>& w, const Mat<E>& y,
            LinearScratch<E>& scratch, int seg = 0) {
  const int n = static_cast<int>(x.extent(0));
  if (seg <= 0 || n % seg != 0) seg = n;
  constexpr bool host =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible;
  // Short sequences (decode) on a device: a warp per output row, coalesced loads.
  if constexpr (!host) {
    if (seg < kWidenRows) {
      if (w.dtype == DType::F32)
        gemv_warp(exec, x, w.f32, y);
      else if (w.dtype == DType::BF16)
        gemv_warp(exec, x, w.bf16, y);
      else
        gemv_warp(exec, x, w.f16, y);
      return;
    }
  }
  // Short sequences (decode) on the host: a streaming GEMV whose fixed-lane dot products
  // vectorise; it reads the weights once at close to memory bandwidth, where per-tile BLAS calls
  // reach about half.
  if (w.dtype == DType::F32 && seg < kWidenRows) {
    detail::linear_direct(exec, x, w.f32, y);
    return;
  }
  if (w.dtype == DType::F32) {
    if constexpr (host) exec.fence();  // the BLAS tiles run on host threads of their own
    detail::blas_linear<E>(exec, x, w.f32, y, seg);
    return;
  }
  if (scratch.bf16_compute && w.dtype == DType::BF16 && seg >= kWidenRows) {
    if constexpr (host) {
      detail::bf16_linear<E>(exec, x, w.bf16, y, seg, scratch);
      return;
    }
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (std::is_same_v<E, Kokkos::Cuda>) {
      detail::cuda_bf16_linear(exec, x, w.bf16, y, seg, scratch);
      return;
    }
#endif
  }
  if (seg >= kWidenRows) {
    Mat<E> wide = scratch.get(w.rows, w.cols);
    if (w.dtype == DType::BF16)
      detail::widen(exec, w.bf16, wide);
    else
      detail::widen(exec, w.f16, wide);
    if constexpr (host) exec.fence();
    detail::blas_linear<E>(exec, x, wide, y, seg);
    return;
  }
  if (w.dtype == DType::BF16)
    detail::linear_direct(exec, x, w.bf16, y);
  else
    detail::linear_direct(exec, x, w.f16, y);
}

}  // namespace sparsim
