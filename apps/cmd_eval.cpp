// sparsim eval: perplexity over sliding windows and multiple-choice tasks, recorded in a run
// file and a JSON summary.
#include "activation_dump.hpp"
#include "common.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "eval/corpus.hpp"
#include "eval/perplexity.hpp"
#include "eval/tasks.hpp"
#include "io/run_file.hpp"
#include "method_setup.hpp"
#include "model/loader.hpp"
#include "model_io.hpp"
#include "records.hpp"
#include "sparsity/plan.hpp"
#include "sparsity_report.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <cmath>
#include <iostream>
#include <limits>

namespace sparsim::app {

int cmd_eval(int argc, char** argv) {
  CommonOptions co;
  std::string model_arg, corpus_arg, text_field, tasks_path, storage, bos_mode, out, json_out,
      progress_mode;
  PplOptions po_;
  int score = -1;
  bool strict = false, no_ppl = false, save_tokens = false;
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
      "tasks", po::value(&tasks_path), "multiple-choice tasks: JSONL {context, choices, gold}");
  ma.add_options(d);
  d.add_options()("storage", po::value(&storage)->default_value("f32"),
                  "weight storage: f32, bf16 or f16")(
      "strict", po::bool_switch(&strict), "NaN/Inf in the weights is an error, not a warning")(
      "out,o", po::value(&out), "run file (HDF5): config, fingerprints, per-window NLL, FLOPs")(
      "json", po::value(&json_out), "JSON summary file")(
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
  ma.resolve(/*read_calibration=*/!check_only);
  // Without the calibration file (--check-options) the layer count is not known yet.
  da.resolve(vm, ma.sparse(), !out.empty(),
             ma.cal ? ma.cal->n_layer : (check_only ? std::numeric_limits<int>::max() : 0));
  const std::string& method = ma.method;
  const std::string& calib_path = ma.calib_path;
  require(bos_mode == "auto" || bos_mode == "yes" || bos_mode == "no",
          "--bos must be auto, yes or no, got '{}'", bos_mode);
  require(progress_mode == "auto" || progress_mode == "always" || progress_mode == "never",
          "--progress must be auto, always or never, got '{}'", progress_mode);
  require(!(no_ppl && tasks_path.empty()), "--no-perplexity needs --tasks");
  po_.score = score < 0 ? po_.stride : score;
  LoadOptions lo;
  lo.storage = parse_dtype(storage);
  lo.strict = strict;
  const bool show_progress =
      progress_mode == "always" || (progress_mode == "auto" && ::isatty(STDERR_FILENO));
  // Fail on bad arguments before loading anything big.
  if (!no_ppl) {
    require(po_.stride >= 1 && po_.batch >= 1 && po_.max_windows >= 0 && po_.context >= 2,
            "--context, --stride, --batch must be positive and --max-windows non-negative");
    po_.validate(std::numeric_limits<int>::max());  // the model's own limit is checked later
  }
  require(co.threads >= 0 && co.threads <= 4096, "--threads {} is out of range", co.threads);
  if (options_checked(vm)) return 0;
  const ResolvedModel rm = resolve_model(model_arg);
  log().info("model {} ({})", rm.path, rm.origin);
  Stopwatch wall;
  Corpus corpus;
  std::vector<TaskItem> tasks;
  if (!no_ppl) corpus = load_corpus(corpus_arg, CorpusOptions{text_field});
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

    sw.reset();
    std::vector<int> stream;
    std::uint64_t corpus_tokens = 0;
    if (!no_ppl) {
      stream = corpus_stream(corpus, tok);
      corpus_tokens = stream.size();
    }
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
    flops::Ledger ledger(c.n_layer);
    Engine<E> eng(w, no_ppl ? 1 : po_.batch, std::max(ctx_needed, 2), &ledger, exec);
    sparsity::ActivationMasker<E> masker(c.n_layer);
    attach_masker(eng, masker, plan);
    std::unique_ptr<DumpingMasker<E>> dumper;
    if (da.enabled()) {
      dumper = std::make_unique<DumpingMasker<E>>(masker, da, *w);
      eng.set_masker(dumper.get());
    }

    std::unique_ptr<io::RunFile> rf;
    if (!out.empty()) rf = std::make_unique<io::RunFile>(out);

    PplResult ppl;
    sw.reset();
    if (!no_ppl) {
      ProgressBar bar("perplexity", show_progress);
      ppl = perplexity(eng, stream, po_, [&](int done, int total) { bar.update(done, total); });
      bar.finish();
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
    const double wall_s = wall.seconds();
    const auto tot = ledger.total();
    const std::vector<double>& token_sp = masker.token_sparsity();
    const SparsityReport report{plan, masker.all_stats(), token_sp, calib_path};
    const bool sparse = ma.sparse();

    // ---- stdout table
    std::cout << fmt::format(
        "model     {}  [{}]\n          fingerprint {}, {} params, {} storage\n", mi.path, rm.origin,
        mi.fingerprint, c.n_params(), storage);
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
    }
    if (sparse) std::cout << report.table() << "\n";
    if (!tasks.empty()) {
      std::cout << fmt::format("  {:<22} {:>14.4f}\n", "tasks acc", tr.acc);
      std::cout << fmt::format("  {:<22} {:>14.4f}\n", "tasks acc_norm", tr.acc_norm);
      std::cout << fmt::format("  {:<22} {:>14}\n", "task items", tr.items);
    }
    std::cout << fmt::format("  {:<22} {:>14.3f}\n", "GFLOP (dense)", tot.flops_dense / 1e9);
    if (sparse)
      std::cout << fmt::format("  {:<22} {:>14.3f}\n", "GFLOP (realised)",
                               tot.flops_realised / 1e9);
    std::cout << fmt::format("  {:<22} {:>14.3f}\n", "wall seconds", wall_s);
    std::cout << fmt::format("  {:<22} {:>14}\n", "backend / threads",
                             fmt::format("{} / {}", backend, rt.threads()));

    nlohmann::json j;
    j["method"] = method;
    j["model"] = {{"path", mi.path}, {"fingerprint", mi.fingerprint}, {"origin", rm.origin}};
    j["storage"] = storage;
    j["threads"] = rt.threads();
    j["backend"] = backend;
    j["wall_seconds"] = wall_s;
    j["flops"] = {{"dense", tot.flops_dense}, {"realised", tot.flops_realised}};
    if (sparse) j["sparsity"] = report.json();
    if (!no_ppl) {
      j["perplexity"] = ppl.perplexity();
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
    if (!tasks.empty())
      j["tasks"] = {
          {"file", tasks_path}, {"items", tr.items}, {"acc", tr.acc}, {"acc_norm", tr.acc_norm}};

    if (rf) {
      io::Group root = rf->root();
      write_run_header(root, argc, argv, backend, rt.threads(), mi, c, lo.storage);
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
      io::Group tm = root.create_group("timings");
      tm.write_scalar("load_seconds", t_load, {"s", "model load and dequantization"});
      tm.write_scalar("tokenize_seconds", t_tok, {"s", "corpus tokenization"});
      tm.write_scalar("perplexity_seconds", t_ppl, {"s", "perplexity forward passes"});
      tm.write_scalar("tasks_seconds", t_tasks, {"s", "task scoring"});
      tm.write_scalar("wall_seconds", wall_s, {"s", "whole command"});
      if (sparse) report.write(root);
      if (dumper) dumper->write(root, plan);
      io::Group fl = root.create_group("flops");
      ledger.write(fl);
    }
    std::unique_ptr<io::AtomicTextFile> jf;
    if (!json_out.empty()) {
      jf = std::make_unique<io::AtomicTextFile>(json_out);
      jf->stream() << j.dump(2) << "\n";
    }
    if (rf) rf->commit();
    if (jf) jf->commit();
    return 0;
  });
}

}  // namespace sparsim::app
