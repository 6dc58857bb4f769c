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
#include "eval_args.hpp"
#include "eval_checkpoint.hpp"
#include "eval_report.hpp"
#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "method_stack.hpp"
#include "model/loader.hpp"
#include "model_io.hpp"
#include "records.hpp"
#include "sparsity/plan.hpp"
#include "sparsity_report.hpp"

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

/// The checks that need the model (the rest were made at parse time): sequence lengths against
/// its context, methods against its layers and head widths; sets the BOS token of the windows.
void check_against_model(EvalArgs& a, const Config& c, const Tokenizer& tok, bool add_bos) {
  require(tok.vocab_size() <= c.vocab,
          "the tokenizer has {} tokens but the model's embedding only {}", tok.vocab_size(),
          c.vocab);
  require(!(a.bos_mode == "yes" && tok.bos_id() < 0), "--bos yes: the model has no BOS token");
  a.ppl.bos_id = add_bos ? tok.bos_id() : -1;
  if (!a.no_ppl) check_as_options([&] { a.ppl.validate(c.context_length); });
  if (a.retrieval) check_as_options([&] { a.ro.validate(c.context_length); });
  if (a.ruler) {
    if (a.ruo.lengths.empty()) a.ruo.lengths = RulerOptions::default_lengths(c.context_length);
    check_as_options([&] { a.ruo.validate(c.context_length); });
  }
  a.ma.validate(c);
  if (a.ma.kv_prune) {
    require(a.no_ppl || a.ma.kv.window <= a.ppl.context - a.ppl.score - 1,
            "--kv-window {}: the observation window is longer than the {} tokens prefilled "
            "before the {} scored ones of a window (--context {} − --score {} − 1)",
            a.ma.kv.window, a.ppl.context - a.ppl.score - 1, a.ppl.score, a.ppl.context,
            a.ppl.score);
    if (a.retrieval)
      require(a.ma.kv.window <= *std::min_element(a.ro.lengths.begin(), a.ro.lengths.end()),
              "--kv-window {}: the observation window is longer than the shortest retrieval "
              "prompt",
              a.ma.kv.window);
  }
}

/// The corpus as tokens, and the generated tasks built from it.
void tokenize_inputs(EvalInputs& in, const Tokenizer& tok) {
  const EvalArgs& a = in.a;
  if (a.reads_corpus()) in.stream = corpus_stream(in.corpus, tok);
  if (a.retrieval) in.ritems = build_retrieval(a.ro, tok, in.stream, in.add_bos);
  if (a.ruler)
    in.ruitems = build_ruler(a.ruo, tok, in.stream, ruler_words(in.corpus.documents), in.add_bos);
}

/// The sequence lengths the engine and the methods are sized and checked for.
struct EvalLengths {
  int cache = 0;  ///< the longest sequence: a window, or a task item's context + choice
  StackLengths stack;
};

EvalLengths sequence_lengths(const EvalInputs& in, const Tokenizer& tok) {
  const EvalArgs& a = in.a;
  const Config& c = in.c;
  // The cache must hold a whole window, and the longest context + choice of any task item.
  int ctx_needed = a.no_ppl ? 0 : a.ppl.context;
  for (const auto& it : in.tasks)
    for (const auto& choice : it.choices) {
      const int len = static_cast<int>(tok.encode(it.context + choice, in.add_bos).size()) + 1;
      require(len <= c.context_length,
              "tasks: an item of {} tokens exceeds the model's context of {} tokens", len,
              c.context_length);
      ctx_needed = std::max(ctx_needed, len);
    }
  int shortest = a.no_ppl ? 0 : a.ppl.context;  // the sequences the token gate sees
  // the prompts prefilled before scored or decoded tokens (K-channel pruning's observations)
  int shortest_prefill =
      a.no_ppl ? std::numeric_limits<int>::max() : a.ppl.context - a.ppl.score - 1;
  if (a.ma.kv_prune || a.ma.evict())
    for (const auto& it : in.tasks)
      shortest_prefill =
          std::min(shortest_prefill,
                   std::max(1, static_cast<int>(tok.encode(it.context, in.add_bos).size())) - 1);
  if (a.retrieval) {
    for (int L : a.ro.lengths) ctx_needed = std::max(ctx_needed, L + a.ro.answer_tokens());
    const int mn = *std::min_element(a.ro.lengths.begin(), a.ro.lengths.end());
    shortest = shortest ? std::min(shortest, mn) : mn;
    shortest_prefill = std::min(shortest_prefill, mn);
  }
  if (a.ruler) {
    int mn = std::numeric_limits<int>::max();
    for (const auto& it : in.ruitems) {
      ctx_needed = std::max(ctx_needed, static_cast<int>(it.prompt.size()) + it.gen_tokens);
      mn = std::min(mn, static_cast<int>(it.prompt.size()));
    }
    if (a.ma.kv_prune)
      require(a.ma.kv.window <= mn,
              "--kv-window {}: the observation window is longer than the shortest ruler prompt "
              "({} tokens)",
              a.ma.kv.window, mn);
    shortest = shortest ? std::min(shortest, mn) : mn;
    shortest_prefill = std::min(shortest_prefill, mn);
  }
  if (shortest == 0) shortest = ctx_needed;  // tasks only: the longest item
  return {ctx_needed, {shortest, shortest_prefill}};
}

