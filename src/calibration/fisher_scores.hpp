#pragma once
/// Fisher scores of the K and V projection output channels (METHODS.md §4, paper 003): the data
/// `calibrate --fisher` writes (transforms/fisher.hpp computes them) and `prune` reads. Plain host
/// code.
///
/// A gate m_c multiplying channel c of the pre-RoPE key k (or the value v) has, at m = 1, the
/// derivative G_c = Σ_t ∂L/∂k_{t,c}·k_{t,c} per sequence (L the next-token cross-entropy); its
/// empirical Fisher information over calibration sequences is
///   F_c = Σ_seq G_c²                       (channel score, KVPruner)
///   F_p = Σ_seq (G_c + G_c')²,  σ_p = √F_p  (a RoPE pair p = {c, c'} gated together, RAP)
/// Pairs are indexed by their RoPE frequency index j within a head: channels (2j, 2j+1) in the
/// GGUF layout, (j, j + D/2) in the Hugging Face rotate_half layout.
#include "model/config.hpp"

#include <string>
#include <vector>

namespace sparsim::calibration {

struct FisherScores {
  int sequences = 0;  ///< calibration sequences
  int tokens = 0;     ///< tokens per sequence
  int n_layer = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  std::string rope_layout;      ///< "adjacent" or "half": which channels form a RoPE pair
  std::vector<double> loss;     ///< [seq] mean next-token cross-entropy (nats)
  std::vector<double> gate_k;   ///< [seq][layer][n_kv_head·head_dim] G of the K channels
  std::vector<double> gate_v;   ///< [seq][layer][n_kv_head·head_dim] G of the V channels
  std::vector<double> k;        ///< [layer][n_kv_head·head_dim] F_c of the K channels
  std::vector<double> v;        ///< [layer][n_kv_head·head_dim] F_c of the V channels
  std::vector<double> pair;     ///< [layer][n_kv_head][head_dim/2] F_p of the RoPE pairs
  double forward_seconds = 0;   ///< wall time of the forward passes (activations kept)
  double backward_seconds = 0;  ///< wall time of the backward passes

  int kv_dim() const { return n_kv_head * head_dim; }
  /// Sums k, v and pair from the per-sequence gate gradients.
  void finish();
  /// Throws sparsim::Error naming the first inconsistent field.
  void validate() const;
  /// σ_p = √F_p of pair j of KV head h in layer l.
  double sigma(int l, int h, int j) const;
};

/// RoPE layout name of a config ("adjacent" / "half").
std::string rope_layout_name(RopeLayout l);

}  // namespace sparsim::calibration
