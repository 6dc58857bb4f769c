#include "transforms/fisher.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"

#include <cmath>

namespace sparsim::pruning {

template <class E>
FisherScores fisher_scores(std::shared_ptr<const Weights<E>> w,
                           const std::vector<std::vector<int>>& seqs,
                           const FisherProgress& progress) {
  const Config& c = w->cfg;
  require(!c.pruned(), "Fisher scores need the full model: this one is already pruned ({})",
          c.prune.method);
  require(!seqs.empty(), "Fisher scores: no calibration sequences");
  const int n = static_cast<int>(seqs[0].size());
  for (const auto& s : seqs)
    require(static_cast<int>(s.size()) == n, "Fisher scores: sequences of unequal length");
  FisherScores f;
  f.sequences = static_cast<int>(seqs.size());
  f.tokens = n;
  f.n_layer = c.n_layer;
  f.n_kv_head = c.n_kv_head;
  f.head_dim = c.head_dim;
  f.rope_layout = rope_layout_name(c.rope_layout);
  Backprop<E, float> bp(w, n);
  const std::size_t KV = static_cast<std::size_t>(c.kv_dim());
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    Stopwatch sw;
    const double loss = bp.forward(seqs[s]);
    f.forward_seconds += sw.seconds();
    sw.reset();
    bp.backward();
    f.backward_seconds += sw.seconds();
    require(std::isfinite(loss), "Fisher scores: the loss of sequence {} is {}", s, loss);
    f.loss.push_back(loss);
    for (int l = 0; l < c.n_layer; ++l) {
      const auto& gk = bp.gate_grad_k()[static_cast<std::size_t>(l)];
      const auto& gv = bp.gate_grad_v()[static_cast<std::size_t>(l)];
      require(gk.size() == KV && gv.size() == KV, "Fisher scores: gate gradient sizes");
      f.gate_k.insert(f.gate_k.end(), gk.begin(), gk.end());
      f.gate_v.insert(f.gate_v.end(), gv.begin(), gv.end());
    }
    if (progress) progress(static_cast<int>(s) + 1, static_cast<int>(seqs.size()));
  }
  f.finish();
  f.validate();
  return f;
}

#define SPARSIM_INSTANTIATE_FISHER(E)                                          \
  template FisherScores fisher_scores<E>(std::shared_ptr<const Weights<E>>,    \
                                         const std::vector<std::vector<int>>&, \
                                         const FisherProgress&);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_FISHER)

}  // namespace sparsim::pruning