/// What the checkpoint of a run is matched by: everything a window's result depends on.
std::string checkpoint_settings(const EvalInputs& in, const po::variables_map& vm) {
  const EvalArgs& a = in.a;
  return fmt::format(
             "sparsim = {}\nmodel.fingerprint = {}\ncorpus.fingerprint = {}\n"
             "corpus.tokens = {}\ncalibration.file = {}\nbackend = {}\nbos = {}\n",
             SPARSIM_VERSION, in.mi.fingerprint, in.corpus.fingerprint, in.stream.size(),
             file_stamp(a.ma.calib_path), in.backend, a.ppl.bos_id) +
         option_settings(vm, kNotSettings);
}

/// Perplexity over the windows, continuing from the checkpoint `ckpt` (if any) and keeping it
/// up to date: every kCheckpointSeconds, when interrupted, and before the tasks that follow.
template <class E>
PplResult run_perplexity(const EvalInputs& in, Engine<E>& eng, flops::Ledger& ledger,
                         sparsity::ActivationMasker<E>& masker, EvalCheckpoint* ckpt,
                         std::size_t& resumed) {
  const EvalArgs& a = in.a;
  PplResume resume;
  std::size_t saved = 0;
  const int n_windows = static_cast<int>(window_starts(in.stream.size(), a.ppl).size());
  if (ckpt) {
    EvalProgress got;
    if (ckpt->read(got, in.c.n_layer)) {
      require(got.masker.has_value() == a.ma.sparse(),
              "checkpoint '{}' {} masker statistics, but this run is {}", a.checkpoint_path,
              got.masker ? "holds" : "lacks", a.ma.sparse() ? "sparse" : "dense");
      resume.done = std::move(got.ppl);
      ledger = got.ledger;
      if (got.masker) masker.restore(*got.masker);
      resumed = saved = resume.done.window_nll.size();
      log().info("continuing from checkpoint '{}': {} of {} windows were done", a.checkpoint_path,
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
                    saved, n_windows, a.checkpoint_path));
  };
  auto keep = [&](const PplResult& r) {
    last.ppl = r;
    last.ledger = ledger;
    if (a.ma.sparse()) last.masker = masker.snapshot();
  };
  if (ckpt)
    resume.after_batch = [&](const PplResult& r) {
      keep(r);
      if (since_save.seconds() >= kCheckpointSeconds) save();
    };
  ProgressBar bar("perplexity", a.show_progress);
  PplResult ppl;
  try {
    ppl = perplexity(
        eng, in.stream, a.ppl, [&](int done, int total) { bar.update(done, total); }, &resume);
  } catch (const Interrupted&) {
    bar.finish();
    if (ckpt && last.ppl.window_nll.size() > saved) save();
    throw;
  }
  bar.finish();
  if (ckpt && (!in.tasks.empty() || a.retrieval || a.ruler) && ppl.window_nll.size() > saved) {
    keep(ppl);
    save();
  }
  return ppl;
}

