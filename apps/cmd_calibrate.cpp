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

int cmd_calibrate(int argc, char** argv) {
  CommonOptions co;
  std::string model_arg, corpus_arg, text_field, out, storage, variants, progress_mode_arg;
  bool strict = false, fisher = false;
  int fisher_seqs = 32, fisher_tokens = 1024;
  po::options_description d("sparsim calibrate options");
  add_model_option(d, model_arg);
  d.add_options()("corpus,c", po::value(&corpus_arg)->default_value("default"),
                  "calibration text: a file, a directory, JSONL (see --text-field), or 'default'")(
      "text-field", po::value(&text_field)->default_value("text"), "JSONL field holding the text")(
      "out,o", po::value(&out), "calibration file to write (HDF5; required)")(
      "variants", po::value(&variants)->default_value("plain,rotated"),
      "activation-sparsity variants: plain (TEAL), rotated (WINA, TopK-Guided), both (the two), or "
      "none (the default with --fisher)")(
      "fisher", po::bool_switch(&fisher),
      "Fisher scores of the K and V channels and RoPE pairs (RAP, KVPruner) from backward "
      "passes over --fisher-seqs sequences of --fisher-tokens tokens")(
      "fisher-seqs", po::value(&fisher_seqs)->default_value(32),
      "calibration sequences for --fisher (consecutive, from the start of the corpus)")(
      "fisher-tokens", po::value(&fisher_tokens)->default_value(1024),
      "tokens per --fisher sequence")("storage", po::value(&storage)->default_value("f32"),
                                      "weight storage: f32, bf16 or f16")(
      "strict", po::bool_switch(&strict), "NaN/Inf in the weights is an error, not a warning")(
      "progress", po::value(&progress_mode_arg)->default_value("auto"),
      "progress on stderr, per stage with its ETA: auto (a bar on a terminal, else a line per "
      "tenth of each stage), always (bar), lines, never");
  CalibrateCli cc;
  cc.add(d);
  add_common_options(d, co);
  add_check_option(d);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: sparsim calibrate --out FILE [--model M] [--corpus C] [options]",
             d, vm))
    return 0;
  require(!out.empty(), "calibrate: --out FILE is required");
  cc.finish();
  const sparsity::CalibrateOptions& opt = cc.opt;
  bool do_plain = false, do_rot = false;
  if (fisher && vm["variants"].defaulted()) variants = "none";
  for (const auto& v : split_list(variants)) {
    require(v == "plain" || v == "rotated" || v == "both" || v == "none",
            "--variants: '{}' is not plain, rotated, both or none", v);
    do_plain = do_plain || v == "plain" || v == "both";
    do_rot = do_rot || v == "rotated" || v == "both";
  }
  require(do_plain || do_rot || fisher,
          "calibrate: nothing to do (--variants none without --fisher)");
  require(!fisher || (fisher_seqs >= 1 && fisher_tokens >= 2),
          "--fisher-seqs must be >= 1 and --fisher-tokens >= 2");
  const ProgressBar::Mode pmode = progress_mode(progress_mode_arg, ProgressBar::Mode::Lines);
  LoadOptions lo;
  lo.storage = parse_dtype(storage);
  require(co.threads >= 0 && co.threads <= 4096, "--threads {} is out of range", co.threads);
  if (options_checked(vm)) return 0;
  lo.strict = strict;
  const ResolvedModel rm = resolve_model(model_arg);
  io::guard_run({{"--model", rm.path}, {"--corpus", corpus_input_path(corpus_arg)}},
                {{"--out", out}});
  const Corpus corpus = load_corpus(corpus_arg, CorpusOptions{text_field});

  Runtime rt(co);
  return with_backend(co.backend, [&](auto exec) {
    using E = decltype(exec);
    Stopwatch wall;
    ModelInfo mi;
    std::shared_ptr<const Weights<E>> w = load_model<E>(rm.path, lo, &mi);
    const Config& c = w->cfg;
    require(!(do_plain || do_rot) ||
                (opt.context <= c.context_length && opt.greedy_tokens <= c.context_length),
            "--context / --greedy-tokens exceed the model's context of {}", c.context_length);
    require(!fisher || fisher_tokens <= c.context_length,
            "--fisher-tokens {} exceeds the model's context of {}", fisher_tokens,
            c.context_length);
    require(!fisher || !c.pruned(), "--fisher needs the full model; {} is already pruned ({})",
            mi.path, c.prune.method);
    const Tokenizer tok = tokenizer_for(rm.path);
    const std::vector<int> stream = corpus_stream(corpus, tok);
    log().info("calibration corpus {}: {} tokens", corpus.source, stream.size());

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
                                         static_cast<std::int64_t>(stream.size()) / opt.context);
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
    cal.command = command_line(argc, argv);

    CalibrationProgress prog(pmode);
    if (do_plain) {
      log().info("calibrating the plain model (TEAL)");
      cal.plain.emplace();
      sparsity::calibrate_variant<E>(w, stream, opt, sparsity::ProbeMasking::Threshold, *cal.plain,
                                     prog.callback("plain"), &cal.timings, "plain");
      prog.finish();
    }
    if (do_rot) {
      log().info("computing the WINA rotation");
      StageClock sc;
      const sparsity::Rotation rot = sparsity::compute_rotation(*w);
      std::shared_ptr<const Weights<E>> wr = sparsity::apply_rotation(*w, rot, lo.storage);
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
    if (fisher) {
      const std::size_t need = static_cast<std::size_t>(fisher_seqs) * fisher_tokens;
      require(stream.size() >= need,
              "calibrate --fisher: the corpus has {} tokens, {} sequences of {} need {}",
              stream.size(), fisher_seqs, fisher_tokens, need);
      std::vector<std::vector<int>> seqs;
      for (int i = 0; i < fisher_seqs; ++i) {
        const auto b = stream.begin() + static_cast<std::ptrdiff_t>(i) * fisher_tokens;
        seqs.emplace_back(b, b + fisher_tokens);
      }
      log().info("Fisher scores: backward passes over {} sequences of {} tokens", fisher_seqs,
                 fisher_tokens);
      StageClock sc;
      const auto cb = prog.callback("");
      cal.fisher = pruning::fisher_scores<E>(
          w, seqs, [&](int done, int total) { cb("fisher", done, total); });
      prog.finish();
      cal.timings.push_back({"fisher", sc.wall(), sc.cpu()});
    }
    interruption_point("write");
    sparsity::write_calibration(out, cal);

    std::cout << fmt::format("calibration {}\n  model {} (fingerprint {})\n", out, mi.path,
                             mi.fingerprint);
    if (do_plain || do_rot) {
      std::cout << fmt::format("  corpus {} ({} tokens in {} windows of {})\n", corpus.source,
                               cal.tokens, cal.windows, cal.context);
      std::cout << fmt::format(
          "  greedy: {} sequences of {} tokens, α = {:g}{}, scored on the last {:g} of each\n",
          cal.greedy_seqs, cal.greedy_seq_tokens, cal.alpha,
          cal.greedy_step_cap > 0 ? fmt::format(", steps capped at {:g}", cal.greedy_step_cap) : "",
          cal.greedy_score_fraction);
    } else {
      std::cout << fmt::format("  corpus {} ({} tokens)\n", corpus.source, stream.size());
    }
    for (const auto* v : {&cal.plain, &cal.rotated}) {
      if (!v->has_value() || (*v)->sensitivity.empty()) continue;
      const sparsity::Sensitivity& set = (*v)->sensitivity.front();
      std::cout << fmt::format(
          "\n  {} model: greedy rows per block, sensitivity e_i at s̄ ({}; {} sets in the "
          "file)\n",
          v == &cal.plain ? "plain" : "rotated", set.describe(), (*v)->sensitivity.size());
      std::cout << fmt::format("  {:>5} {:>6}", "layer", "rows");
      for (double p : opt.probes) std::cout << fmt::format(" {:>9}", fmt::format("e@{:.2f}", p));
      std::cout << "\n";
      for (int l = 0; l < c.n_layer; ++l) {
        std::cout << fmt::format("  {:>5} {:>6}", l, (*v)->greedy[l].rows.size());
        for (std::size_t k = 0; k < opt.probes.size(); ++k)
          std::cout << fmt::format(" {:>9.4f}", set.e[k][l]);
        std::cout << "\n";
      }
    }
    if (cal.fisher) {
      const pruning::FisherScores& f = *cal.fisher;
      double loss = 0;
      for (double x : f.loss) loss += x;
      const std::vector<double> sig = pruning::layer_sigma(f);
      std::cout << fmt::format(
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
        std::cout << fmt::format("  {:>5} {:>12.4e} {:>12.4e} {:>12.4e}\n", l,
                                 sig[static_cast<std::size_t>(l)], fk, fv);
      }
    }
    std::cout << fmt::format("\n  {:<28} {:>10} {:>10}\n", "stage", "wall s", "CPU s");
    for (const auto& t : cal.timings)
      std::cout << fmt::format("  {:<28} {:>10.1f} {:>10.1f}\n", t.stage, t.wall_seconds,
                               t.cpu_seconds);
    std::cout << fmt::format("\n  wall seconds {:.1f}, CPU seconds {:.1f}, {} threads\n",
                             wall.seconds(), process_cpu_seconds(), rt.threads());
    return 0;
  });
}

}  // namespace sparsim::app
