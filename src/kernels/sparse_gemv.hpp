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
/// another fixed order, sparse_gemv_split below.)
///
/// Work split on the host: a thread owns a tile of consecutive outputs, about out / threads of
/// them (a multiple of kTileAlign, at most kMaxTile), and accumulates in y itself, which stays
/// in L1/L2. For each group of kept rows it sweeps the whole tile, so every kept row is read as
/// one long contiguous run (kilobytes, like the dense kernel's rows) that the hardware prefetcher
/// streams; narrow fixed blocks (64 outputs = 128 bytes per row, 8–22 KB apart) were latency-
/// and TLB-bound at a third of the memory bandwidth. Software prefetch of the next group's rows
/// did not measurably help once the runs were long (and prefetching whole rows hurt). The tile
/// width only decides which thread computes which outputs, never an output's bits. On a GPU the
/// kept rows are split across teams and warps (sparse_gemv_split below): a warp reads 512
/// consecutive bytes of a kept row, and the partial sums are added in a fixed order.
#include "kernels/gemv_device.hpp"
#include "kernels/host_gemv.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>

namespace sparsim {

/// Kept rows summed per step of the fixed summation order (see above).
inline constexpr int kGroup = host::kSparseGroup;
/// Host tiles are multiples of this many outputs (64 bytes of bf16 per row) ...
inline constexpr int kTileAlign = 32;
/// ... and at most this many (16 KiB of fp32 partial sums per thread).
inline constexpr int kMaxTile = 4096;

namespace detail {

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
      "sparsim::kernels::sparse_gemv", light(Kokkos::RangePolicy<E>(exec, 0, tiles)),
      [=](const int t) {  // host only: a plain lambda (the tile kernel is a host function)
        const int o0 = t * tile;
        const int n = out - o0 < tile ? out - o0 : tile;
        float* a = &y(o0);
        for (int j = 0; j < n; ++j) a[j] = 0.0f;
        host::sparse_tile(a, n, x.data(), idx.data(), nnz, &wt(0, o0), wt.stride(0));
      });
}

namespace detail {
/// Device kernel (split-K): the outputs are cut into tiles of 32 lanes × V consecutive outputs
/// (V = 16 bytes of weights per lane), and the kept rows into ks slices; one team of kSpWarps
/// warps takes one (tile, slice), its warps take consecutive parts of the slice (two kept rows
/// in flight per lane), and the warps' sums are added in warp order into a partial result of
/// the slice. The last team of a tile to finish (an integer counter) adds the slices' partials
/// in slice order. The kept rows come either from an index list whose length is in device
/// memory, or — for a threshold rule — from the input itself: each team keeps the entries
/// |x_j| >= tau of its slice of the input, in order, without a separate selection kernel.
inline constexpr int kSpWarps = 4;
inline constexpr int kSpLanes = 32;
inline constexpr int kSpThreads = kSpWarps * kSpLanes;
/// Largest slice of the input a threshold team compacts (its scratch list).
inline constexpr int kSpMaxSlice = 2048;

/// Reads a value another team wrote before a fence (through L2 on GPUs).
KOKKOS_INLINE_FUNCTION float load_other(const float* p) {
#if defined(__CUDA_ARCH__)
  return __ldcg(p);
#else
  return *static_cast<const volatile float*>(p);
#endif
}
KOKKOS_INLINE_FUNCTION int load_other(const int* p) {
#if defined(__CUDA_ARCH__)
  return __ldcg(p);
#else
  return *static_cast<const volatile int*>(p);
#endif
}
}  // namespace detail

/// Workspace of the device sparse GEMV: per-slice partial sums and counts, per-tile counters
/// (zero between calls). Sized for the widest output and largest input of a model.
template <class E>
struct SparseGemvWork {
  Vec<E> part;
  IVec<E> kept_part, count;
  int tiles = 0, slices = 0;
  /// Slices for an input of `in` entries and `tiles` output tiles: about 512 teams in all,
  /// and threshold slices of at most kSpMaxSlice entries.
  static int slices_for(int in, int tiles) {
    int ks = (512 + tiles - 1) / tiles;
    ks = std::max(ks, (in + detail::kSpMaxSlice - 1) / detail::kSpMaxSlice);
    return std::max(1, std::min(ks, 256));
  }
  void ensure(int max_in, int max_out) {
    // tiles are 32, 128 or 256 outputs wide: room for the widest rounding, the most tiles
    const int t = (max_out + detail::kSpLanes - 1) / detail::kSpLanes;
    const int ks = std::max(slices_for(max_in, 1), 256);
    if (t > tiles || ks > slices) {
      tiles = std::max(t, tiles);
      slices = std::max(ks, slices);
      const std::size_t width =
          (static_cast<std::size_t>(tiles) * detail::kSpLanes + 255) / 256 * 256;
      part = Vec<E>(Kokkos::view_alloc("sparsim::sparse_gemv::part", Kokkos::WithoutInitializing),
                    static_cast<std::size_t>(slices) * width);
      kept_part = IVec<E>("sparsim::sparse_gemv::kept_part", slices);
      count = IVec<E>("sparsim::sparse_gemv::count", tiles);
    }
  }
};

