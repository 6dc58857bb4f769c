#pragma once
// The method options shared by sparsim eval, bench and generate, and the setup they share:
// activation sparsity (calibration file -> plan -> (rotated) weights -> masker), Token
// Filtering (a token gate before attention), K-cache channel pruning (ThinK or GRACE, a
// channel selector after prefill) and KV-cache token eviction (--evict: StreamingLLM, H2O,
// SnapKV, PyramidKV, a token evictor after prefill). --method joins one of each with '+';
// --evict composes with all of them.
#include "common.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "io/summary_columns.hpp"
#include "model/loader.hpp"
#include "policies/k_channel_selector.hpp"
#include "policies/probe_pruning.hpp"
#include "policies/token_eviction.hpp"
#include "policies/token_filter.hpp"
#include "sparsity/calibration.hpp"
#include "sparsity/masker.hpp"
#include "sparsity/plan.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>

namespace sparsim::app {

/// --method, --sparsity, --calibration, the Token Filtering options (--tf-*), the K-cache
/// channel pruning options (--kv-*) and the methods' tuning options.
struct MethodArgs {
  std::string method = "dense";
  std::string calib_path, budget_mode, masking_mode, norms_mode, lookup_mode, rotation_storage;
  bool no_rotation = false;
  sparsity::MethodOptions mopt;
  std::optional<sparsity::Calibration> cal;  ///< read by resolve()
  bool token_filter = false;                 ///< --method includes token-filter
  gating::TokenFilterOptions tf;
  std::string tf_criterion, tf_anchor, tf_keys, tf_layers;
  std::string tf_drop_mode = "auto";  ///< --tf-drop-mode: auto, compact or mask
  bool kv_prune = false;              ///< --method includes think or grace
  pruning::KvPruneOptions kv;
  std::string kv_protect = "0.05,0.25", kv_guard = "off";
  int kv_trace = 1;
  std::string evict_method;  ///< --evict (empty: no eviction)
  std::string evict_pool = "avg";
  pruning::EvictOptions ev;
  bool evict() const { return !evict_method.empty(); }
  bool probe_pruning = false;  ///< --method probe-pruning
  pruning::ProbePruningOptions pp;

