#include "eval_args.hpp"

#include <unistd.h>
#include <cmath>
#include <limits>

namespace sparsim::app {

void EvalArgs::add_options(po::options_description& d) {
  d.add_options()(
      "model,m", po::value(&model_arg)->default_value("smollm2"),
      "model: a GGUF file, a Hugging Face directory, or the alias smollm2 (SmolLM2-135M-Instruct)")(
      "corpus,c", po::value(&corpus_arg)->default_value("default"),
      "text for perplexity: a file, a directory of files, JSONL (see --text-field), or 'default'")(
      "text-field", po::value(&text_field)->default_value("text"), "JSONL field holding the text")(
      "context", po::value(&ppl.context)->default_value(2048), "tokens per window (C)")(
      "stride", po::value(&ppl.stride)->default_value(512), "tokens between window starts (R)")(
      "score", po::value(&score)->default_value(-1),
      "trailing tokens scored per window (S; -1: equal to the stride)")(
      "batch", po::value(&ppl.batch)->default_value(1), "windows per forward pass")(
      "max-windows", po::value(&ppl.max_windows)->default_value(0),
      "stop after N windows (0: all)")(
      "bos", po::value(&bos_mode)->default_value("auto"),
      "prepend BOS to each window: auto (the model's add_bos setting), yes or no")(
      "no-perplexity", po::bool_switch(&no_ppl), "skip perplexity (tasks only)")(
      "tasks", po::value(&tasks_path), "multiple-choice tasks: JSONL {context, choices, gold}")(
      "task", po::value(&task),
      "generated long-context retrieval task: passkey (a number hidden in corpus text) or "
      "kv-needle (the value of a named key); scored by exact match of the greedy answer; or "
      "ruler[:subset], the generated suite (docs/eval.md): subset is a comma list of "
      "niah_single, niah_multikey, niah_multivalue, niah_multiquery, niah (those four), vt, cwe, "
      "fwe; all when omitted")("retrieval-lengths",
                               po::value(&ret_lengths)->default_value(ret_lengths),
                               "retrieval prompt lengths in tokens, comma separated")(
      "retrieval-depths", po::value(&ret_depths)->default_value(ret_depths),
      "retrieval needle depths in [0, 1], comma separated")(
      "retrieval-samples", po::value(&ro.samples)->default_value(1),
      "retrieval prompts per (length, depth) cell")("retrieval-seed",
                                                    po::value(&ro.seed)->default_value(1),
                                                    "retrieval keys, names and filler offsets")(
      "retrieval-digits", po::value(&ro.digits)->default_value(5),
      "digits of the retrieved number")(
      "ruler-lengths", po::value(&ruler_lengths),
      "ruler: lengths in tokens (prompt + generation budget), comma separated (default: 1024, "
      "2048, … up to the model's context)")(
      "ruler-depths", po::value(&ruler_depths)->default_value(ruler_depths),
      "ruler: needle depths in [0, 1] of the niah tasks, cycled over a cell's samples")(
      "ruler-samples", po::value(&ruo.samples)->default_value(20),
      "ruler: prompts per (task, length) cell")(
      "ruler-seed", po::value(&ruo.seed)->default_value(1),
      "ruler: seed of the generated prompts (an item depends on seed, task, length and sample "
      "only, so a subset builds the same prompts)");
  ma.add_options(d);
  d.add_options()("tf-attention-mass", po::bool_switch(&tf_mass),
                  "Token Filtering: also run the dense model over the first window and record, "
                  "per layer and position, the similarity S and the attention the token receives "
                  "from later tokens (run file /token_filter/attention_mass; needs --out)");
  d.add_options()("storage", po::value(&storage)->default_value("f32"),
                  "weight storage: f32, bf16 or f16")(
      "bf16-compute", po::bool_switch(&bf16_compute), kBf16ComputeHelp)(
      "strict", po::bool_switch(&strict), "NaN/Inf in the weights is an error, not a warning")(
      "out,o", po::value(&out), "run file (HDF5): config, fingerprints, per-window NLL, FLOPs")(
      "json", po::value(&json_out), "JSON summary file")(
      "checkpoint", po::value(&checkpoint_arg)->default_value("auto"),
      "side file keeping the completed perplexity windows, so that running the same command "
      "again continues an interrupted run (bitwise the same result): auto (<--out or "
      "--json>.ckpt, written every 30 s and when interrupted; none without an output file, "
      "with --dump-layers or with token-filter), off, or a file name")(
      "save-tokens", po::bool_switch(&save_tokens),
      "store the corpus token stream in the run file (/corpus/tokens)")(
      "progress", po::value(&progress_mode)->default_value("auto"),
      "progress bar on stderr: auto (when a terminal), always, never");
  da.add_options(d);
  add_common_options(d, co);
  add_check_option(d);
}

void EvalArgs::check(const po::variables_map& vm) {
  check_only = vm["check-options"].as<bool>();
  ma.resolve(&vm, /*read_calibration=*/!check_only);
  // Without the calibration file (--check-options) the layer count is not known yet.
  da.resolve(vm, ma.sparse(), !out.empty(),
             ma.cal ? ma.cal->n_layer : (check_only ? std::numeric_limits<int>::max() : 0));
  ruler = task == "ruler" || task.rfind("ruler:", 0) == 0;
  retrieval = !task.empty() && !ruler;
  for (const char* o : {"ruler-lengths", "ruler-depths", "ruler-samples", "ruler-seed"})
    require(ruler || !vm.count(o) || vm[o].defaulted(), "--{} needs --task ruler[:subset]", o);
  if (ruler) {
    ruo.tasks = parse_ruler_subset(task.size() > 6 ? task.substr(6) : "");
    for (double x :
         parse_double_list(ruler_lengths.empty() ? "1024" : ruler_lengths, "--ruler-lengths")) {
      require(x == std::floor(x) && x >= 1 && x < 1e9, "--ruler-lengths: {} is not a token count",
              x);
      ruo.lengths.push_back(static_cast<int>(x));
    }
    ruo.depths = parse_double_list(ruler_depths, "--ruler-depths");
    ruo.batch = ppl.batch;
    check_as_options([&] { ruo.check_values(); });  // the model's context: once it is loaded
    if (ruler_lengths.empty()) ruo.lengths.clear();
  }
  if (retrieval) {
    require(task == "passkey" || task == "kv-needle",
            "--task must be passkey, kv-needle or ruler[:subset], got '{}'", task);
    ro.kind = task == "passkey" ? "passkey" : "kv";
    ro.lengths.clear();
    for (double x : parse_double_list(ret_lengths, "--retrieval-lengths")) {
      require(x == std::floor(x) && x >= 1 && x < 1e9,
              "--retrieval-lengths: {} is not a token count", x);
      ro.lengths.push_back(static_cast<int>(x));
    }
    ro.depths = parse_double_list(ret_depths, "--retrieval-depths");
    ro.batch = ppl.batch;
    check_as_options([&] { ro.check_values(); });  // the model's context: once it is loaded
  }
  require(!tf_mass || (ma.token_filter && !out.empty() && !no_ppl),
          "--tf-attention-mass needs --method with token-filter, perplexity and --out");
  require(bos_mode == "auto" || bos_mode == "yes" || bos_mode == "no",
          "--bos must be auto, yes or no, got '{}'", bos_mode);
  require(progress_mode == "auto" || progress_mode == "always" || progress_mode == "never",
          "--progress must be auto, always or never, got '{}'", progress_mode);
  require(!(no_ppl && tasks_path.empty() && !retrieval && !ruler),
          "--no-perplexity needs --tasks or --task");
  // Without --score a window scores its last stride tokens: said here, where the message can
  // name both options (a context under 2 tokens is the window check's below).
  if (!no_ppl && score < 0 && ppl.context >= 2)
    require(ppl.stride < ppl.context,
            "--stride {} is not smaller than --context {}: without --score each window scores "
            "its last stride tokens, which must be fewer than the context (lower --stride, or "
            "set --score)",
            ppl.stride, ppl.context);
  ppl.score = score < 0 ? ppl.stride : score;
  // Fail on bad arguments before loading anything big.
  if (!no_ppl) check_as_options([&] { ppl.check_values(); });
  lo.storage = parse_dtype(storage);
  lo.strict = strict;
  lo.bf16_compute = bf16_compute;
  check_as_options([&] { check_load_options(lo); });
  show_progress = progress_mode == "always" || (progress_mode == "auto" && ::isatty(STDERR_FILENO));
  if (!no_ppl && checkpoint_arg == "auto") {
    const std::string& base = !out.empty() ? out : json_out;
    if (!base.empty() && !da.enabled() && !ma.token_filter && !ma.kv_prune && !ma.probe_pruning)
      checkpoint_path = base + ".ckpt";
  } else if (!no_ppl && checkpoint_arg != "off") {
    require(!checkpoint_arg.empty(), "--checkpoint: give auto, off or a file name");
    require(!da.enabled(),
            "--checkpoint cannot be combined with --dump-layers (dumped activations are not kept "
            "in the checkpoint)");
    require(!ma.token_filter,
            "--checkpoint cannot be combined with a token-filter method (the gate's state and "
            "statistics are not kept in the checkpoint)");
    require(!ma.kv_prune,
            "--checkpoint cannot be combined with think or grace (the per-head channel records "
            "are not kept in the checkpoint)");
    require(!ma.probe_pruning,
            "--checkpoint cannot be combined with probe-pruning (the per-batch records are not "
            "kept in the checkpoint)");
    checkpoint_path = checkpoint_arg;
  }
  require(co.threads >= 0 && co.threads <= 4096, "--threads {} is out of range", co.threads);
}

}  // namespace sparsim::app
