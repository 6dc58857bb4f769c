#pragma once
/// Probe Pruning (Le et al., 2025; docs/probe-pruning.md) as the engine's structured pruner
/// (engine/hooks.hpp): online, per forward call (a batch), a probe of a few rows runs ahead, its
/// states score the heads and FFN channels of each layer, and the call runs with the
/// lowest-scored ones pruned.
///
/// Per layer and module (attention, then MLP), in the engine's order:
/// - Probe: the k = max(⌈probe·n⌉, min(2, n)) rows of the call's n rows with the largest L2
///   norm of the residual stream feeding the module (ties: the earlier row).
/// - Probe states: the probe rows of the module's input to W_o (each row's attention over the
///   call on the full model) and to W_down (act(gate)·up on the full MLP).
/// - Statistic of input channel j: without history, the mean over the probe rows of x_j². With
///   the calibration's history (calibration::ProbeHistory), per position t of the probe rows the
///   mean of x_j² over the probe rows at t is fused with the history's mean square at t by the
///   reference's dynamic ratio, and the fused values are summed over the positions.
/// - Score (PPsp): ‖W[:, j]‖² × statistic_j, W = W_o or W_down. An attention unit is one KV head
///   with its group of query heads (whole groups are pruned under GQA); its score is the sum of
///   its W_o channels' scores.
/// - Kept: the max(1, round((1 − ratio)·units)) units with the highest scores (ties: the lower
///   index) of every layer; the others' columns of the module's input are zeroed for every row
///   of the call.
/// Calls that continue sequences one token at a time (T = 1, p0 > 0: decode) reuse the masks of
/// the last selection (the prefill of the batch); every other call selects anew.
///
/// Ratio 0 leaves every layer inactive: the engine runs the dense kernels, bit for bit.
#include "calibration/probe_history.hpp"
#include "engine/hooks.hpp"
#include "model/weights.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sparsim::io {
class Group;
}

namespace sparsim::pruning {

struct ProbePruningOptions {
  double ratio = 0.5;   ///< pruned fraction of the attention units and of the FFN channels
  double probe = 0.05;  ///< probe rows as a fraction of the call's rows
  /// Throws OptionError naming the ratio or the probe share for values outside [0, 1) / (0, 1].
  void validate() const;
};

/// Probe rows for a call of n rows: max(⌈probe·n⌉, min(2, n)), at most n.
int probe_rows(int n, double probe);
/// Units kept of `units` at `ratio`: max(1, round((1 − ratio)·units)).
int kept_units(int units, double ratio);
/// Indices of the k largest values (ties: the lower index), ascending.
std::vector<int> top_indices(const std::vector<double>& v, int k);

/// `calibrate --pp-history`: runs `seqs` (all of one length, at most the model's context)
/// through the dense model, `batch` sequences per forward call, and returns per layer, position
/// and input channel of W_o and W_down the mean of x² over the sequences (the reference's
/// calibration-stage `scaler_inp`). Sums in double, each element by one thread in sequence
/// order. `progress(done, total)` after each call.
template <class E>
calibration::ProbeHistory collect_probe_history(std::shared_ptr<const Weights<E>> w,
                                                const std::vector<std::vector<int>>& seqs,
                                                int batch,
                                                const std::function<void(int, int)>& progress = {});

template <class E>
class ProbePruner final : public StructuredPruner<E> {
 public:
  /// `w`: the (dense) model whose W_o and W_down column norms score the channels. `history`
  /// (may be null; must outlive the pruner): the calibration's historical states, fused with the
  /// probe's per position (calibration::fuse_probe_history).
  ProbePruner(const ProbePruningOptions& o, const Weights<E>& w,
              const calibration::ProbeHistory* history = nullptr);

  void begin_call(int n_seq, int T, int p0) override;
  bool active(int layer) const override {
    (void)layer;
    return o_.ratio > 0;
  }
  void prune(const E& exec, int layer, Site site, const CMat<E>& resid, const Mat<E>& in,
             PolicyCost& cost) override;

