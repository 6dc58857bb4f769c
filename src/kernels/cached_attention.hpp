#pragma once
/// Causal grouped-query attention of arbitrary rows over a KV cache laid out per layer and
/// head (kernels/kv_layout.hpp): the rows a token gate kept, over a cache whose prompt keys may
/// be compacted to kept channels and whose positions may be dropped.
///
/// Row i is a query of sequence row_seq(i) at position row_pos(i); it attends to positions
/// 0 … row_pos(i). Positions below the compacted length score q restricted to the kept
/// channels of the head (the query is gathered to those channels first, so both regions are
/// contiguous dot products); later positions score the full query against full-width keys.
/// Dropped positions, and positions evicted from a head, get no weight. With a dense layout and
/// no drops or evictions the arithmetic is the
/// same as attention() in kernels/attention.hpp, operation for operation.
#include "core/compat.hpp"
#include "kernels/kv_layout.hpp"
#include "kernels/linear.hpp"
#include "kernels/team_softmax.hpp"
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
  const bool evicts = kv.has_evictions();
  const auto evicted = kv.evicted;
  const auto K = kv.k;
  const auto V = kv.v;
  const auto KC = kv.kc;
  const auto kidx = kv.kidx;
  const auto koff = kv.koff;
  const auto dropped = kv.dropped;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    // detail::decode_chunks_host, as attention_host_decode: one (row, chunk) per work item, its
    // value rows and the next item's full-width key rows prefetched while it computes, its KV
    // heads in turn with their query heads together, then the chunks merged in order. A chunk's
    // scores come from up to two host::attn_scores calls: the compacted prefix against the query
    // gathered to the head's kept channels, the full-width rest against the whole query. Dropped
    // positions score kDroppedScore (weight exactly 0). With a dense layout and no drops every call
    // and every operation is that of attention_host_decode.
    const int nkv = sh.n_kv_head;
    const std::size_t kw = K.stride(1), vw = V.stride(1);
    // A layer whose evicted tokens were moved out (KVLayer::gap_begin): a row after the gap
    // reads the slots before it and after it as one run of positions; its chunk starting at
    // logical position pb ≥ gap_begin reads the slots from pb + gap on (the gap is whole chunks,
    // so no chunk straddles it).
    const int g0 = kv.gap_begin, g1 = kv.gap_end, gap = g1 - g0;
    const auto skips = [=](int r) { return gap > 0 && row_pos(r) + 1 > g1; };
    const auto slot = [=](int r, int pb) { return pb >= g0 && skips(r) ? pb + gap : pb; };
    detail::decode_chunks_host(
        exec, "sparsim::kernels::cached_attention_host", n, nh, nkv, vd, max_pos, group * qk,
        [=](int r) { return row_pos(r) + 1 - (skips(r) ? gap : 0); },
        [=](int r, int lpb, int len, bool values) {
          // The value rows, or the full-width key rows, of the chunk: one block each (a compacted
          // head's keys are one contiguous block of their own).
          const int s = row_seq(r), pb = slot(r, lpb);
          if (values)
            return host::Ahead{V.data() + s * V.stride(0) + pb * vw, len * vw * sizeof(float)};
          const int nb = base < row_pos(r) + 1 ? base : row_pos(r) + 1;
          const int fb = pb > nb ? pb : nb;
          if (fb >= pb + len) return host::Ahead{};
          return host::Ahead{K.data() + s * K.stride(0) + (fb - base) * kw,
                             static_cast<std::size_t>(pb + len - fb) * kw * sizeof(float)};
        },
        [=](int r, int kvh, int lpb, int len, float* S, float* qg, const host::Ahead& ahead) {
          const int s = row_seq(r), npos = row_pos(r) + 1, pb = slot(r, lpb);
          const int nb = base < npos ? base : npos;
          const int cend = nb < pb + len ? nb : pb + len;  // end of the compacted part
          const std::size_t ls = static_cast<std::size_t>(len);
          const int fb = pb > nb ? pb : nb;  // first full-width position of the chunk
          const bool full = fb < pb + len;
          bool fetched = false;  // whether a score loop took `ahead`
          if (cend > pb) {
            const int c0 = koff(s, kvh), nc = koff(s, kvh + 1) - c0;
            if (nc == 0) {
              for (int g = 0; g < group; ++g)
                for (int p = 0; p < cend - pb; ++p) S[g * ls + p] = 0.0f;
            } else {
              for (int g = 0; g < group; ++g)
                for (int j = 0; j < nc; ++j)
                  qg[g * nc + j] = q(r, (kvh * group + g) * qk + kidx(s, c0 + j));
              host::attn_scores(qg, static_cast<std::size_t>(nc), group,
                                compact_key_row(KC, s, base, c0, nc, pb),
                                static_cast<std::size_t>(nc), cend - pb, nc, scale, S, ls,
                                full ? host::Ahead{} : ahead);
              fetched = !full;
            }
          }
          if (full) {
            host::attn_scores(&q(r, kvh * group * qk), static_cast<std::size_t>(qk), group,
                              K.data() + s * K.stride(0) + (fb - base) * kw + kvh * qk, kw,
                              pb + len - fb, qk, scale, S + (fb - pb), ls, ahead);
            fetched = true;
          }
          if (!fetched) host::prefetch(ahead);
          if (drops)
            for (int p = 0; p < len; ++p)
              if (dropped(s, pb + p))
                for (int g = 0; g < group; ++g) S[g * ls + p] = detail::kDroppedScore;
          if (evicts)
            for (int p = 0; p < len; ++p)
              if (evicted(s, kvh, pb + p))
                for (int g = 0; g < group; ++g) S[g * ls + p] = detail::kDroppedScore;
        },
        [=](int r, int kvh, int lpb, int) {
          return detail::RowBand{V.data() + row_seq(r) * V.stride(0) + slot(r, lpb) * vw + kvh * vd,
                                 vw};
        },
        out);
    return;
  }
  using Policy = Kokkos::TeamPolicy<E>;
  using Team = typename Policy::member_type;
  using ScratchVec = Kokkos::View<float*, typename E::scratch_memory_space,
                                  Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  Policy pol = team_policy(exec, n * nh);
  pol = pol.set_scratch_size(1, Kokkos::PerTeam(ScratchVec::shmem_size(max_pos + qk)));
  Kokkos::parallel_for(
      "sparsim::kernels::cached_attention", light(pol), KOKKOS_LAMBDA(const Team& team) {
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
          sc(p) = (drops && dropped(s, p)) || (evicts && evicted(s, kvh, p)) ? detail::kDroppedScore
                                                                             : acc * scale;
        });
        detail::team_softmax_mix(team, sc, npos, V, out, r, s, h, kvh, vd);
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
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n_seq * T, nh})),
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
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n_seq, p0 + T})),
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
