#pragma once
/// Decode GEMV for devices: one warp per output row (or per pair of rows), coalesced wide loads,
/// and the epilogues that let one launch do the work of several kernels.
///
/// A team is kWarpsPerTeam "warps": team threads with kLanes vector lanes each. A warp owns one
/// work unit (one output row, or two rows that are finished together) for every token of the
/// call. Lane l reads the chunks c ≡ l (mod kLanes) of the input dimension, kVec consecutive
/// elements per chunk (16 bytes of weights: 4 fp32 or 8 bf16/f16), so a warp reads 512
/// contiguous bytes of a weight row per step; the lanes' partial sums are then added by the
/// backend's fixed vector reduction (a shuffle tree on GPUs, lane order on the host). The
/// summation order depends only on the code and the lane count, never on the schedule, so
/// results are the same run after run.
///
/// The same kernels run on host backends (one thread per team, the lanes as a loop), which is
/// how the tests check them; the engine uses them on devices only, where the host's streaming
/// kernel (linear_direct) would give each output row a single thread.
///
/// Epilogues (what a warp does with its dot products):
///  - Store:    y[t][o] = acc
///  - AddTo:    y[t][o] += acc                  (projection + residual in one launch)
///  - SwiGLU:   h[t][o] = silu(gate_o·x) · (up_o·x)   (gate, up and SwiGLU in one launch)
///  - QKVRope:  q, k, v rows of one token; rotary pairs rotated, k and v written straight
///              into the KV cache at the token's position (Q/K/V + RoPE + cache store)
/// and an optional RMSNorm of the input (x[t][j] · g[j] / rms(x[t])): each warp sums x² from the
/// same loads as its dot products with x ∘ g and scales the finished sums (norm + projection in
/// one launch, with no reduction before the weights are read).
#include "core/compat.hpp"
#include "kernels/fast_math.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

namespace sparsim {

/// An array of N floats with +=, the value type of the lane reductions below.
template <int N>
struct FArr {
  float v[N];
  KOKKOS_INLINE_FUNCTION FArr() {
    for (int i = 0; i < N; ++i) v[i] = 0.0f;
  }
  KOKKOS_INLINE_FUNCTION FArr& operator+=(const FArr& o) {
    for (int i = 0; i < N; ++i) v[i] += o.v[i];
    return *this;
  }
  KOKKOS_INLINE_FUNCTION void operator+=(const volatile FArr& o) volatile {
    for (int i = 0; i < N; ++i) v[i] += o.v[i];
  }
};

}  // namespace sparsim

namespace Kokkos {
template <int N>
struct reduction_identity<sparsim::FArr<N>> {
  KOKKOS_FORCEINLINE_FUNCTION static sparsim::FArr<N> sum() { return sparsim::FArr<N>(); }
};
}  // namespace Kokkos

