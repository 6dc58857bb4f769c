// sparsim compare: the perplexity of several activation-sparsity configurations on the same
// windows, each window's dense context computed once per model variant and shared.
//
// A window of C tokens scores its last S; the methods sparsify only the rows they score (and
// the row before them), so the first C − S − 1 rows are the same dense computation for every
// configuration that runs on the same weights. compare runs that prefix once per window and
// weights (plain, or rotated from one calibration file with one re-rotation storage), then
// each configuration's tail on the same cache. Each configuration's result is what
// `sparsim eval` with the same options gives on these windows (tested).
#include "common.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "eval/corpus.hpp"
#include "eval/perplexity.hpp"
#include "io/run_file.hpp"
#include "kernels/loss.hpp"
#include "method_setup.hpp"
#include "model/loader.hpp"
#include "model_io.hpp"
#include "records.hpp"
#include "run_summary.hpp"
#include "sparsity/plan.hpp"
#include "sparsity_report.hpp"

#include <nlohmann/json.hpp>

#include <cctype>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

namespace sparsim::app {

namespace {

/// One configuration: a name and its method options (as eval takes them).
struct ConfigSpec {
  std::string name, args;
  MethodArgs ma;
};

/// "NAME: --method wina --sparsity 0.5" (also "NAME = …").
ConfigSpec parse_config(const std::string& line, const std::string& default_calibration) {
  const std::size_t colon = line.find_first_of(":=");
  require(colon != std::string::npos && colon > 0,
          "--config '{}': expected NAME: OPTIONS (e.g. 'wina50: --method wina --sparsity 0.5')",
          line);
  ConfigSpec c;
  c.name = line.substr(0, colon);
  while (!c.name.empty() && std::isspace(static_cast<unsigned char>(c.name.back())))
    c.name.pop_back();
  while (!c.name.empty() && std::isspace(static_cast<unsigned char>(c.name.front())))
    c.name.erase(c.name.begin());
  require(!c.name.empty() && c.name.find_first_of(" /\t") == std::string::npos,
          "--config '{}': the name must be one word without '/'", line);
  c.args = line.substr(colon + 1);
  std::vector<std::string> tokens;
  {
    std::istringstream ss(c.args);
    std::string t;
    while (ss >> t) tokens.push_back(t);
  }
  po::options_description d("method options");
  c.ma.add_options(d);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(tokens).options(d).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    fail("--config {}: {}", c.name, e.what());
  }
  if (c.ma.calib_path.empty() && c.ma.method != "dense") c.ma.calib_path = default_calibration;
  try {
    c.ma.resolve();
  } catch (const Error& e) {
    fail("--config {}: {}", c.name, e.what());
  }
  return c;
}

/// compare's options and their checks; check() parses every configuration.
struct CompareArgs {
  CommonOptions co;
  std::string model_arg, corpus_arg, text_field, storage, bos_mode, json_out, out, calib,
      configs_file, progress_arg;
  std::vector<std::string> config_lines;
  PplOptions ppl;
  int score = -1;
  bool strict = false, bf16_compute = false;
  // Set by check():
  std::vector<ConfigSpec> cfgs;
  ProgressBar::Mode pmode = ProgressBar::Mode::Lines;
  LoadOptions lo;

