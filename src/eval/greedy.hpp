#pragma once
/// Greedy continuation of a batch of equal-length prompts, as the generated tasks (passkey, the
/// long-context suite) score their answers.
#include "engine/engine.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <vector>

namespace sparsim {

/// The greedy continuations (at most `max_new` tokens each) of `prompts`, which all have the
/// same length and start at position 0. A row stops at `eos` (not included) or once
/// `stop(row, tokens so far)` is true; the decode ends when every row has stopped.
template <class E, class Stop>
std::vector<std::vector<int>> greedy_continuations(Engine<E>& eng,
                                                   const std::vector<std::vector<int>>& prompts,
                                                   int max_new, int eos, const Stop& stop) {
  const int nb = static_cast<int>(prompts.size()), V = eng.config().vocab;
  const int P = static_cast<int>(prompts.front().size());
  auto argmax_rows = [&](const Mat<E>& logits) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), logits);
    std::vector<int> best(static_cast<std::size_t>(nb));
    for (int b = 0; b < nb; ++b) {
      int bi = 0;
      for (int v = 1; v < V; ++v)
        if (h(b, v) > h(b, bi)) bi = v;
      best[static_cast<std::size_t>(b)] = bi;
    }
    return best;
  };
  std::vector<int> next = argmax_rows(eng.forward(prompts, 0, false));
  std::vector<std::vector<int>> out(static_cast<std::size_t>(nb));
  std::vector<bool> done(static_cast<std::size_t>(nb), false);
  for (int g = 0; g < max_new; ++g) {
    bool all = true;
    for (std::size_t b = 0; b < out.size(); ++b) {
      if (!done[b] && next[b] == eos) done[b] = true;
      if (!done[b]) {
        out[b].push_back(next[b]);
        if (stop(b, out[b])) done[b] = true;
      }
      all = all && done[b];
    }
    if (all || g + 1 == max_new) break;
    std::vector<std::vector<int>> step;
    for (int t : next) step.push_back({t});
    next = argmax_rows(eng.forward(step, P + g, false));
  }
  return out;
}

}  // namespace sparsim