namespace sparsim {

namespace gemv {

/// Lanes per warp: the vector length of the device teams, and the stride of the chunk loop.
inline constexpr int kLanes = 32;
/// Warps per team on devices (128 threads per block).
inline constexpr int kWarpsPerTeam = 4;

/// Team shape: kWarpsPerTeam × kLanes on devices, one thread on the host.
template <class E>
struct Shape {
  static constexpr bool host =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible;
  static constexpr int warps = host ? 1 : kWarpsPerTeam;
  static constexpr int vector = host ? 1 : kLanes;
  static Kokkos::TeamPolicy<E> policy(const E& exec, int units) {
    return Kokkos::TeamPolicy<E>(exec, (units + warps - 1) / warps, warps, vector);
  }
};

/// 16 bytes, the width of one load.
struct alignas(16) Q16 {
  std::uint32_t a, b, c, d;
};

KOKKOS_INLINE_FUNCTION float lo_bf16(std::uint32_t u) {
  union {
    std::uint32_t u;
    float f;
  } c;
  c.u = u << 16;
  return c.f;
}
KOKKOS_INLINE_FUNCTION float hi_bf16(std::uint32_t u) {
  union {
    std::uint32_t u;
    float f;
  } c;
  c.u = u & 0xffff0000u;
  return c.f;
}
KOKKOS_INLINE_FUNCTION float as_f32(std::uint32_t u) {
  union {
    std::uint32_t u;
    float f;
  } c;
  c.u = u;
  return c.f;
}

/// Elements of T per 16-byte load.
template <class T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

/// w[0, kVec) as floats (w 16-byte aligned).
template <class T>
KOKKOS_INLINE_FUNCTION void load_w(const T* w, float* out) {
  const Q16 q = *reinterpret_cast<const Q16*>(w);
  if constexpr (sizeof(T) == 4) {
    out[0] = as_f32(q.a);
    out[1] = as_f32(q.b);
    out[2] = as_f32(q.c);
    out[3] = as_f32(q.d);
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    out[0] = lo_bf16(q.a);
    out[1] = hi_bf16(q.a);
    out[2] = lo_bf16(q.b);
    out[3] = hi_bf16(q.b);
    out[4] = lo_bf16(q.c);
    out[5] = hi_bf16(q.c);
    out[6] = lo_bf16(q.d);
    out[7] = hi_bf16(q.d);
  } else {  // IEEE fp16: the halves of each word (read as integers: no type punning)
    const std::uint32_t u[4] = {q.a, q.b, q.c, q.d};
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = T{static_cast<std::uint16_t>(u[i] & 0xffffu)}.to_float();
      out[2 * i + 1] = T{static_cast<std::uint16_t>(u[i] >> 16)}.to_float();
    }
  }
}

/// x[0, n) as floats, n a multiple of 4 (x 16-byte aligned).
template <int N>
KOKKOS_INLINE_FUNCTION void load_x(const float* x, float* out) {
  for (int i = 0; i < N; i += 4) {
    const Q16 q = *reinterpret_cast<const Q16*>(x + i);
    out[i] = as_f32(q.a);
    out[i + 1] = as_f32(q.b);
    out[i + 2] = as_f32(q.c);
    out[i + 3] = as_f32(q.d);
  }
}

/// Whether the wide loads may be used: rows and the input start on 16-byte boundaries.
template <class T>
inline bool aligned(const void* w, int in, const void* x, int ldx) {
  const auto a = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return a(w) && a(x) && (static_cast<std::size_t>(in) * sizeof(T)) % 16 == 0 &&
         (static_cast<std::size_t>(ldx) * sizeof(float)) % 16 == 0;
}

/// The input of the dot products: x[t][j], optionally RMS-normalised (x · g · inv_rms[t]).
struct Input {
  const float* x = nullptr;  ///< [n][ldx]
  int ldx = 0;
  const float* g = nullptr;  ///< RMSNorm weight [in], or null: x as it is
  float eps = 0;
};

/// Chunks a lane has in flight (16-byte loads issued before the multiply-adds that use them):
/// four for one row per warp, two per row for two rows. Measured on an H200 (one warp per row,
/// bf16 4096 x 4096): two chunks in flight reached 2.0 TB/s, four 2.9.
template <int R>
inline constexpr int kUnroll = R == 1 ? 4 : 2;

/// Slots of a warp's reduction: R·NT dot products, and with kNorm NT sums of squares.
template <int R, int NT, bool kNorm>
inline constexpr int kSlots = kNorm ? (R + 1) * NT : R* NT;

/// Lane `lane`'s partial dot products of R weight rows with NT tokens (tokens t0 … t0+nt−1,
/// nt ≤ NT), into acc[r·NT + t]. With kNorm the products are with x ∘ g, and the lane also sums
/// x² of each token into acc[R·NT + t] from the same loads: the RMSNorm's 1/rms is applied to
/// the finished sums (finish_norm), so no team-wide reduction has to run before the weights are
/// read. The lane takes its chunks kUnroll<R> at a time (all loads first, then the
/// multiply-adds), then the rest one by one, then the elements past the last whole chunk.
template <int R, int NT, bool kWide, bool kNorm, class T>
KOKKOS_INLINE_FUNCTION void lane_dots(int lane, const T* const* w, int in, const Input& inp, int t0,
                                      int nt, FArr<kSlots<R, NT, kNorm>>& acc) {
  constexpr int V = kWide ? kVec<T> : 1;
  constexpr int U = kUnroll<R>;
  const int chunks = in / V;
  const auto madd = [&](int c, const float(&wv)[R][V]) {
    const int j = c * V;
    float gv[V];
    if (kNorm) {
      if constexpr (kWide)
        load_x<V>(inp.g + j, gv);
      else
        gv[0] = inp.g[j];
    }
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      float xv[V];
      const float* xr = inp.x + static_cast<std::size_t>(t0 + t) * inp.ldx + j;
      if constexpr (kWide)
        load_x<V>(xr, xv);
      else
        xv[0] = xr[0];
      if (kNorm) {
        float ss = 0.0f;
        for (int i = 0; i < V; ++i) {
          ss += xv[i] * xv[i];
          xv[i] *= gv[i];
        }
        acc.v[R * NT + t] += ss;
      }
      for (int r = 0; r < R; ++r) {
        float sum = 0.0f;
        for (int i = 0; i < V; ++i) sum += xv[i] * wv[r][i];
        acc.v[r * NT + t] += sum;
      }
    }
  };
  const auto load = [&](int c, float(&wv)[R][V]) {
    const int j = c * V;
    for (int r = 0; r < R; ++r) {
      if constexpr (kWide)
        load_w<T>(w[r] + j, wv[r]);
      else
        wv[r][0] = to_f32(w[r][j]);
    }
  };
  int c = lane;
  for (; c + (U - 1) * kLanes < chunks; c += U * kLanes) {
    float wv[U][R][V];
    for (int u = 0; u < U; ++u) load(c + u * kLanes, wv[u]);
    for (int u = 0; u < U; ++u) madd(c + u * kLanes, wv[u]);
  }
  for (; c < chunks; c += kLanes) {
    float wv[R][V];
    load(c, wv);
    madd(c, wv);
  }
  // the tail past the last whole chunk, one element per lane
  for (int j = chunks * V + lane; j < in; j += kLanes) {
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      float xv = inp.x[static_cast<std::size_t>(t0 + t) * inp.ldx + j];
      if (kNorm) {
        acc.v[R * NT + t] += xv * xv;
        xv *= inp.g[j];
      }
      for (int r = 0; r < R; ++r) acc.v[r * NT + t] += xv * to_f32(w[r][j]);
    }
  }
}

