#pragma once
// sparsim eval's inputs and results, and its report: the table on stdout, the JSON summary and
// the run file. The run (apps/cmd_eval.cpp) fills an EvalResults; everything here only reads.
#include "common.hpp"
#include "eval/corpus.hpp"
#include "eval/perplexity.hpp"
#include "eval/retrieval.hpp"
#include "eval/ruler.hpp"
#include "eval/tasks.hpp"
#include "eval_args.hpp"
#include "flops/ledger.hpp"
#include "io/hdf5.hpp"
#include "io/summary_columns.hpp"
#include "model/loader.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace sparsim::app {

/// What an eval run reads once the model is loaded: the options, the model, the corpus as
/// tokens and the generated and file tasks.
struct EvalInputs {
  const EvalArgs& a;
  const ResolvedModel& rm;
  const ModelInfo& mi;
  const Config& c;
  Corpus corpus;
  std::vector<int> stream;  ///< the corpus token stream (empty when the run reads no corpus)
  std::vector<TaskItem> tasks;
  std::vector<RetrievalItem> ritems;
  std::vector<RulerItem> ruitems;
  bool add_bos = false;
  std::string backend;
  int threads = 1;
};

/// Seconds spent in each part of an eval run.
struct EvalTimings {
  double load = 0, tokenize = 0, perplexity = 0, tasks = 0, retrieval = 0, ruler = 0, wall = 0;
};

/// What an eval run measured.
struct EvalResults {
  PplResult ppl;
  TaskResult tasks;
  RetrievalResult retrieval;
  RulerResult ruler;
  nlohmann::json ruler_json;  ///< the suite's scores by task, length and depth
  /// --tf-attention-mass: the dense model's similarity and received attention over the first
  /// window, [layer][position].
  std::vector<float> similarity, attention_received;
  EvalTimings t;
  std::size_t resumed_windows = 0;  ///< windows taken from a checkpoint
};

/// The table's lines before the methods' own: model, pruned shapes, corpus and perplexity.
std::string eval_table_head(const EvalInputs& in, const EvalResults& r);
/// The table's lines after the methods' own: generated and file tasks, cost, wall time.
std::string eval_table_tail(const EvalInputs& in, const EvalResults& r, const flops::Ledger& ledger,
                            bool sparse);

/// The JSON summary without the methods' records; `cols` gets the pruned model's columns.
nlohmann::json eval_summary_head(const EvalInputs& in, const EvalResults& r,
                                 const flops::Ledger& ledger, io::SummaryColumns& cols);
/// Adds the generated and file tasks to the summary and its columns, then the columns.
void eval_summary_tail(const EvalInputs& in, const EvalResults& r, nlohmann::json& j,
                       io::SummaryColumns& cols);

/// The run file's header, configuration and results groups (perplexity, tasks, retrieval,
/// ruler).
void write_eval_results(io::Group root, const EvalInputs& in, const EvalResults& r, int argc,
                        char** argv);
/// The run file's attention-mass figure (--tf-attention-mass), timings and pruned-model group.
void write_eval_extras(io::Group root, const EvalInputs& in, const EvalResults& r);

}  // namespace sparsim::app