  void add_options(po::options_description& d) {
    add_model_option(d, model_arg);
    d.add_options()("corpus,c", po::value(&corpus_arg)->default_value("default"),
                    "text for perplexity: a file, a directory of files, JSONL (see --text-field), "
                    "or 'default'")("text-field", po::value(&text_field)->default_value("text"),
                                    "JSONL field holding the text")(
        "context", po::value(&ppl.context)->default_value(2048), "tokens per window (C)")(
        "stride", po::value(&ppl.stride)->default_value(512), "tokens between window starts (R)")(
        "score", po::value(&score)->default_value(-1),
        "trailing tokens scored per window (S; -1: equal to the stride)")(
        "max-windows", po::value(&ppl.max_windows)->default_value(0),
        "stop after N windows (0: all)")(
        "bos", po::value(&bos_mode)->default_value("auto"),
        "prepend BOS to each window: auto (the model's add_bos setting), yes or no")(
        "calibration", po::value(&calib),
        "calibration file for every sparse configuration that names none")(
        "config", po::value(&config_lines)->composing(),
        "a configuration 'NAME: OPTIONS' with eval's method options, e.g. 'w50: --method wina "
        "--sparsity 0.5' (repeatable)")(
        "configs", po::value(&configs_file),
        "a file of configurations, one 'NAME: OPTIONS' per line ('#' starts a comment)")(
        "storage", po::value(&storage)->default_value("f32"), "weight storage: f32, bf16 or f16")(
        "bf16-compute", po::bool_switch(&bf16_compute), kBf16ComputeHelp)(
        "strict", po::bool_switch(&strict), "NaN/Inf in the weights is an error, not a warning")(
        "json", po::value(&json_out), "JSON summary file (required)")(
        "out,o", po::value(&out),
        "run file (HDF5): per configuration its windows, sparsity, FLOPs")(
        "progress", po::value(&progress_arg)->default_value("auto"),
        "progress on stderr: auto (a bar on a terminal, else a line per tenth), always, lines, "
        "never");
    add_common_options(d, co);
  }

  void check() {
    require(!json_out.empty(), "compare: --json FILE is required");
    require(bos_mode == "auto" || bos_mode == "yes" || bos_mode == "no",
            "--bos must be auto, yes or no, got '{}'", bos_mode);
    pmode = progress_mode(progress_arg, ProgressBar::Mode::Lines);
    ppl.score = score < 0 ? ppl.stride : score;
    check_as_options([&] { ppl.check_values(); });  // (the model's context: once it is loaded)
    if (!configs_file.empty()) {
      std::ifstream f(configs_file);
      require(f.good(), "--configs: cannot read '{}'", configs_file);
      std::string line;
      while (std::getline(f, line)) {
        const std::size_t hash = line.find('#');
        if (hash != std::string::npos) line.resize(hash);
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        config_lines.push_back(line);
      }
    }
    require(!config_lines.empty(), "compare: no configurations (--config or --configs)");
    for (const std::string& l : config_lines) {
      cfgs.push_back(parse_config(l, calib));
      for (std::size_t i = 0; i + 1 < cfgs.size(); ++i)
        require(cfgs[i].name != cfgs.back().name, "compare: configuration name '{}' is used twice",
                cfgs.back().name);
    }
    lo.storage = parse_dtype(storage);
    lo.strict = strict;
    lo.bf16_compute = bf16_compute;
    check_as_options([&] { check_load_options(lo); });
  }
};

/// The weights of one model variant (plain, or rotated from one calibration file with one
/// re-rotation type), its engine, and the configurations that run on it.
template <class E>
struct Variant {
  std::shared_ptr<const Weights<E>> w;
  std::unique_ptr<Engine<E>> eng;
  std::vector<std::size_t> members;
};

/// One configuration's plan, masker, cost and windows.
template <class E>
struct ConfigRun {
  sparsity::Plan plan;
  std::unique_ptr<sparsity::ActivationMasker<E>> masker;
  flops::Ledger ledger;
  PplResult ppl;
};

/// What every configuration's run shares: the windows, the variants and the buffers of a tail.
template <class E>
struct CompareRuns {
  const std::vector<ConfigSpec>& cfgs;
  std::vector<ConfigRun<E>> runs;
  std::map<std::string, Variant<E>> variants;