/// The RMSNorm applied to finished products: acc[r·NT + t] · 1/sqrt(mean(x_t²) + eps), the
/// sums of squares in acc[R·NT + t].
template <int R, int NT>
KOKKOS_INLINE_FUNCTION void finish_norm(float* acc, int in, float eps) {
  for (int t = 0; t < NT; ++t) {
    const float inv = 1.0f / kx::sqrt(acc[R * NT + t] / static_cast<float>(in) + eps);
    for (int r = 0; r < R; ++r) acc[r * NT + t] *= inv;
  }
}

/// How a launch is shaped: teams (league size; the warps of the league take the units in turn,
/// so a team normalises its input once for all the units its warps take) and tokens per group.
struct Launch {
  int teams = 0;      ///< 0: one team per kWarpsPerTeam units
  int tok_group = 0;  ///< 0: 1 for one token, 4 for up to 4, else 8
};

template <bool kWide, bool kNorm, int R, int NT, class E, class T, class Rows, class Epi>
void run_units_impl(const char* label, const E& exec, int units, int in, int n, const Input& inp,
                    int teams, const Rows& rows, const Epi& epi) {
  using Member = typename Kokkos::TeamPolicy<E>::member_type;
  constexpr int S = kSlots<R, NT, kNorm>;
  const int lanes = kLanes;  // a local copy: namespace-scope constants are not device-addressable
  const int warps = Shape<E>::warps;
  const float eps = inp.eps;
  Kokkos::parallel_for(
      label, light(Kokkos::TeamPolicy<E>(exec, teams, warps, Shape<E>::vector)),
      KOKKOS_LAMBDA(const Member& team) {
        const int first = team.league_rank() * team.team_size() + team.team_rank();
        const int stride = team.league_size() * team.team_size();
        for (int t0 = 0; t0 < n; t0 += NT) {
          const int nt = n - t0 < NT ? n - t0 : NT;
          for (int unit = first; unit < units; unit += stride) {
            const T* w[R];
            rows(unit, w);
            FArr<S> acc;
            Kokkos::parallel_reduce(
                Kokkos::ThreadVectorRange(team, lanes),
                [&](const int lane, FArr<S>& a) {
                  lane_dots<R, NT, kWide, kNorm, T>(lane, w, in, inp, t0, nt, a);
                },
                acc);
            Kokkos::single(Kokkos::PerThread(team), [&]() {
              if (kNorm) finish_norm<R, NT>(acc.v, in, eps);
              epi(unit, t0, nt, acc.v, NT);
            });
          }
        }
      });
}

