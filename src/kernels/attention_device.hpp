#pragma once
/// Attention kernels for devices: a split-K decode kernel and a tiled (flash-attention style)
/// prefill kernel. Both read the dense KV cache [seq][max_ctx][kv_dim] of one layer.
///
/// Decode (one new token per sequence): the cached positions are cut into splits of kChunk
/// positions; one team takes one (sequence, KV head, split) and serves every query head of the
/// KV head's group, so each key and value is read once per group: its threads score whole
/// positions (no reduction across lanes per position), then the value mix runs one thread per
/// (head, channel). A team writes a partial result (its split's max score m,
/// Σ exp(score − m) l and the unnormalised Σ exp(score − m)·v); the last team of a (sequence,
/// KV head) to finish — told by an integer counter — combines the splits in split order and
/// resets the counter. The launch shape depends on the cache size, not on the position, which
/// is read from device memory: a decode step can be replayed as a graph. Compacted prompt keys
/// (ThinK, GRACE) and dropped positions are read in place. Every output has one fixed
/// summation order.
///
/// Prefill (many tokens): one team takes one (sequence, query head, block of kBlock queries) and
/// walks the key blocks up to the causal limit, keeping Q, the current K and V blocks, the
/// scores and the output accumulators in team scratch (online softmax: running max and sum per
/// query). Scores past a query's position are masked.
///
/// Both kernels also run on host backends (one thread per team), which is how the tests check
/// them against the reference kernel; the engine uses them on devices.
#include "core/compat.hpp"
#include "kernels/gemv_device.hpp"
#include "kernels/kv_layout.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>

namespace sparsim {

namespace attn {

/// Reads a value another team wrote before a fence: on GPUs through L2 (ld.global.cg, not
/// cached in the reading SM's L1), elsewhere through a volatile read.
KOKKOS_INLINE_FUNCTION float load_shared(const float* p) {
#if defined(__CUDA_ARCH__)
  return __ldcg(p);
#else
  return *static_cast<const volatile float*>(p);
#endif
}

/// Cached positions per split of the decode kernel.
inline constexpr int kChunk = 64;

/// Team shape of the attention kernels: 4 warps of 32 lanes on devices, one thread on the host.
template <class E>
struct TeamShape {
  static constexpr bool host =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible;
  static constexpr int threads = host ? 1 : 4;
  static constexpr int vector = host ? 1 : 32;
};

/// Partial results and completion counters of the decode kernel, sized once per engine.
template <class E>
struct DecodeWorkspace {
  Kokkos::View<float*, DeviceOf<E>> o;    ///< [seq][head][split][hd]
  Kokkos::View<float*, DeviceOf<E>> ml;   ///< [seq][head][split][2]: max, sum
  Kokkos::View<int*, DeviceOf<E>> count;  ///< [seq][kv_head], zero between calls
  int n_split = 0;

