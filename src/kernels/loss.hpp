#pragma once
/// Per-row negative log-likelihood of a target token under softmax(logits), and the argmax.
///   nll[r] = log Σ_v exp(z[r][v]) − z[r][target[r]]
/// The log-sum-exp is shifted by the row maximum and accumulated in double by one thread per
/// row on the host (a team reduction of fixed size on devices), so it is reproducible.
#include "core/compat.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

namespace sparsim {

template <class E>
void nll_rows(const E& exec, const CMat<E>& logits, const IVec<E>& target,
              const Kokkos::View<double*, DeviceOf<E>>& nll, const IVec<E>& argmax) {
  const int n = static_cast<int>(logits.extent(0));
  const int V = static_cast<int>(logits.extent(1));
  using Team = typename Kokkos::TeamPolicy<E>::member_type;
  Kokkos::parallel_for(
      "sparsim::kernels::nll", light(team_policy(exec, n)), KOKKOS_LAMBDA(const Team& team) {
        const int r = team.league_rank();
        Kokkos::MaxLoc<float, int>::value_type best;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, V),
            [&](const int v, Kokkos::MaxLoc<float, int>::value_type& b) {
              const float z = logits(r, v);
              if (z > b.val || (z == b.val && v < b.loc)) {
                b.val = z;
                b.loc = v;
              }
            },
            Kokkos::MaxLoc<float, int>(best));
        double sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, V),
            [&](const int v, double& a) {
              a += kx::exp(static_cast<double>(logits(r, v) - best.val));
            },
            sum);
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          const int t = target(r);
          nll(r) =
              (t >= 0 && t < V) ? kx::log(sum) + static_cast<double>(best.val - logits(r, t)) : 0.0;
          argmax(r) = best.loc;
        });
      });
}

}  // namespace sparsim
