#pragma once
// The options of sparsim eval: parsed, checked before anything large is loaded, and what the
// checks derive (the task kind, the load options, the checkpoint file).
#include "activation_dump.hpp"
#include "common.hpp"
#include "eval/perplexity.hpp"
#include "eval/retrieval.hpp"
#include "eval/ruler.hpp"
#include "method_setup.hpp"
#include "model/loader.hpp"

#include <string>

namespace sparsim::app {

struct EvalArgs {
  CommonOptions co;
  std::string model_arg, corpus_arg, text_field, tasks_path, storage, bos_mode, out, json_out,
      progress_mode, checkpoint_arg;
  PplOptions ppl;
  int score = -1;
  bool strict = false, bf16_compute = false, no_ppl = false, save_tokens = false, tf_mass = false;
  std::string task, ret_lengths = "2048,4096,8192", ret_depths = "0,0.25,0.5,0.75,1";
  RetrievalOptions ro;
  RulerOptions ruo;
  std::string ruler_lengths, ruler_depths = "0,0.25,0.5,0.75,1";
  MethodArgs ma;
  DumpArgs da;

  // Set by check():
  bool check_only = false;     ///< --check-options: the calibration file is not read
  bool ruler = false;          ///< --task ruler[:subset]
  bool retrieval = false;      ///< --task passkey | kv-needle
  bool show_progress = false;  ///< a progress bar on stderr
  LoadOptions lo;
  std::string checkpoint_path;  ///< empty: no checkpoint

  /// Whether the run reads the corpus: for perplexity, or as the filler of the generated tasks.
  bool reads_corpus() const { return !no_ppl || retrieval || ruler; }

  /// Adds the options to `d` (in the order --help lists them).
  void add_options(po::options_description& d);
  /// After parsing: checks every option that needs no model (the rest is checked once the model
  /// is loaded); throws sparsim::Error naming the option.
  void check(const po::variables_map& vm);
};

}  // namespace sparsim::app
