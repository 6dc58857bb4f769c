#pragma once
// The options of the calibration run, shared by `calibrate` and `profile` (which can compute
// the calibration afresh): declared once, validated once.
#include "common.hpp"
#include "sparsity/calibrate.hpp"

#include <string>

namespace sparsim::app {

struct CalibrateCli {
  sparsity::CalibrateOptions opt;
  std::string probes_arg, norms_mode;

  /// Declares --context … --wina-norms (the calibration text options stay with each command).
  void add(po::options_description& d);
  /// Parses --probes, checks every value and fills opt; throws sparsim::Error naming the option.
  void finish();
};

}  // namespace sparsim::app
