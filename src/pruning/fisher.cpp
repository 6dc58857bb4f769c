#include "pruning/fisher.hpp"

#include "core/error.hpp"
#include "core/timer.hpp"

#include <cmath>

namespace sparsim::pruning {

std::string rope_layout_name(RopeLayout l) {
  return l == RopeLayout::Adjacent ? "adjacent" : "half";
}

void FisherScores::finish() {
  const auto L = static_cast<std::size_t>(n_layer), KV = static_cast<std::size_t>(kv_dim());
  const std::size_t S = static_cast<std::size_t>(sequences);
  const int half = head_dim / 2;
  const bool adj = rope_layout == "adjacent";
  k.assign(L * KV, 0.0);
  v.assign(L * KV, 0.0);
  pair.assign(L * static_cast<std::size_t>(n_kv_head) * half, 0.0);
  for (std::size_t s = 0; s < S; ++s)  // sequences in order: a fixed summation
    for (std::size_t l = 0; l < L; ++l) {
      const double* gk = &gate_k[(s * L + l) * KV];
      const double* gv = &gate_v[(s * L + l) * KV];
      for (std::size_t c = 0; c < KV; ++c) {
        k[l * KV + c] += gk[c] * gk[c];
        v[l * KV + c] += gv[c] * gv[c];
      }
      for (int h = 0; h < n_kv_head; ++h)
        for (int j = 0; j < half; ++j) {
          const std::size_t base = static_cast<std::size_t>(h) * head_dim;
          const double g =
              adj ? gk[base + 2 * j] + gk[base + 2 * j + 1] : gk[base + j] + gk[base + j + half];
          pair[(l * n_kv_head + h) * half + j] += g * g;
        }
    }
}

void FisherScores::validate() const {
  require(sequences >= 1 && tokens >= 2, "Fisher scores: {} sequences of {} tokens", sequences,
          tokens);
  require(n_layer >= 1 && n_kv_head >= 1 && head_dim >= 2 && head_dim % 2 == 0,
          "Fisher scores: shape n_layer {} n_kv_head {} head_dim {} invalid", n_layer, n_kv_head,
          head_dim);
  require(rope_layout == "adjacent" || rope_layout == "half",
          "Fisher scores: RoPE layout '{}' is not adjacent or half", rope_layout);
  const std::size_t L = n_layer, KV = kv_dim(), S = sequences;
  auto check = [](const std::vector<double>& x, std::size_t want, const char* what, bool nonneg) {
    require(x.size() == want, "Fisher scores: '{}' holds {} values, expected {}", what, x.size(),
            want);
    for (std::size_t i = 0; i < x.size(); ++i)
      require(std::isfinite(x[i]) && (!nonneg || x[i] >= 0), "Fisher scores: '{}' entry {} is {}",
              what, i, x[i]);
  };
  check(loss, S, "loss", true);
  check(gate_k, S * L * KV, "gate_k", false);
  check(gate_v, S * L * KV, "gate_v", false);
  check(k, L * KV, "k", true);
  check(v, L * KV, "v", true);
  check(pair, L * n_kv_head * (head_dim / 2), "pair", true);
}

double FisherScores::sigma(int l, int h, int j) const {
  return std::sqrt(pair[(static_cast<std::size_t>(l) * n_kv_head + h) * (head_dim / 2) + j]);
}

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
#ifdef KOKKOS_ENABLE_SERIAL
SPARSIM_INSTANTIATE_FISHER(Kokkos::Serial)
#endif
#ifdef KOKKOS_ENABLE_OPENMP
SPARSIM_INSTANTIATE_FISHER(Kokkos::OpenMP)
#endif
#ifdef KOKKOS_ENABLE_CUDA
SPARSIM_INSTANTIATE_FISHER(Kokkos::Cuda)
#endif

}  // namespace sparsim::pruning