  /// Adds the options to `d` (in the order eval's --help lists them).
  void add_options(po::options_description& d);
  /// After parsing: checks the values, fills mopt / tf and reads the calibration file (so that
  /// bad arguments fail before the model is loaded; `read_calibration` false skips the reading).
  /// Throws sparsim::Error naming the option; with `vm`, a --tf-* (--kv-*) option given without
  /// token-filter (think or grace) in --method, or an --evict-* option without --evict, is an
  /// error too.
  void resolve(const po::variables_map* vm = nullptr, bool read_calibration = true);
  /// The model-dependent checks of the attention-side methods, as options: Token Filtering's
  /// layers, ThinK / GRACE's one key width and their channel count against it. The factories
  /// below run them when they build a policy; a command may run them early, before slow work.
  void validate(const Config& c) const;
  bool sparse() const { return mopt.method != sparsity::Method::Dense; }
};

/// The Token Filtering gate for `eng` (nullptr without token-filter), checked against the
/// model and the length of the sequences it will see (the warm-up must be shorter).
template <class E>
std::unique_ptr<gating::TokenFilter<E>> make_token_filter(const MethodArgs& a, Engine<E>& eng,
                                                          int seq_len) {
  if (!a.token_filter) return nullptr;
  const AttnShape sh = eng.cache().shape(0);
  a.validate(eng.config());
  require(a.tf.warmup < seq_len,
          "--tf-warmup {} is not shorter than the sequences of {} tokens: nothing would be decided",
          a.tf.warmup, seq_len);
  auto g = std::make_unique<gating::TokenFilter<E>>(a.tf, eng.config().n_layer, sh.n_kv_head,
                                                    sh.qk_dim, sh.v_dim, eng.max_seqs());
  eng.set_token_gate(g.get());
  eng.set_drop_compaction(a.tf_drop_mode != "mask");
  return g;
}

/// ThinK / GRACE select the same number of channels in every head: a model whose layers have
/// their own key widths (RAP / KVPruner-pruned) is refused with a message.
inline void require_uniform_key_width(const Config& c) {
  const int d0 = attn_shape(c, 0).qk_dim;
  for (int l = 1; l < c.n_layer; ++l)
    require(attn_shape(c, l).qk_dim == d0,
            "--method think/grace needs one key width in every layer, but layer {} of this "
            "(pruned) model has {} channels per head and layer 0 has {}",
            l, attn_shape(c, l).qk_dim, d0);
}

/// The ThinK / GRACE channel selector for `eng` (nullptr without think or grace), checked against
/// the model and the shortest prompt it will prefill (`shortest_prefill` tokens: the
/// observation window must fit).
template <class E>
std::unique_ptr<pruning::KvChannelPruner<E>> make_kv_pruner(const MethodArgs& a, Engine<E>& eng,
                                                            int shortest_prefill) {
  if (!a.kv_prune) return nullptr;
  a.validate(eng.config());
  const AttnShape sh = eng.cache().shape(0);
  require(a.kv.window <= shortest_prefill,
          "--kv-window {}: the observation window is longer than the prompt of {} tokens that is "
          "prefilled before decoding",
          a.kv.window, shortest_prefill);
  auto p = std::make_unique<pruning::KvChannelPruner<E>>(a.kv, eng.config().n_layer, sh.n_kv_head,
                                                         sh.qk_dim, eng.max_seqs(), a.kv_trace);
  eng.set_channel_selector(p.get());
  return p;
}

/// The token evictor for `eng` (nullptr without --evict), checked against the model and the
/// shortest prompt it will prefill: the window (sinks) must be shorter than that prompt.
template <class E>
std::unique_ptr<pruning::TokenEvictorPolicy<E>> make_token_evictor(const MethodArgs& a,
                                                                   Engine<E>& eng,
                                                                   int shortest_prefill) {
  if (!a.evict()) return nullptr;
  const Config& c = eng.config();
  require(!c.low_rank_kv(),
          "--evict: a low-rank K/V model ({}) caches latents, not keys and values to evict",
          c.prune.method);
  check_as_options([&] { a.ev.validate(); });
  if (a.ev.method == pruning::EvictMethod::Streaming)
    require(a.ev.sinks < shortest_prefill,
            "--evict-sinks {}: not shorter than the prompt of {} tokens that is prefilled before "
            "decoding",
            a.ev.sinks, shortest_prefill);
  else
    require(a.ev.window < shortest_prefill,
            "--evict-window {}: not shorter than the prompt of {} tokens that is prefilled "
            "before decoding",
            a.ev.window, shortest_prefill);
  const AttnShape sh = eng.cache().shape(0);
  auto v = std::make_unique<pruning::TokenEvictorPolicy<E>>(a.ev, c.n_layer, sh.n_kv_head,
                                                            eng.max_seqs());
  eng.set_token_evictor(v.get());
  return v;
}

/// The Probe Pruning policy for `eng` (nullptr without probe-pruning in --method).
template <class E>
std::unique_ptr<pruning::ProbePruner<E>> make_probe_pruner(const MethodArgs& a, Engine<E>& eng) {
  if (!a.probe_pruning) return nullptr;
  auto p = std::make_unique<pruning::ProbePruner<E>>(
      a.pp, eng.weights(), a.cal && a.cal->probe_history ? &*a.cal->probe_history : nullptr);
  eng.set_structured_pruner(p.get());
  return p;
}

/// The `probe_pruning` object of the JSON summaries: the settings, the realised pruned
/// fractions per layer and overall, and per batch (a selecting forward call) and layer the
/// attention units and FFN channels kept.
template <class E>
nlohmann::json probe_pruning_json(const pruning::ProbePruner<E>& p) {
  nlohmann::json per = nlohmann::json::array(), batches = nlohmann::json::array();
  for (int l = 0; l < p.n_layer(); ++l)
    per.push_back(
        {{"layer", l}, {"head_ratio", p.head_ratio(l)}, {"channel_ratio", p.channel_ratio(l)}});
  for (const auto& b : p.batches())
    batches.push_back({{"sequences", b.n_seq},
                       {"tokens", b.T},
                       {"p0", b.p0},
                       {"probe_rows", b.probe},
                       {"heads_kept", b.heads_kept},
                       {"channels_kept", b.channels_kept}});
  return {{"ratio", p.options().ratio},
          {"probe", p.options().probe},
          {"history", p.history_description()},
          {"units_per_layer", p.units()},
          {"d_ff", p.d_ff()},
          {"head_ratio", p.head_ratio()},
          {"channel_ratio", p.channel_ratio()},
          {"selections", p.batches().size()},
          {"reused_calls", p.reused_calls()},
          {"per_layer", per},
          {"batches", batches}};
}

/// The `evict` object of the JSON summaries: the settings, per layer the tokens kept against
/// the budget, and the prompt KV bytes (keys and values) dense and of the kept tokens.
template <class E>
nlohmann::json evict_json(const pruning::TokenEvictorPolicy<E>& v) {
  const auto& o = v.options();
  nlohmann::json per = nlohmann::json::array();
  for (int l = 0; l < v.n_layer(); ++l) {
    double kept = 0, budget = 0, prompt = 0;
    std::uint64_t n = 0, evicting = 0;
    nlohmann::json heads = nlohmann::json::array();
    for (int h = 0; h < v.n_kv_head(); ++h) {
      const auto& r = v.record(l, h);
      kept += r.kept;
      budget += r.budget;
      prompt += r.prompt;
      n += r.selections;
      evicting += r.evicting;
      heads.push_back(r.selections ? r.kept / static_cast<double>(r.selections) : 0.0);
    }
    const double nn = n ? static_cast<double>(n) : 1.0;
    per.push_back({{"layer", l},
                   {"kept_tokens_mean", kept / nn},
                   {"kept_tokens_per_head", heads},
                   {"budget_tokens_mean", budget / nn},
                   {"prompt_tokens_mean", prompt / nn},
                   {"selections", n},
                   {"evicting", evicting},
                   {"kv_bytes_dense", v.kv_bytes_dense(l)},
                   {"kv_bytes_kept", v.kv_bytes_kept(l)}});
  }
  const double dense = v.kv_bytes_dense(), kept = v.kv_bytes_kept();
  return {{"method", pruning::to_string(o.method)},
          {"budget", o.budget},
          {"budget_unit", o.budget > 1 ? "tokens" : "fraction"},
          {"window", o.window},
          {"sinks", o.sinks},
          {"kernel", o.kernel},
          {"pool", pruning::to_string(o.pool)},
          {"beta", o.beta},
          {"kept_fraction", v.kept_fraction()},
          {"budget_use", v.budget_use()},
          {"kv_bytes_dense", dense},
          {"kv_bytes_kept", kept},
          {"kv_bytes_fraction", dense > 0 ? kept / dense : 1.0},
          {"selections", v.selections()},
          {"prefills", v.prefills()},
          {"select_seconds", v.select_seconds()},
          {"per_layer", per}};
}

/// The sweep table's columns of token eviction, from the `evict` object evict_json made.
inline void add_evict_columns(const nlohmann::json& ev, io::SummaryColumns& cols) {
  cols.add("evict_method", ev["method"].get<std::string>(), "",
           "KV-cache token eviction (streaming, h2o, snapkv or pyramidkv)");
  cols.add("evict_budget", ev["budget"].get<double>(), "1",
           "token budget per head and layer: a fraction of the prompt (≤ 1) or tokens (> 1)");
  cols.add("evict_kept_fraction", ev["kept_fraction"].get<double>(), "1",
           "prompt tokens kept over prompt tokens, all layers, heads and prefills");
  cols.add("evict_kv_bytes_fraction", ev["kv_bytes_fraction"].get<double>(), "1",
           "prompt K+V bytes of the kept tokens over a dense cache's");
}

/// The `kv_prune` object of the JSON summaries: the settings, the K-cache bytes of a dense cache
/// and what `eng`'s cache allocated at the end of the run (per layer and in total), and the
/// selector's records.
template <class E>
nlohmann::json kv_prune_json(const pruning::KvChannelPruner<E>& p, const Engine<E>& eng) {
  const auto& o = p.options();
  const KVCache<E>& kc = eng.cache();
  double dense = 0, real = 0;
  nlohmann::json per = nlohmann::json::array();
  for (int l = 0; l < kc.n_layer(); ++l) {
    const double d = 4.0 * kc.max_seqs() * kc.max_ctx() * kc.shape(l).k_width();
    const double b = static_cast<double>(kc.k_bytes(l));
    dense += d;
    real += b;
    double think = 0, grace = 0, mies = 0, prot = 0, kept = 0;
    std::uint64_t n = 0, guard = 0, worse = 0;
    for (int h = 0; h < p.n_kv_head(); ++h) {
      const auto& r = p.record(l, h);
      think += r.rel_think;
      grace += r.rel_grace;
      mies += r.rel_mies;
      prot += r.protected_share;
      kept += static_cast<double>(r.kept);
      n += r.selections;
      guard += r.guard_used;
      worse += r.grace_worse;
    }
    const double nn = n ? static_cast<double>(n) : 1.0;
    per.push_back({{"layer", l},
                   {"k_bytes_dense", d},
                   {"k_bytes", b},
                   {"compacted", kc.layer(l).compacted()},
                   {"kept_channels_mean", kept / nn},
                   {"recon_error_think", think / nn},
                   {"recon_error_grace", grace / nn},
                   {"recon_error_mies", mies / nn},
                   {"protected_share", prot / nn},
                   {"guard_used", guard},
                   {"grace_worse_than_think", worse}});
  }
  const double heads = static_cast<double>(p.selections());
  return {{"method", pruning::to_string(o.method)},
          {"lambda", o.lambda},
          {"window", o.window},
          {"recent", o.recent},
          {"head_dim", p.head_dim()},
          {"pruned_per_head", pruning::prune_count(o.lambda, p.head_dim())},
          {"kept_per_head", p.kept_per_head()},
          {"protect", {o.protect_lo, o.protect_hi}},
          {"guard", o.guard},
          {"k_bytes_dense", dense},
          {"k_bytes", real},
          {"recon_error_mean", p.recon_error_mean()},
          {"recon_error_think_mean", p.rel_error_mean(pruning::KvMethod::Think)},
          {"recon_error_grace_mean", p.rel_error_mean(pruning::KvMethod::Grace)},
          {"recon_error_mies_mean", p.rel_error_mies_mean()},
          {"protected_share_mean", p.protected_share_mean()},
          {"selections", p.selections()},
          {"prefills", p.prefills()},
          {"guard_used", p.guard_used()},
          {"grace_worse_than_think", p.grace_worse()},
          {"gram_seconds", p.gram_seconds()},
          {"select_seconds", p.select_seconds()},
          {"select_seconds_per_head", heads > 0 ? p.select_seconds() / heads : 0.0},
          {"per_layer", per}};
}

/// The `token_filter` object of the JSON summaries.
template <class E>
nlohmann::json token_filter_json(const gating::TokenFilter<E>& g) {
  const auto& o = g.options();
  nlohmann::json per = nlohmann::json::array();
  for (int l : g.layers())
    per.push_back({{"layer", l},
                   {"target", g.layer_target()},
                   {"realised", g.realised(l)},
                   {"skipped", g.skipped(l)},
                   {"similarity_mean", g.similarity_mean(l)},
                   {"threshold_final", g.threshold_final_mean(l)}});
  nlohmann::json j = {{"target", o.ratio},
                      {"realised", g.realised()},
                      {"criterion", gating::to_string(o.criterion)},
                      {"layers", g.layers()},
                      {"layer_set", gating::to_string(o.layers)},
                      {"layer_target", g.layer_target()},
                      {"anchor", gating::to_string(o.anchor)},
                      {"gamma", o.gamma},
                      {"keys", o.pre_rope ? "pre-rope" : "post-rope"},
                      {"warmup", o.warmup},
                      {"eta", o.eta},
                      {"drop_skipped", o.drop_skipped},
                      {"decided_tokens", g.decided_tokens()},
                      {"per_layer", per}};
  const gating::KVCacheRecord& kv = g.kv_cache();
  if (!kv.empty()) {
    nlohmann::json pl = nlohmann::json::array();
    bool all = true, any = false;
    for (std::size_t l = 0; l < kv.layers.size(); ++l) {
      const auto& r = kv.layers[l];
      const bool gated =
          std::find(g.layers().begin(), g.layers().end(), static_cast<int>(l)) != g.layers().end();
      if (gated) all = all && r.compacted, any = any || r.compacted;
      pl.push_back({{"layer", l},
                    {"gated", gated},
                    {"compacted", r.compacted},
                    {"positions_final", r.positions_final},
                    {"held_final", r.held_final},
                    {"held_fraction", r.positions_sum > 0 ? r.held_sum / r.positions_sum : 1.0},
                    {"bytes_held_peak", r.held_bytes_peak},
                    {"bytes_allocated_peak", r.allocated_peak},
                    {"bytes_allocated_final", r.allocated_final},
                    {"bytes_allocated_dense", r.allocated_dense}});
    }
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 1.0; };
    j["kv_cache"] = {{"mode", all   ? "compacted"
                              : any ? "mixed"
                                    : "masked"},
                     {"calls", kv.calls},
                     {"bytes_held_final", kv.held_final},
                     {"bytes_dense_final", kv.dense_final},
                     {"bytes_allocated_final", kv.allocated_final},
                     {"bytes_held_peak", kv.held_peak},
                     {"bytes_dense_peak", kv.dense_peak},
                     {"bytes_allocated_peak", kv.allocated_peak},
                     {"bytes_allocated_dense", kv.allocated_dense},
                     {"held_fraction", kv.held_fraction()},
                     {"held_peak_vs_dense_peak", ratio(kv.held_peak, kv.dense_peak)},
                     {"allocated_peak_vs_dense", ratio(kv.allocated_peak, kv.allocated_dense)},
                     {"per_layer", pl}};
  }
  return j;
}

