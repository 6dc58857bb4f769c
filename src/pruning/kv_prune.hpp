#pragma once
/// Weight-side KV pruning (METHODS.md §4, paper 003): RAP and the KVPruner baseline.
///
/// Both keep, in every layer ℓ, the same number of channels per KV head for K and for V, from
/// the same layer-adaptive budget m_ℓ (pairs per KV head):
///   σ_ℓ = Σ_heads Σ_pairs σ_p  (σ_p = √F_p),   m_ℓ ∝ σ_ℓ, clamped to [1, D/2], rounded so that
///   Σ_ℓ m_ℓ = round(ρ·L·D/2)  (the mean retain ratio is ρ up to that rounding);
///   V: the 2m_ℓ channels with the largest F_c of each KV head (both methods).
///   RAP K:      the m_ℓ whole RoPE pairs with the largest σ_p of each KV head (2m_ℓ channels);
///   KVPruner K: the 2m_ℓ single channels with the largest F_c of each KV head (RoPE-agnostic:
///               a kept channel may lose its partner — an orphan).
/// Ties go to the lower index. The reduced model keeps the rows of W_q (every query head of the
/// group), W_k, W_v of the kept channels and the matching columns of W_o; RoPE rotates each kept
/// pair by its original frequency, and an orphan with a zero partner (engine: RopeUnits); the
/// softmax scale stays 1/√D.
#include "calibration/fisher_scores.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace sparsim::io {
class SummaryColumns;
}

namespace sparsim::pruning {

using calibration::FisherScores;
using calibration::rope_layout_name;

enum class PruneMethod { Rap, KvPruner };
const char* method_name(PruneMethod m);
/// "rap" / "kvpruner"; throws sparsim::Error naming the choices otherwise.
PruneMethod parse_prune_method(const std::string& s);

/// σ_ℓ = Σ_h Σ_j √F_p of every layer.
std::vector<double> layer_sigma(const FisherScores& f);

/// Pairs per KV head m_ℓ of every layer for mean retain ratio `retain` ∈ (0, 1]: proportional
/// to sigma, clamped to [1, max_pairs], Σ m_ℓ = round(retain·L·max_pairs) (or L when that is
/// smaller: every layer keeps a pair). All-zero sigma: a uniform budget. Throws for retain
/// outside (0, 1] or a negative / non-finite sigma.
std::vector<int> layer_pair_budgets(const std::vector<double>& sigma, double retain, int max_pairs);

/// What to keep: the pruned config of the full model `full` (attn and prune filled).
struct PruneOptions {
  PruneMethod method = PruneMethod::Rap;
  double retain = 0.7;
  int flops_context = 2048;
  std::string source_fingerprint;
  std::string calibration;  ///< identifies the Fisher scores (model and corpus fingerprints)
};
Config plan_pruning(const Config& full, const FisherScores& f, const PruneOptions& opt);

/// The reduced model: rows / columns of the attention projections of `full` selected as
/// `pruned` says (values copied exactly, storage type kept); everything else shared.
template <class E>
std::shared_ptr<Weights<E>> fuse_pruned(const Weights<E>& full, const Config& pruned);

/// Costs of a pruned model against its full model (same config with attn cleared).
struct LayerCost {
  int qk_dim = 0, v_dim = 0;
  int pairs = 0;       ///< whole RoPE pairs kept, summed over KV heads
  int orphans = 0;     ///< kept K channels whose RoPE partner was cut, summed over KV heads
  int k_channels = 0;  ///< kept K channels, summed over KV heads
  double kv_bytes_fraction = 1;
  double attn_params_fraction = 1;
  double attn_flops_fraction = 1;
};
struct PruneReport {
  std::string method;
  double retain = 1;           ///< target ρ
  double retain_realised = 1;  ///< kept K and V channels / all, over the model
  double orphan_ratio = 0;     ///< kept K channels whose partner was cut / kept K channels
  double kv_bytes_fraction = 1;
  double attn_params_fraction = 1;
  double attn_flops_fraction = 1;
  int flops_context = 0;
  std::vector<LayerCost> layers;
  nlohmann::json json() const;
  /// The sweep table's columns of a pruned model (io/summary_columns.hpp): json()'s figures.
  void add_columns(io::SummaryColumns& cols) const;
  /// Per-layer table for stdout.
  std::string table() const;
};

/// Attention FLOPs of layer l for a prefill of `context` tokens (the projections q, k, v, o,
/// RoPE, scores, softmax and value mixing; the formulas of the engine's ledger).
double attention_flops(const Config& c, int l, int context);
/// Attention parameters (W_q, W_k, W_v, W_o) of layer l.
double attention_params(const Config& c, int l);

/// The report of a pruned config (throws for a dense one).
PruneReport prune_report(const Config& pruned);

}  // namespace sparsim::pruning
