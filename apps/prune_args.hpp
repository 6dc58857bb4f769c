#pragma once
// The options of sparsim prune: parsed and checked before anything is read or written, and what
// the checks derive for each family of methods (K/V channels, low rank, FLAP, SlimGPT).
#include "common.hpp"
#include "prune_io.hpp"
#include "prune_low_rank.hpp"
#include "transforms/kv_weight_pruning.hpp"
#include "transforms/pruned_gguf.hpp"
#include "transforms/slimgpt.hpp"

#include <string>

namespace sparsim::app {

struct PruneArgs {
  CommonOptions co;
  std::string model_arg, method, calib_path, out, json_out, type, corpus_arg, text_field;
  double ratio = 0.2;
  int flap_windows = 64, flap_tokens = 128;
  pruning::SlimGptOptions slim;
  std::string slim_schedule = "log", slim_hessian = "dense";
  std::string score = "fisher", budget = "adaptive", pair_score = "joint", kv_budget = "balanced";
  double retain = 0.7, k_share = 0.5;
  int flops_context = 2048;
  LowRankPrune lr;
  bool no_whiten = false;

  // Set by check():
  enum class Family { KvChannels, LowRank, Flap, SlimGpt } family = Family::KvChannels;
  /// the files of the structured methods (FLAP, SlimGPT), which gather statistics over the
  /// corpus
  PruneFiles corpus_files;
  pruning::PruneOptions kv;  ///< rap, kvpruner, kvpruner-naive and flap
  pruning::CutType cut;
  bool fisher = true;  ///< K/V channels scored by the calibration's Fisher scores

  /// Adds the options to `d` (in the order --help lists them).
  void add_options(po::options_description& d);
  /// After parsing: checks every option (prune needs no model for that) and fills the
  /// settings of the method's family; throws sparsim::Error naming the option.
  void check(const po::variables_map& vm);
};

}  // namespace sparsim::app
