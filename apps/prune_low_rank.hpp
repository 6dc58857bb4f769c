#pragma once
// sparsim prune --method palu|svd-llm: low-rank K/V factorisation, the model written as GGUF.
#include "common.hpp"
#include "transforms/low_rank.hpp"

#include <string>

namespace sparsim::app {

/// Everything prune's low-rank path needs, its options already checked at parse time.
struct LowRankPrune {
  CommonOptions co;
  std::string model_arg, calib_path, out, json_out, corpus_arg, text_field, command;
  pruning::LowRankOptions opt;
  int seqs = 16, tokens = 1024;  ///< whitening statistics: consecutive corpus sequences
};

/// Loads the model, gathers the attention inputs' second moments over the corpus (whitened
/// methods), plans the ranks (PaLU: from the calibration's Fisher scores), factorises, writes and
/// reads back the model, prints the report. Returns the exit code.
int prune_low_rank(const LowRankPrune& a);

}  // namespace sparsim::app
