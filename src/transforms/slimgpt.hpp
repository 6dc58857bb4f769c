#pragma once
/// SlimGPT (Ling et al., 2024; docs/slimgpt.md): layer-wise Optimal-Brain-Surgeon structured
/// pruning of whole attention units and FFN channels, the remaining columns of W_o and W_down
/// compensated for what was removed.
///
/// - Statistic: per layer, the second moment G = Σ x xᵀ / n of the inputs of W_o (q_dim wide)
///   and of W_down (d_ff wide) over the calibration tokens (the OBS Hessian is 2G; the factor
///   changes no decision), from one pass of the dense model (slimgpt_grams) or, as the paper
///   does, layer by layer on the outputs of the already-pruned layers below
///   (slimgpt_prune_sequential). A damping λ · mean(diag G) is added to the diagonal.
/// - Error of removing the columns Q of W (kept set K, H⁻¹ = (G_KK)⁻¹):
///   E(Q) = tr(W_Q (H⁻¹_QQ)⁻¹ W_Qᵀ) = min ‖(W' − W) X‖² / n over W' with W'_Q = 0 — computed per
///   unit from the Cholesky factor of its diagonal block of H⁻¹ (grouped Cholesky).
/// - Compensation: W_R ← W_R − W_Q (H⁻¹_QQ)⁻¹ H⁻¹_QR on the remaining columns R (exact OBS).
/// - Batched greedy: every step recomputes H⁻¹ of the kept columns, scores every kept unit by
///   E, removes the `step` cheapest together and compensates. Attention: one unit per step, a
///   unit being one KV head with its group of query heads (one head in a multi-head model);
///   FFN: `ffn_group` single channels per step.
/// - Incremental pruning ratio: layer l removes the share r_l = min(1, s·ln(l + 2)) of its
///   attention units and of its FFN channels, s such that the mean of r_l over layers is the
///   target ratio (every layer keeps at least one unit and one channel).
#include "engine/engine.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"
#include "transforms/pruned_gguf.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sparsim::pruning {

/// How the target ratio is spread over the layers.
enum class SlimGptSchedule {
  Log,     ///< r_l = min(1, s·ln(l + 2)), mean over layers = ratio (the method's default)
  Uniform  ///< r_l = ratio in every layer (the ablation)
};
/// "log" / "uniform"; throws sparsim::Error naming the choices otherwise.
SlimGptSchedule parse_slimgpt_schedule(const std::string& s);
const char* schedule_name(SlimGptSchedule s);

struct SlimGptOptions {
  double ratio = 0.2;  ///< target share of the blocks' projection parameters removed, in [0, 1)
  double damp = 0.01;  ///< λ: λ · mean(diag G) added to G's diagonal
  int ffn_group = 64;  ///< FFN channels removed per greedy step
  SlimGptSchedule schedule = SlimGptSchedule::Log;
  int windows = 64, tokens = 128;  ///< calibration windows × tokens (recorded in the recipe)
  /// Hessians of each layer on the inputs the already-pruned layers below it give
  /// (slimgpt_prune_sequential), instead of all from one pass of the dense model
  bool sequential = false;
  std::string source_fingerprint, calibration;
  /// Throws OptionError naming the setting at fault: ratio outside [0, 1), a negative or
  /// non-finite damping, a group below 1, no calibration windows.
  void validate() const;
  /// "hessian=dense-once|sequential unit=kv-group schedule=log damp=0.01 ffn_group=64 ratio=…
  /// windows=… tokens=…", as recorded in the pruned model
  std::string recipe() const;
};

/// Per layer, G = Σ x xᵀ / n of the inputs of W_o ([q_dim][q_dim]) and of W_down
/// ([d_ff][d_ff]), row-major, symmetric.
struct SlimGptGrams {
  int n_layer = 0, q_dim = 0, d_ff = 0;
  std::int64_t tokens = 0;
  std::vector<std::vector<double>> o, down;
};