  void ensure(int n_seq, int n_head, int n_kv, int hd, int max_ctx) {
    const int ns = (max_ctx + kChunk - 1) / kChunk;
    const std::size_t need_o = static_cast<std::size_t>(n_seq) * n_head * ns * hd;
    if (ns != n_split || o.extent(0) < need_o) {
      n_split = ns;
      o = Kokkos::View<float*, DeviceOf<E>>(
          Kokkos::view_alloc("sparsim::attention::partial_o", Kokkos::WithoutInitializing), need_o);
      ml = Kokkos::View<float*, DeviceOf<E>>(
          Kokkos::view_alloc("sparsim::attention::partial_ml", Kokkos::WithoutInitializing),
          static_cast<std::size_t>(n_seq) * n_head * ns * 2);
    }
    if (count.extent(0) < static_cast<std::size_t>(n_seq) * n_kv)
      count = Kokkos::View<int*, DeviceOf<E>>("sparsim::attention::count",
                                              static_cast<std::size_t>(n_seq) * n_kv);
  }
};

/// Query rows per team of the prefill kernel for a head width: Q, K, V, the output and the
/// scores of a block fit in about 40 KB of team scratch.
inline int prefill_block(int head_dim) {
  int b = 64;
  while (b > 8 && b * (head_dim + 1) * 4 * 4 + b * b * 4 > 40 * 1024) b /= 2;
  return b;
}

}  // namespace attn

/// Decode attention over one layer's cache: out[s][h·vd + i] for one new token per sequence
/// (rows s = 0 … n_seq−1) at position pos(s), keys 0 … pos(s). The cache may hold compacted
/// prompt keys (positions below kv.k_base scored on the head's kept channels, as
/// cached_attention does), dropped positions and positions evicted from a head (no weight). Rows
/// whose skip[s] is set (a token gate's decision, in device memory; null: none) get no output.
///
/// One team (4 warps) takes one (sequence, KV head, split of kChunk positions) and serves every
/// query head of the group: each lane scores whole positions (one key row read once for all the
/// group's heads, the queries in team scratch), one warp per head takes the softmax over the
/// split (shuffles, no team barrier), and the value mix gives every lane a head, four channels
/// and a share of the positions (16-byte loads, the shares added in order). The last team of a
/// (sequence, KV head) to finish combines the splits in split order. ws must have been ensure()d
/// for the cache's size.
template <class E>
void attention_decode_split(const E& exec, const CMat<E>& q, const KVLayer<E>& kv,
                            const IVec<E>& pos, const Mat<E>& out, int n_seq, const AttnShape& sh,
                            attn::DecodeWorkspace<E>& ws, const int* skip = nullptr) {
  using Policy = Kokkos::TeamPolicy<E>;
  using Member = typename Policy::member_type;
  constexpr int C = attn::kChunk;
  constexpr bool host = attn::TeamShape<E>::host;
  const int n_head = sh.n_head, n_kv = sh.n_kv_head, hd = sh.qk_dim, vh = sh.v_dim;
  const int group = n_head / n_kv;
  const int ns = ws.n_split;
  const int base = kv.k_base;
  const int kvd = n_kv * hd, qd = n_head * hd, od = n_head * vh;
  const std::size_t kst0 = kv.k.stride(0), vst0 = kv.v.stride(0);
  const std::size_t vvd = kv.v.stride(1);
  const float sc_mul = sh.scale;
  const float* qp = q.data();
  const float* kp = kv.k.data();
  const float* vp = kv.v.data();
  const float* cp = kv.kc.data();
  const std::size_t cst0 = base > 0 ? kv.kc.stride(0) : 0;
  const int* kidx = base > 0 ? kv.kidx.data() : nullptr;
  const int* koff = base > 0 ? kv.koff.data() : nullptr;
  const std::size_t kidx_st = base > 0 ? kv.kidx.stride(0) : 0;
  const std::size_t koff_st = base > 0 ? kv.koff.stride(0) : 0;
  const int* dropped = kv.has_drops() ? kv.dropped.data() : nullptr;
  const std::size_t drop_st = kv.has_drops() ? kv.dropped.stride(0) : 0;
  const int* evicted = kv.has_evictions() ? kv.evicted.data() : nullptr;
  const std::size_t ev_st0 = kv.has_evictions() ? kv.evicted.stride(0) : 0;
  const std::size_t ev_st1 = kv.has_evictions() ? kv.evicted.stride(1) : 0;
  const int gap0 = kv.gap_begin, gap1 = kv.gap_end;
  const int* pp = pos.data();
  float* op = out.data();
  float* po = ws.o.data();
  float* pml = ws.ml.data();
  int* cnt = ws.count.data();
  const bool wide = hd % 4 == 0 && kvd % 4 == 0 && reinterpret_cast<std::uintptr_t>(kp) % 16 == 0;
  // The value mix: one work item per (head, 4 channels, part of the split's positions), so that
  // about every thread of the team has four 16-byte value loads in flight; the parts are added
  // in part order afterwards. (Channels one by one where the rows are not 16-byte aligned.)
  const bool vwide = vh % 4 == 0 && vvd % 4 == 0 && reinterpret_cast<std::uintptr_t>(vp) % 16 == 0;
  const int vq = vwide ? vh / 4 : vh;  // channel groups per head
  const int vw = vwide ? 4 : 1;        // channels per group
  int parts = 1;
  if (!host)
    while (parts < 8 && group * vq * parts * 2 <= 128) parts *= 2;
  // scratch: the group's queries, the group's scores, the parts' value sums (or, in the team
  // that combines, the splits' factors and the denominators), one flag word
  const int combine_words = group * ns + group;
  const int vs_words = parts * group * vh > combine_words ? parts * group * vh : combine_words;
  const int words = group * hd + group * C + vs_words + 1;
  Policy pol(exec, n_seq * n_kv * ns, attn::TeamShape<E>::threads, attn::TeamShape<E>::vector);
  pol = pol.set_scratch_size(0, Kokkos::PerTeam((words + 4) * sizeof(float)));
  Kokkos::parallel_for(
      "sparsim::kernels::attention_decode", light(pol), KOKKOS_LAMBDA(const Member& team) {
        const int b = team.league_rank();
        const int sp = b % ns, sk = b / ns;
        const int kvh = sk % n_kv, s = sk / n_kv;
        const bool skipped = skip && skip[s];
        const int npos = pp[s] + 1;
        const int p0 = sp * C;
        // a split inside the gap of moved-out evicted tokens (KVLayer::gap_begin, whole chunks
        // of a multiple of C) holds nothing: its partials are neutral (no weight, no value)
        const bool in_gap = gap1 > gap0 && npos > gap1 && p0 >= gap0 && p0 + C <= gap1;
        const int len =
            skipped || in_gap ? 0 : (npos - p0 < C ? (npos - p0 > 0 ? npos - p0 : 0) : C);
        float* qs = static_cast<float*>(team.team_scratch(0).get_shmem_aligned(
            static_cast<std::ptrdiff_t>(words * sizeof(float)), 16));
        float* sc = qs + group * hd;
        float* vs = sc + group * C;
        int* last = reinterpret_cast<int*>(vs + vs_words);
        if (len > 0) {
          // the group's queries into scratch
          const float* qrow = qp + static_cast<std::size_t>(s) * qd + kvh * group * hd;
          Kokkos::parallel_for(Kokkos::TeamVectorRange(team, group * hd),
                               [&](const int i) { qs[i] = qrow[i]; });
          team.team_barrier();
          const int c0 = base > 0 ? koff[s * koff_st + kvh] : 0;
          const int nc = base > 0 ? koff[s * koff_st + kvh + 1] - c0 : 0;
          // scores: one lane per position, every query head of the group
          Kokkos::parallel_for(Kokkos::TeamVectorRange(team, len), [&](const int i) {
            const int p = p0 + i;
            if ((dropped && dropped[s * drop_st + p]) ||
                (evicted && evicted[s * ev_st0 + kvh * ev_st1 + p])) {
              for (int g = 0; g < group; ++g) sc[g * C + i] = -3.0e38f;
              return;
            }
            if (p < base) {  // compacted: the head's kept channels only
              const float* kr = cp + s * cst0 + static_cast<std::size_t>(c0) * base +
                                static_cast<std::size_t>(p) * nc;
              const int* ki = kidx + s * kidx_st + c0;
              for (int g = 0; g < group; ++g) {
                const float* qg = qs + g * hd;
                float d = 0.0f;
                for (int j = 0; j < nc; ++j) d += qg[ki[j]] * kr[j];
                sc[g * C + i] = d * sc_mul;
              }
              return;
            }
            const float* kr = kp + s * kst0 + static_cast<std::size_t>(p - base) * kvd + kvh * hd;
            // every key channel read once, for all the group's heads (at most 8 at a time)
            for (int g0 = 0; g0 < group; g0 += 8) {
              const int ng = group - g0 < 8 ? group - g0 : 8;
              float d[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
              int e = 0;
              if (wide) {  // 16-byte loads of the key row, eight in flight before they are used
                for (; e + 32 <= hd; e += 32) {
                  float k4[8][4];
                  for (int u = 0; u < 8; ++u) gemv::load_x<4>(kr + e + 4 * u, k4[u]);
                  for (int g = 0; g < 8; ++g)
                    if (g < ng) {
                      const float* qg = qs + (g0 + g) * hd + e;
                      float a = 0.0f;
                      for (int u = 0; u < 8; ++u)
                        a += (qg[4 * u] * k4[u][0] + qg[4 * u + 1] * k4[u][1]) +
                             (qg[4 * u + 2] * k4[u][2] + qg[4 * u + 3] * k4[u][3]);
                      d[g] += a;
                    }
                }
              }
              if (wide)
                for (; e + 4 <= hd; e += 4) {
                  float k4[4];
                  gemv::load_x<4>(kr + e, k4);
                  for (int g = 0; g < 8; ++g)
                    if (g < ng) {
                      const float* qg = qs + (g0 + g) * hd + e;
                      d[g] += (qg[0] * k4[0] + qg[1] * k4[1]) + (qg[2] * k4[2] + qg[3] * k4[3]);
                    }
                }
              for (; e < hd; ++e) {
                const float kv_e = kr[e];
                for (int g = 0; g < 8; ++g)
                  if (g < ng) d[g] += qs[(g0 + g) * hd + e] * kv_e;
              }
              for (int g = 0; g < ng; ++g) sc[(g0 + g) * C + i] = d[g] * sc_mul;
            }
          });
          team.team_barrier();
          // softmax parts of each head over the split (max, exp, sum): one warp per head
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, group), [&](const int g) {
            float* sg = sc + g * C;
            float m = -3.0e38f;
            Kokkos::parallel_reduce(
                Kokkos::ThreadVectorRange(team, len),
                [&](const int i, float& mx) { mx = sg[i] > mx ? sg[i] : mx; },
                Kokkos::Max<float>(m));
            float l = 0.0f;
            Kokkos::parallel_reduce(
                Kokkos::ThreadVectorRange(team, len),
                [&](const int i, float& a) {
                  const float e = kx::exp(sg[i] - m);
                  sg[i] = e;
                  a += e;
                },
                l);
            const std::size_t part =
                (static_cast<std::size_t>(s) * n_head + kvh * group + g) * ns + sp;
            Kokkos::single(Kokkos::PerThread(team), [&]() {
              pml[part * 2] = m;
              pml[part * 2 + 1] = l;
            });
          });
          team.team_barrier();
          // value mix, in parts of the split's positions (i ≡ part mod parts)
          Kokkos::parallel_for(Kokkos::TeamVectorRange(team, group * vq * parts), [&](const int x) {
            const int part = x % parts, gq = x / parts;
            const int g = gq / vq, c = (gq % vq) * vw;
            const float* sg = sc + g * C;
            const float* vr = vp + s * vst0 + static_cast<std::size_t>(p0) * vvd + kvh * vh + c;
            float a[4] = {0.0f, 0.0f, 0.0f, 0.0f}, bb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            int i = part;
            if (vwide) {
              // eight positions at a time: their 16-byte loads in flight before they are used
              for (; i + 7 * parts < len; i += 8 * parts) {
                float v8[8][4];
                for (int u = 0; u < 8; ++u)
                  gemv::load_x<4>(vr + static_cast<std::size_t>(i + u * parts) * vvd, v8[u]);
                for (int u = 0; u < 8; u += 2) {
                  const float w0 = sg[i + u * parts], w1 = sg[i + (u + 1) * parts];
                  for (int k = 0; k < 4; ++k) {
                    a[k] += w0 * v8[u][k];
                    bb[k] += w1 * v8[u + 1][k];
                  }
                }
              }
              for (; i + parts < len; i += 2 * parts) {
                float v0[4], v1[4];
                gemv::load_x<4>(vr + static_cast<std::size_t>(i) * vvd, v0);
                gemv::load_x<4>(vr + static_cast<std::size_t>(i + parts) * vvd, v1);
                const float w0 = sg[i], w1 = sg[i + parts];
                for (int k = 0; k < 4; ++k) {
                  a[k] += w0 * v0[k];
                  bb[k] += w1 * v1[k];
                }
              }
              if (i < len) {
                float v0[4];
                gemv::load_x<4>(vr + static_cast<std::size_t>(i) * vvd, v0);
                for (int k = 0; k < 4; ++k) a[k] += sg[i] * v0[k];
              }
            } else {
              for (; i + parts < len; i += 2 * parts) {
                a[0] += sg[i] * vr[static_cast<std::size_t>(i) * vvd];
                bb[0] += sg[i + parts] * vr[static_cast<std::size_t>(i + parts) * vvd];
              }
              if (i < len) a[0] += sg[i] * vr[static_cast<std::size_t>(i) * vvd];
            }
            float* dst = vs + (part * group + g) * vh + c;
            for (int k = 0; k < vw; ++k) dst[k] = a[k] + bb[k];
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamVectorRange(team, group * vh), [&](const int x) {
            const int g = x / vh, e = x % vh;
            float acc = 0.0f;
            for (int k = 0; k < parts; ++k) acc += vs[(k * group + g) * vh + e];
            const std::size_t part =
                (static_cast<std::size_t>(s) * n_head + kvh * group + g) * ns + sp;
            po[part * vh + e] = acc;
          });
        } else if (in_gap) {
          Kokkos::parallel_for(Kokkos::TeamVectorRange(team, group * vh), [&](const int x) {
            const int g = x / vh, e = x % vh;
            const std::size_t part =
                (static_cast<std::size_t>(s) * n_head + kvh * group + g) * ns + sp;
            po[part * vh + e] = 0.0f;
            if (e == 0) {
              pml[part * 2] = -3.0e38f;
              pml[part * 2 + 1] = 0.0f;
            }
          });
        }
        // the last team of this (sequence, KV head) combines the splits: every thread makes
        // its partial writes visible before the team counts itself done
        Kokkos::memory_fence();
        team.team_barrier();
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          const int done = Kokkos::atomic_fetch_add(&cnt[sk], 1);
          *last = done == ns - 1 ? 1 : 0;
        });
        team.team_barrier();
        if (*last) {
          Kokkos::memory_fence();
          if (!skipped) {
            const int active = (npos + C - 1) / C;
            // each split's factor exp(m_k - max) and the softmax denominator, one warp per head
            float* fk = vs;  // the value sums are done with: [group][ns] factors, [group] sums
            float* lsum = fk + group * ns;
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, group), [&](const int g) {
              const float* vml =
                  pml + (static_cast<std::size_t>(s) * n_head + kvh * group + g) * ns * 2;
              float mx = -3.0e38f;
              Kokkos::parallel_reduce(
                  Kokkos::ThreadVectorRange(team, active),
                  [&](const int k, float& m) {
                    const float v = attn::load_shared(vml + 2 * k);
                    m = v > m ? v : m;
                  },
                  Kokkos::Max<float>(mx));
              float l = 0.0f;
              Kokkos::parallel_reduce(
                  Kokkos::ThreadVectorRange(team, active),
                  [&](const int k, float& a) {
                    const float f = kx::exp(attn::load_shared(vml + 2 * k) - mx);
                    fk[g * ns + k] = f;
                    a += attn::load_shared(vml + 2 * k + 1) * f;
                  },
                  l);
              Kokkos::single(Kokkos::PerThread(team), [&]() { lsum[g] = l; });
            });
            team.team_barrier();
            Kokkos::parallel_for(Kokkos::TeamVectorRange(team, group * vh), [&](const int x) {
              const int g = x / vh, e = x % vh;
              const int h = kvh * group + g;
              const float* vo = po + (static_cast<std::size_t>(s) * n_head + h) * ns * vh + e;
              const float* f = fk + g * ns;
              // four independent sums keep four partial loads in flight
              float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
              int k = 0;
              for (; k + 4 <= active; k += 4) {
                a0 += attn::load_shared(vo + static_cast<std::size_t>(k) * vh) * f[k];
                a1 += attn::load_shared(vo + static_cast<std::size_t>(k + 1) * vh) * f[k + 1];
                a2 += attn::load_shared(vo + static_cast<std::size_t>(k + 2) * vh) * f[k + 2];
                a3 += attn::load_shared(vo + static_cast<std::size_t>(k + 3) * vh) * f[k + 3];
              }
              for (; k < active; ++k)
                a0 += attn::load_shared(vo + static_cast<std::size_t>(k) * vh) * f[k];
              op[static_cast<std::size_t>(s) * od + h * vh + e] = ((a0 + a1) + (a2 + a3)) / lsum[g];
            });
          }
          Kokkos::single(Kokkos::PerTeam(team), [&]() { cnt[sk] = 0; });
        }
      });
}

