// sparsim eval: perplexity over sliding windows and multiple-choice tasks, recorded in a run
// file and a JSON summary.
#include "activation_dump.hpp"
#include "common.hpp"
#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "eval/corpus.hpp"
#include "eval/perplexity.hpp"
#include "eval/retrieval.hpp"
#include "eval/ruler.hpp"
#include "eval/tasks.hpp"
#include "eval_checkpoint.hpp"
#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "method_stack.hpp"
#include "model/loader.hpp"
#include "model_io.hpp"
#include "records.hpp"
#include "run_summary.hpp"
#include "sparsity/plan.hpp"
#include "sparsity_report.hpp"
#include "transforms/flap.hpp"
#include "transforms/kv_weight_pruning.hpp"
#include "transforms/low_rank.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>

namespace sparsim::app {

namespace {

/// Seconds between two writes of the checkpoint (it is also written when the run is
/// interrupted, and before the tasks).
constexpr double kCheckpointSeconds = 30.0;

/// Options that cannot change a perplexity window's result: left out of the settings a
/// checkpoint is matched by. (Results do not depend on --batch or --threads, bitwise.)
const std::set<std::string> kNotSettings = {"batch",       "threads",    "progress",  "out",
                                            "json",        "checkpoint", "log-level", "help",
                                            "save-tokens", "tasks",      "model",     "corpus"};

}  // namespace

int cmd_eval(int argc, char** argv) {
  CommonOptions co;
  std::string model_arg, corpus_arg, text_field, tasks_path, storage, bos_mode, out, json_out,
      progress_mode, checkpoint_arg;
  PplOptions po_;
  int score = -1;
  bool strict = false, bf16_compute = false, no_ppl = false, save_tokens = false, tf_mass = false;
  std::string task, ret_lengths = "2048,4096,8192", ret_depths = "0,0.25,0.5,0.75,1";
  RetrievalOptions ro;
  RulerOptions ruo;
  std::string ruler_lengths, ruler_depths = "0,0.25,0.5,0.75,1";
  MethodArgs ma;
  DumpArgs da;
  po::options_description d("sparsim eval options");
  d.add_options()(
      "model,m", po::value(&model_arg)->default_value("smollm2"),
      "model: a GGUF file, a Hugging Face directory, or the alias smollm2 (SmolLM2-135M-Instruct)")(
      "corpus,c", po::value(&corpus_arg)->default_value("default"),
      "text for perplexity: a file, a directory of files, JSONL (see --text-field), or 'default'")(
      "text-field", po::value(&text_field)->default_value("text"), "JSONL field holding the text")(
      "context", po::value(&po_.context)->default_value(2048), "tokens per window (C)")(
      "stride", po::value(&po_.stride)->default_value(512), "tokens between window starts (R)")(
      "score", po::value(&score)->default_value(-1),
      "trailing tokens scored per window (S; -1: equal to the stride)")(
      "batch", po::value(&po_.batch)->default_value(1), "windows per forward pass")(
      "max-windows", po::value(&po_.max_windows)->default_value(0),
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
  po::variables_map vm;
  if (!parse(argc, argv, "usage: sparsim eval [--model smollm2] [--corpus default] [options]", d,
             vm))
    return 0;
  const bool check_only = vm["check-options"].as<bool>();
  ma.resolve(&vm, /*read_calibration=*/!check_only);
  // Without the calibration file (--check-options) the layer count is not known yet.
  da.resolve(vm, ma.sparse(), !out.empty(),
             ma.cal ? ma.cal->n_layer : (check_only ? std::numeric_limits<int>::max() : 0));
  const bool ruler = task == "ruler" || task.rfind("ruler:", 0) == 0;
  const bool retrieval = !task.empty() && !ruler;
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
    ruo.batch = po_.batch;
    ruo.validate(1 << 30);  // the model's context is checked once it is loaded
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
    ro.batch = po_.batch;
    ro.validate(1 << 30);  // the model's context is checked once it is loaded
  }
  require(!tf_mass || (ma.token_filter && !out.empty() && !no_ppl),
          "--tf-attention-mass needs --method with token-filter, perplexity and --out");
  const std::string& method = ma.method;
  const std::string& calib_path = ma.calib_path;
  require(bos_mode == "auto" || bos_mode == "yes" || bos_mode == "no",
          "--bos must be auto, yes or no, got '{}'", bos_mode);
  require(progress_mode == "auto" || progress_mode == "always" || progress_mode == "never",
          "--progress must be auto, always or never, got '{}'", progress_mode);
  require(!(no_ppl && tasks_path.empty() && !retrieval && !ruler),
          "--no-perplexity needs --tasks or --task");
  if (!no_ppl)
    require(po_.context >= 2, "--context must be at least 2 tokens (one predicts the next), got {}",
            po_.context);
  if (!no_ppl && score < 0)
    require(po_.stride < po_.context,
            "--stride {} is not smaller than --context {}: without --score each window scores "
            "its last stride tokens, which must be fewer than the context (lower --stride, or "
            "set --score)",
            po_.stride, po_.context);
  po_.score = score < 0 ? po_.stride : score;
  LoadOptions lo;
  lo.storage = parse_dtype(storage);
  lo.strict = strict;
  lo.bf16_compute = bf16_compute;
  check_load_options(lo);
  const bool show_progress =
      progress_mode == "always" || (progress_mode == "auto" && ::isatty(STDERR_FILENO));
  // Fail on bad arguments before loading anything big.
  if (!no_ppl) po_.validate(0);
  std::string checkpoint_path;
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
  if (options_checked(vm)) return 0;
  const ResolvedModel rm = resolve_model(model_arg);
  io::guard_run({{"--model", rm.path},
                 {"--corpus", no_ppl && !retrieval && !ruler ? "" : corpus_input_path(corpus_arg)},
                 {"--tasks", tasks_path},
                 {"--calibration", calib_path}},
                {{"--out", out},
                 {"--json", json_out},
                 {checkpoint_arg == "auto" ? "the checkpoint (--checkpoint auto)" : "--checkpoint",
                  checkpoint_path, false, true}});
  log().info("model {} ({})", rm.path, rm.origin);
  Stopwatch wall;
  Corpus corpus;
  std::vector<TaskItem> tasks;
  if (!no_ppl || retrieval || ruler) corpus = load_corpus(corpus_arg, CorpusOptions{text_field});
  if (!tasks_path.empty()) tasks = load_tasks(tasks_path);

  Runtime rt(co);
  const std::string backend = resolve_backend(co.backend);
  return with_backend(co.backend, [&](auto exec) {
    using E = decltype(exec);
    Stopwatch sw;
    ModelInfo mi;
    std::shared_ptr<const Weights<E>> w = load_model<E>(rm.path, lo, &mi);
    const double t_load = sw.seconds();
    // (rotated plans replace w: take the config reference afterwards)
    const sparsity::Plan plan = prepare_method(ma, mi, w, lo.storage);
    const Config& c = w->cfg;
    const Tokenizer tok = tokenizer_for(rm.path);
    require(tok.vocab_size() <= c.vocab,
            "the tokenizer has {} tokens but the model's embedding only {}", tok.vocab_size(),
            c.vocab);
    const bool add_bos =
        bos_mode == "yes" || (bos_mode == "auto" && tok.add_bos_default() && tok.bos_id() >= 0);
    require(!(bos_mode == "yes" && tok.bos_id() < 0), "--bos yes: the model has no BOS token");
    po_.bos_id = add_bos ? tok.bos_id() : -1;
    if (!no_ppl) po_.validate(c.context_length);
    if (retrieval) ro.validate(c.context_length);
    if (ruler) {
      if (ruo.lengths.empty()) ruo.lengths = RulerOptions::default_lengths(c.context_length);
      ruo.validate(c.context_length);
    }
    if (ma.token_filter) ma.tf.validate(c.n_layer);
    if (ma.kv_prune) {
      require_uniform_key_width(c);
      ma.kv.validate(attn_shape(c, 0).qk_dim);
      require(no_ppl || ma.kv.window <= po_.context - po_.score - 1,
              "--kv-window {}: the observation window is longer than the {} tokens prefilled "
              "before the {} scored ones of a window (--context {} − --score {} − 1)",
              ma.kv.window, po_.context - po_.score - 1, po_.score, po_.context, po_.score);
      if (retrieval)
        require(ma.kv.window <= *std::min_element(ro.lengths.begin(), ro.lengths.end()),
                "--kv-window {}: the observation window is longer than the shortest retrieval "
                "prompt",
                ma.kv.window);
    }

    sw.reset();
    std::vector<int> stream;
    std::uint64_t corpus_tokens = 0;
    if (!no_ppl || retrieval || ruler) {
      stream = corpus_stream(corpus, tok);
      corpus_tokens = stream.size();
    }
    std::vector<RetrievalItem> ritems;
    if (retrieval) ritems = build_retrieval(ro, tok, stream, add_bos);
    std::vector<RulerItem> ruitems;
    if (ruler) ruitems = build_ruler(ruo, tok, stream, ruler_words(corpus.documents), add_bos);
    const double t_tok = sw.seconds();

    // The cache must hold a whole window, and the longest context + choice of any task item.
    int ctx_needed = no_ppl ? 0 : po_.context;
    for (const auto& it : tasks)
      for (const auto& choice : it.choices) {
        const int len = static_cast<int>(tok.encode(it.context + choice, add_bos).size()) + 1;
        require(len <= c.context_length,
                "tasks: an item of {} tokens exceeds the model's context of {} tokens", len,
                c.context_length);
        ctx_needed = std::max(ctx_needed, len);
      }
    int shortest = no_ppl ? 0 : po_.context;  // the sequences the token gate sees
    // the prompts prefilled before scored or decoded tokens (K-channel pruning's observations)
    int shortest_prefill = no_ppl ? std::numeric_limits<int>::max() : po_.context - po_.score - 1;
    if (ma.kv_prune || ma.evict())
      for (const auto& it : tasks)
        shortest_prefill =
            std::min(shortest_prefill,
                     std::max(1, static_cast<int>(tok.encode(it.context, add_bos).size())) - 1);
    if (retrieval) {
      for (int L : ro.lengths) ctx_needed = std::max(ctx_needed, L + ro.answer_tokens());
      const int mn = *std::min_element(ro.lengths.begin(), ro.lengths.end());
      shortest = shortest ? std::min(shortest, mn) : mn;
      shortest_prefill = std::min(shortest_prefill, mn);
    }
    if (ruler) {
      int mn = std::numeric_limits<int>::max();
      for (const auto& it : ruitems) {
        ctx_needed = std::max(ctx_needed, static_cast<int>(it.prompt.size()) + it.gen_tokens);
        mn = std::min(mn, static_cast<int>(it.prompt.size()));
      }
      if (ma.kv_prune)
        require(ma.kv.window <= mn,
                "--kv-window {}: the observation window is longer than the shortest ruler prompt "
                "({} tokens)",
                ma.kv.window, mn);
      shortest = shortest ? std::min(shortest, mn) : mn;
      shortest_prefill = std::min(shortest_prefill, mn);
    }
    if (shortest == 0) shortest = ctx_needed;  // tasks only: the longest item
    flops::Ledger ledger(c.n_layer);
    Engine<E> eng(w, (no_ppl && !retrieval && !ruler) ? 1 : po_.batch, std::max(ctx_needed, 2),
                  &ledger, exec);
    MethodStack<E> stack(ma, eng, plan, {shortest, shortest_prefill});
    sparsity::ActivationMasker<E>& masker = stack.masker();
    std::unique_ptr<DumpingMasker<E>> dumper;
    if (da.enabled()) {
      dumper = std::make_unique<DumpingMasker<E>>(masker, da, *w);
      eng.set_masker(dumper.get());
    }

    // Checkpoint: the windows an interrupted run of the same settings completed.
    std::optional<EvalCheckpoint> ckpt;
    PplResume resume;
    std::size_t resumed = 0, saved = 0;
    const int n_windows = no_ppl ? 0 : static_cast<int>(window_starts(stream.size(), po_).size());
    if (!checkpoint_path.empty()) {
      const std::string settings =
          fmt::format(
              "sparsim = {}\nmodel.fingerprint = {}\ncorpus.fingerprint = {}\n"
              "corpus.tokens = {}\ncalibration.file = {}\nbackend = {}\nbos = {}\n",
              SPARSIM_VERSION, mi.fingerprint, corpus.fingerprint, stream.size(),
              file_stamp(calib_path), backend, po_.bos_id) +
          option_settings(vm, kNotSettings);
      ckpt.emplace(checkpoint_path, settings);
      EvalProgress got;
      if (ckpt->read(got, c.n_layer)) {
        require(got.masker.has_value() == ma.sparse(),
                "checkpoint '{}' {} masker statistics, but this run is {}", checkpoint_path,
                got.masker ? "holds" : "lacks", ma.sparse() ? "sparse" : "dense");
        resume.done = std::move(got.ppl);
        ledger = got.ledger;
        if (got.masker) masker.restore(*got.masker);
        resumed = saved = resume.done.window_nll.size();
        log().info("continuing from checkpoint '{}': {} of {} windows were done", checkpoint_path,
                   resumed, n_windows);
      }
    }
    EvalProgress last;  // the state after the last completed batch
    Stopwatch since_save;
    auto save = [&] {
      ckpt->write(last);
      saved = last.ppl.window_nll.size();
      since_save.reset();
      interrupt::set_note(
          fmt::format("{} of {} windows are kept in '{}': run the same command again to continue",
                      saved, n_windows, checkpoint_path));
    };
    if (ckpt) {
      resume.after_batch = [&](const PplResult& r) {
        last.ppl = r;
        last.ledger = ledger;
        if (ma.sparse()) last.masker = masker.snapshot();
        if (since_save.seconds() >= kCheckpointSeconds) save();
      };
    }

    std::unique_ptr<io::RunFile> rf;
    if (!out.empty()) rf = std::make_unique<io::RunFile>(out);

    PplResult ppl;
    sw.reset();
    if (!no_ppl) {
      ProgressBar bar("perplexity", show_progress);
      try {
        ppl = perplexity(
            eng, stream, po_, [&](int done, int total) { bar.update(done, total); }, &resume);
      } catch (const Interrupted&) {
        bar.finish();
        if (ckpt && last.ppl.window_nll.size() > saved) save();
        throw;
      }
      bar.finish();
      if (ckpt && (!tasks.empty() || retrieval || ruler) && ppl.window_nll.size() > saved) {
        last.ppl = ppl;
        last.ledger = ledger;
        if (ma.sparse()) last.masker = masker.snapshot();
        save();
      }
    }
    const double t_ppl = sw.seconds();
    TaskResult tr;
    sw.reset();
    if (!tasks.empty()) {
      ProgressBar bar("tasks", show_progress);
      tr = score_tasks(eng, tok, tasks, add_bos,
                       [&](int done, int total) { bar.update(done, total); });
      bar.finish();
    }
    const double t_tasks = sw.seconds();
    RetrievalResult rr;
    sw.reset();
    if (retrieval) {
      ProgressBar bar("retrieval", show_progress);
      rr = run_retrieval(eng, tok, ritems, ro,
                         [&](int done, int total) { bar.update(done, total); });
      bar.finish();
    }
    const double t_ret = sw.seconds();
    RulerResult rur;
    sw.reset();
    if (ruler) {
      ProgressBar bar("ruler", show_progress);
      rur =
          run_ruler(eng, tok, ruitems, ruo, [&](int done, int total) { bar.update(done, total); });
      bar.finish();
    }
    const double t_ruler = sw.seconds();
    // The dense model's similarity and received attention over the first window (Figure 2).
    std::vector<float> fig_s, fig_mass;
    if (tf_mass) {
      gating::TokenFilterOptions fo = ma.tf;
      fo.ratio = 0;
      fo.layers = gating::LayerSet::Uniform;
      fo.num_layers = c.n_layer;
      fo.observe_only = true;
      fo.trace_sequences = 1;
      fo.drop_skipped = false;
      Engine<E> de(w, 1, po_.context, nullptr, exec);
      const AttnShape sh = de.cache().shape(0);
      gating::TokenFilter<E> obs(fo, c.n_layer, sh.n_kv_head, sh.qk_dim, sh.v_dim, 1);
      de.set_token_gate(&obs);
      de.record_attention_mass(true);
      std::vector<int> win;
      if (po_.bos_id >= 0) win.push_back(po_.bos_id);
      win.insert(win.end(), stream.begin(), stream.begin() + (po_.context - win.size()));
      de.forward_tail({win}, 0, 1);
      for (int l = 0; l < c.n_layer; ++l) {
        const auto& trace = obs.traces().at(0).at(static_cast<std::size_t>(l));
        fig_s.insert(fig_s.end(), trace.similarity.begin(), trace.similarity.end());
        const auto m = de.attention_mass(l), q = de.attention_mass_queries(l);
        for (int p = 0; p < po_.context; ++p)
          fig_mass.push_back(q[static_cast<std::size_t>(p)] > 0
                                 ? static_cast<float>(m[static_cast<std::size_t>(p)] /
                                                      (q[static_cast<std::size_t>(p)] * c.n_head))
                                 : std::numeric_limits<float>::quiet_NaN());
      }
    }
    const double wall_s = wall.seconds();
    const std::vector<double>& token_sp = masker.token_sparsity();
    const SparsityReport report{plan, masker.all_stats(), token_sp, calib_path};
    const bool sparse = ma.sparse();

    // ---- stdout table
    std::cout << fmt::format(
        "model     {}  [{}]\n          fingerprint {}, {} params, {} storage\n", mi.path, rm.origin,
        mi.fingerprint, c.n_params(), storage);
    if (c.pruned()) {
      const pruning::PruneReport pr = pruning::prune_report(c);
      std::cout << fmt::format(
          "          pruned ({}, retain {:.2f}): KV cache {:.3f}, attention parameters {:.3f}, "
          "FLOPs {:.3f} of the full model, orphan ratio {:.3f}\n",
          pr.method, pr.retain, pr.kv_bytes_fraction, pr.attn_params_fraction,
          pr.attn_flops_fraction, pr.orphan_ratio);
    }
    if (c.low_rank_kv()) {
      const pruning::LowRankReport lr = pruning::low_rank_summary(c);
      std::cout << fmt::format(
          "          low-rank K/V ({}, ρ {:.2f}): KV cache {:.3f}, attention parameters {:.3f}, "
          "FLOPs {:.3f} (prefill), {:.3f} (decode step) of the full model\n",
          lr.method, lr.retain, lr.kv_bytes_fraction, lr.attn_params_fraction,
          lr.attn_flops_fraction, lr.attn_decode_flops_fraction);
    }
    if (!no_ppl) {
      std::cout << fmt::format(
          "corpus    {}  ({} documents, {} bytes, {} tokens, fingerprint {})\n", corpus.source,
          corpus.documents.size(), corpus.bytes, corpus_tokens, corpus.fingerprint);
      std::cout << fmt::format(
          "windows   {} of {} tokens, stride {}, scoring the last {}, BOS {}\n",
          ppl.window_nll.size(), po_.context, po_.stride, po_.score, add_bos ? "yes" : "no");
      std::cout << fmt::format("\n  {:<22} {:>14}\n", "metric", "value");
      std::cout << fmt::format("  {:<22} {:>14.4f}\n", "perplexity", ppl.perplexity());
      std::cout << fmt::format("  {:<22} {:>14.4f}\n", "nll / token (nats)",
                               ppl.nll_sum / std::max<std::uint64_t>(1, ppl.tokens_scored));
      std::cout << fmt::format("  {:<22} {:>14}\n", "tokens scored", ppl.tokens_scored);
      std::cout << fmt::format(
          "  {:<22} {:>14.4f}\n", "top-1 accuracy",
          static_cast<double>(ppl.argmax_hits) / std::max<std::uint64_t>(1, ppl.tokens_scored));
      const PplSpread sp = ppl_spread(ppl);
      if (sp.windows > 1)
        std::cout << fmt::format("  {:<22} {:>14}\n", "perplexity 95% CI",
                                 fmt::format("{:.3f} … {:.3f}", sp.ci95[0], sp.ci95[1]));
    }
    if (sparse) std::cout << report.table() << "\n";
    const nlohmann::json mrec = stack.records();
    std::cout << stack.table(mrec);
    if (retrieval)
      std::cout << fmt::format("  {:<22} {:>14.4f}\n", fmt::format("{} accuracy", task),
                               rr.accuracy);
    nlohmann::json rj;
    if (ruler) {
      rj = ruler_json(ruo, ruitems, rur);
      for (const auto& t : ruo.tasks)
        std::cout << fmt::format(
            "  {:<22} {:>14}\n", fmt::format("ruler {}", t),
            fmt::format("{:.4f} ({})", rj["by_task"][t]["accuracy"].get<double>(),
                        rj["by_task"][t]["items"].get<int>()));
      std::cout << fmt::format("  {:<22} {:>14.4f}\n", "ruler accuracy",
                               rj["accuracy"].get<double>());
    }
    if (!tasks.empty()) {
      std::cout << fmt::format("  {:<22} {:>14.4f}\n", "tasks acc", tr.acc);
      std::cout << fmt::format("  {:<22} {:>14.4f}\n", "tasks acc_norm", tr.acc_norm);
      std::cout << fmt::format("  {:<22} {:>14}\n", "task items", tr.items);
    }
    std::cout << cost_table(ledger, sparse);
    std::cout << fmt::format("  {:<22} {:>14.3f}\n", "wall seconds", wall_s);
    std::cout << fmt::format("  {:<22} {:>14}\n", "backend / threads",
                             fmt::format("{} / {}", backend, rt.threads()));

    nlohmann::json j;
    j["method"] = method;
    j["model"] = {{"path", mi.path}, {"fingerprint", mi.fingerprint}, {"origin", rm.origin}};
    j["storage"] = storage;
    j["bf16_compute"] = bf16_compute;
    j["threads"] = rt.threads();
    j["backend"] = backend;
    j["wall_seconds"] = wall_s;
    {
      const nlohmann::json cost = cost_json(ledger);
      j["flops"] = cost["flops"];
      j["bytes"] = cost["bytes"];
    }
    if (sparse) j["sparsity"] = report.json();
    io::SummaryColumns cols;  // the sweep table's columns of each family present
    if (c.pruned()) {
      const pruning::PruneReport pr = pruning::prune_report(c);
      j["pruned"] = pr.json();
      pr.add_columns(cols);
    }
    if (c.low_rank_kv()) j["low_rank"] = pruning::low_rank_summary(c).json();
    j["n_params"] = c.n_params();
    if (c.structured()) {  // FLAP: kept heads and FFN widths against the full model
      Config full = c;
      full.structure.clear();
      nlohmann::json sj = pruning::flap_report(full, c, 1.0 - c.prune.retain).json();
      sj["n_params_full"] = full.n_params();
      sj["recipe"] = c.prune.recipe;
      j["structured"] = sj;
    }
    if (!no_ppl) {
      j["perplexity"] = ppl.perplexity();
      const PplSpread sp = ppl_spread(ppl);
      j["perplexity_spread"] = {{"mean_nll_per_window", sp.mean_nll},
                                {"se", sp.se},
                                {"ci95", {sp.ci95[0], sp.ci95[1]}},
                                {"what", "exp(mean ± 1.96 se) of the windows' per-token NLL"}};
      j["tokens_scored"] = ppl.tokens_scored;
      j["windows"] = ppl.window_nll.size();
      j["corpus"] = {{"source", corpus.source},
                     {"fingerprint", corpus.fingerprint},
                     {"bytes", corpus.bytes},
                     {"tokens", corpus_tokens}};
      j["protocol"] = {
          {"context", po_.context}, {"stride", po_.stride}, {"score", po_.score}, {"bos", add_bos}};
    } else {
      j["perplexity"] = nullptr;
      j["tokens_scored"] = 0;
      j["windows"] = 0;
      j["corpus"] = {{"fingerprint", nullptr}};
    }
    stack.add_to_summary(mrec, j, cols);
    if (retrieval) {
      nlohmann::json cells = nlohmann::json::array();
      for (std::size_t li = 0; li < ro.lengths.size(); ++li)
        for (std::size_t di = 0; di < ro.depths.size(); ++di)
          cells.push_back({{"length", ro.lengths[li]},
                           {"depth", ro.depths[di]},
                           {"accuracy", rr.cell_accuracy[li * ro.depths.size() + di]},
                           {"items", ro.samples}});
      j["retrieval"] = {
          {"task", task},          {"accuracy", rr.accuracy}, {"items", ritems.size()},
          {"lengths", ro.lengths}, {"depths", ro.depths},     {"samples", ro.samples},
          {"seed", ro.seed},       {"digits", ro.digits},     {"cells", cells},
          {"correct", rr.correct}};  // per prompt, in item order (paired comparisons)
      cols.add("retrieval_task", task, "", "generated retrieval task");
      cols.add("retrieval_accuracy", rr.accuracy, "1",
               "retrieval accuracy over every (length, depth) cell's prompts");
      cols.add("retrieval_items", static_cast<double>(ritems.size()), "1",
               "retrieval prompts scored");
    }
    if (ruler) {
      j["ruler"] = rj;
      cols.add("ruler_accuracy", rj["accuracy"].get<double>(), "1",
               "long-context suite accuracy: share of items whose continuation holds every answer");
      cols.add("ruler_items", rj["items_total"].get<double>(), "1",
               "long-context suite items scored");
    }
    if (!tasks.empty())
      j["tasks"] = {
          {"file", tasks_path}, {"items", tr.items}, {"acc", tr.acc}, {"acc_norm", tr.acc_norm}};
    // (tasks have fixed columns of the sweep table: tasks_acc, tasks_acc_norm, task_items)
    j["columns"] = cols.json();

    if (rf) {
      io::Group root = rf->root();
      write_run_header(root, argc, argv, backend, rt.threads(), mi, c, lo.storage, lo.bf16_compute);
      io::Group cfg = root.create_group("config");
      cfg.set_attr("method", method);
      cfg.set_attr("context", po_.context);
      cfg.set_attr("stride", po_.stride);
      cfg.set_attr("score", po_.score);
      cfg.set_attr("batch", po_.batch);
      cfg.set_attr("max_windows", po_.max_windows);
      cfg.set_attr("bos", add_bos ? 1 : 0);
      cfg.set_attr("model_origin", rm.origin);
      io::Group res = root.create_group("results");
      if (!no_ppl) {
        io::Group cg = root.create_group("corpus");
        cg.set_attr("source", corpus.source);
        cg.set_attr("fingerprint", corpus.fingerprint);
        cg.set_attr("bytes", static_cast<std::int64_t>(corpus.bytes));
        cg.set_attr("documents", static_cast<std::int64_t>(corpus.documents.size()));
        cg.set_attr("tokens", static_cast<std::int64_t>(corpus_tokens));
        if (save_tokens) {
          std::vector<std::int32_t> t32(stream.begin(), stream.end());
          cg.write<std::int32_t>("tokens", t32, {"token id", "the corpus token stream"});
        }
        io::Group pg = res.create_group("perplexity");
        pg.set_attr("perplexity", ppl.perplexity());
        pg.set_attr("tokens_scored", static_cast<std::int64_t>(ppl.tokens_scored));
        pg.set_attr("nll_sum", ppl.nll_sum);
        pg.write<double>("window_nll", ppl.window_nll, {"nat", "summed NLL of the scored tokens"});
        pg.write<std::uint64_t>("window_tokens", ppl.window_tokens, {"token", "tokens scored"});
        pg.write<std::uint64_t>("window_start", ppl.window_start,
                                {"token", "window start offset in the corpus token stream"});
      }
      if (!tasks.empty()) {
        io::Group tg = res.create_group("tasks");
        tg.set_attr("file", tasks_path);
        tg.set_attr("acc", tr.acc);
        tg.set_attr("acc_norm", tr.acc_norm);
        tg.write<double>("loglik", tr.loglik, {"nat", "continuation log-likelihood per choice"});
        std::vector<std::int32_t> off(tr.choice_offset.begin(), tr.choice_offset.end());
        tg.write<std::int32_t>("choice_offset", off, {"", "first loglik entry of each item"});
        std::vector<std::int32_t> pred(tr.pred.begin(), tr.pred.end()),
            pn(tr.pred_norm.begin(), tr.pred_norm.end());
        tg.write<std::int32_t>("pred", pred, {"", "argmax choice"});
        tg.write<std::int32_t>("pred_norm", pn, {"", "argmax choice by loglik per byte"});
      }
      if (retrieval) {
        io::Group rg = res.create_group("retrieval");
        rg.set_attr("task", task);
        rg.set_attr("accuracy", rr.accuracy);
        rg.set_attr("samples", ro.samples);
        rg.set_attr("seed", static_cast<std::int64_t>(ro.seed));
        rg.set_attr("digits", ro.digits);
        std::vector<std::int32_t> lens(ro.lengths.begin(), ro.lengths.end());
        rg.write<std::int32_t>("lengths", lens, {"token", "prompt lengths (first index)"});
        rg.write<double>("depths", ro.depths, {"1", "needle depths (second index)"});
        rg.write<double>(
            "accuracy", rr.cell_accuracy.data(),
            {static_cast<hsize_t>(ro.lengths.size()), static_cast<hsize_t>(ro.depths.size())},
            {"1", "exact-match accuracy per [length][depth]"});
        std::vector<std::int32_t> il, ok;
        std::vector<double> idp, ipl;
        std::vector<std::string> ans, outp, keys;
        for (std::size_t k = 0; k < ritems.size(); ++k) {
          il.push_back(ritems[k].length);
          idp.push_back(ritems[k].depth);
          ipl.push_back(ritems[k].placed);
          ok.push_back(rr.correct[k]);
          ans.push_back(ritems[k].answer);
          outp.push_back(rr.output[k]);
          keys.push_back(ritems[k].key);
        }
        rg.write<std::int32_t>("item_length", il, {"token", "prompt length of each item"});
        rg.write<double>("item_depth", idp, {"1", "requested needle depth of each item"});
        rg.write<double>("item_placed", ipl, {"1", "needle start / filler length, as placed"});
        rg.write<std::int32_t>("item_correct", ok, {"", "1: exact match"});
        rg.write_strings("item_answer", ans, {"", "the number to retrieve"});
        rg.write_strings("item_output", outp, {"", "greedy continuation"});
        if (ro.kind == "kv") rg.write_strings("item_key", keys, {"", "the key asked for"});
      }
      if (ruler) {
        io::Group rg = res.create_group("ruler");
        write_ruler(rg, ruo, ruitems, rur);
      }
      stack.write(mrec, root);
      if (tf_mass) {
        io::Group tg = root.open_group("token_filter");
        io::Group mg = tg.create_group("attention_mass");
        mg.set_attr("meaning",
                    "dense model, first window: similarity S of every position in every layer "
                    "and the mean attention (over later queries and heads) it receives");
        const std::vector<hsize_t> dims = {static_cast<hsize_t>(c.n_layer),
                                           static_cast<hsize_t>(po_.context)};
        mg.write<float>("similarity", fig_s.data(), dims,
                        {"1", "similarity S [layer][position] (NaN: no anchor)"});
        mg.write<float>("attention_received", fig_mass.data(), dims,
                        {"1", "mean softmax weight from later queries [layer][position]"});
      }
      io::Group tm = root.create_group("timings");
      tm.write_scalar("load_seconds", t_load, {"s", "model load and dequantization"});
      tm.write_scalar("tokenize_seconds", t_tok, {"s", "corpus tokenization"});
      tm.write_scalar("perplexity_seconds", t_ppl, {"s", "perplexity forward passes"});
      tm.write_scalar("tasks_seconds", t_tasks, {"s", "task scoring"});
      tm.write_scalar("retrieval_seconds", t_ret, {"s", "retrieval task"});
      tm.write_scalar("ruler_seconds", t_ruler, {"s", "ruler suite"});
      tm.write_scalar("wall_seconds", wall_s, {"s", "whole command"});
      tm.set_attr("resumed_windows", static_cast<std::int64_t>(resumed));
      if (sparse) report.write(root);
      if (c.pruned() || c.low_rank_kv()) write_prune_group(root, c);
      if (dumper) dumper->write(root, plan);
      io::Group fl = root.create_group("flops");
      ledger.write(fl);
    }
    std::unique_ptr<io::AtomicTextFile> jf;
    if (!json_out.empty()) {
      jf = std::make_unique<io::AtomicTextFile>(json_out);
      jf->stream() << io::json_file_text(j);
    }
    interruption_point("write");
    if (rf) rf->commit();
    if (jf) jf->commit();
    if (ckpt) {
      ckpt->remove();
      interrupt::set_note("");
    }
    return 0;
  });
}

}  // namespace sparsim::app
