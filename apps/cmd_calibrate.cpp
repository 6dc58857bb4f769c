// sparsim calibrate: activation statistics, greedy per-projection allocation tables, block
// sensitivities and the WINA rotation, written to a calibration file that eval reads.
#include "calibrate_options.hpp"
#include "common.hpp"
#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "eval/corpus.hpp"
#include "io/run_guard.hpp"
#include "model/loader.hpp"
#include "model_io.hpp"
#include "policies/probe_pruning.hpp"
#include "records.hpp"
#include "sparsity/calibrate.hpp"
#include "sparsity/rotation.hpp"
#include "transforms/fisher.hpp"
#include "transforms/kv_weight_pruning.hpp"

#include <fmt/format.h>

#include <unistd.h>
#include <iostream>
#include <sstream>

namespace sparsim::app {

namespace {

/// calibrate's options, checked before anything is read (the context lengths after the model
/// is loaded).
struct CalibrateArgs {
  CommonOptions co;
  std::string model_arg, corpus_arg, text_field, out, storage, variants, progress_mode_arg;
  bool strict = false, fisher = false, pp_history = false;
  int fisher_seqs = 32, fisher_tokens = 1024, pp_seqs = 32, pp_tokens = 128;
  CalibrateCli cc;
  // Set by check():
  bool do_plain = false, do_rot = false;  ///< the activation-sparsity variants to calibrate
  ProgressBar::Mode pmode = ProgressBar::Mode::Lines;
  LoadOptions lo;

  void add_options(po::options_description& d) {
    add_model_option(d, model_arg);
    d.add_options()(
        "corpus,c", po::value(&corpus_arg)->default_value("default"),
        "calibration text: a file, a directory, JSONL (see --text-field), or 'default'")(
        "text-field", po::value(&text_field)->default_value("text"),
        "JSONL field holding the text")("out,o", po::value(&out),
                                        "calibration file to write (HDF5; required)")(
        "variants", po::value(&variants)->default_value("plain,rotated"),
        "activation-sparsity variants: plain (TEAL), rotated (WINA, TopK-Guided), both (the two), "
        "or "
        "none (the default with --fisher)")(
        "fisher", po::bool_switch(&fisher),
        "Fisher scores of the K and V channels and RoPE pairs (RAP, KVPruner) from backward "
        "passes over --fisher-seqs sequences of --fisher-tokens tokens")(
        "fisher-seqs", po::value(&fisher_seqs)->default_value(32),
        "calibration sequences for --fisher (consecutive, from the start of the corpus)")(
        "fisher-tokens", po::value(&fisher_tokens)->default_value(1024),
        "tokens per --fisher sequence")(
        "pp-history", po::bool_switch(&pp_history),
        "Probe Pruning's historical states: the mean x² per position and input channel of W_o "
        "and W_down over --pp-history-seqs sequences of --pp-history-tokens tokens")(
        "pp-history-seqs", po::value(&pp_seqs)->default_value(32),
        "calibration sequences for --pp-history (consecutive, from the start of the corpus)")(
        "pp-history-tokens", po::value(&pp_tokens)->default_value(128),
        "tokens per --pp-history sequence: the positions the history covers")(
        "storage", po::value(&storage)->default_value("f32"), "weight storage: f32, bf16 or f16")(
        "strict", po::bool_switch(&strict), "NaN/Inf in the weights is an error, not a warning")(
        "progress", po::value(&progress_mode_arg)->default_value("auto"),
        "progress on stderr, per stage with its ETA: auto (a bar on a terminal, else a line per "
        "tenth of each stage), always (bar), lines, never");
    cc.add(d);
    add_common_options(d, co);
    add_check_option(d);
  }

  void check(const po::variables_map& vm) {
    require(!out.empty(), "calibrate: --out FILE is required");
    cc.finish();
    if ((fisher || pp_history) && vm["variants"].defaulted()) variants = "none";
    for (const auto& v : split_list(variants)) {
      require(v == "plain" || v == "rotated" || v == "both" || v == "none",
              "--variants: '{}' is not plain, rotated, both or none", v);
      do_plain = do_plain || v == "plain" || v == "both";
      do_rot = do_rot || v == "rotated" || v == "both";
    }
    require(do_plain || do_rot || fisher || pp_history,
            "calibrate: nothing to do (--variants none without --fisher or --pp-history)");
    require(!fisher || (fisher_seqs >= 1 && fisher_tokens >= 2),
            "--fisher-seqs must be >= 1 and --fisher-tokens >= 2");
    require(!pp_history || (pp_seqs >= 1 && pp_tokens >= 1),
            "--pp-history-seqs and --pp-history-tokens must be >= 1");
    for (const char* name : {"pp-history-seqs", "pp-history-tokens"})
      require(pp_history || vm[name].defaulted(), "--{} is a setting of --pp-history: add it",
              name);
    pmode = progress_mode(progress_mode_arg, ProgressBar::Mode::Lines);
    lo.storage = parse_dtype(storage);
    require(co.threads >= 0 && co.threads <= 4096, "--threads {} is out of range", co.threads);
    lo.strict = strict;
  }

