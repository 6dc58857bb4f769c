#pragma once
/// Column-skipping GEMV for activation sparsity at decode time.
///
/// The weight is stored transposed, Wt[in][out] (TEAL's layout): the weights that multiply one
/// input entry h_j are contiguous, so skipping h_j = 0 skips a whole row of Wt and the kernel
/// reads only the kept rows. y[o] = Σ_k h[idx[k]] · Wt[idx[k]][o] over the kept indices.
///
/// Summation order (the same for every output, every tile width and every thread count): the
/// kept indices are taken in groups of kGroup = 4 from k = 0,
///   acc += (x0·w0 + x1·w1) + (x2·w2 + x3·w3),
/// then the remaining nnz mod 4 one at a time, acc += xk·wk. Each output is owned by one
/// thread, so y is bitwise identical for Serial, OpenMP and any thread count. (Devices use
/// another fixed order, sparse_gemv_teams below.)
///
/// Work split on the host: a thread owns a tile of consecutive outputs, about out / threads of
/// them (a multiple of kTileAlign, at most kMaxTile), and accumulates in y itself, which stays
/// in L1/L2. For each group of kept rows it sweeps the whole tile, so every kept row is read as
/// one long contiguous run (kilobytes, like the dense kernel's rows) that the hardware prefetcher
/// streams; narrow fixed blocks (64 outputs = 128 bytes per row, 8–22 KB apart) were latency-
/// and TLB-bound at a third of the memory bandwidth. Software prefetch of the next group's rows
/// did not measurably help once the runs were long (and prefetching whole rows hurt). The tile
/// width only decides which thread computes which outputs, never an output's bits. On a GPU a
/// team owns a tile of outputs and its warps split the kept rows (sparse_gemv_teams below): a
/// warp reads consecutive weights of a kept row (coalesced), and the warps' sums are added in a
/// fixed order.
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>