  /// Prepares each configuration's method and puts it on its variant's engine.
  CompareRuns(const std::vector<ConfigSpec>& c, std::shared_ptr<const Weights<E>> w,
              const ModelInfo& mi, DType storage, int context, E exec)
      : cfgs(c), runs(c.size()) {
    for (std::size_t i = 0; i < cfgs.size(); ++i) {
      std::shared_ptr<const Weights<E>> wv = w;
      runs[i].plan = prepare_method(cfgs[i].ma, mi, wv, storage);
      const sparsity::Plan& plan = runs[i].plan;
      const std::string key = plan.rotated ? fmt::format("rotated:{}:{}", cfgs[i].ma.calib_path,
                                                         to_string(plan.opt.rotation_storage))
                                           : "plain";
      Variant<E>& g = variants[key];
      if (!g.w) {
        g.w = wv;
        g.eng = std::make_unique<Engine<E>>(g.w, 1, context, nullptr, exec);
      }
      g.members.push_back(i);
      runs[i].ledger = flops::Ledger(w->cfg.n_layer);
      runs[i].masker = std::make_unique<sparsity::ActivationMasker<E>>(w->cfg.n_layer);
      if (cfgs[i].ma.sparse()) sparsity::configure_masker(*runs[i].masker, plan, *g.w);
    }
  }
};

/// Every window: the dense prefix once per variant, then each configuration's tail on that
/// cache, scored as perplexity() scores a window.
template <class E>
void run_windows(CompareRuns<E>& cr, const std::vector<int>& stream,
                 const std::vector<std::uint64_t>& starts, const PplOptions& po_, bool add_bos,
                 int n_layer, ProgressBar& bar) {
  const int C = po_.context, S = po_.score, tail = S + 1, bos = add_bos ? 1 : 0;
  const int prefix = C - tail;  // dense rows shared by every configuration of a variant
  Kokkos::View<double*, DeviceOf<E>> nll("sparsim::compare::nll", tail);
  IVec<E> target("sparsim::compare::target", tail), amax("sparsim::compare::argmax", tail);
  auto h_target = Kokkos::create_mirror_view(target);
  flops::Ledger prefix_ledger(n_layer);
  const int total = static_cast<int>(starts.size() * cr.cfgs.size());
  int done = 0;
  for (std::size_t wi = 0; wi < starts.size(); ++wi) {
    std::vector<int> s;
    s.reserve(static_cast<std::size_t>(C));
    if (bos) s.push_back(po_.bos_id);
    s.insert(s.end(), stream.begin() + static_cast<std::ptrdiff_t>(starts[wi]),
             stream.begin() + static_cast<std::ptrdiff_t>(starts[wi] + C - bos));
    for (int i = 0; i < tail; ++i) h_target(i) = i + 1 < tail ? s[C - tail + i + 1] : -1;
    Kokkos::deep_copy(target, h_target);
    const std::vector<int> head(s.begin(), s.begin() + prefix), rest(s.begin() + prefix, s.end());
    for (auto& kv : cr.variants) {
      Variant<E>& g = kv.second;
      Engine<E>& eng = *g.eng;
      prefix_ledger.reset();
      if (prefix > 0) {
        eng.set_masker(nullptr);
        eng.set_ledger(&prefix_ledger);
        eng.forward_tail({head}, 0, 1);
      }
      for (std::size_t i : g.members) {
        ConfigRun<E>& r = cr.runs[i];
        eng.set_masker(cr.cfgs[i].ma.sparse() ? r.masker.get() : nullptr);
        eng.set_sparse_from(0);
        eng.set_ledger(&r.ledger);
        Mat<E> logits = eng.forward_tail({rest}, prefix, tail);
        eng.set_sparse_from(Engine<E>::kDecodeOnly);
        eng.set_ledger(nullptr);
        // the prefix's cache is what counts; its one logit row (final norm and LM head) is
        // not part of a window's work
        r.ledger.merge(prefix_ledger, flops::Op::LMHead);
        const auto fn = prefix_ledger.at(flops::Phase::Prefill, flops::Op::RMSNorm, -1);
        r.ledger.add(flops::Op::RMSNorm, -1, flops::Phase::Prefill, -fn.flops_dense,
                     -fn.flops_realised, -fn.bytes_dense, -fn.bytes_realised, 0);
        nll_rows(eng.exec(), CMat<E>(logits), target, nll, amax);
        auto hn = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), nll);
        auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), amax);
        double wsum = 0;  // fixed order, as perplexity()
        for (int k = 0; k < S; ++k) {
          wsum += hn(k);
          if (ha(k) == h_target(k)) ++r.ppl.argmax_hits;
        }
        r.ppl.window_nll.push_back(wsum);
        r.ppl.window_tokens.push_back(static_cast<std::uint64_t>(S));
        r.ppl.window_start.push_back(starts[wi]);
        r.ppl.nll_sum += wsum;
        r.ppl.tokens_scored += static_cast<std::uint64_t>(S);
        bar.update(++done, total);
      }
      eng.set_masker(nullptr);
    }
  }
}

