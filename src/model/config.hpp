#pragma once
/// Llama hyper-parameters, as read from a model file's metadata.
#include <cstdint>
#include <string>
#include <vector>

namespace sparsim {

/// Which dimensions RoPE rotates together.
enum class RopeLayout {
  Adjacent,  ///< (2j, 2j+1): the GGUF / llama.cpp layout
  Half       ///< (j, j + D/2): the Hugging Face rotate_half layout
};

/// Llama-3 style frequency scaling ("rope_scaling" with rope_type "llama3").
struct RopeScaling {
  bool enabled = false;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
};

struct Config {
  std::string name;        ///< general.name, informational
  int n_layer = 0;         ///< transformer blocks
  int d_model = 0;         ///< hidden size
  int n_head = 0;          ///< query heads
  int n_kv_head = 0;       ///< key/value heads (GQA: n_head % n_kv_head == 0)
  int head_dim = 0;        ///< per-head dimension
  int d_ff = 0;            ///< SwiGLU inner size
  int vocab = 0;           ///< vocabulary size
  int context_length = 0;  ///< trained context
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  RopeLayout rope_layout = RopeLayout::Adjacent;
  RopeScaling rope_scaling;
  bool tied_embeddings = false;  ///< LM head reuses the token embedding
  int bos_id = -1;
  int eos_id = -1;

  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_kv_head * head_dim; }
  /// Throws sparsim::Error naming the first inconsistent field.
  void validate() const;
  /// Number of parameters (embedding counted once when tied).
  std::uint64_t n_params() const;
  /// Inverse RoPE frequencies θ_j for j < head_dim/2, with Llama-3 scaling applied and, when
  /// given, per-frequency divisors (GGUF `rope_freqs.weight`).
  std::vector<double> rope_inv_freq(const std::vector<float>& freq_factors = {}) const;
};

}  // namespace sparsim