template <bool kWide, bool kNorm, int R, class E, class T, class Rows, class Epi>
void run_units_nt(const char* label, const E& exec, int units, int in, int n, const Input& inp,
                  const Launch& how, const Rows& rows, const Epi& epi) {
  const int warps = Shape<E>::warps;
  // Devices: at most about 8 teams of 4 warps per multiprocessor (the concurrency over 256
  // threads); the warps take the units in turn. On an H200 this made the 32000 x 4096 bf16 LM
  // head 9% faster and the 49152 x 576 one 36% (fewer teams normalise the input) and changed
  // nothing for 4096 rows.
  int teams = (units + warps - 1) / warps;
  if (!Shape<E>::host) {
    const int cap = static_cast<int>(exec.concurrency() / 256);
    if (cap > 0 && teams > cap) teams = cap;
  }
  if (how.teams > 0) teams = how.teams;
  // tokens a warp keeps in registers at once: all of a decode batch of up to 8 rows, so that
  // the weights are read once per call
  const int g = how.tok_group > 0 ? how.tok_group : (n == 1 ? 1 : n <= 4 ? 4 : 8);
  if (g == 1)
    run_units_impl<kWide, kNorm, R, 1, E, T>(label, exec, units, in, n, inp, teams, rows, epi);
  else if (g <= 4)
    run_units_impl<kWide, kNorm, R, 4, E, T>(label, exec, units, in, n, inp, teams, rows, epi);
  else
    run_units_impl<kWide, kNorm, R, 8, E, T>(label, exec, units, in, n, inp, teams, rows, epi);
}

/// Runs `epi(unit, t0, nt, acc, stride)` after the dot products of the R rows `rows(unit, w)`
/// chooses for each work unit: acc[r·stride + t] is row r with token t0 + t (t < nt), for all
/// n tokens in groups. The epilogue runs on one lane per warp. `wide`: 16-byte loads (see
/// aligned()); inp.g set: the input is RMS-normalised first.
template <int R, class E, class T, class Rows, class Epi>
void run_units(const char* label, const E& exec, int units, int in, int n, const Input& inp,
               bool wide, const Rows& rows, const Epi& epi, const Launch& how = Launch()) {
  const bool norm = inp.g != nullptr;
  if (wide && norm)
    run_units_nt<true, true, R, E, T>(label, exec, units, in, n, inp, how, rows, epi);
  else if (wide)
    run_units_nt<true, false, R, E, T>(label, exec, units, in, n, inp, how, rows, epi);
  else if (norm)
    run_units_nt<false, true, R, E, T>(label, exec, units, in, n, inp, how, rows, epi);
  else
    run_units_nt<false, false, R, E, T>(label, exec, units, in, n, inp, how, rows, epi);
}

}  // namespace gemv

