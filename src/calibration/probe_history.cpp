#include "calibration/probe_history.hpp"

#include "core/error.hpp"

#include <cmath>

namespace sparsim::calibration {

void ProbeHistory::validate() const {
  require(sequences >= 1 && tokens >= 1 && n_layer >= 1 && o_width >= 1 && down_width >= 1,
          "Probe Pruning history: {} sequences of {} tokens, {} layers, widths {} and {} must be "
          "positive",
          sequences, tokens, n_layer, o_width, down_width);
  const std::size_t rows = static_cast<std::size_t>(n_layer) * tokens;
  require(o.size() == rows * o_width && down.size() == rows * down_width,
          "Probe Pruning history: {} W_o and {} W_down values, expected {} and {}", o.size(),
          down.size(), rows * o_width, rows * down_width);
  for (const auto* v : {&o, &down})
    for (std::size_t i = 0; i < v->size(); ++i)
      require(std::isfinite((*v)[i]) && (*v)[i] >= 0.0f,
              "Probe Pruning history: {} mean square {} at index {} is not a finite value ≥ 0",
              v == &o ? "W_o" : "W_down", (*v)[i], i);
}

void ProbeHistory::check_covers(int layers, int o_inputs, int down_inputs,
                                const char* prefix) const {
  require(n_layer == layers && o_width == o_inputs && down_width == down_inputs,
          "{}Probe Pruning's history covers {} layers of {} W_o and {} W_down inputs, the model "
          "has {} of {} and {}",
          prefix, n_layer, o_width, down_width, layers, o_inputs, down_inputs);
}

}  // namespace sparsim::calibration