/// The sweep table's columns of Token Filtering (io/summary_columns.hpp), from the
/// `token_filter` object token_filter_json made.
inline void add_token_filter_columns(const nlohmann::json& tf, io::SummaryColumns& cols) {
  cols.add(
      "tf_target", tf["target"].get<double>(), "1",
      "Token Filtering target: model-wide fraction of (token, layer) attention blocks to skip");
  cols.add("tf_realised", tf["realised"].get<double>(), "1",
           "Token Filtering realised skip ratio over the decided tokens, model-wide");
  cols.add("tf_layer_target", tf["layer_target"].get<double>(), "1",
           "Token Filtering skip target of each gated layer (r·L/N)");
  cols.add("tf_criterion", tf["criterion"].get<std::string>(), "",
           "Token Filtering similarity criterion (key, value or kv)");
  cols.add("tf_layers", tf["layer_set"].get<std::string>(), "",
           "Token Filtering gated layer set (tail, head or uniform)");
  cols.add("tf_gated_layers", static_cast<double>(tf["layers"].size()), "1",
           "Token Filtering: number of gated layers");
}

/// The sweep table's columns of K-channel pruning (ThinK / GRACE; io/summary_columns.hpp), from
/// the `kv_prune` object kv_prune_json made.
inline void add_kv_prune_columns(const nlohmann::json& kv, io::SummaryColumns& cols) {
  const double bytes = kv["k_bytes"].get<double>(), dense = kv["k_bytes_dense"].get<double>();
  cols.add("kv_method", kv["method"].get<std::string>(), "",
           "K-cache channel pruning method (think or grace)");
  cols.add("kv_lambda", kv["lambda"].get<double>(), "1",
           "pruned fraction λ of every head's key channels");
  cols.add("kv_kept_per_head", kv["kept_per_head"].get<double>(), "channel",
           "key channels kept per head after prefill");
  cols.add("kv_head_dim", kv["head_dim"].get<double>(), "channel", "key channels per head");
  cols.add("kv_recent", kv["recent"].get<double>(), "token",
           "last prompt keys kept at full width (not compacted)");
  cols.add("k_bytes", bytes, "byte", "K-cache bytes allocated at the end of the run");
  cols.add("k_bytes_dense", dense, "byte", "K-cache bytes of a dense cache of the same size");
  cols.add("k_bytes_fraction", dense > 0 ? bytes / dense : std::nan(""), "1",
           "K-cache bytes over a dense cache's (k_bytes / k_bytes_dense)");
  cols.add("kv_recon_error", kv["recon_error_mean"].get<double>(), "1",
           "mean relative reconstruction error ‖Q_P K_Pᵀ‖/‖QKᵀ‖ of the method's own choice of "
           "channels");
}

