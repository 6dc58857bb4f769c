// sparsim prune: weight-side KV pruning (RAP, KVPruner) from Fisher scores, low-rank K/V
// factorisation (PaLU, SVD-LLM; prune_low_rank.cpp), or structured pruning of whole heads and FFN
// channels (FLAP, SlimGPT) from statistics gathered over a corpus, written out as a smaller GGUF
// model that every command runs.
#include "common.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "eval/corpus.hpp"
#include "model/gguf.hpp"
#include "model/loader.hpp"
#include "prune_io.hpp"
#include "prune_low_rank.hpp"
#include "records.hpp"
#include "sparsity/calibration.hpp"
#include "transforms/flap.hpp"
#include "transforms/kv_weight_pruning.hpp"
#include "transforms/pruned_gguf.hpp"
#include "transforms/slimgpt.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <iostream>
#include <optional>

namespace sparsim::app {

namespace {

/// A structured method's run (FLAP, SlimGPT), its options checked.
template <class Options>
struct StructuredArgs {
  PruneFiles files;
  pruning::CutType cut;
  Options opt;
  CommonOptions co;
};
using FlapArgs = StructuredArgs<pruning::PruneOptions>;
using SlimGptArgs = StructuredArgs<pruning::SlimGptOptions>;

/// The start the structured methods share: the source and its corpus opened, the full model
/// loaded, the calibration windows `r` cut and named in the options; then f(src, model, windows).
template <class Options, class F>
int with_calibration_windows(StructuredArgs<Options>& a, const WindowRequest& r, F&& f) {
  const PruneSource src = open_prune_source(a.files);
  return with_full_model(a.co, src.model, RefuseSource::AnyReduction, [&](const auto& m) {
    const std::vector<std::vector<int>> windows =
        corpus_windows(*src.corpus, src.model.path, m.w->cfg.context_length, r);
    a.opt.source_fingerprint = m.info.fingerprint;
    a.opt.calibration = windows_label(*src.corpus, r.count, r.tokens);
    return f(src, m, windows);
  });
}

/// prune --method flap: statistics over corpus windows, scores, the global structure search,
/// the biases, the reduced GGUF.
int prune_flap(int argc, char** argv, FlapArgs& a) {
  pruning::PruneOptions& po = a.opt;
  const WindowRequest r = method_windows("flap", po.flap_windows, po.flap_tokens);
  return with_calibration_windows(a, r, [&](const auto& src, const auto& m, const auto& windows) {
    log().info("FLAP statistics: {} windows of {} tokens", po.flap_windows, po.flap_tokens);
    using E = typename std::decay_t<decltype(m)>::Exec;
    const auto& [w, mi, wall] = m;
    const Config& c = w->cfg;
    Stopwatch stats_clock;
    const pruning::FlapStats st = pruning::flap_statistics<E>(w, windows);
    const double stats_s = stats_clock.seconds();
    const pruning::FlapScores sc = pruning::flap_scores(*w, st);
    const Config pc = pruning::plan_flap(c, sc, po);
    const pruning::OutputBiases biases = pruning::flap_biases(*w, pc, st);
    const std::string& out = a.files.out;
    const pruning::WrittenModel written =
        pruning::write_pruned_gguf(src.model.path, pc, out, a.cut, &biases);
    const ModelInfo mo = check_written_pruned<E>(out, pc);
    const pruning::FlapReport rep = pruning::flap_report(c, pc, po.ratio);
    std::cout << fmt::format(
        "pruned flap -> {}\n  source {} (fingerprint {})\n  statistics {} ({} tokens, {:.1f} "
        "s)\n  recipe {}\n  output fingerprint {}, {} parameters (full: {})\n\n",
        out, mi.path, mi.fingerprint, po.calibration, st.tokens, stats_s, pc.prune.recipe,
        mo.fingerprint, pc.n_params(), c.n_params());
    std::cout << rep.table() << written.text();
    std::cout << fmt::format("  wall seconds {:.1f}\n", wall.seconds());
    if (!a.files.json_out.empty()) {
      nlohmann::json j = rep.json();
      j.update(written.json());
      j["calibration"] = windows_json(*src.corpus, po.flap_windows, po.flap_tokens, st.tokens);
      j["recipe"] = pc.prune.recipe;
      j["n_params"] = pc.n_params();
      j["n_params_full"] = c.n_params();
      j["statistics_seconds"] = stats_s;
      j["wall_seconds"] = wall.seconds();
      write_prune_json(std::move(j), a.files, src, mi, mo, command_line(argc, argv));
    }
    return 0;
  });
}

/// prune --method slimgpt: Gram matrices of the W_o and W_down inputs over corpus windows, the
/// OBS greedy per layer with the incremental ratio, the compensated weights, the reduced GGUF.
int prune_slimgpt(int argc, char** argv, SlimGptArgs& a) {
  pruning::SlimGptOptions& so = a.opt;
  const WindowRequest r = method_windows("slimgpt", so.windows, so.tokens);
  return with_calibration_windows(a, r, [&](const auto& src, const auto& m, const auto& windows) {
    log().info("SlimGPT statistics: {} windows of {} tokens{}", so.windows, so.tokens,
               so.sequential ? ", gathered again for every layer" : "");
    using E = typename std::decay_t<decltype(m)>::Exec;
    const auto& [w, mi, wall] = m;
    const Config& c = w->cfg;
    const std::int64_t tokens = static_cast<std::int64_t>(so.windows) * so.tokens;
    double stats_s = 0, prune_s = 0;
    pruning::SlimGptResult res;
    if (so.sequential) {  // statistics and greedy interleaved, layer by layer
      Stopwatch clock;
      res = pruning::slimgpt_prune_sequential<E>(w, windows, so, [](int done, int total) {
        log().info("SlimGPT: layer {} of {} pruned", done, total);
      });
      prune_s = clock.seconds();
    } else {
      Stopwatch stats_clock;
      const pruning::SlimGptGrams g = pruning::slimgpt_grams<E>(w, windows);
      stats_s = stats_clock.seconds();
      Stopwatch prune_clock;
      res = pruning::slimgpt_prune(*w, g, so);
      prune_s = prune_clock.seconds();
    }
    const Config& pc = res.plan;
    const pruning::OutputBiases biases = pruning::zero_biases(pc);
    const std::string& out = a.files.out;
    const pruning::WrittenModel written =
        pruning::write_pruned_gguf(src.model.path, pc, out, a.cut, &biases, &res.values);
    const ModelInfo mo = check_written_pruned<E>(out, pc);
    const pruning::FlapReport rep = pruning::flap_report(c, pc, so.ratio);
    std::cout << fmt::format(
        "pruned slimgpt -> {}\n  source {} (fingerprint {})\n  statistics {} ({} tokens, {:.1f} "
        "s)\n  greedy and compensation {:.1f} s\n  recipe {}\n  output fingerprint {}, {} "
        "parameters (full: {})\n\n",
        out, mi.path, mi.fingerprint, so.calibration, tokens, stats_s, prune_s, pc.prune.recipe,
        mo.fingerprint, pc.n_params(), c.n_params());
    std::cout << rep.table() << written.text();
    std::cout << fmt::format("  wall seconds {:.1f}\n", wall.seconds());
    if (!a.files.json_out.empty()) {
      nlohmann::json j = rep.json();
      j["method"] = "slimgpt";
      j["layers"] = pruning::slimgpt_layers_json(res);
      j.update(written.json());
      j["calibration"] = windows_json(*src.corpus, so.windows, so.tokens, tokens);
      j["schedule"] = pruning::schedule_name(so.schedule);
      j["hessian"] = so.sequential ? "sequential" : "dense";
      j["damp"] = so.damp;
      j["ffn_group"] = so.ffn_group;
      j["recipe"] = pc.prune.recipe;
      j["n_params"] = pc.n_params();
      j["n_params_full"] = c.n_params();
      j["statistics_seconds"] = stats_s;
      j["prune_seconds"] = prune_s;
      j["wall_seconds"] = wall.seconds();
      write_prune_json(std::move(j), a.files, src, mi, mo, command_line(argc, argv));
    }
    return 0;
  });
}

}  // namespace

int cmd_prune(int argc, char** argv) {
  CommonOptions co;
  std::string model_arg, method, calib_path, out, json_out, type, corpus_arg, text_field;
  double ratio = 0.2;
  int flap_windows = 64, flap_tokens = 128;
  pruning::SlimGptOptions slim;
  std::string slim_schedule = "log", slim_hessian = "dense";
  std::string score = "fisher", budget = "adaptive", pair_score = "joint", kv_budget = "balanced";
  double retain = 0.7, k_share = 0.5;
  int flops_context = 2048;
  LowRankPrune lr;
  bool no_whiten = false;
  po::options_description d("sparsim prune options");
  add_model_option(d, model_arg, "the full model (GGUF)");
  d.add_options()(
      "method", po::value(&method)->default_value("rap"),
      "rap (whole RoPE pairs of K, per-layer budgets from the Fisher scores), kvpruner "
      "(single K channels by Fisher score, each rotated at its own RoPE frequency; same "
      "budgets), kvpruner-naive (the same channels re-packed as a smaller head and rotated "
      "as its consecutive pairs, at that head's frequencies), palu (whitened low-rank W_k and "
      "W_v per group of KV heads, ranks by Fisher score; the cache holds the latents), "
      "svd-llm (whitened low-rank W_k and W_v over all KV heads, equal ranks) or flap (whole "
      "attention heads and FFN channels by fluctuation score, one ranking over the model, "
      "removed parts' mean output folded into biases; statistics from --corpus) or slimgpt "
      "(whole attention heads and FFN channels removed layer by layer by the Optimal Brain "
      "Surgeon greedy on the W_o / W_down input Hessians, the kept columns compensated; ratios "
      "rising with depth; statistics from --corpus)")(
      "ratio", po::value(&ratio)->default_value(ratio),
      "flap, slimgpt: share of the blocks' projection parameters removed, in (0, 1) for flap, "
      "[0, 1) for slimgpt")(
      "corpus,c", po::value(&corpus_arg)->default_value("default"),
      "flap, slimgpt, palu, svd-llm: calibration / whitening text (a file, a directory, JSONL, or "
      "'default')")("text-field", po::value(&text_field)->default_value("text"),
                    "JSONL field holding the text")(
      "flap-windows", po::value(&flap_windows)->default_value(flap_windows),
      "flap: calibration windows (consecutive, from the start of the corpus)")(
      "flap-tokens", po::value(&flap_tokens)->default_value(flap_tokens),
      "flap: tokens per calibration window (each run from position 0)")(
      "slimgpt-windows", po::value(&slim.windows)->default_value(slim.windows),
      "slimgpt: calibration windows (consecutive, from the start of the corpus)")(
      "slimgpt-tokens", po::value(&slim.tokens)->default_value(slim.tokens),
      "slimgpt: tokens per calibration window (each run from position 0)")(
      "slimgpt-damp", po::value(&slim.damp)->default_value(slim.damp),
      "slimgpt: damping λ, λ·mean(diag H) added to the Hessian's diagonal")(
      "slimgpt-ffn-group", po::value(&slim.ffn_group)->default_value(slim.ffn_group),
      "slimgpt: FFN channels removed per greedy step (the inverse Hessian is recomputed "
      "between steps)")(
      "slimgpt-schedule", po::value(&slim_schedule)->default_value(slim_schedule),
      "slimgpt: per-layer ratios: log (rising as ln(l + 2) with depth, mean = --ratio) or "
      "uniform (--ratio in every layer)")(
      "slimgpt-hessian", po::value(&slim_hessian)->default_value(slim_hessian),
      "slimgpt: dense (every layer's Hessian from one pass of the dense model) or sequential "
      "(layer by layer on the inputs of the already-pruned layers below: one pass per layer, "
      "about L/2 times the statistics' cost)")(
      "retain", po::value(&retain)->default_value(0.7),
      "mean retain ratio ρ in (0, 1]: the fraction of K and V channels kept over the model "
      "(palu, svd-llm: the KV-cache width kept, Σ ranks over Σ K and V widths)")(
      "calibration", po::value(&calib_path),
      "calibration file with Fisher scores of this model (sparsim calibrate --fisher; required)")(
      "out,o", po::value(&out), "pruned model to write (GGUF; required)")(
      "json", po::value(&json_out),
      "JSON summary: method, retain, orphan_ratio, kv_bytes_fraction, attn_params_fraction, "
      "attn_flops_fraction and per-layer figures")(
      "flops-context", po::value(&flops_context)->default_value(2048),
      "prefill length at which the attention FLOP fraction is reported")(
      "type", po::value(&type)->default_value("auto"),
      "type of a tensor that cannot be cut in its source type (W_o of a block-quantized model "
      "cut through its blocks): auto (smallest of f16, bf16, f32 that keeps every value "
      "exactly), source (requantize in the source tensor's type; lossy) or a type: f32, f16, "
      "bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k (requantized; lossy)")(
      "score", po::value(&score)->default_value(score),
      "channel scores: fisher (the calibration's) or magnitude (squared norm of each K / V "
      "weight row; no calibration needed)")(
      "budget", po::value(&budget)->default_value(budget),
      "layer budgets: adaptive (pairs per head proportional to the layer's Σ σ_p) or uniform "
      "(the same width in every layer)")(
      "pair-score", po::value(&pair_score)->default_value(pair_score),
      "RoPE pair score: joint (F_p of the pair gated together) or additive (F_c + F_c')")(
      "k-share", po::value(&k_share)->default_value(k_share),
      "share of the kept K and V channels given to K, in (0, 1): K keeps 2·share·ρ of its "
      "channels, V 2·(1 − share)·ρ (0.5: equal K and V budgets)")(
      "kv-budget", po::value(&kv_budget)->default_value(kv_budget),
      "balanced (K and V widths by --k-share) or pooled (each layer's kept channels split "
      "between K and V by their score mass: one allocation over both)")(
      "group", po::value(&lr.opt.group)->default_value(0),
      "palu, svd-llm: KV heads factorised together (0: the method's default, PaLU 4 capped at "
      "the model's KV heads, SVD-LLM all of them)")(
      "no-whiten", po::bool_switch(&no_whiten),
      "palu, svd-llm: plain SVD of the weights instead of the truncation-aware whitening "
      "(the ablation; needs no corpus)")(
      "whiten-seqs", po::value(&lr.seqs)->default_value(lr.seqs),
      "palu, svd-llm: whitening sequences (consecutive, from the start of the corpus)")(
      "whiten-tokens", po::value(&lr.tokens)->default_value(lr.tokens),
      "palu, svd-llm: tokens per whitening sequence");
  add_common_options(d, co);
  po::variables_map vm;
  if (!parse(
          argc, argv,
          "usage: sparsim prune --method rap|kvpruner|kvpruner-naive|palu|svd-llm --retain R "
          "[--calibration C] --out M.gguf [--model smollm2] [--json S] [--type auto|source|TYPE]\n"
          "       sparsim prune --method flap|slimgpt --ratio P [--corpus C] --out M.gguf",
          d, vm))
    return 0;
  // Everything a user can get wrong is checked before anything is written.
  require(!out.empty(), "prune: --out FILE is required");
  const bool low_rank = method == "palu" || method == "svd-llm";
  require(low_rank || method == "rap" || method == "kvpruner" || method == "kvpruner-naive" ||
              method == "flap" || method == "slimgpt",
          "pruning method '{}' is not rap, kvpruner, kvpruner-naive, palu, svd-llm, flap or "
          "slimgpt",
          method);
  for (const char* o : {"group", "no-whiten", "whiten-seqs", "whiten-tokens"})
    require(low_rank || vm[o].defaulted(), "--{} applies to --method palu and svd-llm only", o);
  for (const char* o : {"slimgpt-windows", "slimgpt-tokens", "slimgpt-damp", "slimgpt-ffn-group",
                        "slimgpt-schedule", "slimgpt-hessian"})
    require(method == "slimgpt" || vm[o].defaulted(), "--{} applies to --method slimgpt only", o);
  // the files of the structured methods (FLAP, SlimGPT), which gather statistics over the corpus
  const PruneFiles corpus_files{model_arg, "", out, json_out, true, corpus_arg, text_field};
  if (method == "slimgpt") {
    for (const char* o : {"retain", "calibration", "score", "budget", "pair-score", "k-share",
                          "kv-budget", "flops-context", "flap-windows", "flap-tokens"})
      require(!vm.count(o) || vm[o].defaulted(),
              "--{} does not apply to --method slimgpt (a RAP / KVPruner / FLAP option)", o);
    slim.ratio = ratio;
    slim.schedule = pruning::parse_slimgpt_schedule(slim_schedule);
    require(slim_hessian == "dense" || slim_hessian == "sequential",
            "--slimgpt-hessian '{}' is not dense or sequential", slim_hessian);
    slim.sequential = slim_hessian == "sequential";
    slim.validate();
    SlimGptArgs a{corpus_files, pruning::CutType::parse(type), slim, co};
    return prune_slimgpt(argc, argv, a);
  }
  if (low_rank) {
    for (const char* o : {"score", "budget", "pair-score", "k-share", "kv-budget", "type",
                          "flops-context", "ratio", "flap-windows", "flap-tokens"})
      require(vm[o].defaulted(),
              "--{} does not apply to --method {} (a RAP / KVPruner / FLAP option)", o, method);
    lr.corpus_arg = corpus_arg;
    lr.text_field = text_field;
    lr.opt.method =
        method == "palu" ? pruning::LowRankMethod::Palu : pruning::LowRankMethod::SvdLlm;
    lr.opt.retain = retain;
    lr.opt.whiten = !no_whiten;
    require(std::isfinite(retain) && retain > 0 && retain <= 1, "--retain {} is outside (0, 1]",
            retain);
    require(lr.opt.group >= 0, "--group {} must be positive (or 0: the method's default)",
            lr.opt.group);
    require(lr.seqs >= 1 && lr.tokens >= 2,
            "--whiten-seqs must be >= 1 and --whiten-tokens >= 2, got {} and {}", lr.seqs,
            lr.tokens);
    require(!no_whiten || vm["corpus"].defaulted(),
            "--no-whiten factorises the weights alone; --corpus is not read");
    lr.co = co;
    lr.model_arg = model_arg;
    lr.calib_path = calib_path;
    lr.out = out;
    lr.json_out = json_out;
    lr.command = command_line(argc, argv);
    return prune_low_rank(lr);
  }
  const pruning::PruneMethod pm = pruning::parse_prune_method(method);
  const pruning::CutType cut = pruning::CutType::parse(type);
  pruning::PruneOptions po_;
  po_.method = pm;
  po_.retain = retain;
  po_.flops_context = flops_context;
  po_.score = pruning::parse_score_source(score);
  po_.budget = pruning::parse_layer_budget(budget);
  po_.pair_score = pruning::parse_pair_score(pair_score);
  po_.k_share = k_share;
  po_.kv_budget = pruning::parse_kv_budget(kv_budget);
  po_.ratio = ratio;
  po_.flap_windows = flap_windows;
  po_.flap_tokens = flap_tokens;
  po_.validate();
  require(flops_context >= 1, "--flops-context must be positive, got {}", flops_context);
  if (pm == pruning::PruneMethod::Flap) {
    for (const char* o :
         {"retain", "calibration", "score", "budget", "pair-score", "k-share", "kv-budget"})
      require(!vm.count(o) || vm[o].defaulted(),
              "--{} applies to K/V channel pruning (rap, kvpruner), not to flap", o);
    FlapArgs a{corpus_files, cut, po_, co};
    return prune_flap(argc, argv, a);
  }
  for (const char* o : {"ratio", "flap-windows", "flap-tokens", "corpus", "text-field"})
    require(vm[o].defaulted(), "--{} does not apply to --method {}", o, method);
  // (given at all, even at its default value, --k-share is a balanced-budget option)
  require(po_.kv_budget == pruning::KvBudget::Balanced || vm["k-share"].defaulted(),
          "--kv-budget pooled sets the K/V split itself; --k-share applies to balanced budgets");
  const bool fisher = po_.score == pruning::ScoreSource::Fisher;
  require(!fisher || !calib_path.empty(),
          "prune: --calibration FILE (from sparsim calibrate --fisher) is required with --score "
          "fisher");
  require(fisher || vm["pair-score"].defaulted(),
          "--pair-score applies to Fisher scores only (a magnitude pair score is the sum of its "
          "rows' squared norms)");
  const std::optional<sparsity::Calibration> calopt = read_fisher_calibration(calib_path);
  PruneFiles files;  // no corpus: the Fisher scores come from the calibration file
  files.model_arg = model_arg;
  files.calibration = calib_path;
  files.out = out;
  files.json_out = json_out;
  const PruneSource src = open_prune_source(files, [](const ResolvedModel& rm) {
    gguf::File f = gguf::File::open(rm.path);
    const std::string arch = f.get_string("general.architecture").value_or("llama");
    for (const char* k : {"rope.dimension_count", "rope.freq_base"})
      require(f.has(arch + "." + k),
              "{}: no RoPE metadata ('{}.{}'): pruning RoPE pairs needs a model that states how "
              "it rotates its keys",
              rm.path, arch, k);
  });
  const ResolvedModel& rm = src.model;
  // (the model is loaded for its fingerprint and config: the check against the calibration)
  return with_full_model(co, rm, RefuseSource::KvPruned, [&](const auto& m) {
    using E = typename std::decay_t<decltype(m)>::Exec;
    const auto& [w, mi, wall] = m;
    const Config& c = w->cfg;
    if (calopt) calopt->check_model(mi.fingerprint, c, mi.path);
    po_.source_fingerprint = mi.fingerprint;
    po_.calibration =
        fisher ? fisher_label(*calopt) : std::string("none: magnitude scores of the weights");
    const Config pc = fisher ? pruning::plan_pruning(c, *calopt->fisher, po_)
                             : pruning::plan_pruning(c, pruning::magnitude_channel_scores(*w), po_);
    const pruning::WrittenModel written = pruning::write_pruned_gguf(rm.path, pc, out, cut);
    // The file must be a model sparsim runs: load it back (shapes, layout, fingerprint).
    const ModelInfo mo = check_written_pruned<E>(out, pc);
    const pruning::PruneReport rep = pruning::prune_report(pc);
    std::cout << fmt::format(
        "pruned {} -> {}\n  source {} (fingerprint {})\n  scores {} "
        "({})\n  recipe {}\n  output fingerprint {}, {} parameters (full: {})\n\n",
        pruning::method_name(pm), out, mi.path, mi.fingerprint,
        fisher ? calib_path : std::string("magnitude"), po_.calibration, po_.recipe(),
        mo.fingerprint, pc.n_params(), c.n_params());
    std::cout << rep.table() << written.text();
    std::cout << fmt::format("  wall seconds {:.1f}\n", wall.seconds());
    if (!json_out.empty()) {
      nlohmann::json j = rep.json();
      j.update(written.json());
      if (calopt) {
        j["calibration"] = {{"path", calib_path},
                            {"model_fingerprint", calopt->model_fingerprint},
                            {"corpus_fingerprint", calopt->corpus_fingerprint},
                            {"corpus_path", calopt->corpus_path},
                            {"sequences", calopt->fisher->sequences},
                            {"tokens", calopt->fisher->tokens}};
        j["layer_sigma"] = pruning::layer_sigma(*calopt->fisher);
      }
      j["switches"] = {{"score", score},
                       {"budget", budget},
                       {"pair_score", pair_score},
                       {"k_share", k_share},
                       {"kv_budget", kv_budget}};
      j["n_params"] = pc.n_params();
      j["n_params_full"] = c.n_params();
      write_prune_json(std::move(j), files, src, mi, mo, command_line(argc, argv));
    }
    return 0;
  });
}

}  // namespace sparsim::app
