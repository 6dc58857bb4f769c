#pragma once
/// Causal grouped-query attention over a KV cache.
///
/// Rows are (sequence, token) pairs, row = s·T + t, at cache position p0 + t. The cache of one
/// layer is [n_seq][max_ctx][kv_dim]. One team computes one (row, query head): it scores every
/// cached key up to its own position, takes a max-shifted softmax and mixes the values. Each
/// score and each output element is produced by one thread with a fixed summation order.
#include "core/compat.hpp"
#include "kernels/linear.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

namespace sparsim {

template <class E>
using Cache = Kokkos::View<float***, Layout, DeviceOf<E>>;  // [seq][pos][kv_dim]

/// Writes the new keys/values of rows (s, t) into cache position p0 + t of sequence s. Keys and
/// values may have different widths (a pruned layer).
template <class E>
void kv_store(const E& exec, const CMat<E>& k, const CMat<E>& v, const Cache<E>& kc,
              const Cache<E>& vc, int n_seq, int T, int p0) {
  const int kd = static_cast<int>(k.extent(1)), vd = static_cast<int>(v.extent(1));
  Kokkos::parallel_for(
      "sparsim::kernels::kv_store",
      Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n_seq * T, kd > vd ? kd : vd}),
      KOKKOS_LAMBDA(const int r, const int j) {
        const int s = r / T, t = r % T;
        if (j < kd) kc(s, p0 + t, j) = k(r, j);
        if (j < vd) vc(s, p0 + t, j) = v(r, j);
      });
}

/// Host attention: one (row, head) per work item, written so the compiler vectorises it —
/// scores are fixed-lane dot products, values are accumulated position by position into a
/// head-sized accumulator. Every output element still has one fixed summation order.
/// Query and key heads are `qk_dim` wide, value heads and output heads `v_dim`; scores are
/// multiplied by `scale`.
template <class E>
void attention_host(const E& exec, const CMat<E>& q, const Cache<E>& kc, const Cache<E>& vc,
                    const Mat<E>& out, int n_seq, int T, int p0, int n_head, int n_kv_head,
                    int qk_dim, int v_dim, float scale) {
  const int ctx = p0 + T;
  const int group = n_head / n_kv_head;
  // One scratch row of scores per concurrent worker.
  Kokkos::Experimental::UniqueToken<E> token(exec);
  Kokkos::View<float**, Layout, DeviceOf<E>> scores(
      Kokkos::view_alloc(std::string("sparsim::attention::scores"), Kokkos::WithoutInitializing),
      token.size(), ctx);
  Kokkos::parallel_for("sparsim::kernels::attention_host",
                       Kokkos::RangePolicy<E>(exec, 0, n_seq * T * n_head), [=](const int item) {
                         const int r = item / n_head, h = item % n_head;
                         const int s = r / T, t = r % T;
                         const int kvh = h / group;
                         const int npos = p0 + t + 1;
                         const int slot = token.acquire();
                         float* sc = &scores(slot, 0);
                         const float* qr = &q(r, h * qk_dim);
                         float mx = -3.0e38f;
                         for (int p = 0; p < npos; ++p) {
                           const float v =
                               detail::dot_lanes(qr, &kc(s, p, kvh * qk_dim), qk_dim) * scale;
                           sc[p] = v;
                           mx = v > mx ? v : mx;
                         }
                         float sum = 0.0f;
                         for (int p = 0; p < npos; ++p) {
                           sc[p] = kx::exp(sc[p] - mx);
                           sum += sc[p];
                         }
                         const float inv = 1.0f / sum;
                         float* o = &out(r, h * v_dim);
                         for (int i = 0; i < v_dim; ++i) o[i] = 0.0f;
                         for (int p = 0; p < npos; ++p) {
                           const float w = sc[p];
                           const float* vr = &vc(s, p, kvh * v_dim);
                           for (int i = 0; i < v_dim; ++i) o[i] += w * vr[i];
                         }
                         for (int i = 0; i < v_dim; ++i) o[i] *= inv;
                         token.release(slot);
                       });
}

/// out[r][h·dv + i] = Σ_p softmax_p(scale · q_h·k_p) v_p[i] over p ≤ p0 + t, with query/key
/// heads `qk_dim` wide and value/output heads `v_dim` wide (a pruned layer keeps the full
/// model's scale 1/√head_dim).
template <class E>
void attention(const E& exec, const CMat<E>& q, const Cache<E>& kc, const Cache<E>& vc,
               const Mat<E>& out, int n_seq, int T, int p0, int n_head, int n_kv_head, int qk_dim,
               int v_dim, float scale) {
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    attention_host(exec, q, kc, vc, out, n_seq, T, p0, n_head, n_kv_head, qk_dim, v_dim, scale);
    return;
  }
  using Policy = Kokkos::TeamPolicy<E>;
  using Team = typename Policy::member_type;
  using ScratchVec = Kokkos::View<float*, typename E::scratch_memory_space,
                                  Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const int ctx = p0 + T;
  const int group = n_head / n_kv_head;
  Policy pol = team_policy(exec, n_seq * T * n_head);
  pol = pol.set_scratch_size(1, Kokkos::PerTeam(ScratchVec::shmem_size(ctx)));
  Kokkos::parallel_for(
      "sparsim::kernels::attention", pol, KOKKOS_LAMBDA(const Team& team) {
        const int r = team.league_rank() / n_head;
        const int h = team.league_rank() % n_head;
        const int s = r / T, t = r % T;
        const int kvh = h / group;
        const int npos = p0 + t + 1;
        ScratchVec sc(team.team_scratch(1), ctx);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, npos), [&](const int p) {
          float acc = 0.0f;
          for (int i = 0; i < qk_dim; ++i) acc += q(r, h * qk_dim + i) * kc(s, p, kvh * qk_dim + i);
          sc(p) = acc * scale;
        });
        team.team_barrier();
        float mx = -3.0e38f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, npos),
            [&](const int p, float& m) { m = sc(p) > m ? sc(p) : m; }, Kokkos::Max<float>(mx));
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, npos),
                             [&](const int p) { sc(p) = kx::exp(sc(p) - mx); });
        team.team_barrier();
        float sum = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, npos), [&](const int p, float& a) { a += sc(p); }, sum);
        const float inv = 1.0f / sum;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, v_dim), [&](const int i) {
          float acc = 0.0f;
          for (int p = 0; p < npos; ++p) acc += sc(p) * vc(s, p, kvh * v_dim + i);
          out(r, h * v_dim + i) = acc * inv;
        });
      });
}

/// Dense heads: every head `head_dim` wide, scale 1/√head_dim.
template <class E>
void attention(const E& exec, const CMat<E>& q, const Cache<E>& kc, const Cache<E>& vc,
               const Mat<E>& out, int n_seq, int T, int p0, int n_head, int n_kv_head,
               int head_dim) {
  attention(exec, q, kc, vc, out, n_seq, T, p0, n_head, n_kv_head, head_dim, head_dim,
            1.0f / kx::sqrt(static_cast<float>(head_dim)));
}

}  // namespace sparsim
