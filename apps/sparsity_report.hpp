#pragma once
// What an activation-sparsity run reports: targets against realised sparsity per layer and
// projection, per token, and the method's configuration (stdout, JSON, run file).
#include "io/hdf5.hpp"
#include "sparsity/masker.hpp"
#include "sparsity/plan.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <string>
#include <vector>

namespace sparsim::app {

struct SparsityReport {
  const sparsity::Plan& plan;
  const std::vector<std::array<sparsity::ProjStats, kNumProj>>& stats;  ///< [layer][proj]
  const std::vector<double>& token_sparsity;  ///< FLOP-weighted, per masked token
  std::string calibration;                    ///< calibration file path

  /// The JSON "sparsity" object: target, realised_mean/min/max over tokens (all projections,
  /// FLOP-weighted), the mean block budget, and a per-projection breakdown.
  nlohmann::json json() const;
  /// Writes /sparsity into a run file.
  void write(io::Group root) const;
  /// A per-projection table for stdout.
  std::string table() const;
};

}  // namespace sparsim::app
