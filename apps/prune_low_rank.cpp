#include "prune_low_rank.hpp"

#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "model/loader.hpp"
#include "prune_io.hpp"
#include "sparsity/calibration.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <optional>

namespace sparsim::app {

int prune_low_rank(const LowRankPrune& a) {
  const bool palu = a.opt.method == pruning::LowRankMethod::Palu;
  const std::optional<sparsity::Calibration> cal = read_fisher_calibration(a.calib_path);
  require(!palu || cal.has_value(),
          "prune --method palu: --calibration FILE (from sparsim calibrate --fisher) is required: "
          "PaLU allocates the ranks by Fisher score");
  const PruneFiles files{a.model_arg,  a.calib_path, a.out,       a.json_out,
                         a.opt.whiten, a.corpus_arg, a.text_field};
  const PruneSource src = open_prune_source(files);
  const ResolvedModel& rm = src.model;
  const std::optional<Corpus>& corpus = src.corpus;

  return with_full_model(a.co, rm, RefuseSource::AnyReduction, [&](const auto& m) {
    using E = typename std::decay_t<decltype(m)>::Exec;
    const auto& [w, mi, wall] = m;
    const Config& c = w->cfg;
    if (cal) cal->check_model(mi.fingerprint, c, mi.path);
    pruning::LowRankOptions opt = a.opt;
    opt.source_fingerprint = mi.fingerprint;
    opt.calibration = cal ? fisher_label(*cal) : std::string("none: equal ranks");
    const Config plan = pruning::plan_low_rank(c, opt, cal ? &*cal->fisher : nullptr);

    std::vector<std::vector<double>> grams;
    Stopwatch stats;
    if (opt.whiten) {
      WindowRequest r;
      r.count = a.seqs;
      r.tokens = a.tokens;
      r.tokens_option = "--whiten-tokens";
      r.command = "prune";
      r.noun = "whitening sequences";
      const std::vector<std::vector<int>> seqs =
          corpus_windows(*corpus, rm.path, c.context_length, r);
      log().info("whitening statistics: {} sequences of {} tokens from {}", a.seqs, a.tokens,
                 corpus->source);
      grams = pruning::attention_input_grams<E>(w, seqs);
    }
    const double stats_seconds = stats.seconds();
    pruning::LowRankReport rep;
    auto lr = pruning::factorise(*w, plan, grams, &rep);
    interruption_point("write");
    pruning::write_low_rank_gguf(rm.path, *lr, a.out);
    const ModelInfo mo = check_written<E>(
        a.out,
        [&](const Config& back) {
          bool same = back.low_rank.size() == plan.low_rank.size();
          for (std::size_t l = 0; same && l < plan.low_rank.size(); ++l)
            same = back.low_rank[l].k_ranks == plan.low_rank[l].k_ranks &&
                   back.low_rank[l].v_ranks == plan.low_rank[l].v_ranks;
          return same;
        },
        "the written model does not read back with the planned ranks");
    std::cout << fmt::format(
        "pruned {} -> {}\n  source {} (fingerprint {})\n  ranks {}\n  recipe {}\n"
        "  output fingerprint {}, {} parameters (full: {})\n\n",
        opt.method == pruning::LowRankMethod::Palu ? "palu" : "svd-llm", a.out, mi.path,
        mi.fingerprint, palu ? "by Fisher score (" + a.calib_path + ")" : std::string("equal"),
        plan.prune.recipe, mo.fingerprint, plan.n_params(), c.n_params());
    if (opt.whiten)
      std::cout << fmt::format("  whitening: {} sequences of {} tokens of {} ({:.1f} s)\n", a.seqs,
                               a.tokens, corpus->source, stats_seconds);
    std::cout << rep.text();
    std::cout << fmt::format("  wall seconds {:.1f}\n", wall.seconds());
    if (!a.json_out.empty()) {
      nlohmann::json j = rep.json();
      if (cal)
        j["calibration"] = {{"path", a.calib_path},
                            {"model_fingerprint", cal->model_fingerprint},
                            {"corpus_fingerprint", cal->corpus_fingerprint},
                            {"sequences", cal->fisher->sequences},
                            {"tokens", cal->fisher->tokens}};
      if (opt.whiten)
        j["whitening"] = {{"corpus", corpus->source},
                          {"corpus_fingerprint", corpus->fingerprint},
                          {"sequences", a.seqs},
                          {"tokens", a.tokens},
                          {"seconds", stats_seconds}};
      j["recipe"] = plan.prune.recipe;
      j["n_params"] = plan.n_params();
      j["n_params_full"] = c.n_params();
      j["wall_seconds"] = wall.seconds();
      write_prune_json(std::move(j), files, src, mi, mo, a.command);
    }
    return 0;
  });
}

}  // namespace sparsim::app