/// How a warp GEMV's results are written.
enum class GemvOut { Store, AddTo };

/// y[t][o] (=|+=) Σ_j x̂[t][j] · W[o][j] for t < n = x.extent(0), where x̂ is x or, with g
/// given, RMSNorm(x)·g. W is [out][in] in T.
template <class E, class T>
void gemv_warp(const E& exec, const CMat<E>& x, const Kokkos::View<T**, Layout, DeviceOf<E>>& w,
               const Mat<E>& y, GemvOut mode = GemvOut::Store, const CVec<E>& g = CVec<E>(),
               float eps = 0) {
  const int n = static_cast<int>(x.extent(0));
  const int out = static_cast<int>(w.extent(0)), in = static_cast<int>(w.extent(1));
  gemv::Input inp{x.data(), static_cast<int>(x.stride(0)), g.extent(0) ? g.data() : nullptr, eps};
  const bool wide = gemv::aligned<T>(w.data(), in, x.data(), inp.ldx) &&
                    (!inp.g || reinterpret_cast<std::uintptr_t>(inp.g) % 16 == 0);
  const T* wp = w.data();
  float* yp = y.data();
  const int ldy = static_cast<int>(y.stride(0));
  const bool add = mode == GemvOut::AddTo;
  gemv::run_units<1, E, T>(
      "sparsim::kernels::gemv_warp", exec, out, in, n, inp, wide,
      KOKKOS_LAMBDA(int o, const T** r) { r[0] = wp + static_cast<std::size_t>(o) * in; },
      KOKKOS_LAMBDA(int o, int t0, int nt, const float* acc, int) {
        for (int t = 0; t < nt; ++t) {
          float& dst = yp[static_cast<std::size_t>(t0 + t) * ldy + o];
          dst = add ? dst + acc[t] : acc[t];
        }
      });
}

/// h[t][o] = silu(Σ_j x̂[t][j] Wg[o][j]) · Σ_j x̂[t][j] Wu[o][j]: gate, up and SwiGLU at once.
template <class E, class T>
void gemv_swiglu(const E& exec, const CMat<E>& x, const Kokkos::View<T**, Layout, DeviceOf<E>>& wg,
                 const Kokkos::View<T**, Layout, DeviceOf<E>>& wu, const Mat<E>& h,
                 const CVec<E>& g = CVec<E>(), float eps = 0) {
  const int n = static_cast<int>(x.extent(0));
  const int out = static_cast<int>(wg.extent(0)), in = static_cast<int>(wg.extent(1));
  gemv::Input inp{x.data(), static_cast<int>(x.stride(0)), g.extent(0) ? g.data() : nullptr, eps};
  const bool wide = gemv::aligned<T>(wg.data(), in, x.data(), inp.ldx) &&
                    gemv::aligned<T>(wu.data(), in, x.data(), inp.ldx) &&
                    (!inp.g || reinterpret_cast<std::uintptr_t>(inp.g) % 16 == 0);
  const T* gp = wg.data();
  const T* up = wu.data();
  float* hp = h.data();
  const int ldh = static_cast<int>(h.stride(0));
  gemv::run_units<2, E, T>(
      "sparsim::kernels::gemv_swiglu", exec, out, in, n, inp, wide,
      KOKKOS_LAMBDA(int o, const T** r) {
        r[0] = gp + static_cast<std::size_t>(o) * in;
        r[1] = up + static_cast<std::size_t>(o) * in;
      },
      KOKKOS_LAMBDA(int o, int t0, int nt, const float* acc, int stride) {
        for (int t = 0; t < nt; ++t) {
          const float gv = acc[t], uv = acc[stride + t];
          hp[static_cast<std::size_t>(t0 + t) * ldh + o] = detail::silu(gv) * uv;
        }
      });
}

