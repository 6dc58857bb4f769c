#include "model/config.hpp"

#include "core/error.hpp"

#include <cmath>

namespace sparsim {

void Config::validate() const {
  auto pos = [](const char* what, long v) {
    require(v > 0, "model config: {} must be positive, got {}", what, v);
  };
  pos("n_layer (block_count)", n_layer);
  pos("d_model (embedding_length)", d_model);
  pos("n_head (attention.head_count)", n_head);
  pos("n_kv_head (attention.head_count_kv)", n_kv_head);
  pos("head_dim", head_dim);
  pos("d_ff (feed_forward_length)", d_ff);
  pos("vocab", vocab);
  pos("context_length", context_length);
  require(n_head % n_kv_head == 0,
          "model config: head_count {} is not a multiple of head_count_kv {}", n_head, n_kv_head);
  require(head_dim % 2 == 0, "model config: head dimension {} must be even for RoPE", head_dim);
  require(rope_theta > 0 && std::isfinite(rope_theta), "model config: rope.freq_base {} invalid",
          rope_theta);
  require(rms_eps > 0 && std::isfinite(rms_eps),
          "model config: attention.layer_norm_rms_epsilon {} invalid", rms_eps);
  if (rope_scaling.enabled) {
    require(rope_scaling.factor >= 1 && rope_scaling.original_context > 0 &&
                rope_scaling.high_freq_factor > rope_scaling.low_freq_factor,
            "model config: llama3 rope scaling parameters invalid (factor {}, low {}, high {}, "
            "original context {})",
            rope_scaling.factor, rope_scaling.low_freq_factor, rope_scaling.high_freq_factor,
            rope_scaling.original_context);
  }
}

std::uint64_t Config::n_params() const {
  const std::uint64_t d = d_model, v = vocab;
  std::uint64_t per_layer = 2 * d                                           // norms
                            + d * q_dim() * 2                               // q, o
                            + d * static_cast<std::uint64_t>(kv_dim()) * 2  // k, v
                            + 3 * d * static_cast<std::uint64_t>(d_ff);     // gate, up, down
  return v * d * (tied_embeddings ? 1 : 2) + d + per_layer * n_layer;
}

std::vector<double> Config::rope_inv_freq(const std::vector<float>& freq_factors) const {
  const int half = head_dim / 2;
  require(freq_factors.empty() || static_cast<int>(freq_factors.size()) == half,
          "rope_freqs has {} entries, expected head_dim/2 = {}", freq_factors.size(), half);
  std::vector<double> inv(half);
  for (int j = 0; j < half; ++j) {
    double f = std::pow(static_cast<double>(rope_theta), -2.0 * j / head_dim);
    if (rope_scaling.enabled) {
      // Llama-3: long wavelengths are divided by `factor`, short ones kept, a smooth ramp between.
      const double pi = 3.14159265358979323846;
      const double wavelen = 2 * pi / f;
      const double lo_wl = rope_scaling.original_context / rope_scaling.low_freq_factor;
      const double hi_wl = rope_scaling.original_context / rope_scaling.high_freq_factor;
      if (wavelen > lo_wl) {
        f = f / rope_scaling.factor;
      } else if (wavelen >= hi_wl) {
        const double smooth =
            (rope_scaling.original_context / wavelen - rope_scaling.low_freq_factor) /
            (rope_scaling.high_freq_factor - rope_scaling.low_freq_factor);
        f = (1 - smooth) * f / rope_scaling.factor + smooth * f;
      }
    }
    if (!freq_factors.empty()) f /= freq_factors[j];
    inv[j] = f;
  }
  return inv;
}

}  // namespace sparsim
