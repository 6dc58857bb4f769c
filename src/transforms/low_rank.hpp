#pragma once
/// Low-rank K/V compression (METHODS.md §5, docs/low-rank.md): PaLU and SVD-LLM. W_k and W_v of
/// every layer are factorised, KV heads `group` at a time, as W ≈ B·A at rank r: the cache holds
/// the latent A·x (r wide instead of n_kv·D), and keys (then rotated) and values are rebuilt as
/// B·latent at attention time (engine: Engine::attend_low_rank).
///
/// - SVD-LLM: truncation-aware whitening. With G = Σ x xᵀ over calibration inputs of the
///   projection and S its Cholesky factor (G = S·Sᵀ), the SVD W·S = U Σ Vᵀ is truncated to r and
///   A = V_rᵀ S⁻¹, B = U_r Σ_r; the calibration loss ‖(W − B·A)·X‖_F² equals Σ_{i>r} σ_i² exactly
///   (Σ of the discarded singular values' squares). Ranks: the same ratio in every layer; the
///   whole projection one group.
/// - PaLU: the same whitened decomposition per group of KV heads (its G-LRD), ranks allocated
///   across layers, K/V and groups in proportion to each group's Fisher score (the mean of √F_c
///   over the group's channels, from sparsim calibrate --fisher).
/// Plain (unwhitened) truncation: an empty Gram matrix; the Frobenius error then equals the
/// discarded singular values.
#include "calibration/fisher_scores.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sparsim::pruning {

/// W ≈ B·A of rank `rank`, W given row-major [m][d].
struct Factors {
  int m = 0, d = 0, rank = 0;
  std::vector<double> a;   ///< [rank][d]: the latent is A·x
  std::vector<double> b;   ///< [m][rank]
  std::vector<double> sv;  ///< every singular value of W (plain) or W·S (whitened), descending
  double ridge = 0;        ///< added to G's diagonal when G was not positive definite
  /// Σ_{i ≥ rank} σ_i²: ‖W − B·A‖_F² (plain) or ‖(W − B·A)·S‖_F² (whitened).
  double discarded() const;
};

/// Truncated SVD of w [m][d] at `rank` (1 … min(m, d)), plain when `gram` is empty, else whitened
/// by the Cholesky factor of gram [d][d] (symmetric; a ridge of 1e-6 × its mean diagonal, grown
/// tenfold until the factorisation succeeds, when it is not positive definite). LAPACK (dgesdd,
/// dpotrf; BLAS dtrsm). Throws sparsim::Error for a bad rank, shape or non-finite input.
Factors truncated_svd(const std::vector<double>& w, int m, int d, int rank,
                      const std::vector<double>& gram = {});

enum class LowRankMethod { Palu, SvdLlm };
const char* method_name(LowRankMethod m);

struct LowRankOptions {
  LowRankMethod method = LowRankMethod::SvdLlm;
  double retain = 0.7;  ///< KV-cache budget ρ: Σ ranks = ρ · Σ n_kv·D over layers and K/V
  int group = 0;        ///< KV heads per group (0: the method's default: PaLU 4 capped at n_kv,
                        ///< SVD-LLM every KV head)
  bool whiten = true;   ///< truncation-aware whitening (both methods' default)
  int flops_context = 2048;
  std::string source_fingerprint, calibration;
  /// Throws sparsim::Error naming the quantity for ρ outside (0, 1] or a group that does not
  /// divide the model's KV heads.
  void validate(const Config& full) const;
  int group_of(const Config& full) const;
};

/// The low-rank config (ranks of every layer and group) for the full model `full`: SVD-LLM
/// uniform (fisher may be null), PaLU by Fisher score (required). Ranks are in 1 … group·D and
/// sum to round(ρ · L · 2 · n_kv/group) group widths (layer_pair_budgets).
Config plan_low_rank(const Config& full, const LowRankOptions& o,
                     const calibration::FisherScores* fisher);

/// What the factorisation did, per layer: ranks, relative calibration loss of K and V
/// (Σ discarded σ² / Σ σ²), KV-cache bytes and K/V parameters against the full model.
struct LowRankReport {
  std::string method;
  double retain = 0, retain_realised = 0;
  int group = 0;
  bool whiten = true;
  double kv_bytes_fraction = 0, kv_params_fraction = 0, params_fraction = 0;
  /// attention parameters, FLOPs of a prefill of flops_context tokens and of one decode step at
  /// that context, the rebuilding of K and V included (transforms/kv_weight_pruning.hpp's formulas)
  double attn_params_fraction = 0, attn_flops_fraction = 0, attn_decode_flops_fraction = 0;
  int flops_context = 0;
  struct Layer {
    int k_rank = 0, v_rank = 0;
    double k_loss = 0, v_loss = 0;  ///< relative truncation loss (whitened or plain)
  };
  std::vector<Layer> layers;
  nlohmann::json json() const;
  std::string text() const;
};

/// The second moment Σ x xᵀ / n of the attention input x (the normalised block input that W_q,
/// W_k and W_v see) of every layer, from dense forward passes over `seqs`, one at a time: [L] of
/// [d][d], row-major, symmetric (SVD-LLM's whitening matrix before its Cholesky factor). Summed in
/// float64 by single-threaded BLAS (dsyrk) in token order, so the result does not depend on the
/// thread count. `progress(done, total)` after each sequence.
template <class E>
std::vector<std::vector<double>> attention_input_grams(
    std::shared_ptr<const Weights<E>> w, const std::vector<std::vector<int>>& seqs,
    const std::function<void(int, int)>& progress = {});

/// The figures of a low-rank model that its config alone gives (method, ranks, bytes, parameters
/// and attention FLOPs against the full model; losses 0): what eval, inspect and run files show.
LowRankReport low_rank_summary(const Config& lr);

/// Factorises W_k and W_v of `full` as `plan` says (whitened with grams[l], [d][d] of layer l's
/// attention input, when o.whiten), giving the low-rank model's weights (fp32 factors) on the
/// same backend; `report` (optional) receives the per-layer figures.
template <class E>
std::shared_ptr<Weights<E>> factorise(const Weights<E>& full, const Config& plan,
                                      const std::vector<std::vector<double>>& grams,
                                      LowRankReport* report = nullptr);

/// Writes the low-rank model `lr` (from factorise) as a GGUF file beside its source's tensors:
/// blk.N.attn_k / attn_v become the down factors A and blk.N.attn_k_up / attn_v_up the up
/// factors B (F32), every other tensor and the metadata (tokenizer included) copied; the layout
/// in sparsim.low_rank.* (model/pruned_layout.hpp). Atomic: nothing at `out` on failure.
template <class E>
void write_low_rank_gguf(const std::string& source, const Weights<E>& lr, const std::string& out);

}  // namespace sparsim::pruning
