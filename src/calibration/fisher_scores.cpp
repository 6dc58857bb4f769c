#include "calibration/fisher_scores.hpp"

#include "core/error.hpp"

#include <cmath>

namespace sparsim::calibration {

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

}  // namespace sparsim::calibration