  /// The checks that need the model: sequence lengths against its context, a full model for
  /// Fisher scores.
  void check_against_model(const Config& c, const ModelInfo& mi) const {
    const sparsity::CalibrateOptions& opt = cc.opt;
    require(!(do_plain || do_rot) ||
                (opt.context <= c.context_length && opt.greedy_tokens <= c.context_length),
            "--context / --greedy-tokens exceed the model's context of {}", c.context_length);
    require(!fisher || fisher_tokens <= c.context_length,
            "--fisher-tokens {} exceeds the model's context of {}", fisher_tokens,
            c.context_length);
    require(!fisher || !c.pruned(), "--fisher needs the full model; {} is already pruned ({})",
            mi.path, c.prune.method);
    require(!pp_history || pp_tokens <= c.context_length,
            "--pp-history-tokens {} exceeds the model's context of {}", pp_tokens,
            c.context_length);
    require(!pp_history || !c.pruned(),
            "--pp-history needs the full model; {} is already pruned ({})", mi.path,
            c.prune.method);
  }
};

/// The calibration file's header: the model, the corpus and the settings.
sparsity::Calibration calibration_header(const sparsity::CalibrateOptions& opt, const ModelInfo& mi,
                                         const Config& c, const Corpus& corpus,
                                         std::size_t stream_tokens) {
  sparsity::Calibration cal;
  cal.model_fingerprint = mi.fingerprint;
  cal.model_path = mi.path;
  cal.corpus_fingerprint = corpus.fingerprint;
  cal.corpus_path = corpus.source;
  cal.n_layer = c.n_layer;
  cal.d_model = c.d_model;
  cal.d_ff = c.d_ff;
  cal.q_dim = c.q_dim();
  cal.kv_dim = c.kv_dim();
  cal.context = opt.context;
  cal.windows = std::min<std::int64_t>(opt.max_windows,
                                       static_cast<std::int64_t>(stream_tokens) / opt.context);
  cal.tokens = cal.windows * opt.context;
  cal.alpha = opt.alpha;
  cal.greedy_cap = opt.cap;
  cal.greedy_tokens = static_cast<std::int64_t>(opt.greedy_seqs) * opt.greedy_tokens;
  cal.greedy_seqs = opt.greedy_seqs;
  cal.greedy_seq_tokens = opt.greedy_tokens;
  cal.greedy_step_cap = opt.step_cap;
  cal.greedy_score_fraction = opt.score_fraction;
  cal.histogram_range_values = static_cast<std::int64_t>(opt.range_values);
  cal.probe_levels = opt.probes;
  return cal;
}

/// The plain (TEAL) and rotated (WINA, TopK-Guided) variants' statistics and tables.
template <class E>
void calibrate_variants(const CalibrateArgs& a, std::shared_ptr<const Weights<E>> w,
                        const std::vector<int>& stream, CalibrationProgress& prog,
                        sparsity::Calibration& cal) {
  const sparsity::CalibrateOptions& opt = a.cc.opt;
  if (a.do_plain) {
    log().info("calibrating the plain model (TEAL)");
    cal.plain.emplace();
    sparsity::calibrate_variant<E>(w, stream, opt, sparsity::ProbeMasking::Threshold, *cal.plain,
                                   prog.callback("plain"), &cal.timings, "plain");
    prog.finish();
  }
  if (a.do_rot) {
    log().info("computing the WINA rotation");
    StageClock sc;
    const sparsity::Rotation rot = sparsity::compute_rotation(*w);
    std::shared_ptr<const Weights<E>> wr = sparsity::apply_rotation(*w, rot, a.lo.storage);
    cal.timings.push_back({"rotation", sc.wall(), sc.cpu()});
    log().info("rotation: {:.1f} s", sc.wall());
    cal.rotated.emplace();
    for (const auto& q : rot.q_attn)
      cal.rotated->q_attn.insert(cal.rotated->q_attn.end(), q.begin(), q.end());
    for (const auto& q : rot.q_mlp)
      cal.rotated->q_mlp.insert(cal.rotated->q_mlp.end(), q.begin(), q.end());
    log().info("calibrating the rotated model (WINA, TopK-Guided)");
    sparsity::calibrate_variant<E>(wr, stream, opt, sparsity::ProbeMasking::Guided, *cal.rotated,
                                   prog.callback("rotated"), &cal.timings, "rotated");
    prog.finish();
  }
}

/// The first `n` consecutive sequences of `tokens` tokens of the corpus, for the stage `stage`
/// (its option, named in the error when the corpus is too short).
std::vector<std::vector<int>> leading_sequences(const std::vector<int>& stream, int n, int tokens,
                                                const char* stage) {
  const std::size_t need = static_cast<std::size_t>(n) * tokens;
  require(stream.size() >= need,
          "calibrate {}: the corpus has {} tokens, {} sequences of {} need {}", stage,
          stream.size(), n, tokens, need);
  std::vector<std::vector<int>> seqs;
  for (int i = 0; i < n; ++i) {
    const auto b = stream.begin() + static_cast<std::ptrdiff_t>(i) * tokens;
    seqs.emplace_back(b, b + tokens);
  }
  return seqs;
}

/// --fisher: the K/V channel and RoPE pair scores from backward passes over the first
/// sequences of the corpus.
template <class E>
void calibrate_fisher(const CalibrateArgs& a, std::shared_ptr<const Weights<E>> w,
                      const std::vector<int>& stream, CalibrationProgress& prog,
                      sparsity::Calibration& cal) {
  const auto seqs = leading_sequences(stream, a.fisher_seqs, a.fisher_tokens, "--fisher");
  log().info("Fisher scores: backward passes over {} sequences of {} tokens", a.fisher_seqs,
             a.fisher_tokens);
  StageClock sc;
  const auto cb = prog.callback("");
  cal.fisher =
      pruning::fisher_scores<E>(w, seqs, [&](int done, int total) { cb("fisher", done, total); });
  prog.finish();
  cal.timings.push_back({"fisher", sc.wall(), sc.cpu()});
}

/// --pp-history: Probe Pruning's historical states over the first sequences of the corpus.
template <class E>
void calibrate_pp_history(const CalibrateArgs& a, std::shared_ptr<const Weights<E>> w,
                          const std::vector<int>& stream, CalibrationProgress& prog,
                          sparsity::Calibration& cal) {
  const auto seqs = leading_sequences(stream, a.pp_seqs, a.pp_tokens, "--pp-history");
  log().info("Probe Pruning history: {} sequences of {} tokens", a.pp_seqs, a.pp_tokens);
  StageClock sc;
  const auto cb = prog.callback("");
  cal.probe_history = pruning::collect_probe_history<E>(
      w, seqs, 8, [&](int done, int total) { cb("pp-history", done, total); });
  prog.finish();
  cal.timings.push_back({"pp-history", sc.wall(), sc.cpu()});
}

/// Each variant's greedy rows and block sensitivities per layer.
std::string sensitivity_tables(const sparsity::Calibration& cal,
                               const sparsity::CalibrateOptions& opt, int n_layer) {
  std::string s;
  for (const auto* v : {&cal.plain, &cal.rotated}) {
    if (!v->has_value() || (*v)->sensitivity.empty()) continue;
    const sparsity::Sensitivity& set = (*v)->sensitivity.front();
    s += fmt::format(
        "\n  {} model: greedy rows per block, sensitivity e_i at s̄ ({}; {} sets in the "
        "file)\n",
        v == &cal.plain ? "plain" : "rotated", set.describe(), (*v)->sensitivity.size());
    s += fmt::format("  {:>5} {:>6}", "layer", "rows");
    for (double p : opt.probes) s += fmt::format(" {:>9}", fmt::format("e@{:.2f}", p));
    s += "\n";
    for (int l = 0; l < n_layer; ++l) {
      s += fmt::format("  {:>5} {:>6}", l, (*v)->greedy[l].rows.size());
      for (std::size_t k = 0; k < opt.probes.size(); ++k)
        s += fmt::format(" {:>9.4f}", set.e[k][l]);
      s += "\n";
    }
  }
  return s;
}

/// The Fisher scores' loss, timings and per-layer sums.
std::string fisher_table(const pruning::FisherScores& f) {
  double loss = 0;
  for (double x : f.loss) loss += x;
  const std::vector<double> sig = pruning::layer_sigma(f);
  std::string s = fmt::format(
      "\n  Fisher scores: {} sequences of {} tokens, mean loss {:.4f} nats\n"
      "  forward {:.2f} s, backward {:.2f} s ({:.3f} ms / {:.3f} ms per token, backward / "
      "forward {:.2f})\n  {:>5} {:>12} {:>12} {:>12}\n",
      f.sequences, f.tokens, loss / f.sequences, f.forward_seconds, f.backward_seconds,
      1e3 * f.forward_seconds / (static_cast<double>(f.sequences) * f.tokens),
      1e3 * f.backward_seconds / (static_cast<double>(f.sequences) * f.tokens),
      f.backward_seconds / f.forward_seconds, "layer", "sigma_l", "sum F(K)", "sum F(V)");
  const std::size_t KV = static_cast<std::size_t>(f.kv_dim());
  for (int l = 0; l < f.n_layer; ++l) {
    double fk = 0, fv = 0;
    for (std::size_t ch = 0; ch < KV; ++ch) {
      fk += f.k[static_cast<std::size_t>(l) * KV + ch];
      fv += f.v[static_cast<std::size_t>(l) * KV + ch];
    }
    s += fmt::format("  {:>5} {:>12.4e} {:>12.4e} {:>12.4e}\n", l, sig[static_cast<std::size_t>(l)],
                     fk, fv);
  }
  return s;
}

/// What was calibrated, over which text, and the time of each stage.
std::string calibration_report(const CalibrateArgs& a, const sparsity::Calibration& cal,
                               const ModelInfo& mi, const Corpus& corpus, std::size_t stream_tokens,
                               int n_layer) {
  std::string s =
      fmt::format("calibration {}\n  model {} (fingerprint {})\n", a.out, mi.path, mi.fingerprint);
  if (a.do_plain || a.do_rot) {
    s += fmt::format("  corpus {} ({} tokens in {} windows of {})\n", corpus.source, cal.tokens,
                     cal.windows, cal.context);
    s += fmt::format(
        "  greedy: {} sequences of {} tokens, α = {:g}{}, scored on the last {:g} of each\n",
        cal.greedy_seqs, cal.greedy_seq_tokens, cal.alpha,
        cal.greedy_step_cap > 0 ? fmt::format(", steps capped at {:g}", cal.greedy_step_cap) : "",
        cal.greedy_score_fraction);
  } else {
    s += fmt::format("  corpus {} ({} tokens)\n", corpus.source, stream_tokens);
  }
  s += sensitivity_tables(cal, a.cc.opt, n_layer);
  if (cal.fisher) s += fisher_table(*cal.fisher);
  if (cal.probe_history)
    s += fmt::format(
        "\n  Probe Pruning history: {} sequences of {} tokens ({} positions × ({} W_o + "
        "{} W_down inputs) per layer)\n",
        cal.probe_history->sequences, cal.probe_history->tokens, cal.probe_history->tokens,
        cal.probe_history->o_width, cal.probe_history->down_width);
  s += fmt::format("\n  {:<28} {:>10} {:>10}\n", "stage", "wall s", "CPU s");
  for (const auto& t : cal.timings)
    s += fmt::format("  {:<28} {:>10.1f} {:>10.1f}\n", t.stage, t.wall_seconds, t.cpu_seconds);
  return s;
}

}  // namespace

int cmd_calibrate(int argc, char** argv) {
  CalibrateArgs a;
  po::options_description d("sparsim calibrate options");
  a.add_options(d);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: sparsim calibrate --out FILE [--model M] [--corpus C] [options]",
             d, vm))
    return 0;
  a.check(vm);
  if (options_checked(vm)) return 0;
  const ResolvedModel rm = resolve_model(a.model_arg);
  io::guard_run({{"--model", rm.path}, {"--corpus", corpus_input_path(a.corpus_arg)}},
                {{"--out", a.out}});
  const Corpus corpus = load_corpus_arg(a.corpus_arg, CorpusOptions{a.text_field});

  Runtime rt(a.co);
  return with_backend(a.co.backend, [&](auto exec) {
    using E = decltype(exec);
    Stopwatch wall;
    ModelInfo mi;
    std::shared_ptr<const Weights<E>> w = load_model<E>(rm.path, a.lo, &mi);
    const Config& c = w->cfg;
    a.check_against_model(c, mi);
    const Tokenizer tok = tokenizer_for(rm.path);
    const std::vector<int> stream = corpus_stream(corpus, tok);
    log().info("calibration corpus {}: {} tokens", corpus.source, stream.size());

    sparsity::Calibration cal = calibration_header(a.cc.opt, mi, c, corpus, stream.size());
    cal.command = command_line(argc, argv);
    CalibrationProgress prog(a.pmode);
    calibrate_variants(a, w, stream, prog, cal);
    if (a.fisher) calibrate_fisher(a, w, stream, prog, cal);
    if (a.pp_history) calibrate_pp_history(a, w, stream, prog, cal);
    interruption_point("write");
    sparsity::write_calibration(a.out, cal);

    std::cout << calibration_report(a, cal, mi, corpus, stream.size(), c.n_layer);
    std::cout << fmt::format("\n  wall seconds {:.1f}, CPU seconds {:.1f}, {} threads\n",
                             wall.seconds(), process_cpu_seconds(), rt.threads());
    return 0;
  });
}

}  // namespace sparsim::app