namespace sparsim {

/// Kept rows summed per step of the fixed summation order (see above).
inline constexpr int kGroup = 4;
/// Host tiles are multiples of this many outputs (64 bytes of bf16 per row) ...
inline constexpr int kTileAlign = 32;
/// ... and at most this many (16 KiB of fp32 partial sums per thread).
inline constexpr int kMaxTile = 4096;

namespace detail {

/// a[0:n] += Σ over kept indices [0, nnz) of x[i] · wt[i][o0 : o0 + n], in the fixed order.
/// a holds the partial sums on entry (zero for a fresh output).
template <class T, class X, class I, class Wt>
KOKKOS_INLINE_FUNCTION void gemv_tile(float* a, int n, const X& x, const I& idx, int nnz,
                                      const Wt& wt, int o0) {
  int k = 0;
  for (; k + kGroup <= nnz; k += kGroup) {
    const int i0 = idx(k), i1 = idx(k + 1), i2 = idx(k + 2), i3 = idx(k + 3);
    const float x0 = x(i0), x1 = x(i1), x2 = x(i2), x3 = x(i3);
    const T* r0 = &wt(i0, o0);
    const T* r1 = &wt(i1, o0);
    const T* r2 = &wt(i2, o0);
    const T* r3 = &wt(i3, o0);
    for (int j = 0; j < n; ++j)
      a[j] += (x0 * to_f32(r0[j]) + x1 * to_f32(r1[j])) + (x2 * to_f32(r2[j]) + x3 * to_f32(r3[j]));
  }
  for (; k < nnz; ++k) {
    const int i = idx(k);
    const float xi = x(i);
    const T* r = &wt(i, o0);
    for (int j = 0; j < n; ++j) a[j] += xi * to_f32(r[j]);
  }
}

/// True where the execution space runs on the host.
template <class E>
inline constexpr bool kHostSpace =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible;

}  // namespace detail

/// The host tile width for `out` outputs on `threads` threads: one tile per thread (more when a
/// tile would exceed kMaxTile), rounded up to kTileAlign.
inline int sparse_gemv_tile(int out, int threads) {
  threads = std::max(threads, 1);
  const int per_thread = (out + threads - 1) / threads;
  const int tiles = threads * ((per_thread + kMaxTile - 1) / kMaxTile);
  const int w = (out + tiles - 1) / tiles;
  return std::max(kTileAlign, (w + kTileAlign - 1) / kTileAlign * kTileAlign);
}

/// The host kernel with an explicit tile width (any tile >= 1 gives the same bits; tests and
/// tuning use this overload, sparse_gemv picks the tile).
template <class E, class T>
void sparse_gemv_tiled(const E& exec, const CVec<E>& x, const IVec<E>& idx, int nnz,
                       const Kokkos::View<T**, Layout, DeviceOf<E>>& wt, const Vec<E>& y,
                       int tile) {
  static_assert(detail::kHostSpace<E>, "tiles accumulate in y: host backends only");
  const int out = static_cast<int>(wt.extent(1));
  const int tiles = (out + tile - 1) / tile;
  Kokkos::parallel_for(
      "sparsim::kernels::sparse_gemv", Kokkos::RangePolicy<E>(exec, 0, tiles),
      KOKKOS_LAMBDA(const int t) {
        const int o0 = t * tile;
        const int n = out - o0 < tile ? out - o0 : tile;
        float* a = &y(o0);
        for (int j = 0; j < n; ++j) a[j] = 0.0f;
        detail::gemv_tile<T>(a, n, x, idx, nnz, wt, o0);
      });
}

namespace detail {
/// Device kernel: a team owns kDevTile consecutive outputs (two per lane of a 32-lane warp, so a
/// warp reads 64 consecutive outputs of a kept row); its kDevWarps warps take consecutive
/// slices of the kept indices, and the warps' partial sums are added in warp order. The kept
/// count is read from device memory.
inline constexpr int kDevWarps = 8;
inline constexpr int kDevLanes = 32;
inline constexpr int kDevTile = 2 * kDevLanes;

template <class E, class T>
void sparse_gemv_teams(const E& exec, const CVec<E>& x, const IVec<E>& idx, const IVec<E>& count,
                       const Kokkos::View<T**, Layout, DeviceOf<E>>& wt, const Vec<E>& y) {
  using Policy = Kokkos::TeamPolicy<E>;
  using Member = typename Policy::member_type;
  using Scratch = Kokkos::View<float*, typename E::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  constexpr bool host = kHostSpace<E>;
  const int out = static_cast<int>(wt.extent(1));
  const int tiles = (out + kDevTile - 1) / kDevTile;
  Policy pol(exec, tiles, host ? 1 : kDevWarps, host ? 1 : kDevLanes);
  pol = pol.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(kDevWarps * kDevTile)));
  // local copies: namespace-scope constants are not addressable in device code
  const int n_warps = kDevWarps, lanes = kDevLanes, tile = kDevTile;
  const float* xp = x.data();
  const int* ip = idx.data();
  const int* cp = count.data();
  const T* wp = wt.data();
  float* yp = y.data();
  Kokkos::parallel_for(
      "sparsim::kernels::sparse_gemv_teams", pol, KOKKOS_LAMBDA(const Member& team) {
        const int o0 = team.league_rank() * tile;
        const int nnz = cp[0];
        const int per = (nnz + n_warps - 1) / n_warps;
        Scratch part(team.team_scratch(0), n_warps * tile);
        for (int w = team.team_rank(); w < n_warps; w += team.team_size()) {
          const int k0 = w * per, k1 = k0 + per < nnz ? k0 + per : nnz;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, lanes), [&](const int lane) {
            const int oa = o0 + 2 * lane, ob = oa + 1;
            float a0 = 0.0f, a1 = 0.0f;
            for (int k = k0; k < k1; ++k) {
              const int i = ip[k];
              const float xi = xp[i];
              const T* r = wp + static_cast<std::size_t>(i) * out;
              if (oa < out) a0 += xi * to_f32(r[oa]);
              if (ob < out) a1 += xi * to_f32(r[ob]);
            }
            part(w * tile + 2 * lane) = a0;
            part(w * tile + 2 * lane + 1) = a1;
          });
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamVectorRange(team, tile), [&](const int j) {
          if (o0 + j >= out) return;
          float acc = 0.0f;
          for (int w = 0; w < n_warps; ++w) acc += part(w * tile + j);
          yp[o0 + j] = acc;
        });
      });
}
}  // namespace detail

/// y[out] = Σ_{k < nnz} x[idx[k]] · wt[idx[k]][:], wt is [in][out], idx ascending.
template <class E, class T>
void sparse_gemv(const E& exec, const CVec<E>& x, const IVec<E>& idx, int nnz,
                 const Kokkos::View<T**, Layout, DeviceOf<E>>& wt, const Vec<E>& y) {
  const int out = static_cast<int>(wt.extent(1));
  if constexpr (detail::kHostSpace<E>) {
    sparse_gemv_tiled(exec, x, idx, nnz, wt, y, sparse_gemv_tile(out, exec.concurrency()));
  } else {
    IVec<E> count("sparsim::sparse_gemv::count", 1);
    Kokkos::deep_copy(exec, count, nnz);
    detail::sparse_gemv_teams(exec, x, idx, count, wt, y);
  }
}

/// As above with nnz = count(0) in the execution space's memory: on devices it is read by the
/// kernel (no host round trip), on the host after the producer of count has finished.
template <class E, class T>
void sparse_gemv(const E& exec, const CVec<E>& x, const IVec<E>& idx, const IVec<E>& count,
                 const Kokkos::View<T**, Layout, DeviceOf<E>>& wt, const Vec<E>& y) {
  if constexpr (detail::kHostSpace<E>) {
    exec.fence();
    sparse_gemv(exec, x, idx, count(0), wt, y);
  } else {
    detail::sparse_gemv_teams(exec, x, idx, count, wt, y);
  }
}

}  // namespace sparsim
