#pragma once
/// The second half of a team's attention for one (query row, head): the max-shifted softmax of
/// the scores the team has written to scratch, and the value mix. attention() and
/// cached_attention() share it, so that both take the same operations in the same order.
#include "core/compat.hpp"

#include <Kokkos_Core.hpp>

namespace sparsim::detail {

/// On entry `sc(0 … npos−1)` holds the scaled scores of positions 0 … npos−1, written by the
/// team's threads (the routine synchronises first); on return it holds exp(score − max) and
///   out(r, h·vd + i) = Σ_p sc(p) · vals(s, p, kvh·vd + i) / Σ_p sc(p),   i < vd,
/// each output element summed over p in order by one thread.
template <class Team, class Scratch, class Values, class Out>
KOKKOS_INLINE_FUNCTION void team_softmax_mix(const Team& team, const Scratch& sc, int npos,
                                             const Values& vals, const Out& out, int r, int s,
                                             int h, int kvh, int vd) {
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
    for (int p = 0; p < npos; ++p) acc += sc(p) * vals(s, p, kvh * vd + i);
    out(r, h * vd + i) = acc * inv;
  });
}

}  // namespace sparsim::detail