namespace detail {
template <bool kThreshold, bool kWide, class E, class T>
void sparse_gemv_split_impl(const E& exec, const CVec<E>& x, const IVec<E>& idx,
                            const IVec<E>& count, float tau,
                            const Kokkos::View<T**, Layout, DeviceOf<E>>& wt, const Vec<E>& y,
                            SparseGemvWork<E>& work) {
  using Policy = Kokkos::TeamPolicy<E>;
  using Member = typename Policy::member_type;
  using FScratch = Kokkos::View<float*, typename E::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using IScratch = Kokkos::View<int*, typename E::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  constexpr bool host = kHostSpace<E>;
  constexpr int V = kWide ? 16 / static_cast<int>(sizeof(T)) : 1;
  const int in = static_cast<int>(wt.extent(0)), out = static_cast<int>(wt.extent(1));
  const int tw = kSpLanes * V;
  const int tiles = (out + tw - 1) / tw;
  const int ks = SparseGemvWork<E>::slices_for(in, tiles);
  work.ensure(in, out);
  const int slice_in = (in + ks - 1) / ks;
  const int list_len = kThreshold ? slice_in : 1;
  const int threads = kSpThreads, lanes = kSpLanes, warps = kSpWarps;
  Policy pol(exec, tiles * ks, host ? 1 : kSpThreads, 1);
  pol = pol.set_scratch_size(
      0, Kokkos::PerTeam(FScratch::shmem_size(warps * tw) + IScratch::shmem_size(list_len + 2)));
  const float* xp = x.data();
  const int* ip = idx.data();
  int* cp = count.data();
  const T* wp = wt.data();
  float* yp = y.data();
  float* pp = work.part.data();
  int* kp = work.kept_part.data();
  int* cnt = work.count.data();
  Kokkos::parallel_for(
      "sparsim::kernels::sparse_gemv_split", light(pol), KOKKOS_LAMBDA(const Member& team) {
        const int tile = team.league_rank() % tiles, sl = team.league_rank() / tiles;
        const int o0 = tile * tw;
        FScratch wsum(team.team_scratch(0), warps * tw);
        IScratch list(team.team_scratch(0), list_len + 2);
        int* rows = list.data();
        int n = 0;  // kept rows of this team's slice
        // (a plain `if`: nvcc's device lambdas must not first-capture inside `if constexpr`)
        if (kThreshold) {
          const int i0 = sl * slice_in;
          const int len = in - i0 < slice_in ? (in - i0 > 0 ? in - i0 : 0) : slice_in;
          Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, len),
                                [&](const int i, int& pre, const bool fin) {
                                  const bool keep = kx::fabs(xp[i0 + i]) >= tau;
                                  if (fin && keep) rows[pre] = i0 + i;
                                  pre += keep ? 1 : 0;
                                });
          int c = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, len),
              [&](const int i, int& a) { a += kx::fabs(xp[i0 + i]) >= tau ? 1 : 0; }, c);
          n = c;
          team.team_barrier();
        } else {
          const int nnz = cp[0];
          const int per = (nnz + ks - 1) / ks;
          const int k0 = sl * per;
          n = nnz - k0 < per ? (nnz - k0 > 0 ? nnz - k0 : 0) : per;
          rows = const_cast<int*>(ip) + k0;
        }
        // each warp a contiguous part of the slice's kept rows; lane l outputs o0 + l·V … +V
        const int sub = (n + warps - 1) / warps;
        for (int tid = team.team_rank(); tid < threads; tid += team.team_size()) {
          const int w = tid / lanes, lane = tid % lanes;
          const int oa = o0 + lane * V;
          const int r0 = w * sub, r1 = r0 + sub < n ? r0 + sub : n;
          float a[V], b[V];
          for (int v = 0; v < V; ++v) a[v] = b[v] = 0.0f;
          const auto row = [&](int i, float* acc) {
            const float xi = xp[i];
            const T* wr = wp + static_cast<std::size_t>(i) * out + oa;
            if constexpr (kWide) {
              if (oa < out) {
                float wv[V];
                gemv::load_w<T>(wr, wv);
                for (int v = 0; v < V; ++v) acc[v] += xi * wv[v];
              }
            } else {
              if (oa < out) acc[0] += xi * to_f32(wr[0]);
            }
          };
          int k = r0;
          for (; k + 1 < r1; k += 2) {  // two rows in flight: a takes the even, b the odd
            const int i0 = rows[k], i1 = rows[k + 1];
            row(i0, a);
            row(i1, b);
          }
          if (k < r1) row(rows[k], a);
          for (int v = 0; v < V; ++v) wsum(w * tw + lane * V + v) = a[v] + b[v];
        }
        team.team_barrier();
        // the slice's partial: warps added in order
        const std::size_t pbase = (static_cast<std::size_t>(sl) * tiles + tile) * tw;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tw), [&](const int j) {
          float acc = 0.0f;
          for (int w = 0; w < warps; ++w) acc += wsum(w * tw + j);
          pp[pbase + j] = acc;
        });
        if (kThreshold && tile == 0) Kokkos::single(Kokkos::PerTeam(team), [&]() { kp[sl] = n; });
        Kokkos::memory_fence();
        team.team_barrier();
        int* last = list.data() + list_len;
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          const int done = Kokkos::atomic_fetch_add(&cnt[tile], 1);
          *last = done == ks - 1 ? 1 : 0;
        });
        team.team_barrier();
        if (*last) {
          Kokkos::memory_fence();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tw), [&](const int j) {
            if (o0 + j >= out) return;
            float acc = 0.0f;
            for (int q = 0; q < ks; ++q)
              acc += load_other(pp + (static_cast<std::size_t>(q) * tiles + tile) * tw + j);
            yp[o0 + j] = acc;
          });
          Kokkos::single(Kokkos::PerTeam(team), [&]() {
            cnt[tile] = 0;
            if (kThreshold && tile == 0) {
              int total = 0;
              for (int q = 0; q < ks; ++q) total += load_other(kp + q);
              cp[0] = total;
            }
          });
        }
      });
}
}  // namespace detail

