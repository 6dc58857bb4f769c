#include "calibrate_options.hpp"

#include "core/error.hpp"

namespace sparsim::app {

void CalibrateCli::add(po::options_description& d) {
  d.add_options()("context", po::value(&opt.context)->default_value(2048),
                  "tokens per histogram window")(
      "max-windows", po::value(&opt.max_windows)->default_value(8),
      "histogram windows (consecutive, from the start of the corpus)")(
      "greedy-seqs", po::value(&opt.greedy_seqs)->default_value(4),
      "sequences feeding the greedy search and the sensitivity probe")(
      "greedy-tokens", po::value(&opt.greedy_tokens)->default_value(128),
      "tokens per greedy sequence")("alpha", po::value(&opt.alpha)->default_value(0.025),
                                    "greedy base step α")(
      "cap", po::value(&opt.cap)->default_value(0.95), "greedy search stops at P >= cap")(
      "score-fraction", po::value(&opt.score_fraction)->default_value(0.25),
      "greedy error over the last fraction of each sequence")(
      "probes", po::value(&probes_arg)->default_value("0.2,0.4,0.6,0.8"),
      "sensitivity probe sparsities s̄ (comma-separated)")(
      "delta", po::value(&opt.delta)->default_value(0.01),
      "TopK-Guided clip margin δ used when probing the rotated model")(
      "wina-norms", po::value(&norms_mode)->default_value("kg"),
      "projections scored with column norms: kg (k and gate) or all");
}

void CalibrateCli::finish() {
  opt.probes = parse_double_list(probes_arg, "--probes");
  for (double v : opt.probes) require(v > 0 && v < 1, "--probes: {} is outside (0, 1)", v);
  require(opt.context >= 2 && opt.max_windows >= 1, "--context must be ≥ 2 and --max-windows ≥ 1");
  require(opt.greedy_seqs >= 1 && opt.greedy_tokens >= 4,
          "--greedy-seqs must be ≥ 1 and --greedy-tokens ≥ 4");
  require(opt.alpha > 0 && opt.alpha <= 0.5, "--alpha {} is outside (0, 0.5]", opt.alpha);
  require(opt.cap > 0 && opt.cap <= 1, "--cap {} is outside (0, 1]", opt.cap);
  require(opt.score_fraction > 0 && opt.score_fraction <= 1,
          "--score-fraction {} is outside (0, 1]", opt.score_fraction);
  require(opt.delta >= 0 && opt.delta < 0.5, "--delta {} is outside [0, 0.5)", opt.delta);
  require(norms_mode == "kg" || norms_mode == "all", "--wina-norms must be kg or all, got '{}'",
          norms_mode);
  opt.wina_norms_all = norms_mode == "all";
}

}  // namespace sparsim::app