/// The file tasks, the retrieval task and the long-context suite, each timed.
template <class E>
void run_tasks(const EvalInputs& in, Engine<E>& eng, const Tokenizer& tok, EvalResults& r) {
  const EvalArgs& a = in.a;
  Stopwatch sw;
  if (!in.tasks.empty()) {
    ProgressBar bar("tasks", a.show_progress);
    r.tasks = score_tasks(eng, tok, in.tasks, in.add_bos,
                          [&](int done, int total) { bar.update(done, total); });
    bar.finish();
  }
  r.t.tasks = sw.seconds();
  sw.reset();
  if (a.retrieval) {
    ProgressBar bar("retrieval", a.show_progress);
    r.retrieval = run_retrieval(eng, tok, in.ritems, a.ro,
                                [&](int done, int total) { bar.update(done, total); });
    bar.finish();
  }
  r.t.retrieval = sw.seconds();
  sw.reset();
  if (a.ruler) {
    ProgressBar bar("ruler", a.show_progress);
    r.ruler = run_ruler(eng, tok, in.ruitems, a.ruo,
                        [&](int done, int total) { bar.update(done, total); });
    bar.finish();
    r.ruler_json = ruler_json(a.ruo, in.ruitems, r.ruler);
  }
  r.t.ruler = sw.seconds();
}

/// --tf-attention-mass: the dense model's similarity and received attention over the first
/// window (Figure 2 of the Token Filtering paper), from an observing gate.
template <class E>
void attention_mass_figure(const EvalInputs& in, std::shared_ptr<const Weights<E>> w, E exec,
                           EvalResults& r) {
  const EvalArgs& a = in.a;
  const Config& c = in.c;
  gating::TokenFilterOptions fo = a.ma.tf;
  fo.ratio = 0;
  fo.layers = gating::LayerSet::Uniform;
  fo.num_layers = c.n_layer;
  fo.observe_only = true;
  fo.trace_sequences = 1;
  fo.drop_skipped = false;
  Engine<E> de(w, 1, a.ppl.context, nullptr, exec);
  const AttnShape sh = de.cache().shape(0);
  gating::TokenFilter<E> obs(fo, c.n_layer, sh.n_kv_head, sh.qk_dim, sh.v_dim, 1);
  de.set_token_gate(&obs);
  de.record_attention_mass(true);
  std::vector<int> win;
  if (a.ppl.bos_id >= 0) win.push_back(a.ppl.bos_id);
  win.insert(win.end(), in.stream.begin(), in.stream.begin() + (a.ppl.context - win.size()));
  de.forward_tail({win}, 0, 1);
  for (int l = 0; l < c.n_layer; ++l) {
    const auto& trace = obs.traces().at(0).at(static_cast<std::size_t>(l));
    r.similarity.insert(r.similarity.end(), trace.similarity.begin(), trace.similarity.end());
    const auto m = de.attention_mass(l), q = de.attention_mass_queries(l);
    for (int p = 0; p < a.ppl.context; ++p) {
      const auto i = static_cast<std::size_t>(p);
      r.attention_received.push_back(q[i] > 0 ? static_cast<float>(m[i] / (q[i] * c.n_head))
                                              : std::numeric_limits<float>::quiet_NaN());
    }
  }
}