/// Device sparse GEMV, y[out] = Σ over kept rows i of x[i] · wt[i][:], wt [in][out]:
/// - list mode (kThreshold false): the kept rows are idx[0, count(0)) (count in device memory);
/// - threshold mode: the kept rows are every i with |x_i| >= tau, and count(0) receives their
///   number. Runs on host backends too (one thread per team), for tests.
template <bool kThreshold, class E, class T>
void sparse_gemv_split(const E& exec, const CVec<E>& x, const IVec<E>& idx, const IVec<E>& count,
                       float tau, const Kokkos::View<T**, Layout, DeviceOf<E>>& wt, const Vec<E>& y,
                       SparseGemvWork<E>& work) {
  const int out = static_cast<int>(wt.extent(1));
  const bool wide = reinterpret_cast<std::uintptr_t>(wt.data()) % 16 == 0 &&
                    (static_cast<std::size_t>(out) * sizeof(T)) % 16 == 0;
  if (wide)
    detail::sparse_gemv_split_impl<kThreshold, true>(exec, x, idx, count, tau, wt, y, work);
  else
    detail::sparse_gemv_split_impl<kThreshold, false>(exec, x, idx, count, tau, wt, y, work);
}

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
    SparseGemvWork<E> work;
    sparse_gemv_split<false>(exec, x, idx, count, 0.0f, wt, y, work);
  }
}

/// As above with nnz = count(0) in the execution space's memory: on devices it is read by the
/// kernel (no host round trip), on the host after the producer of count has finished.
template <class E, class T>
void sparse_gemv(const E& exec, const CVec<E>& x, const IVec<E>& idx, const IVec<E>& count,
                 const Kokkos::View<T**, Layout, DeviceOf<E>>& wt, const Vec<E>& y,
                 SparseGemvWork<E>& work) {
  if constexpr (detail::kHostSpace<E>) {
    exec.fence();
    sparse_gemv(exec, x, idx, count(0), wt, y);
  } else {
    sparse_gemv_split<false>(exec, x, idx, count, 0.0f, wt, y, work);
  }
}

}  // namespace sparsim