namespace gemv {
/// The channels (r0, r1) of rotary pair i within the q (isq) or k rows of a layer, and the pair's
/// frequency index j: fixed places in head_dim-wide heads, or a pruned layer's unit table.
struct QKPairs {
  const int* i0;
  const int* i1;
  const int* freq;
  bool mapped, adjacent;
  int hd, hu, half, group;  ///< head width, pairs per head, head_dim / 2, query heads per KV head
  KOKKOS_INLINE_FUNCTION void operator()(bool isq, int i, int& r0, int& r1, int& j) const {
    const int h = i / hu, u = i % hu;
    if (mapped) {
      const int e = (isq ? h / group : h) * hu + u;
      r0 = h * hd + i0[e];
      r1 = h * hd + i1[e];
      j = freq[e];
    } else {
      r0 = h * hd + (adjacent ? 2 * u : u);
      r1 = h * hd + (adjacent ? 2 * u + 1 : u + half);
      j = u;
    }
  }
};
}  // namespace gemv

/// Where the QKV kernel writes: q rows of the call, and the layer's KV cache.
struct QKVTarget {
  float* q = nullptr;   ///< [n][q_dim]
  float* kc = nullptr;  ///< full-width key cache [seq][k_ctx][k_dim], position p at p − k_base
  float* vc = nullptr;  ///< value cache [seq][max_ctx][v_dim]
  int max_ctx = 0;
  int k_ctx = 0;   ///< positions the key cache holds (0: max_ctx; max_ctx − k_base compacted)
  int k_base = 0;  ///< compacted prompt positions (kept apart, not written here)
  const int* pos = nullptr;      ///< [n] position of each row (row t is sequence t / T_call)
  int T = 1;                     ///< tokens per sequence in the call
  const float* cos_t = nullptr;  ///< [max_ctx][rope_cols]
  const float* sin_t = nullptr;
  int head_dim = 0;      ///< the model's head width
  int rope_cols = 0;     ///< columns of the RoPE tables (0: head_dim/2)
  bool adjacent = true;  ///< RoPE pairs (2j, 2j+1), else (j, j + head_dim/2)
  /// A pruned layer's RoPE units (RopeMap: [n_kv][units] pairs (i0, i1) of the reduced head
  /// rotated by frequency freq; every unit a pair): null for a dense layer, whose q/k heads are
  /// head_dim wide with the pairs above.
  const int* unit_i0 = nullptr;
  const int* unit_i1 = nullptr;
  const int* unit_freq = nullptr;
  int units = 0;   ///< RoPE units (pairs) per head of a pruned layer
  int qk_dim = 0;  ///< q/k head width of a pruned layer (2·units)
};

