#pragma once
/// Fisher scores (fisher_scores.hpp) from backward passes over calibration sequences.
#include "calibration/fisher_scores.hpp"
#include "engine/backprop.hpp"

#include <functional>
#include <memory>
#include <vector>

namespace sparsim::pruning {

using calibration::FisherScores;
using calibration::rope_layout_name;

/// Progress: (sequences done, total).
using FisherProgress = std::function<void(int, int)>;

/// Runs the forward and backward pass (fp32) over every sequence of `seqs` (each of the same
/// length ≥ 2) on the full model `w` and returns the Fisher scores. Throws for a pruned model.
template <class E>
FisherScores fisher_scores(std::shared_ptr<const Weights<E>> w,
                           const std::vector<std::vector<int>>& seqs,
                           const FisherProgress& progress = {});

}  // namespace sparsim::pruning
