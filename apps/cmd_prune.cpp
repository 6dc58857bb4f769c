// sparsim prune: weight-side KV pruning (RAP, KVPruner) from Fisher scores, or low-rank K/V
// factorisation (PaLU, SVD-LLM; prune_low_rank.cpp), written out as a smaller GGUF model that
// every command runs.
#include "common.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "model/gguf.hpp"
#include "model/loader.hpp"
#include "prune_low_rank.hpp"
#include "pruning/kv_prune.hpp"
#include "pruning/pruned_gguf.hpp"
#include "records.hpp"
#include "sparsity/calibration.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>

namespace sparsim::app {

int cmd_prune(int argc, char** argv) {
  CommonOptions co;
  std::string model_arg, method, calib_path, out, json_out, type;
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
      "W_v per group of KV heads, ranks by Fisher score; the cache holds the latents) or "
      "svd-llm (whitened low-rank W_k and W_v over all KV heads, equal ranks)")(
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
      "corpus,c", po::value(&lr.corpus_arg)->default_value("default"),
      "palu, svd-llm: text of the whitening statistics (a file, a directory, JSONL or "
      "'default')")("text-field", po::value(&lr.text_field)->default_value("text"),
                    "JSONL field holding the text")(
      "whiten-seqs", po::value(&lr.seqs)->default_value(lr.seqs),
      "palu, svd-llm: whitening sequences (consecutive, from the start of the corpus)")(
      "whiten-tokens", po::value(&lr.tokens)->default_value(lr.tokens),
      "palu, svd-llm: tokens per whitening sequence");
  add_common_options(d, co);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: sparsim prune --method rap|kvpruner|kvpruner-naive|palu|svd-llm --retain R "
             "[--calibration C] --out M.gguf "
             "[--model smollm2] [--json S] [--type auto|source|TYPE]",
             d, vm))
    return 0;
  // Everything a user can get wrong is checked before anything is written.
  require(!out.empty(), "prune: --out FILE is required");
  const bool low_rank = method == "palu" || method == "svd-llm";
  require(low_rank || method == "rap" || method == "kvpruner" || method == "kvpruner-naive",
          "pruning method '{}' is not rap, kvpruner, kvpruner-naive, palu or svd-llm", method);
  for (const char* o :
       {"group", "no-whiten", "corpus", "text-field", "whiten-seqs", "whiten-tokens"})
    require(low_rank || vm[o].defaulted(), "--{} applies to --method palu and svd-llm only", o);
  if (low_rank) {
    for (const char* o :
         {"score", "budget", "pair-score", "k-share", "kv-budget", "type", "flops-context"})
      require(vm[o].defaulted(), "--{} does not apply to --method {} (a RAP / KVPruner option)", o,
              method);
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
  po_.validate();
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
  require(flops_context >= 1, "--flops-context must be positive, got {}", flops_context);
  std::optional<sparsity::Calibration> calopt;
  if (!calib_path.empty()) {
    calopt = sparsity::read_calibration(calib_path);
    require(calopt->fisher.has_value(),
            "calibration file {} holds no Fisher scores (make one with sparsim calibrate --fisher)",
            calib_path);
  }
  const ResolvedModel rm = resolve_model(model_arg);
  require(detect_model_format(rm.path) == ModelFormat::Gguf,
          "prune: {} is not a GGUF model; prune writes a GGUF built from the source GGUF's "
          "tensors and tokenizer",
          rm.path);
  {
    gguf::File f = gguf::File::open(rm.path);
    const std::string arch = f.get_string("general.architecture").value_or("llama");
    for (const char* k : {"rope.dimension_count", "rope.freq_base"})
      require(f.has(arch + "." + k),
              "{}: no RoPE metadata ('{}.{}'): pruning RoPE pairs needs a model that states how "
              "it rotates its keys",
              rm.path, arch, k);
  }
  // outputs checked against the inputs by file identity, folders, collisions (exit 2)
  io::guard_run({{"--model", rm.path}, {"--calibration", calib_path}},
                {{"--out", out}, {"--json", json_out}});

  Runtime rt(co);
  return with_backend(co.backend, [&](auto exec) {
    using E = decltype(exec);
    (void)exec;
    Stopwatch wall;
    ModelInfo mi;
    // loaded for its fingerprint and config (the check against the calibration)
    std::shared_ptr<const Weights<E>> w = load_model<E>(rm.path, LoadOptions{}, &mi);
    const Config& c = w->cfg;
    require(!c.pruned(), "{} is already pruned ({}); prune the full model", rm.path,
            c.prune.method);
    if (calopt) calopt->check_model(mi.fingerprint, c, mi.path);
    po_.source_fingerprint = mi.fingerprint;
    po_.calibration = fisher ? fmt::format("model {} corpus {} ({} sequences of {} tokens)",
                                           calopt->model_fingerprint, calopt->corpus_fingerprint,
                                           calopt->fisher->sequences, calopt->fisher->tokens)
                             : std::string("none: magnitude scores of the weights");
    const Config pc = fisher ? pruning::plan_pruning(c, *calopt->fisher, po_)
                             : pruning::plan_pruning(c, pruning::magnitude_channel_scores(*w), po_);
    const pruning::WrittenModel written = pruning::write_pruned_gguf(rm.path, pc, out, cut);
    // The file must be a model sparsim runs: load it back (shapes, layout, fingerprint).
    ModelInfo mo;
    try {
      auto wp = load_model<E>(out, LoadOptions{}, &mo);
      require(wp->cfg.pruned() && wp->cfg.attn.size() == pc.attn.size(),
              "the written model does not read back as pruned");
    } catch (const Error& e) {
      std::error_code ec;
      std::filesystem::remove(out, ec);
      fail("prune: the written model {} does not load ({}); removed", out, e.what());
    }
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
      j["source"] = {{"path", mi.path}, {"fingerprint", mi.fingerprint}, {"origin", rm.origin}};
      j["output"] = {{"path", out}, {"fingerprint", mo.fingerprint}};
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
      j["command"] = command_line(argc, argv);
      io::write_file_atomically(json_out, j.dump(2) + "\n");
    }
    return 0;
  });
}

}  // namespace sparsim::app