/// q, k, v of every row, RoPE on q and k, k and v stored in the cache at the row's position:
/// one warp per rotary pair of q or k rows, or per two consecutive v rows. All three weights
/// are [·][in] in T and read the same input (optionally RMS-normalised). A pruned layer (RAP,
/// or KVPruner without orphans) gives its RoPE units in tg; its v rows must be even in number.
template <class E, class T>
void gemv_qkv_rope(const E& exec, const CMat<E>& x,
                   const Kokkos::View<T**, Layout, DeviceOf<E>>& wq,
                   const Kokkos::View<T**, Layout, DeviceOf<E>>& wk,
                   const Kokkos::View<T**, Layout, DeviceOf<E>>& wv, const QKVTarget& tg,
                   const CVec<E>& g = CVec<E>(), float eps = 0) {
  const int n = static_cast<int>(x.extent(0));
  const int in = static_cast<int>(wq.extent(1));
  const int qd = static_cast<int>(wq.extent(0)), kd = static_cast<int>(wk.extent(0));
  const int vd = static_cast<int>(wv.extent(0));
  const int half = tg.head_dim / 2;
  const int cols = tg.rope_cols > 0 ? tg.rope_cols : half;
  // Dense: a head is head_dim wide with head_dim/2 pairs at fixed places. Pruned: a head is
  // qk_dim wide and its pairs come from the layer's unit table (the KV head's for a query head).
  const bool mapped = tg.unit_i0 != nullptr;
  const int hd = mapped ? tg.qk_dim : tg.head_dim;
  const int hu = mapped ? tg.units : half;  // pairs per head
  const int group = kd > 0 ? (qd / hd) / (kd / hd) : 1;
  gemv::Input inp{x.data(), static_cast<int>(x.stride(0)), g.extent(0) ? g.data() : nullptr, eps};
  const bool wide = gemv::aligned<T>(wq.data(), in, x.data(), inp.ldx) &&
                    gemv::aligned<T>(wk.data(), in, x.data(), inp.ldx) &&
                    gemv::aligned<T>(wv.data(), in, x.data(), inp.ldx) &&
                    (!inp.g || reinterpret_cast<std::uintptr_t>(inp.g) % 16 == 0);
  const T* qp = wq.data();
  const T* kp = wk.data();
  const T* vp = wv.data();
  const int qpairs = (qd / hd) * hu, kpairs = (kd / hd) * hu, units = qpairs + kpairs + vd / 2;
  const gemv::QKPairs pair_of{tg.unit_i0, tg.unit_i1, tg.unit_freq, mapped, tg.adjacent,
                              hd,         hu,         half,         group};
  gemv::run_units<2, E, T>(
      "sparsim::kernels::gemv_qkv_rope", exec, units, in, n, inp, wide,
      KOKKOS_LAMBDA(int u, const T** r) {
        if (u < qpairs + kpairs) {
          const bool isq = u < qpairs;
          int r0, r1, j;
          pair_of(isq, isq ? u : u - qpairs, r0, r1, j);
          const T* base = isq ? qp : kp;
          r[0] = base + static_cast<std::size_t>(r0) * in;
          r[1] = base + static_cast<std::size_t>(r1) * in;
        } else {
          const int r0 = 2 * (u - qpairs - kpairs);
          r[0] = vp + static_cast<std::size_t>(r0) * in;
          r[1] = vp + static_cast<std::size_t>(r0 + 1) * in;
        }
      },
      KOKKOS_LAMBDA(int u, int t0, int nt, const float* acc, int stride) {
        for (int t = 0; t < nt; ++t) {
          const int row = t0 + t;
          const int p = tg.pos[row];
          const int s = row / tg.T;
          const float a = acc[t], b = acc[stride + t];
          const std::size_t cache_pos = static_cast<std::size_t>(s) * tg.max_ctx + p;
          const std::size_t key_pos =
              static_cast<std::size_t>(s) * (tg.k_ctx > 0 ? tg.k_ctx : tg.max_ctx) +
              (p - tg.k_base);
          if (u < qpairs + kpairs) {
            const bool isq = u < qpairs;
            int r0, r1, j;
            pair_of(isq, isq ? u : u - qpairs, r0, r1, j);
            const float c = tg.cos_t[static_cast<std::size_t>(p) * cols + j];
            const float sn = tg.sin_t[static_cast<std::size_t>(p) * cols + j];
            const float ra = a * c - b * sn, rb = a * sn + b * c;
            if (isq) {
              tg.q[static_cast<std::size_t>(row) * qd + r0] = ra;
              tg.q[static_cast<std::size_t>(row) * qd + r1] = rb;
            } else {
              tg.kc[key_pos * kd + r0] = ra;
              tg.kc[key_pos * kd + r1] = rb;
            }
          } else {
            const int r0 = 2 * (u - qpairs - kpairs);
            tg.vc[cache_pos * vd + r0] = a;
            tg.vc[cache_pos * vd + r0 + 1] = b;
          }
        }
      });
}

}  // namespace sparsim
