#include "prune_low_rank.hpp"

#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "model/gguf.hpp"
#include "model/loader.hpp"
#include "model_io.hpp"
#include "sparsity/calibration.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <optional>

namespace sparsim::app {

int prune_low_rank(const LowRankPrune& a) {
  const bool palu = a.opt.method == pruning::LowRankMethod::Palu;
  std::optional<sparsity::Calibration> cal;
  if (!a.calib_path.empty()) {
    cal = sparsity::read_calibration(a.calib_path);
    require(cal->fisher.has_value(),
            "calibration file {} holds no Fisher scores (make one with sparsim calibrate --fisher)",
            a.calib_path);
  }
  require(!palu || cal.has_value(),
          "prune --method palu: --calibration FILE (from sparsim calibrate --fisher) is required: "
          "PaLU allocates the ranks by Fisher score");
  const ResolvedModel rm = resolve_model(a.model_arg);
  require(detect_model_format(rm.path) == ModelFormat::Gguf,
          "prune: {} is not a GGUF model; prune writes a GGUF built from the source GGUF's "
          "tensors and tokenizer",
          rm.path);
  const std::string corpus_path = a.opt.whiten ? corpus_input_path(a.corpus_arg) : std::string();
  io::guard_run({{"--model", rm.path}, {"--calibration", a.calib_path}, {"--corpus", corpus_path}},
                {{"--out", a.out}, {"--json", a.json_out}});
  std::optional<Corpus> corpus;
  if (a.opt.whiten) corpus = load_corpus(a.corpus_arg, CorpusOptions{a.text_field});

  Runtime rt(a.co);
  return with_backend(a.co.backend, [&](auto exec) {
    using E = decltype(exec);
    (void)exec;
    Stopwatch wall;
    ModelInfo mi;
    std::shared_ptr<const Weights<E>> w = load_model<E>(rm.path, LoadOptions{}, &mi);
    const Config& c = w->cfg;
    require(!c.pruned() && !c.low_rank_kv() && !c.structured(),
            "{} is already pruned ({}); prune the full model", rm.path, c.prune.method);
    if (cal) cal->check_model(mi.fingerprint, c, mi.path);
    pruning::LowRankOptions opt = a.opt;
    opt.source_fingerprint = mi.fingerprint;
    opt.calibration =
        cal ? fmt::format("model {} corpus {} ({} sequences of {} tokens)", cal->model_fingerprint,
                          cal->corpus_fingerprint, cal->fisher->sequences, cal->fisher->tokens)
            : std::string("none: equal ranks");
    const Config plan = pruning::plan_low_rank(c, opt, cal ? &*cal->fisher : nullptr);

    std::vector<std::vector<double>> grams;
    Stopwatch stats;
    if (opt.whiten) {
      require(a.tokens <= c.context_length, "--whiten-tokens {} exceeds the model's context of {}",
              a.tokens, c.context_length);
      const std::vector<int> stream = corpus_stream(*corpus, tokenizer_for(rm.path));
      const std::size_t need = static_cast<std::size_t>(a.seqs) * a.tokens;
      require(stream.size() >= need,
              "prune: the corpus {} has {} tokens; {} whitening sequences of {} need {}",
              corpus->source, stream.size(), a.seqs, a.tokens, need);
      std::vector<std::vector<int>> seqs;
      for (int i = 0; i < a.seqs; ++i) {
        const auto b = stream.begin() + static_cast<std::ptrdiff_t>(i) * a.tokens;
        seqs.emplace_back(b, b + a.tokens);
      }
      log().info("whitening statistics: {} sequences of {} tokens from {}", a.seqs, a.tokens,
                 corpus->source);
      grams = pruning::attention_input_grams<E>(w, seqs);
    }
    const double stats_seconds = stats.seconds();
    pruning::LowRankReport rep;
    auto lr = pruning::factorise(*w, plan, grams, &rep);
    interruption_point("write");
    pruning::write_low_rank_gguf(rm.path, *lr, a.out);
    ModelInfo mo;
    try {
      auto back = load_model<E>(a.out, LoadOptions{}, &mo);
      bool same = back->cfg.low_rank.size() == plan.low_rank.size();
      for (std::size_t l = 0; same && l < plan.low_rank.size(); ++l)
        same = back->cfg.low_rank[l].k_ranks == plan.low_rank[l].k_ranks &&
               back->cfg.low_rank[l].v_ranks == plan.low_rank[l].v_ranks;
      require(same, "the written model does not read back with the planned ranks");
    } catch (const Error& e) {
      std::error_code ec;
      std::filesystem::remove(a.out, ec);
      fail("prune: the written model {} does not load ({}); removed", a.out, e.what());
    }
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
      j["source"] = {{"path", mi.path}, {"fingerprint", mi.fingerprint}, {"origin", rm.origin}};
      j["output"] = {{"path", a.out}, {"fingerprint", mo.fingerprint}};
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
      j["command"] = a.command;
      io::write_file_atomically(a.json_out, j.dump(2) + "\n");
    }
    return 0;
  });
}

}  // namespace sparsim::app
