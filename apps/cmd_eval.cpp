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
       {"--corpus", a.no_ppl && !a.retrieval && !a.ruler ? "" : corpus_input_path(a.corpus_arg)},
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
  if (!a.no_ppl || a.retrieval || a.ruler)
    corpus = load_corpus(a.corpus_arg, CorpusOptions{a.text_field});
  if (!a.tasks_path.empty()) tasks = load_tasks(a.tasks_path);

  Runtime rt(a.co);
  const std::string backend = resolve_backend(a.co.backend);
  return with_backend(a.co.backend, [&](auto exec) {
    using E = decltype(exec);
    Stopwatch sw;
    ModelInfo mi;
    std::shared_ptr<const Weights<E>> w = load_model<E>(rm.path, a.lo, &mi);
    const double t_load = sw.seconds();
    // (rotated plans replace w: take the config reference afterwards)
    const sparsity::Plan plan = prepare_method(a.ma, mi, w, a.lo.storage);
    const Config& c = w->cfg;
    const Tokenizer tok = tokenizer_for(rm.path);
    require(tok.vocab_size() <= c.vocab,
            "the tokenizer has {} tokens but the model's embedding only {}", tok.vocab_size(),
            c.vocab);
    const bool add_bos =
        a.bos_mode == "yes" || (a.bos_mode == "auto" && tok.add_bos_default() && tok.bos_id() >= 0);
    require(!(a.bos_mode == "yes" && tok.bos_id() < 0), "--bos yes: the model has no BOS token");
    a.ppl.bos_id = add_bos ? tok.bos_id() : -1;
    if (!a.no_ppl) a.ppl.validate(c.context_length);
    if (a.retrieval) a.ro.validate(c.context_length);
    if (a.ruler) {
      if (a.ruo.lengths.empty()) a.ruo.lengths = RulerOptions::default_lengths(c.context_length);
      a.ruo.validate(c.context_length);
    }
    if (a.ma.token_filter) a.ma.tf.validate(c.n_layer);
    if (a.ma.kv_prune) {
      require_uniform_key_width(c);
      a.ma.kv.validate(attn_shape(c, 0).qk_dim);
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

    sw.reset();
    std::vector<int> stream;
    std::uint64_t corpus_tokens = 0;
    if (!a.no_ppl || a.retrieval || a.ruler) {
      stream = corpus_stream(corpus, tok);
      corpus_tokens = stream.size();
    }
    std::vector<RetrievalItem> ritems;
    if (a.retrieval) ritems = build_retrieval(a.ro, tok, stream, add_bos);
    std::vector<RulerItem> ruitems;
    if (a.ruler) ruitems = build_ruler(a.ruo, tok, stream, ruler_words(corpus.documents), add_bos);
    const double t_tok = sw.seconds();

    // The cache must hold a whole window, and the longest context + choice of any task item.
    int ctx_needed = a.no_ppl ? 0 : a.ppl.context;
    for (const auto& it : tasks)
      for (const auto& choice : it.choices) {
        const int len = static_cast<int>(tok.encode(it.context + choice, add_bos).size()) + 1;
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
      for (const auto& it : tasks)
        shortest_prefill =
            std::min(shortest_prefill,
                     std::max(1, static_cast<int>(tok.encode(it.context, add_bos).size())) - 1);
    if (a.retrieval) {
      for (int L : a.ro.lengths) ctx_needed = std::max(ctx_needed, L + a.ro.answer_tokens());
      const int mn = *std::min_element(a.ro.lengths.begin(), a.ro.lengths.end());
      shortest = shortest ? std::min(shortest, mn) : mn;
      shortest_prefill = std::min(shortest_prefill, mn);
    }
    if (a.ruler) {
      int mn = std::numeric_limits<int>::max();
      for (const auto& it : ruitems) {
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
    flops::Ledger ledger(c.n_layer);
    Engine<E> eng(w, (a.no_ppl && !a.retrieval && !a.ruler) ? 1 : a.ppl.batch,
                  std::max(ctx_needed, 2), &ledger, exec);
    MethodStack<E> stack(a.ma, eng, plan, {shortest, shortest_prefill});
    sparsity::ActivationMasker<E>& masker = stack.masker();
    std::unique_ptr<DumpingMasker<E>> dumper;
    if (a.da.enabled()) {
      dumper = std::make_unique<DumpingMasker<E>>(masker, a.da, *w);
      eng.set_masker(dumper.get());
    }

    // Checkpoint: the windows an interrupted run of the same settings completed.
    std::optional<EvalCheckpoint> ckpt;
    PplResume resume;
    std::size_t resumed = 0, saved = 0;
    const int n_windows =
        a.no_ppl ? 0 : static_cast<int>(window_starts(stream.size(), a.ppl).size());
    if (!a.checkpoint_path.empty()) {
      const std::string settings =
          fmt::format(
              "sparsim = {}\nmodel.fingerprint = {}\ncorpus.fingerprint = {}\n"
              "corpus.tokens = {}\ncalibration.file = {}\nbackend = {}\nbos = {}\n",
              SPARSIM_VERSION, mi.fingerprint, corpus.fingerprint, stream.size(),
              file_stamp(a.ma.calib_path), backend, a.ppl.bos_id) +
          option_settings(vm, kNotSettings);
      ckpt.emplace(a.checkpoint_path, settings);
      EvalProgress got;
      if (ckpt->read(got, c.n_layer)) {
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
    if (ckpt) {
      resume.after_batch = [&](const PplResult& r) {
        last.ppl = r;
        last.ledger = ledger;
        if (a.ma.sparse()) last.masker = masker.snapshot();
        if (since_save.seconds() >= kCheckpointSeconds) save();
      };
    }

    std::unique_ptr<io::RunFile> rf;
    if (!a.out.empty()) rf = std::make_unique<io::RunFile>(a.out);

    PplResult ppl;
    sw.reset();
    if (!a.no_ppl) {
      ProgressBar bar("perplexity", a.show_progress);
      try {
        ppl = perplexity(
            eng, stream, a.ppl, [&](int done, int total) { bar.update(done, total); }, &resume);
      } catch (const Interrupted&) {
        bar.finish();
        if (ckpt && last.ppl.window_nll.size() > saved) save();
        throw;
      }
      bar.finish();
      if (ckpt && (!tasks.empty() || a.retrieval || a.ruler) && ppl.window_nll.size() > saved) {
        last.ppl = ppl;
        last.ledger = ledger;
        if (a.ma.sparse()) last.masker = masker.snapshot();
        save();
      }
    }
    const double t_ppl = sw.seconds();
    TaskResult tr;
    sw.reset();
    if (!tasks.empty()) {
      ProgressBar bar("tasks", a.show_progress);
      tr = score_tasks(eng, tok, tasks, add_bos,
                       [&](int done, int total) { bar.update(done, total); });
      bar.finish();
    }
    const double t_tasks = sw.seconds();
    RetrievalResult rr;
    sw.reset();
    if (a.retrieval) {
      ProgressBar bar("retrieval", a.show_progress);
      rr = run_retrieval(eng, tok, ritems, a.ro,
                         [&](int done, int total) { bar.update(done, total); });
      bar.finish();
    }
    const double t_ret = sw.seconds();
    RulerResult rur;
    sw.reset();
    if (a.ruler) {
      ProgressBar bar("ruler", a.show_progress);
      rur = run_ruler(eng, tok, ruitems, a.ruo,
                      [&](int done, int total) { bar.update(done, total); });
      bar.finish();
    }
    const double t_ruler = sw.seconds();
    // The dense model's similarity and received attention over the first window (Figure 2).
    std::vector<float> fig_s, fig_mass;
    if (a.tf_mass) {
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
      win.insert(win.end(), stream.begin(), stream.begin() + (a.ppl.context - win.size()));
      de.forward_tail({win}, 0, 1);
      for (int l = 0; l < c.n_layer; ++l) {
        const auto& trace = obs.traces().at(0).at(static_cast<std::size_t>(l));
        fig_s.insert(fig_s.end(), trace.similarity.begin(), trace.similarity.end());
        const auto m = de.attention_mass(l), q = de.attention_mass_queries(l);
        for (int p = 0; p < a.ppl.context; ++p)
          fig_mass.push_back(q[static_cast<std::size_t>(p)] > 0
                                 ? static_cast<float>(m[static_cast<std::size_t>(p)] /
                                                      (q[static_cast<std::size_t>(p)] * c.n_head))
                                 : std::numeric_limits<float>::quiet_NaN());
      }
    }
    const double wall_s = wall.seconds();
    const std::vector<double>& token_sp = masker.token_sparsity();
    const SparsityReport report{plan, masker.all_stats(), token_sp, a.ma.calib_path};
    const bool sparse = a.ma.sparse();

    // ---- stdout table
    std::cout << fmt::format(
        "model     {}  [{}]\n          fingerprint {}, {} params, {} storage\n", mi.path, rm.origin,
        mi.fingerprint, c.n_params(), a.storage);
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
    if (!a.no_ppl) {
      std::cout << fmt::format(
          "corpus    {}  ({} documents, {} bytes, {} tokens, fingerprint {})\n", corpus.source,
          corpus.documents.size(), corpus.bytes, corpus_tokens, corpus.fingerprint);
      std::cout << fmt::format(
          "windows   {} of {} tokens, stride {}, scoring the last {}, BOS {}\n",
          ppl.window_nll.size(), a.ppl.context, a.ppl.stride, a.ppl.score, add_bos ? "yes" : "no");
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
    if (a.retrieval)
      std::cout << fmt::format("  {:<22} {:>14.4f}\n", fmt::format("{} accuracy", a.task),
                               rr.accuracy);
    nlohmann::json rj;
    if (a.ruler) {
      rj = ruler_json(a.ruo, ruitems, rur);
      for (const auto& t : a.ruo.tasks)
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
    j["method"] = a.ma.method;
    j["model"] = {{"path", mi.path}, {"fingerprint", mi.fingerprint}, {"origin", rm.origin}};
    j["storage"] = a.storage;
    j["bf16_compute"] = a.bf16_compute;
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
    if (!a.no_ppl) {
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
      j["protocol"] = {{"context", a.ppl.context},
                       {"stride", a.ppl.stride},
                       {"score", a.ppl.score},
                       {"bos", add_bos}};
    } else {
      j["perplexity"] = nullptr;
      j["tokens_scored"] = 0;
      j["windows"] = 0;
      j["corpus"] = {{"fingerprint", nullptr}};
    }
    stack.add_to_summary(mrec, j, cols);
    if (a.retrieval) {
      nlohmann::json cells = nlohmann::json::array();
      for (std::size_t li = 0; li < a.ro.lengths.size(); ++li)
        for (std::size_t di = 0; di < a.ro.depths.size(); ++di)
          cells.push_back({{"length", a.ro.lengths[li]},
                           {"depth", a.ro.depths[di]},
                           {"accuracy", rr.cell_accuracy[li * a.ro.depths.size() + di]},
                           {"items", a.ro.samples}});
      j["retrieval"] = {
          {"task", a.task},          {"accuracy", rr.accuracy}, {"items", ritems.size()},
          {"lengths", a.ro.lengths}, {"depths", a.ro.depths},   {"samples", a.ro.samples},
          {"seed", a.ro.seed},       {"digits", a.ro.digits},   {"cells", cells},
          {"correct", rr.correct}};  // per prompt, in item order (paired comparisons)
      cols.add("retrieval_task", a.task, "", "generated retrieval task");
      cols.add("retrieval_accuracy", rr.accuracy, "1",
               "retrieval accuracy over every (length, depth) cell's prompts");
      cols.add("retrieval_items", static_cast<double>(ritems.size()), "1",
               "retrieval prompts scored");
    }
    if (a.ruler) {
      j["ruler"] = rj;
      cols.add("ruler_accuracy", rj["accuracy"].get<double>(), "1",
               "long-context suite accuracy: share of items whose continuation holds every answer");
      cols.add("ruler_items", rj["items_total"].get<double>(), "1",
               "long-context suite items scored");
    }
    if (!tasks.empty())
      j["tasks"] = {
          {"file", a.tasks_path}, {"items", tr.items}, {"acc", tr.acc}, {"acc_norm", tr.acc_norm}};
    // (tasks have fixed columns of the sweep table: tasks_acc, tasks_acc_norm, task_items)
    j["columns"] = cols.json();

    if (rf) {
      io::Group root = rf->root();
      write_run_header(root, argc, argv, backend, rt.threads(), mi, c, a.lo.storage,
                       a.lo.bf16_compute);
      io::Group cfg = root.create_group("config");
      cfg.set_attr("method", a.ma.method);
      cfg.set_attr("context", a.ppl.context);
      cfg.set_attr("stride", a.ppl.stride);
      cfg.set_attr("score", a.ppl.score);
      cfg.set_attr("batch", a.ppl.batch);
      cfg.set_attr("max_windows", a.ppl.max_windows);
      cfg.set_attr("bos", add_bos ? 1 : 0);
      cfg.set_attr("model_origin", rm.origin);
      io::Group res = root.create_group("results");
      if (!a.no_ppl) {
        io::Group cg = root.create_group("corpus");
        cg.set_attr("source", corpus.source);
        cg.set_attr("fingerprint", corpus.fingerprint);
        cg.set_attr("bytes", static_cast<std::int64_t>(corpus.bytes));
        cg.set_attr("documents", static_cast<std::int64_t>(corpus.documents.size()));
        cg.set_attr("tokens", static_cast<std::int64_t>(corpus_tokens));
        if (a.save_tokens) {
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
        tg.set_attr("file", a.tasks_path);
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
      if (a.retrieval) {
        io::Group rg = res.create_group("retrieval");
        rg.set_attr("task", a.task);
        rg.set_attr("accuracy", rr.accuracy);
        rg.set_attr("samples", a.ro.samples);
        rg.set_attr("seed", static_cast<std::int64_t>(a.ro.seed));
        rg.set_attr("digits", a.ro.digits);
        std::vector<std::int32_t> lens(a.ro.lengths.begin(), a.ro.lengths.end());
        rg.write<std::int32_t>("lengths", lens, {"token", "prompt lengths (first index)"});
        rg.write<double>("depths", a.ro.depths, {"1", "needle depths (second index)"});
        rg.write<double>(
            "accuracy", rr.cell_accuracy.data(),
            {static_cast<hsize_t>(a.ro.lengths.size()), static_cast<hsize_t>(a.ro.depths.size())},
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
        if (a.ro.kind == "kv") rg.write_strings("item_key", keys, {"", "the key asked for"});
      }
      if (a.ruler) {
        io::Group rg = res.create_group("ruler");
        write_ruler(rg, a.ruo, ruitems, rur);
      }
      stack.write(mrec, root);
      if (a.tf_mass) {
        io::Group tg = root.open_group("token_filter");
        io::Group mg = tg.create_group("attention_mass");
        mg.set_attr("meaning",
                    "dense model, first window: similarity S of every position in every layer "
                    "and the mean attention (over later queries and heads) it receives");
        const std::vector<hsize_t> dims = {static_cast<hsize_t>(c.n_layer),
                                           static_cast<hsize_t>(a.ppl.context)};
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
  });
}

}  // namespace sparsim::app
