#pragma once
/// Activation-sparsity calibration on a model variant (plain, or WINA-rotated): activation
/// histograms of every layer × site, the greedy per-projection allocation table of every block,
/// and the block sensitivities e_i at probe sparsities (METHODS.md §1).
#include "engine/engine.hpp"
#include "sparsity/calibration.hpp"
#include "sparsity/histogram.hpp"
#include "sparsity/masker.hpp"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sparsim::sparsity {

struct CalibrateOptions {
  int context = 2048;       ///< tokens per histogram window
  int max_windows = 8;      ///< histogram windows (consecutive, non-overlapping)
  int greedy_seqs = 8;      ///< sequences whose block inputs drive the greedy search / sensitivity
  int greedy_tokens = 256;  ///< tokens per such sequence
  double alpha = 0.025;     ///< greedy base step
  double cap = 0.95;        ///< greedy stops at P ≥ cap
  double step_cap = 0.0;    ///< cap on each matrix's greedy step (0: none, the paper's α·F/f_i)
  double score_fraction = 0.25;  ///< greedy error over the last fraction of each sequence
  std::vector<double> probes{0.2, 0.4, 0.6, 0.8};  ///< sensitivity probe sparsities s̄
  double delta = 0.01;                             ///< TopK-Guided clip margin of the guided probes
  /// Masking rules of the sensitivity probes; empty: the variant's own (plain: threshold;
  /// rotated: guided and topk, the masks of TopK-Guided and of its ablation with WINA's TopK).
  std::vector<ProbeRule> probe_rules;
  /// Column-norm modes of the topk / guided probes: false = k and gate (WINA's code), true = all.
  std::vector<bool> norms_modes{false};
  /// First positions of the sensitivity error: 0 (every token) and, to leave out the
  /// attention-sink tokens, a later one. Each gives its own sensitivity set.
  std::vector<int> sensitivity_from{0, 4};
  std::size_t range_values = std::size_t{1} << 20;  ///< values fixing each histogram's range
};

/// Progress: (stage, done, total) in the stage's own units (windows, greedy steps, probes).
using CalibrateProgress = std::function<void(const std::string&, int, int)>;

/// Which variant is calibrated: the plain model (TEAL; threshold probes by default) or the
/// WINA-rotated one (WINA, TopK-Guided; guided and topk probes by default, column norms stored).
enum class ProbeMasking { Threshold, Guided };

/// Calibrates one variant: `w` is the model as it will be evaluated (rotated or not), `stream`
/// the calibration tokens. Fills `out` (histograms, greedy tables, sensitivities) and, for the
/// rotated variant, its column norms. `timings` (optional) receives the wall and CPU seconds
/// of each stage, named "<stage> (<prefix>)" when `prefix` is given.
template <class E>
void calibrate_variant(std::shared_ptr<const Weights<E>> w, const std::vector<int>& stream,
                       const CalibrateOptions& opt, ProbeMasking masking, CalibrationVariant& out,
                       const CalibrateProgress& progress = {},
                       std::vector<Calibration::Timing>* timings = nullptr,
                       const std::string& prefix = "");

/// The probe rules calibrate_variant uses for `masking` under `opt`.
std::vector<ProbeRule> probe_rules_of(const CalibrateOptions& opt, ProbeMasking masking);

}  // namespace sparsim::sparsity
