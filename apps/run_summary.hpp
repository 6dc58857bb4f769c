#pragma once
// Figures eval and compare report alike: the spread of a perplexity across its windows, and the
// FLOP / byte totals of a run with the online re-rotation and the mask selection shown apart.
#include "eval/perplexity.hpp"
#include "flops/ledger.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <string>

namespace sparsim::app {

/// Per-token NLL of each window, its mean over windows and the standard error of that mean
/// (sample standard deviation / √windows); the perplexity interval exp(mean ± 1.96·se). The
/// scored tokens of the windows do not overlap; the windows' contexts do.
struct PplSpread {
  int windows = 0;
  double mean_nll = 0;  ///< mean over windows of the per-token NLL
  double se = 0;        ///< standard error of mean_nll (0 for one window)
  std::array<double, 2> ci95{0, 0};
};
PplSpread ppl_spread(const PplResult& r);

/// {"dense", "realised", "rotation", "mask_select", "realised_over_dense"} for FLOPs and bytes:
/// realised includes the online re-rotation and the mask selection (work a dense model does not
/// do), so a rotated method can total more than dense.
nlohmann::json cost_json(const flops::Ledger& l);
/// Lines for stdout: dense and realised GFLOP and GB, the realised / dense ratios and what the
/// rotation and the selection add.
std::string cost_table(const flops::Ledger& l, bool sparse);

}  // namespace sparsim::app
