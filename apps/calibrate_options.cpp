#include "calibrate_options.hpp"

#include "core/error.hpp"

#include <sstream>

namespace sparsim::app {

void CalibrateCli::add(po::options_description& d) {
  d.add_options()("context", po::value(&opt.context)->default_value(2048),
                  "tokens per histogram window")(
      "max-windows", po::value(&opt.max_windows)->default_value(8),
      "histogram windows (consecutive, from the start of the corpus)")(
      "greedy-seqs", po::value(&opt.greedy_seqs)->default_value(8),
      "sequences feeding the greedy search and the sensitivity probe (from the start of the "
      "corpus)")("greedy-tokens", po::value(&opt.greedy_tokens)->default_value(256),
                 "tokens per greedy sequence")("alpha", po::value(&opt.alpha)->default_value(0.025),
                                               "greedy base step α")(
      "cap", po::value(&opt.cap)->default_value(0.95), "greedy search stops at P >= cap")(
      "greedy-step-cap", po::value(&opt.step_cap)->default_value(0.0),
      "cap on each projection's greedy step α·F/f_i (0: no cap, the paper's rule; e.g. 0.1 "
      "lets small projections such as GQA's k and v move in steps of 0.1 instead of all at "
      "once)")("score-fraction", po::value(&opt.score_fraction)->default_value(0.25),
               "greedy error over the last fraction of each sequence")(
      "probes", po::value(&probes_arg)->default_value("0.2,0.4,0.6,0.8"),
      "sensitivity probe sparsities s̄ (comma-separated)")(
      "delta", po::value(&opt.delta)->default_value(0.01),
      "TopK-Guided clip margin δ of the guided sensitivity probes")(
      "probe-masking", po::value(&probe_masking)->default_value("auto"),
      "masking of the sensitivity probes, comma-separated threshold, topk, guided; auto: "
      "threshold for the plain model, guided and topk for the rotated one")(
      "wina-norms", po::value(&norms_mode)->default_value("kg"),
      "column norms of the topk / guided probes: kg (k and gate), all, or kg,all (both sets)")(
      "sensitivity-from", po::value(&from_arg)->default_value("0,4"),
      "first positions of the sensitivity error, one sensitivity set each (0: every token; 4 "
      "leaves out the first four, the attention-sink tokens)");
}

const std::vector<std::string>& CalibrateCli::names() {
  static const std::vector<std::string> n = {
      "context",       "max-windows",     "greedy-seqs",     "greedy-tokens", "alpha",
      "cap",           "greedy-step-cap", "score-fraction",  "probes",        "delta",
      "probe-masking", "wina-norms",      "sensitivity-from"};
  return n;
}

void CalibrateCli::finish() {
  opt.probes = parse_double_list(probes_arg, "--probes");
  for (double v : opt.probes) require(v > 0 && v < 1, "--probes: {} is outside (0, 1)", v);
  require(opt.context >= 2 && opt.max_windows >= 1, "--context must be ≥ 2 and --max-windows ≥ 1");
  require(opt.greedy_seqs >= 1 && opt.greedy_tokens >= 4,
          "--greedy-seqs must be ≥ 1 and --greedy-tokens ≥ 4");
  require(opt.alpha > 0 && opt.alpha <= 0.5, "--alpha {} is outside (0, 0.5]", opt.alpha);
  require(opt.cap > 0 && opt.cap <= 1, "--cap {} is outside (0, 1]", opt.cap);
  require(opt.step_cap >= 0 && opt.step_cap <= 1, "--greedy-step-cap {} is outside [0, 1]",
          opt.step_cap);
  require(opt.score_fraction > 0 && opt.score_fraction <= 1,
          "--score-fraction {} is outside (0, 1]", opt.score_fraction);
  require(opt.delta >= 0 && opt.delta < 0.5, "--delta {} is outside [0, 0.5)", opt.delta);
  opt.norms_modes.clear();
  for (const std::string& m : split_list(norms_mode)) {
    require(m == "kg" || m == "all", "--wina-norms must be kg, all or kg,all, got '{}'",
            norms_mode);
    const bool all = m == "all";
    for (bool b : opt.norms_modes) require(b != all, "--wina-norms lists '{}' twice", m);
    opt.norms_modes.push_back(all);
  }
  require(!opt.norms_modes.empty(), "--wina-norms is empty");
  opt.probe_rules.clear();
  if (probe_masking != "auto")
    for (const std::string& m : split_list(probe_masking)) {
      require(m == "threshold" || m == "topk" || m == "guided",
              "--probe-masking must be auto or a list of threshold, topk, guided, got '{}'", m);
      opt.probe_rules.push_back(sparsity::parse_probe_rule(m));
    }
  opt.sensitivity_from.clear();
  for (double v : parse_double_list(from_arg, "--sensitivity-from")) {
    require(v >= 0 && v == static_cast<int>(v) && v < opt.greedy_tokens,
            "--sensitivity-from: {} is not a position of the greedy sequences (0 … {})", v,
            opt.greedy_tokens - 1);
    for (int f : opt.sensitivity_from)
      require(f != static_cast<int>(v), "--sensitivity-from lists {} twice", v);
    opt.sensitivity_from.push_back(static_cast<int>(v));
  }
}

sparsity::CalibrateProgress CalibrationProgress::callback(const std::string& variant) {
  return [this, variant](const std::string& what, int done, int total) {
    const std::string label = variant.empty() ? what : variant + ": " + what;
    if (label != stage_) {
      if (bar_) bar_->finish();
      bar_ = std::make_unique<ProgressBar>(label, mode_);
      stage_ = label;
    }
    bar_->update(done, total);
  };
}

void CalibrationProgress::finish() {
  if (bar_) bar_->finish();
  bar_.reset();
  stage_.clear();
}

}  // namespace sparsim::app
