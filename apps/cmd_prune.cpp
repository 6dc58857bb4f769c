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
#include "prune_args.hpp"
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
    std::cout << rep.table() << written_model_text(written);
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
    std::cout << rep.table() << written_model_text(written);
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

/// prune --method rap|kvpruner|kvpruner-naive: channel scores (the calibration's Fisher scores
/// or the weights' magnitudes), the per-layer budgets, the kept K/V channels, the reduced GGUF.
int prune_kv_channels(int argc, char** argv, PruneArgs& a) {
  const std::optional<sparsity::Calibration> calopt = read_fisher_calibration(a.calib_path);
  PruneFiles files;  // no corpus: the Fisher scores come from the calibration file
  files.model_arg = a.model_arg;
  files.calibration = a.calib_path;
  files.out = a.out;
  files.json_out = a.json_out;
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
  return with_full_model(a.co, rm, RefuseSource::KvPruned, [&](const auto& m) {
    using E = typename std::decay_t<decltype(m)>::Exec;
    const auto& [w, mi, wall] = m;
    const Config& c = w->cfg;
    if (calopt) calopt->check_model(mi.fingerprint, c, mi.path);
    a.kv.source_fingerprint = mi.fingerprint;
    a.kv.calibration =
        a.fisher ? fisher_label(*calopt) : std::string("none: magnitude scores of the weights");
    const Config pc = a.fisher
                          ? pruning::plan_pruning(c, *calopt->fisher, a.kv)
                          : pruning::plan_pruning(c, pruning::magnitude_channel_scores(*w), a.kv);
    const pruning::WrittenModel written = pruning::write_pruned_gguf(rm.path, pc, a.out, a.cut);
    // The file must be a model sparsim runs: load it back (shapes, layout, fingerprint).
    const ModelInfo mo = check_written_pruned<E>(a.out, pc);
    const pruning::PruneReport rep = pruning::prune_report(pc);
    std::cout << fmt::format(
        "pruned {} -> {}\n  source {} (fingerprint {})\n  scores {} "
        "({})\n  recipe {}\n  output fingerprint {}, {} parameters (full: {})\n\n",
        pruning::method_name(a.kv.method), a.out, mi.path, mi.fingerprint,
        a.fisher ? a.calib_path : std::string("magnitude"), a.kv.calibration, a.kv.recipe(),
        mo.fingerprint, pc.n_params(), c.n_params());
    std::cout << rep.table() << written_model_text(written);
    std::cout << fmt::format("  wall seconds {:.1f}\n", wall.seconds());
    if (!a.json_out.empty()) {
      nlohmann::json j = rep.json();
      j.update(written.json());
      if (calopt) {
        j["calibration"] = {{"path", a.calib_path},
                            {"model_fingerprint", calopt->model_fingerprint},
                            {"corpus_fingerprint", calopt->corpus_fingerprint},
                            {"corpus_path", calopt->corpus_path},
                            {"sequences", calopt->fisher->sequences},
                            {"tokens", calopt->fisher->tokens}};
        j["layer_sigma"] = pruning::layer_sigma(*calopt->fisher);
      }
      j["switches"] = {{"score", a.score},
                       {"budget", a.budget},
                       {"pair_score", a.pair_score},
                       {"k_share", a.k_share},
                       {"kv_budget", a.kv_budget}};
      j["n_params"] = pc.n_params();
      j["n_params_full"] = c.n_params();
      write_prune_json(std::move(j), files, src, mi, mo, command_line(argc, argv));
    }
    return 0;
  });
}

}  // namespace

int cmd_prune(int argc, char** argv) {
  PruneArgs a;
  po::options_description d("sparsim prune options");
  a.add_options(d);
  po::variables_map vm;
  if (!parse(
          argc, argv,
          "usage: sparsim prune --method rap|kvpruner|kvpruner-naive|palu|svd-llm --retain R "
          "[--calibration C] --out M.gguf [--model smollm2] [--json S] [--type auto|source|TYPE]\n"
          "       sparsim prune --method flap|slimgpt --ratio P [--corpus C] --out M.gguf",
          d, vm))
    return 0;
  // Everything a user can get wrong is checked before anything is written.
  check_as_options([&] { a.check(vm); });
  // the writers' checks of settings (the tensor type against the kept row lengths) name the
  // option too
  int rc = 0;
  check_as_options([&] {
    switch (a.family) {
      case PruneArgs::Family::SlimGpt: {
        SlimGptArgs s{a.corpus_files, a.cut, a.slim, a.co};
        rc = prune_slimgpt(argc, argv, s);
        return;
      }
      case PruneArgs::Family::LowRank:
        a.lr.command = command_line(argc, argv);
        rc = prune_low_rank(a.lr);
        return;
      case PruneArgs::Family::Flap: {
        FlapArgs f{a.corpus_files, a.cut, a.kv, a.co};
        rc = prune_flap(argc, argv, f);
        return;
      }
      case PruneArgs::Family::KvChannels:
        break;
    }
    rc = prune_kv_channels(argc, argv, a);
  });
  return rc;
}

}  // namespace sparsim::app