  const ProbePruningOptions& options() const { return o_; }
  int n_layer() const { return n_layer_; }
  int units() const { return n_kv_head_; }  ///< attention units (KV groups) per layer
  int d_ff() const { return d_ff_; }

  /// One selection (a call that chose its masks): per layer, the units and channels kept.
  struct Batch {
    int n_seq = 0, T = 0, p0 = 0, probe = 0;
    std::vector<int> heads_kept, channels_kept;  ///< [layer]; -1: layer not reached
  };
  const std::vector<Batch>& batches() const { return batches_; }
  /// Calls that reused the masks of the last selection (decode steps).
  std::uint64_t reused_calls() const { return reused_; }
  /// Wall seconds spent choosing masks (probe rows, statistics, scores, masks; fenced).
  double select_seconds() const { return select_seconds_; }
  /// Realised pruned fraction of attention units (heads) and FFN channels of `layer`, over the
  /// selections (NaN-free: 0 when none).
  double head_ratio(int layer) const;
  double channel_ratio(int layer) const;
  double head_ratio() const;     ///< over all layers and selections
  double channel_ratio() const;  ///< over all layers and selections

  /// The last selection's probe rows, channel statistics, channel scores, unit scores (O:
  /// per KV group; Down: per channel) and kept units of `layer` at `site` (O or Down).
  const std::vector<int>& last_probe(int layer, Site site) const { return slot(layer, site).rows; }
  const std::vector<double>& last_stat(int layer, Site site) const {
    return slot(layer, site).stat;
  }
  const std::vector<double>& last_scores(int layer, Site site) const {
    return slot(layer, site).scores;
  }
  const std::vector<double>& last_unit_scores(int layer, Site site) const {
    return slot(layer, site).unit_scores;
  }
  const std::vector<int>& last_kept(int layer, Site site) const { return slot(layer, site).kept; }

  /// The run-file group: settings, per batch and layer the kept heads and channels.
  void write(io::Group& g) const;
  bool has_history() const { return history_ != nullptr; }
  /// "none (probe-only statistics)" or the history's sequences, tokens and fusion.
  std::string history_description() const;

 private:
  struct Slot {
    std::vector<int> rows, kept;
    std::vector<double> stat, scores, unit_scores;
    IVec<E> mask;  ///< [width] 1: column kept
    bool any_pruned = false;
  };
  const Slot& slot(int layer, Site site) const {
    return slots_[static_cast<std::size_t>(2 * layer + (site == Site::Down ? 1 : 0))];
  }
  Slot& slot(int layer, Site site) {
    return slots_[static_cast<std::size_t>(2 * layer + (site == Site::Down ? 1 : 0))];
  }

  /// The statistic with history: per position of the probe rows, the mean of x_j² over the
  /// probe rows there fused with the history's (0 beyond the positions it covers), summed over
  /// the positions.
  std::vector<double> fused_stat(const E& exec, int layer, bool down_site, const Mat<E>& in,
                                 const IVec<E>& rows, const std::vector<int>& h_rows, int width);
  ProbePruningOptions o_;
  const calibration::ProbeHistory* history_ = nullptr;
  int n_layer_, n_head_, n_kv_head_, v_dim_, d_ff_;
  std::vector<std::vector<double>> o_norm2_, down_norm2_;  ///< [layer][column] ‖W[:, j]‖²
  std::vector<Slot> slots_;                                ///< [layer][O, Down]
  std::vector<Batch> batches_;
  bool select_ = true;
  std::uint64_t reused_ = 0;
  double select_seconds_ = 0;
  Kokkos::View<double*, DeviceOf<E>> norms_, stat_, sq_;  ///< scratch, grown on demand
  IVec<E> rows_;
};

}  // namespace sparsim::pruning
