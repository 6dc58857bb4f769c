#pragma once
/// Causal grouped-query attention of arbitrary rows over a KV cache laid out per layer and
/// head (kernels/kv_layout.hpp): the rows a token gate kept, over a cache whose prompt keys may
/// be compacted to kept channels and whose positions may be dropped.
///
/// Row i is a query of sequence row_seq(i) at position row_pos(i); it attends to positions
/// 0 … row_pos(i). Positions below the compacted length score q restricted to the kept
/// channels of the head (the query is gathered to those channels first, so both regions are
/// contiguous dot products); later positions score the full query against full-width keys.
/// Dropped positions get no weight. With a dense layout and no drops the arithmetic is the
/// same as attention() in kernels/attention.hpp, operation for operation.
#include "core/compat.hpp"
#include "kernels/kv_layout.hpp"
#include "kernels/linear.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

namespace sparsim {

namespace detail {
/// Score of a dropped position: exp(kDroppedScore − max) is exactly 0.
inline constexpr float kDroppedScore = -3.0e38f;
}  // namespace detail

/// out[i][h·vd + c] = Σ_p softmax_p(q_h·k_p · scale) v_p[c] for the rows i of q [n][n_head·qk].
/// `max_pos` bounds row_pos(i) + 1 (the scratch length).
template <class E>
void cached_attention(const E& exec, const CMat<E>& q, const IVec<E>& row_seq,
                      const IVec<E>& row_pos, const KVLayer<E>& kv, const AttnShape& sh,
                      const Mat<E>& out, int max_pos) {
  const int n = static_cast<int>(q.extent(0));
  if (n == 0) return;
  const int nh = sh.n_head, group = sh.group(), qk = sh.qk_dim, vd = sh.v_dim;
  const float scale = sh.scale;
  const int base = kv.k_base;
  const bool drops = kv.has_drops();
  const auto K = kv.k;
  const auto V = kv.v;
  const auto KC = kv.kc;
  const auto kidx = kv.kidx;
  const auto koff = kv.koff;
  const auto dropped = kv.dropped;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    // One (row, head) per work item, as attention_host: fixed-lane dot products for scores,
    // values accumulated position by position into a head-sized accumulator.
    Kokkos::Experimental::UniqueToken<E> token(exec);
    Kokkos::View<float**, Layout, DeviceOf<E>> scratch(
        Kokkos::view_alloc(std::string("sparsim::cached_attention::scores"),
                           Kokkos::WithoutInitializing),
        token.size(), max_pos + qk);
    Kokkos::parallel_for("sparsim::kernels::cached_attention_host",
                         Kokkos::RangePolicy<E>(exec, 0, n * nh), [=](const int item) {
                           const int r = item / nh, h = item % nh;
                           const int s = row_seq(r), npos = row_pos(r) + 1;
                           const int kvh = h / group;
                           const int slot = token.acquire();
                           float* sc = &scratch(slot, 0);
                           float* qg = &scratch(slot, max_pos);
                           const float* qr = &q(r, h * qk);
                           float mx = -3.0e38f;
                           const int nb = base < npos ? base : npos;
                           if (nb > 0) {
                             const int c0 = koff(s, kvh), nc = koff(s, kvh + 1) - c0;
                             for (int j = 0; j < nc; ++j) qg[j] = qr[kidx(s, c0 + j)];
                             const float* kh = compact_key_row(KC, s, base, c0, nc, 0);
                             for (int p = 0; p < nb; ++p) {
                               float v = detail::dot_lanes(qg, kh + p * nc, nc) * scale;
                               if (drops && dropped(s, p)) v = detail::kDroppedScore;
                               sc[p] = v;
                               mx = v > mx ? v : mx;
                             }
                           }
                           for (int p = nb; p < npos; ++p) {
                             float v = detail::dot_lanes(qr, &K(s, p - base, kvh * qk), qk) * scale;
                             if (drops && dropped(s, p)) v = detail::kDroppedScore;
                             sc[p] = v;
                             mx = v > mx ? v : mx;
                           }
                           float sum = 0.0f;
                           for (int p = 0; p < npos; ++p) {
                             sc[p] = kx::exp(sc[p] - mx);
                             sum += sc[p];
                           }
                           const float inv = 1.0f / sum;
                           float* o = &out(r, h * vd);
                           for (int i = 0; i < vd; ++i) o[i] = 0.0f;
                           for (int p = 0; p < npos; ++p) {
                             const float w = sc[p];
                             const float* vr = &V(s, p, kvh * vd);
                             for (int i = 0; i < vd; ++i) o[i] += w * vr[i];
                           }
                           for (int i = 0; i < vd; ++i) o[i] *= inv;
                           token.release(slot);
                         });
    return;
  }
  using Policy = Kokkos::TeamPolicy<E>;
  using Team = typename Policy::member_type;
  using ScratchVec = Kokkos::View<float*, typename E::scratch_memory_space,
                                  Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  Policy pol = team_policy(exec, n * nh);
  pol = pol.set_scratch_size(1, Kokkos::PerTeam(ScratchVec::shmem_size(max_pos + qk)));
  Kokkos::parallel_for(
      "sparsim::kernels::cached_attention", pol, KOKKOS_LAMBDA(const Team& team) {
        const int r = team.league_rank() / nh;
        const int h = team.league_rank() % nh;
        const int s = row_seq(r), npos = row_pos(r) + 1;
        const int kvh = h / group;
        const int nb = base < npos ? base : npos;
        ScratchVec sc(team.team_scratch(1), max_pos + qk);
        const int c0 = nb > 0 ? koff(s, kvh) : 0;
        const int nc = nb > 0 ? koff(s, kvh + 1) - c0 : 0;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nc), [&](const int j) {
          sc(max_pos + j) = q(r, h * qk + kidx(s, c0 + j));
        });
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, npos), [&](const int p) {
          float acc = 0.0f;
          if (p < nb) {
            const float* kr = compact_key_row(KC, s, base, c0, nc, p);
            for (int j = 0; j < nc; ++j) acc += sc(max_pos + j) * kr[j];
          } else {
            for (int i = 0; i < qk; ++i) acc += q(r, h * qk + i) * K(s, p - base, kvh * qk + i);
          }
          sc(p) = drops && dropped(s, p) ? detail::kDroppedScore : acc * scale;
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
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, vd), [&](const int i) {
          float acc = 0.0f;
          for (int p = 0; p < npos; ++p) acc += sc(p) * V(s, p, kvh * vd + i);
          out(r, h * vd + i) = acc * inv;
        });
      });
}

