#pragma once
/// Probe Pruning's historical states (docs/probe-pruning.md, "History"): per layer, position and
/// input channel of W_o and W_down, the mean over calibration sequences of x², the squared
/// activation the probe's own statistic is fused with. `calibrate --pp-history` computes them
/// (policies/probe_pruning.hpp) and `--method probe-pruning --calibration FILE` reads them. Plain
/// host code.
#include <string>
#include <vector>

namespace sparsim::calibration {

struct ProbeHistory {
  int sequences = 0;  ///< calibration sequences
  int tokens = 0;     ///< tokens per sequence: the positions 0 … tokens − 1 the history covers
  int n_layer = 0;
  int o_width = 0;          ///< input channels of W_o (query heads × value width)
  int down_width = 0;       ///< input channels of W_down (d_ff)
  std::vector<float> o;     ///< [layer][position][o_width] mean of x² over the sequences
  std::vector<float> down;  ///< [layer][position][down_width]

  /// Row of `layer` and `position` (< tokens) of the W_o (`down` false) or W_down history.
  const float* row(int layer, bool down_site, int position) const {
    const int w = down_site ? down_width : o_width;
    const auto& v = down_site ? this->down : o;
    return v.data() + (static_cast<std::size_t>(layer) * tokens + position) * w;
  }
  /// Throws sparsim::Error naming the first inconsistent field (sizes, negative or non-finite
  /// values).
  void validate() const;
  /// Throws sparsim::Error (its message starting with `prefix`) unless the history is of a model
  /// of `layers` layers with `o_inputs` W_o and `down_inputs` W_down inputs.
  void check_covers(int layers, int o_inputs, int down_inputs, const char* prefix = "") const;
};

/// Probe Pruning's fusion of one channel at one position (the reference's dynamic ratio): with
/// the probe's mean square p and the history's h, r = p / (p + h + 1e−6) and the fused value is
/// (1 − r)·h + r·p.
inline double fuse_probe_history(double p, double h) {
  const double r = p / (p + h + 1e-6);
  return (1.0 - r) * h + r * p;
}

}  // namespace sparsim::calibration