/// Load, run and report on one backend.
template <class E>
int run_eval(EvalArgs& a, const po::variables_map& vm, const ResolvedModel& rm, Corpus corpus,
             std::vector<TaskItem> tasks, const Stopwatch& wall, const Runtime& rt, E exec,
             int argc, char** argv) {
  Stopwatch sw;
  ModelInfo mi;
  std::shared_ptr<const Weights<E>> w;
  check_as_options([&] { w = load_model<E>(rm.path, a.lo, &mi); });
  EvalResults r;
  r.t.load = sw.seconds();
  // (rotated plans replace w: take the config reference afterwards)
  const sparsity::Plan plan = prepare_method(a.ma, mi, w, a.lo.storage);
  const Config& c = w->cfg;
  const Tokenizer tok = tokenizer_for(rm.path);
  EvalInputs in{a,
                rm,
                mi,
                c,
                std::move(corpus),
                {},
                std::move(tasks),
                {},
                {},
                false,
                resolve_backend(a.co.backend),
                rt.threads()};
  in.add_bos =
      a.bos_mode == "yes" || (a.bos_mode == "auto" && tok.add_bos_default() && tok.bos_id() >= 0);
  check_against_model(a, c, tok, in.add_bos);
  sw.reset();
  tokenize_inputs(in, tok);
  r.t.tokenize = sw.seconds();

  const EvalLengths len = sequence_lengths(in, tok);
  flops::Ledger ledger(c.n_layer);
  Engine<E> eng(w, a.reads_corpus() ? a.ppl.batch : 1, std::max(len.cache, 2), &ledger, exec);
  MethodStack<E> stack(a.ma, eng, plan, len.stack);
  sparsity::ActivationMasker<E>& masker = stack.masker();
  std::unique_ptr<DumpingMasker<E>> dumper;
  if (a.da.enabled()) {
    dumper = std::make_unique<DumpingMasker<E>>(masker, a.da, *w);
    eng.set_masker(dumper.get());
  }
  // Checkpoint: the windows an interrupted run of the same settings completed.
  std::optional<EvalCheckpoint> ckpt;
  if (!a.checkpoint_path.empty()) ckpt.emplace(a.checkpoint_path, checkpoint_settings(in, vm));
  std::unique_ptr<io::RunFile> rf;
  if (!a.out.empty()) rf = std::make_unique<io::RunFile>(a.out);

  sw.reset();
  if (!a.no_ppl)
    r.ppl = run_perplexity(in, eng, ledger, masker, ckpt ? &*ckpt : nullptr, r.resumed_windows);
  r.t.perplexity = sw.seconds();
  run_tasks(in, eng, tok, r);
  if (a.tf_mass) attention_mass_figure(in, w, exec, r);
  r.t.wall = wall.seconds();

  const bool sparse = a.ma.sparse();
  const SparsityReport report{plan, masker.all_stats(), masker.token_sparsity(), a.ma.calib_path};
  const nlohmann::json mrec = stack.records();
  std::cout << eval_table_head(in, r);
  if (sparse) std::cout << report.table() << "\n";
  std::cout << stack.table(mrec) << eval_table_tail(in, r, ledger, sparse);

  io::SummaryColumns cols;  // the sweep table's columns of each family present
  nlohmann::json j = eval_summary_head(in, r, ledger, cols);
  if (sparse) j["sparsity"] = report.json();
  stack.add_to_summary(mrec, j, cols);
  eval_summary_tail(in, r, j, cols);

  if (rf) {
    io::Group root = rf->root();
    write_eval_results(root, in, r, argc, argv);
    stack.write(mrec, root);
    write_eval_extras(root, in, r);
    if (sparse) report.write(root);
    if (c.pruned() || c.low_rank_kv()) write_prune_group(root, c);
    if (dumper) dumper->write(root, plan);
    io::Group fl = root.create_group("flops");
    ledger.write(fl);
  }
  std::unique_ptr<io::AtomicTextFile> jf;
  if (!a.json_out.empty()) {
    jf = std::make_unique<io::AtomicTextFile>(a.json_out);
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
}

}  // namespace

int cmd_eval(int argc, char** argv) {
  EvalArgs a;
  po::options_description d("sparsim eval options");
  a.add_options(d);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: sparsim eval [--model smollm2] [--corpus default] [options]", d,
             vm))
    return 0;
  a.check(vm);
  if (options_checked(vm)) return 0;
  const ResolvedModel rm = resolve_model(a.model_arg);
  io::guard_run(
      {{"--model", rm.path},
       {"--corpus", a.reads_corpus() ? corpus_input_path(a.corpus_arg) : ""},
       {"--tasks", a.tasks_path},
       {"--calibration", a.ma.calib_path}},
      {{"--out", a.out},
       {"--json", a.json_out},
       {a.checkpoint_arg == "auto" ? "the checkpoint (--checkpoint auto)" : "--checkpoint",
        a.checkpoint_path, false, true}});
  log().info("model {} ({})", rm.path, rm.origin);
  Stopwatch wall;
  Corpus corpus;
  std::vector<TaskItem> tasks;
  if (a.reads_corpus()) corpus = load_corpus_arg(a.corpus_arg, CorpusOptions{a.text_field});
  if (!a.tasks_path.empty()) tasks = load_tasks(a.tasks_path);

  Runtime rt(a.co);
  return with_backend(a.co.backend, [&](auto exec) {
    return run_eval(a, vm, rm, std::move(corpus), std::move(tasks), wall, rt, exec, argc, argv);
  });
}

}  // namespace sparsim::app
