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

/// KvPruner keeps each kept channel's own RoPE frequency (index-aware, the paper's Appendix F
/// variant); KvPrunerNaive (the paper's main-table KVPruner) re-packs the same channels as a
/// smaller head and rotates them as its pairs (Config::naive_rope).
/// Flap removes whole attention heads and FFN channels instead (transforms/flap.hpp).
enum class PruneMethod { Rap, KvPruner, KvPrunerNaive, Flap };
const char* method_name(PruneMethod m);
/// "rap" / "kvpruner" / "kvpruner-naive" / "flap"; throws sparsim::Error naming the choices
/// otherwise.
PruneMethod parse_prune_method(const std::string& s);

/// σ_ℓ = Σ_h Σ_j √F_p of every layer.
std::vector<double> layer_sigma(const FisherScores& f);

/// Pairs per KV head m_ℓ of every layer for mean retain ratio `retain` ∈ (0, 1]: proportional
/// to sigma, clamped to [1, max_pairs], Σ m_ℓ = round(retain·L·max_pairs) (or L when that is
/// smaller: every layer keeps a pair). All-zero sigma: a uniform budget. Throws for retain
/// outside (0, 1] or a negative / non-finite sigma.
std::vector<int> layer_pair_budgets(const std::vector<double>& sigma, double retain, int max_pairs);

/// The switches behind the paper's ablations (its Figures 5-7); the defaults are RAP's recipe.
enum class ScoreSource { Fisher, Magnitude };  ///< channel scores: Fisher, or squared row norms
enum class LayerBudget { Adaptive, Uniform };  ///< m_ℓ ∝ σ_ℓ, or the same in every layer
enum class PairScore { Joint, Additive };      ///< F_p = Σ(G_c + G_c')², or F_c + F_c'
/// K and V widths: balanced (K/V split by k_share, RAP: equal), or pooled (each layer's kept
/// channels split between K and V by their root-score mass Σ√F_c: one allocation over both)
enum class KvBudget { Balanced, Pooled };
KvBudget parse_kv_budget(const std::string& s);
ScoreSource parse_score_source(const std::string& s);
LayerBudget parse_layer_budget(const std::string& s);
PairScore parse_pair_score(const std::string& s);

/// Scores the selection ranks by, in the layout of FisherScores (k, v: [layer][kv_dim]; pair:
/// [layer][n_kv_head][head_dim/2]); σ_p = √pair.
struct ChannelScores {
  int n_layer = 0, n_kv_head = 0, head_dim = 0;
  std::vector<double> k, v, pair;
  double sigma(int l, int h, int j) const;
};
/// Fisher scores with the pair score `ps` (Joint: the calibration's F_p; Additive: F_c + F_c').
ChannelScores fisher_channel_scores(const FisherScores& f, const Config& full, PairScore ps);
/// Magnitude scores: the squared norm of each K / V output channel's weight row, given as
/// [layer][kv_dim] (k_rows2, v_rows2); pairs by `ps` (Joint and Additive agree here: the pair's
/// squared norm is the sum of its rows').
ChannelScores magnitude_channel_scores(const Config& full, std::vector<double> k_rows2,
                                       std::vector<double> v_rows2);
/// The same from a full model's weights (W_k and W_v rows as stored, in double).
template <class E>
ChannelScores magnitude_channel_scores(const Weights<E>& w);

/// What to keep: the pruned config of the full model `full` (attn and prune filled).
struct PruneOptions {
  PruneMethod method = PruneMethod::Rap;
  double retain = 0.7;
  int flops_context = 2048;
  std::string source_fingerprint;
  std::string calibration;  ///< identifies the Fisher scores (model and corpus fingerprints)
  ScoreSource score = ScoreSource::Fisher;
  LayerBudget budget = LayerBudget::Adaptive;
  PairScore pair_score = PairScore::Joint;
  /// Share of the kept K and V channels that go to K: K keeps a retain ratio 2·k_share·ρ, V
  /// 2·(1 − k_share)·ρ, each from its own layer budgets of the same weights (0.5: RAP's equal
  /// K and V budgets, m_ℓ pairs of K and 2m_ℓ channels of V per head).
  double k_share = 0.5;
  KvBudget kv_budget = KvBudget::Balanced;
  /// FLAP: the share of the blocks' projection parameters removed, in (0, 1), and the
  /// calibration windows its statistics are gathered over (windows × tokens, from the corpus)
  double ratio = 0.2;
  int flap_windows = 64, flap_tokens = 128;
  /// "score=… budget=… pair=… k_share=… kv=…", as recorded in the pruned model
  std::string recipe() const;
  /// Throws OptionError naming the setting at fault: retain outside (0, 1], k_share outside
  /// (0, 1) or asking K or V for more than all its channels, a k_share with pooled budgets;
  /// for flap, a ratio outside (0, 1) or no calibration windows.
  void validate() const;
};
Config plan_pruning(const Config& full, const ChannelScores& s, const PruneOptions& opt);
/// plan_pruning on the Fisher scores with opt.pair_score (opt.score must be Fisher).
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
  std::string recipe;  ///< PruneOptions::recipe() ("" for models pruned before it was recorded)
  double retain = 1;   ///< target ρ
  double retain_realised = 1;  ///< kept K and V channels / all, over the model
  double orphan_ratio = 0;     ///< kept K channels whose partner was cut / kept K channels
  double kv_bytes_fraction = 1;
  double attn_params_fraction = 1;
  double attn_flops_fraction = 1;
  double attn_decode_flops_fraction = 1;  ///< one decode step at flops_context
  int flops_context = 0;
  std::vector<LayerCost> layers;
  nlohmann::json json() const;
  /// The sweep table's columns of a pruned model (io/summary_columns.hpp): json()'s figures.
  void add_columns(io::SummaryColumns& cols) const;
  /// Per-layer table for stdout.
  std::string table() const;
};

/// Attention FLOPs of layer l for a prefill of `context` tokens (the projections q, k, v, o,
/// RoPE, scores, softmax and value mixing; for a low-rank model the rebuilding of K and V from
/// the latents; the formulas of the engine's ledger).
double attention_flops(const Config& c, int l, int context);
/// The same for one decode step of one sequence at `context` cached positions (a low-rank model
/// rebuilds K and V of every cached position at each step).
double attention_decode_flops(const Config& c, int l, int context);
/// Attention parameters (W_q, W_k, W_v, W_o, or the low-rank factors of W_k and W_v) of layer l.
double attention_params(const Config& c, int l);

/// The report of a pruned config (throws for a dense one).
PruneReport prune_report(const Config& pruned);

}  // namespace sparsim::pruning
