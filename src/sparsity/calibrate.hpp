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
  int greedy_seqs = 4;      ///< sequences whose block inputs drive the greedy search / sensitivity
  int greedy_tokens = 128;  ///< tokens per such sequence
  double alpha = 0.025;     ///< greedy base step
  double cap = 0.95;        ///< greedy stops at P ≥ cap
  double score_fraction = 0.25;  ///< greedy error over the last fraction of each sequence
  std::vector<double> probes{0.2, 0.4, 0.6, 0.8};  ///< sensitivity probe sparsities s̄
  double delta = 0.01;          ///< TopK-Guided clip margin used when probing the rotated variant
  bool wina_norms_all = false;  ///< score every projection with its column norms
  std::size_t range_values = std::size_t{1} << 20;  ///< values fixing each histogram's range
};

/// Progress: (stage, done, total).
using CalibrateProgress = std::function<void(const std::string&, int, int)>;

/// Masking used for one projection: threshold masks (plain variant; TEAL) or TopK-Guided
/// with WINA scores (rotated variant).
enum class ProbeMasking { Threshold, Guided };

/// Calibrates one variant: `w` is the model as it will be evaluated (rotated or not), `stream`
/// the calibration tokens. Fills `out` (histograms, greedy tables, sensitivities) and, for the
/// rotated variant, its column norms.
template <class E>
void calibrate_variant(std::shared_ptr<const Weights<E>> w, const std::vector<int>& stream,
                       const CalibrateOptions& opt, ProbeMasking masking, CalibrationVariant& out,
                       const CalibrateProgress& progress = {});

}  // namespace sparsim::sparsity