/// One configuration's JSON block: perplexity with its windows and spread, cost, sparsity.
template <class E>
nlohmann::json config_json(const ConfigSpec& cfg, const ConfigRun<E>& r) {
  const PplSpread sp = ppl_spread(r.ppl);
  nlohmann::json e;
  e["name"] = cfg.name;
  e["options"] = cfg.args;
  e["method"] = cfg.ma.method;
  e["perplexity"] = r.ppl.perplexity();
  e["nll_sum"] = r.ppl.nll_sum;
  e["tokens_scored"] = r.ppl.tokens_scored;
  e["top1"] = static_cast<double>(r.ppl.argmax_hits) /
              static_cast<double>(std::max<std::uint64_t>(1, r.ppl.tokens_scored));
  e["window_nll"] = r.ppl.window_nll;
  e["window_tokens"] = r.ppl.window_tokens;
  e["window_start"] = r.ppl.window_start;
  e["perplexity_spread"] = {
      {"mean_nll_per_window", sp.mean_nll}, {"se", sp.se}, {"ci95", {sp.ci95[0], sp.ci95[1]}}};
  const nlohmann::json cost = cost_json(r.ledger);
  e["flops"] = cost["flops"];
  e["bytes"] = cost["bytes"];
  if (cfg.ma.sparse()) {
    const SparsityReport rep{r.plan, r.masker->all_stats(), r.masker->token_sparsity(),
                             cfg.ma.calib_path};
    e["sparsity"] = rep.json();
  }
  return e;
}

/// The run file: per configuration its windows, sparsity and FLOPs.
template <class E>
void write_compare_runs(io::Group root, const CompareRuns<E>& cr, const Corpus& corpus) {
  io::Group cg = root.create_group("corpus");
  cg.set_attr("source", corpus.source);
  cg.set_attr("fingerprint", corpus.fingerprint);
  io::Group all = root.create_group("configs");
  for (std::size_t i = 0; i < cr.cfgs.size(); ++i) {
    const ConfigSpec& cfg = cr.cfgs[i];
    const ConfigRun<E>& r = cr.runs[i];
    io::Group g = all.create_group(cfg.name);
    g.set_attr("options", cfg.args);
    g.set_attr("method", cfg.ma.method);
    io::Group pg = g.create_group("perplexity");
    pg.set_attr("perplexity", r.ppl.perplexity());
    pg.set_attr("tokens_scored", static_cast<std::int64_t>(r.ppl.tokens_scored));
    pg.write<double>("window_nll", r.ppl.window_nll, {"nat", "summed NLL of the scored tokens"});
    pg.write<std::uint64_t>("window_start", r.ppl.window_start,
                            {"token", "window start offset in the corpus token stream"});
    if (cfg.ma.sparse()) {
      const SparsityReport rep{r.plan, r.masker->all_stats(), r.masker->token_sparsity(),
                               cfg.ma.calib_path};
      rep.write(g);
    }
    io::Group fl = g.create_group("flops");
    r.ledger.write(fl);
  }
}