/// Runs the whole model over `windows` (each its own sequence, from position 0) and gathers the
/// Gram matrices at the inputs of W_o and W_down through the engine's activation observer, summed
/// in float64 by single-threaded BLAS (dsyrk, one call per matrix for every 512 or more buffered
/// tokens, the matrices spread over the host threads) in token order: the result does not depend
/// on the thread count.
template <class E>
SlimGptGrams slimgpt_grams(std::shared_ptr<const Weights<E>> w,
                           const std::vector<std::vector<int>>& windows,
                           const std::function<void(int done, int total)>& progress = {});

/// The share of attention units and FFN channels each layer removes (see the file comment).
std::vector<double> slimgpt_layer_ratios(int n_layer, double ratio, SlimGptSchedule s);

/// One matrix pruned by the batched greedy.
struct ObsPruned {
  std::vector<int> removed;        ///< units in the order the greedy removed them
  std::vector<int> kept;           ///< kept units, ascending
  std::vector<double> w;           ///< [rows][kept.size() · unit]: the compensated kept columns
  std::vector<double> step_error;  ///< E of every greedy step, in units of G (‖ΔW·X‖² / n)
};

/// Removes `remove` units of `unit` consecutive columns from w ([rows][cols], row-major) by the
/// batched greedy (`step` units per step) on gram ([cols][cols]) damped by λ = `damp`; with
/// remove = 0 the values come back unchanged. Columns whose input is always zero (diag G = 0)
/// are zeroed. LAPACK (dpotrf, dpotri, dpotrs) and BLAS (dtrsm, dgemm) in double; throws
/// sparsim::Error for bad shapes or when the damped G is not positive definite.
ObsPruned obs_prune_units(const std::vector<double>& w, int rows, int cols,
                          const std::vector<double>& gram, int unit, int remove, int step,
                          double damp);

/// E(Q) of removing the given units together from the whole matrix (brute-force reference for
/// the greedy): tr(W_Q (H⁻¹_QQ)⁻¹ W_Qᵀ) with H the damped gram.
double obs_removal_error(const std::vector<double>& w, int rows, int cols,
                         const std::vector<double>& gram, int unit, const std::vector<int>& units,
                         double damp);

/// The pruned model's plan and new W_o / W_down values.
struct SlimGptResult {
  Config plan;                      ///< structure and prune record filled
  KeptColumnValues values;          ///< compensated kept columns of W_o and W_down, every layer
  std::vector<double> layer_ratio;  ///< r_l
  std::vector<double> o_error, down_error;    ///< Σ of the greedy's step errors, per layer
  std::vector<double> o_energy, down_energy;  ///< tr(W G Wᵀ) of the dense W_o / W_down
};

/// Prunes every layer of `full` (independent tasks, one BLAS thread each: thread-count
/// independent). Throws sparsim::Error when the statistics do not fit the model.
template <class E>
SlimGptResult slimgpt_prune(const Weights<E>& full, const SlimGptGrams& g, const SlimGptOptions& o);

/// The method as the paper runs it: layer by layer, the Gram matrices of layer l gathered from a
/// pass over the windows of the model cut after layer l with layers 0 … l − 1 already pruned and
/// compensated (L passes of growing depth); the same result type as slimgpt_prune.
/// `progress(layers done, L)`.
template <class E>
SlimGptResult slimgpt_prune_sequential(std::shared_ptr<const Weights<E>> full,
                                       const std::vector<std::vector<int>>& windows,
                                       const SlimGptOptions& o,
                                       const std::function<void(int, int)>& progress = {});

/// The pruned model in memory: fuse_structured with zero biases, W_o and W_down replaced by the
/// compensated values (fp32) where the layer removed something from them (a whole matrix keeps
/// its values, and needs none in r.values).
template <class E>
std::shared_ptr<Weights<E>> fuse_slimgpt(const Weights<E>& full, const SlimGptResult& r);

/// Zero biases for every layer of `c` (SlimGPT compensates in the weights; the structured
/// format carries biases).
OutputBiases zero_biases(const Config& c);

/// Per layer: r_l, units and channels kept, relative layer errors E / tr(W G Wᵀ).
nlohmann::json slimgpt_layers_json(const SlimGptResult& r);

}  // namespace sparsim::pruning
