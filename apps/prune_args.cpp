// sparsim prune's options and their checks.
#include "prune_args.hpp"

#include <cmath>

namespace sparsim::app {

void PruneArgs::add_options(po::options_description& d) {
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
}

void PruneArgs::check(const po::variables_map& vm) {
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
  corpus_files = PruneFiles{model_arg, "", out, json_out, true, corpus_arg, text_field};
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
    cut = pruning::CutType::parse(type);
    family = Family::SlimGpt;
    return;
  }
  if (low_rank) {
    for (const char* o : {"score", "budget", "pair-score", "k-share", "kv-budget", "type", "ratio",
                          "flap-windows", "flap-tokens"})
      require(vm[o].defaulted(),
              "--{} does not apply to --method {} (a RAP / KVPruner / FLAP option)", o, method);
    require(flops_context >= 1, "--flops-context must be positive, got {}", flops_context);
    lr.opt.flops_context = flops_context;
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
    family = Family::LowRank;
    return;
  }
  const pruning::PruneMethod pm = pruning::parse_prune_method(method);
  cut = pruning::CutType::parse(type);
  kv.method = pm;
  kv.retain = retain;
  kv.flops_context = flops_context;
  kv.score = pruning::parse_score_source(score);
  kv.budget = pruning::parse_layer_budget(budget);
  kv.pair_score = pruning::parse_pair_score(pair_score);
  kv.k_share = k_share;
  kv.kv_budget = pruning::parse_kv_budget(kv_budget);
  kv.ratio = ratio;
  kv.flap_windows = flap_windows;
  kv.flap_tokens = flap_tokens;
  kv.validate();
  require(flops_context >= 1, "--flops-context must be positive, got {}", flops_context);
  if (pm == pruning::PruneMethod::Flap) {
    for (const char* o :
         {"retain", "calibration", "score", "budget", "pair-score", "k-share", "kv-budget"})
      require(!vm.count(o) || vm[o].defaulted(),
              "--{} applies to K/V channel pruning (rap, kvpruner), not to flap", o);
    family = Family::Flap;
    return;
  }
  for (const char* o : {"ratio", "flap-windows", "flap-tokens", "corpus", "text-field"})
    require(vm[o].defaulted(), "--{} does not apply to --method {}", o, method);
  // (given at all, even at its default value, --k-share is a balanced-budget option)
  require(kv.kv_budget == pruning::KvBudget::Balanced || vm["k-share"].defaulted(),
          "--kv-budget pooled sets the K/V split itself; --k-share applies to balanced budgets");
  fisher = kv.score == pruning::ScoreSource::Fisher;
  require(!fisher || !calib_path.empty(),
          "prune: --calibration FILE (from sparsim calibrate --fisher) is required with --score "
          "fisher");
  require(fisher || vm["pair-score"].defaulted(),
          "--pair-score applies to Fisher scores only (a magnitude pair score is the sum of its "
          "rows' squared norms)");
}

}  // namespace sparsim::app