/// For a sparse method: checks that the calibration belongs to the model, builds the plan and,
/// for rotated plans, replaces `w` by the WINA-rotated model stored as `storage`. For dense, the
/// plan only carries the options.
template <class E>
sparsity::Plan prepare_method(const MethodArgs& a, const ModelInfo& mi,
                              std::shared_ptr<const Weights<E>>& w, DType storage) {
  sparsity::Plan plan;
  plan.opt = a.mopt;
  if (a.cal) a.cal->check_model(mi.fingerprint, w->cfg, mi.path);
  if (a.cal && a.mopt.needs_calibration()) {
    plan = sparsity::make_plan(*a.cal, a.mopt);
    if (plan.rotated) {
      Stopwatch sw;
      w = sparsity::apply_rotation(*w, sparsity::rotation_from(*a.cal), storage,
                                   a.mopt.rotation_storage);
      log().info("WINA rotation applied ({:.1f} s)", sw.seconds());
    }
  }
  return plan;
}

/// Loads the plan into `masker` (column norms from the engine's weights) and hands it to the
/// engine; nothing for dense.
template <class E>
void attach_masker(Engine<E>& eng, sparsity::ActivationMasker<E>& masker,
                   const sparsity::Plan& plan) {
  if (plan.opt.method == sparsity::Method::Dense) return;
  sparsity::configure_masker(masker, plan, eng.weights());
  eng.set_masker(&masker);
}

}  // namespace sparsim::app
