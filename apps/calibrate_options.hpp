#pragma once
// The options of the calibration run, shared by `calibrate` and `profile` (which can compute
// the calibration afresh): declared once, validated once; and the per-stage progress display.
#include "common.hpp"
#include "sparsity/calibrate.hpp"

#include <memory>
#include <string>

namespace sparsim::app {

struct CalibrateCli {
  sparsity::CalibrateOptions opt;
  std::string probes_arg, norms_mode, probe_masking, from_arg;

  /// Declares --context … --sensitivity-from (the calibration text options stay with each
  /// command).
  void add(po::options_description& d);
  /// Parses the lists, checks every value and fills opt; throws sparsim::Error naming the
  /// option.
  void finish();
  /// The option names add() declares (for commands that refuse them in some modes).
  static const std::vector<std::string>& names();
};

/// One progress display per calibration stage ("<variant>: <stage>"), each with its own ETA.
class CalibrationProgress {
 public:
  explicit CalibrationProgress(ProgressBar::Mode mode) : mode_(mode) {}
  /// The callback calibrate_variant reports to, labelling stages with `variant`.
  sparsity::CalibrateProgress callback(const std::string& variant);
  void finish();

 private:
  ProgressBar::Mode mode_;
  std::unique_ptr<ProgressBar> bar_;
  std::string stage_;
};

}  // namespace sparsim::app