/// Attention mass each cached position receives (the paper's Figure 2 statistic): for the
/// rows r = s·T + t at positions p0 + t of a dense layer, adds to mass(s, p) the softmax weight
/// Σ_h a(r, h, p) of every row whose position is after p, and to queries(s, p) the number of
/// such rows. Two passes (normalisers, then weights); each output has one owner and a fixed
/// order. For recording runs only: it costs as much as the attention itself.
template <class E>
void attention_mass(const E& exec, const CMat<E>& q, const KVLayer<E>& kv, const AttnShape& sh,
                    int n_seq, int T, int p0,
                    const Kokkos::View<double**, Layout, DeviceOf<E>>& mass,
                    const Kokkos::View<double**, Layout, DeviceOf<E>>& queries) {
  const int nh = sh.n_head, group = sh.group(), qk = sh.qk_dim;
  const float scale = sh.scale;
  const auto K = kv.k;
  Kokkos::View<float**, Layout, DeviceOf<E>> mx("sparsim::attention_mass::max", n_seq * T, nh),
      z("sparsim::attention_mass::sum", n_seq * T, nh);
  Kokkos::parallel_for(
      "sparsim::kernels::attention_mass_norm",
      Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n_seq * T, nh}),
      KOKKOS_LAMBDA(const int r, const int h) {
        const int s = r / T, npos = p0 + r % T + 1, kvh = h / group;
        float m = -3.0e38f;
        for (int p = 0; p < npos; ++p) {
          const float v = detail::dot_lanes(&q(r, h * qk), &K(s, p, kvh * qk), qk) * scale;
          m = v > m ? v : m;
        }
        float sum = 0.0f;
        for (int p = 0; p < npos; ++p)
          sum += kx::exp(detail::dot_lanes(&q(r, h * qk), &K(s, p, kvh * qk), qk) * scale - m);
        mx(r, h) = m;
        z(r, h) = sum;
      });
  Kokkos::parallel_for(
      "sparsim::kernels::attention_mass",
      Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n_seq, p0 + T}),
      KOKKOS_LAMBDA(const int s, const int p) {
        double acc = 0.0;
        int cnt = 0;
        for (int t = 0; t < T; ++t) {
          if (p0 + t <= p) continue;
          const int r = s * T + t;
          ++cnt;
          for (int h = 0; h < nh; ++h) {
            const float v =
                detail::dot_lanes(&q(r, h * qk), &K(s, p, (h / group) * qk), qk) * scale;
            acc += static_cast<double>(kx::exp(v - mx(r, h)) / z(r, h));
          }
        }
        mass(s, p) += acc;
        queries(s, p) += cnt;
      });
}

}  // namespace sparsim