/// The same over a dense cache (keys kc, values vc of one layer): hd the query / key head
/// width, v_dim (0: hd) the value and output head width, scale (0: 1/sqrt(hd)) the softmax
/// scale — a pruned layer keeps its model's 1/sqrt(head_dim).
template <class E>
void attention_decode_split(const E& exec, const CMat<E>& q,
                            const Kokkos::View<float***, Layout, DeviceOf<E>>& kc,
                            const Kokkos::View<float***, Layout, DeviceOf<E>>& vc,
                            const IVec<E>& pos, const Mat<E>& out, int n_seq, int n_head, int n_kv,
                            int hd, attn::DecodeWorkspace<E>& ws, int v_dim = 0,
                            float scale = 0.0f) {
  KVLayer<E> kv;
  kv.k = kc;
  kv.v = vc;
  AttnShape sh;
  sh.n_head = n_head;
  sh.n_kv_head = n_kv;
  sh.qk_dim = hd;
  sh.v_dim = v_dim > 0 ? v_dim : hd;
  sh.scale = scale > 0.0f ? scale : 1.0f / kx::sqrt(static_cast<float>(hd));
  attention_decode_split(exec, q, kv, pos, out, n_seq, sh, ws);
}

/// Prefill attention: rows r = s·T + t at positions p0 + t, keys 0 … p0 + t of the cache.
template <class E>
void attention_prefill_tiled(const E& exec, const CMat<E>& q,
                             const Kokkos::View<float***, Layout, DeviceOf<E>>& kc,
                             const Kokkos::View<float***, Layout, DeviceOf<E>>& vc,
                             const Mat<E>& out, int n_seq, int T, int p0, int n_head, int n_kv,
                             int hd) {
  using Policy = Kokkos::TeamPolicy<E>;
  using Member = typename Policy::member_type;
  using Scratch = Kokkos::View<float*, typename E::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  const int B = attn::prefill_block(hd);
  const int nqb = (T + B - 1) / B;
  const int group = n_head / n_kv;
  const int max_ctx = static_cast<int>(kc.extent(1));
  const int kvd = n_kv * hd, qd = n_head * hd;
  const int kst = hd + 1;  // padded K rows: threads reading a column hit distinct banks
  const float scale = 1.0f / kx::sqrt(static_cast<float>(hd));
  const float* qp = q.data();
  const float* kp = kc.data();
  const float* vp = vc.data();
  float* op = out.data();
  const int words = B * kst + 3 * B * hd + B * B + 3 * B;
  const int threads = attn::TeamShape<E>::host ? 1 : 128;
  Policy pol(exec, n_seq * n_head * nqb, threads, 1);
  pol = pol.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(words)));
  Kokkos::parallel_for(
      "sparsim::kernels::attention_prefill", light(pol), KOKKOS_LAMBDA(const Member& team) {
        const int b = team.league_rank();
        const int qb = b % nqb, sh_ = b / nqb;
        const int h = sh_ % n_head, s = sh_ / n_head;
        const int kvh = h / group;
        const int t0 = qb * B;
        const int nq = T - t0 < B ? T - t0 : B;
        Scratch sh(team.team_scratch(0), words);
        float* Ks = sh.data();
        float* Vs = Ks + B * kst;
        float* Qs = Vs + B * hd;
        float* Os = Qs + B * hd;
        float* S = Os + B * hd;
        float* M = S + B * B;
        float* L = M + B;
        float* A = L + B;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, B * hd), [&](const int x) {
          const int i = x / hd, e = x % hd;
          Qs[x] = i < nq ? qp[(static_cast<std::size_t>(s) * T + t0 + i) * qd + h * hd + e] : 0.0f;
          Os[x] = 0.0f;
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, B), [&](const int i) {
          M[i] = -3.0e38f;
          L[i] = 0.0f;
        });
        const int kend = p0 + t0 + nq;  // keys [0, kend) are visible to some query of the block
        const std::size_t kv_base =
            static_cast<std::size_t>(s) * max_ctx * kvd + static_cast<std::size_t>(kvh) * hd;
        for (int k0 = 0; k0 < kend; k0 += B) {
          const int nk = kend - k0 < B ? kend - k0 : B;
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, B * hd), [&](const int x) {
            const int j = x / hd, e = x % hd;
            const std::size_t at = kv_base + static_cast<std::size_t>(k0 + j) * kvd + e;
            Ks[j * kst + e] = j < nk ? kp[at] : 0.0f;
            Vs[x] = j < nk ? vp[at] : 0.0f;
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, B * B), [&](const int x) {
            const int i = x / B, j = x % B;
            float d = -3.0e38f;
            if (i < nq && j < nk && k0 + j <= p0 + t0 + i) {
              d = 0.0f;
              const float* qr = Qs + i * hd;
              const float* kr = Ks + j * kst;
              for (int e = 0; e < hd; ++e) d += qr[e] * kr[e];
              d *= scale;
            }
            S[x] = d;
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, B), [&](const int i) {
            float* si = S + i * B;
            float mx = M[i];
            for (int j = 0; j < B; ++j) mx = si[j] > mx ? si[j] : mx;
            float sum = 0.0f;
            for (int j = 0; j < B; ++j) {
              const float p = si[j] > -1.0e38f ? kx::exp(si[j] - mx) : 0.0f;
              si[j] = p;
              sum += p;
            }
            const float a = kx::exp(M[i] - mx);
            A[i] = a;
            L[i] = L[i] * a + sum;
            M[i] = mx;
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, B * hd), [&](const int x) {
            const int i = x / hd, e = x % hd;
            const float* si = S + i * B;
            float acc = 0.0f;
            for (int j = 0; j < nk; ++j) acc += si[j] * Vs[j * hd + e];
            Os[x] = Os[x] * A[i] + acc;
          });
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nq * hd), [&](const int x) {
          const int i = x / hd, e = x % hd;
          op[(static_cast<std::size_t>(s) * T + t0 + i) * qd + h * hd + e] = Os[x] / L[i];
        });
      });
}

}  // namespace sparsim