template <class E>
int run_compare(CompareArgs& a, const ResolvedModel& rm, const Corpus& corpus, const Runtime& rt,
                E exec, int argc, char** argv) {
  PplOptions& po_ = a.ppl;
  const std::string backend = resolve_backend(a.co.backend);
  Stopwatch wall;
  ModelInfo mi;
  std::shared_ptr<const Weights<E>> w;
  check_as_options([&] { w = load_model<E>(rm.path, a.lo, &mi); });
  const Config& c = w->cfg;
  const Tokenizer tok = tokenizer_for(rm.path);
  const bool add_bos =
      a.bos_mode == "yes" || (a.bos_mode == "auto" && tok.add_bos_default() && tok.bos_id() >= 0);
  require(!(a.bos_mode == "yes" && tok.bos_id() < 0), "--bos yes: the model has no BOS token");
  po_.bos_id = add_bos ? tok.bos_id() : -1;
  check_as_options([&] { po_.validate(c.context_length); });
  const std::vector<int> stream = corpus_stream(corpus, tok);
  const auto starts = window_starts(stream.size(), po_);
  require(!starts.empty(),
          "the corpus has {} tokens, fewer than one window of {} (use a smaller --context)",
          stream.size(), po_.context);

  CompareRuns<E> cr(a.cfgs, w, mi, a.lo.storage, po_.context, exec);
  log().info("compare: {} configurations on {} model variants, {} windows", a.cfgs.size(),
             cr.variants.size(), starts.size());
  ProgressBar bar("compare", a.pmode);
  run_windows(cr, stream, starts, po_, add_bos, c.n_layer, bar);
  bar.finish();
  const double wall_s = wall.seconds();

  const int C = po_.context, S = po_.score, prefix = C - S - 1;
  nlohmann::json j;
  j["model"] = {{"path", mi.path}, {"fingerprint", mi.fingerprint}, {"origin", rm.origin}};
  j["storage"] = a.storage;
  j["bf16_compute"] = a.bf16_compute;
  j["threads"] = rt.threads();
  j["backend"] = backend;
  j["wall_seconds"] = wall_s;
  j["cpu_seconds"] = process_cpu_seconds();
  j["corpus"] = {{"source", corpus.source},
                 {"fingerprint", corpus.fingerprint},
                 {"bytes", corpus.bytes},
                 {"tokens", stream.size()}};
  j["protocol"] = {{"context", C},   {"stride", po_.stride},     {"score", S},
                   {"bos", add_bos}, {"windows", starts.size()}, {"shared_prefix", prefix}};
  j["command"] = command_line(argc, argv);
  nlohmann::json jc = nlohmann::json::array();
  std::cout << fmt::format("{} windows of {} tokens, stride {}, scoring the last {}; {}\n",
                           starts.size(), C, po_.stride, S, corpus.source);
  std::cout << fmt::format("  {:<24} {:>10} {:>21} {:>10} {:>10}\n", "configuration", "perplexity",
                           "95% CI over windows", "realised", "FLOPs/dense");
  for (std::size_t i = 0; i < a.cfgs.size(); ++i) {
    const nlohmann::json e = config_json(a.cfgs[i], cr.runs[i]);
    jc.push_back(e);
    const PplSpread sp = ppl_spread(cr.runs[i].ppl);
    std::cout << fmt::format(
        "  {:<24} {:>10.4f} {:>21} {:>10.4f} {:>10.4f}\n", a.cfgs[i].name,
        e["perplexity"].get<double>(), fmt::format("{:.3f} … {:.3f}", sp.ci95[0], sp.ci95[1]),
        e.contains("sparsity") ? e["sparsity"]["realised_mean"].get<double>() : 0.0,
        e["flops"]["realised_over_dense"].get<double>());
  }
  j["configs"] = jc;
  std::cout << fmt::format("  wall seconds {:.1f}, backend {} / {} threads\n", wall_s, backend,
                           rt.threads());

  std::unique_ptr<io::RunFile> rf;
  if (!a.out.empty()) {
    rf = std::make_unique<io::RunFile>(a.out);
    io::Group root = rf->root();
    write_run_header(root, argc, argv, backend, rt.threads(), mi, c, a.lo.storage,
                     a.lo.bf16_compute);
    write_compare_runs(root, cr, corpus);
  }
  io::AtomicTextFile jf(a.json_out);
  jf.stream() << io::json_file_text(j);
  if (rf) rf->commit();
  jf.commit();
  return 0;
}

}  // namespace

int cmd_compare(int argc, char** argv) {
  CompareArgs a;
  po::options_description d("sparsim compare options");
  a.add_options(d);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: sparsim compare --json FILE --config 'NAME: OPTIONS' … [--calibration C] "
             "[--model M] [--corpus C] [options]",
             d, vm))
    return 0;
  a.check();
  const ResolvedModel rm = resolve_model(a.model_arg);
  const Corpus corpus = load_corpus_arg(a.corpus_arg, CorpusOptions{a.text_field});

  Runtime rt(a.co);
  return with_backend(a.co.backend,
                      [&](auto exec) { return run_compare(a, rm, corpus, rt, exec, argc, argv); });
}

}  // namespace sparsim::app
