#pragma once
/// FLAP (An et al., 2024; docs/flap.md): fluctuation-based structured pruning of whole attention
/// heads and FFN channels, with the removed part's mean output folded into a bias.
///
/// - Statistic: for every input channel c of W_o and of W_down, the variance over calibration
///   tokens of that input, times the squared norm of the weight column W[:, c] (WIFV). W_o's
///   values are squared once more (as the reference code does).
/// - Standardised per layer and module: (s − mean) / std over the layer's W_o channels, and over
///   its W_down channels (std with n − 1).
/// - Units: an FFN channel, and an attention unit = one KV head with its group of query heads
///   (one query head in a multi-head model); a unit's score is the mean of its W_o channels'.
/// - Adaptive search over layers and modules (AL-AM): one ranking of every unit of the model,
///   best first, each weighted by the parameters it holds in units of an FFN channel's (3·d):
///   (2·group + 2)·head_dim / 3 for an attention unit; the units ranked before the position where
///   the cumulative weight comes closest to (1 − ratio) of the total are kept.
/// - Bias compensation: b = W[:, removed] · mean(removed inputs) over the calibration tokens, for
///   W_o and W_down of every layer (the model then gives, on average over those tokens, the
///   dense layer's mean output).
#include "engine/engine.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"
#include "transforms/kv_weight_pruning.hpp"
#include "transforms/pruned_gguf.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sparsim::pruning {

/// Mean and variance of every column of the rows it is given, merged batch by batch in double
/// (Chan, Golub and LeVeque's pairwise update); the variance divides by the row count.
class ChannelMoments {
 public:
  explicit ChannelMoments(int d = 0);
  /// Adds n rows of d values (row-major).
  void add(const float* x, std::int64_t n);
  std::int64_t count() const { return n_; }
  const std::vector<double>& mean() const { return mean_; }
  std::vector<double> variance() const;

 private:
  int d_ = 0;
  std::int64_t n_ = 0;
  std::vector<double> mean_, m2_;
};

/// What FLAP needs from the calibration tokens: per layer, the mean and variance of every input
/// channel of W_o (q_dim) and of W_down (d_ff).
struct FlapStats {
  int n_layer = 0, q_dim = 0, d_ff = 0;
  std::int64_t tokens = 0;
  std::vector<double> o_mean, o_var;        ///< [layer][q_dim]
  std::vector<double> down_mean, down_var;  ///< [layer][d_ff]
};

/// Runs the (whole) model over `windows` (each its own sequence, from position 0) and gathers
/// FlapStats at the inputs of W_o and W_down through the engine's activation observer.
template <class E>
FlapStats flap_statistics(std::shared_ptr<const Weights<E>> w,
                          const std::vector<std::vector<int>>& windows,
                          const std::function<void(int done, int total)>& progress = {});

/// FLAP's scores of one model.
struct FlapScores {
  int n_layer = 0;
  int units = 0;       ///< attention units per layer (KV heads)
  int unit_heads = 0;  ///< query heads per unit
  int d_ff = 0;
  double unit_weight = 0;        ///< parameters of an attention unit / those of an FFN channel
  std::vector<double> o_raw;     ///< (var_c · ‖W_o[:, c]‖²)², [layer][q_dim]
  std::vector<double> down_raw;  ///< var_c · ‖W_down[:, c]‖², [layer][d_ff]
  std::vector<double> unit;      ///< standardised score of each attention unit, [layer][units]
  std::vector<double> ffn;       ///< standardised score of each FFN channel, [layer][d_ff]
};

/// Scores from the statistics and the squared column norms of W_o ([layer][q_dim]) and W_down
/// ([layer][d_ff]). Throws sparsim::Error when the shapes disagree with `full`.
FlapScores flap_scores(const Config& full, const FlapStats& s, const std::vector<double>& o_norm2,
                       const std::vector<double>& down_norm2);
/// The same, with the column norms taken from the weights (in double, from their storage type).
template <class E>
FlapScores flap_scores(const Weights<E>& full, const FlapStats& s);

/// The structure FLAP keeps at `opt.ratio` (Config::structure and prune filled). Throws
/// sparsim::Error naming the layer when the ranking would leave a layer without attention units
/// or FFN channels.
Config plan_flap(const Config& full, const FlapScores& sc, const PruneOptions& opt);

/// b = W[:, removed] · mean(removed inputs) for W_o and W_down of every layer of `plan` (fp32
/// values of the sum taken in double; BLAS dgemv).
template <class E>
OutputBiases flap_biases(const Weights<E>& full, const Config& plan, const FlapStats& s);

/// The structurally pruned model in memory: the kept rows / columns of every projection of
/// `full` (values copied exactly) and the biases.
template <class E>
std::shared_ptr<Weights<E>> fuse_structured(const Weights<E>& full, const Config& plan,
                                            const OutputBiases& b);

/// What FLAP removed, per layer and over the model.
struct FlapReport {
  double ratio = 0;              ///< target share of the block projection parameters removed
  double ratio_realised = 0;     ///< removed / all block projection parameters
  double params_fraction = 1;    ///< n_params() of the pruned model / of the full model
  double kv_bytes_fraction = 1;  ///< KV-cache width kept over the layers
  struct Layer {
    int q_heads = 0, kv_heads = 0, d_ff = 0;
  };
  std::vector<Layer> layers;
  nlohmann::json json() const;
  std::string table() const;
};
FlapReport flap_report(const Config& full, const Config& plan, double ratio);

}  // namespace sparsim::pruning
