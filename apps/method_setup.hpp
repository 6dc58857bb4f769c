#pragma once
// The method options shared by sparsim eval, bench and generate, and the setup they share:
// activation sparsity (calibration file -> plan -> (rotated) weights -> masker) and Token
// Filtering (a token gate before attention). --method joins one of each with '+'.
#include "common.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "gating/token_filter.hpp"
#include "model/loader.hpp"
#include "sparsity/calibration.hpp"
#include "sparsity/masker.hpp"
#include "sparsity/plan.hpp"

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>

namespace sparsim::app {

/// --method, --sparsity, --calibration, the Token Filtering options (--tf-*) and the methods'
/// tuning options.
struct MethodArgs {
  std::string method = "dense";
  std::string calib_path, budget_mode, masking_mode, norms_mode;
  bool no_rotation = false;
  sparsity::MethodOptions mopt;
  std::optional<sparsity::Calibration> cal;  ///< read by resolve()
  bool token_filter = false;                 ///< --method includes token-filter
  gating::TokenFilterOptions tf;
  std::string tf_criterion, tf_anchor, tf_keys, tf_layers;

  /// Adds the options to `d` (in the order eval's --help lists them).
  void add_options(po::options_description& d);
  /// After parsing: checks the values, fills mopt / tf and reads the calibration file (so that
  /// bad arguments fail before the model is loaded; `read_calibration` false skips the reading).
  /// Throws sparsim::Error naming the option; with `vm`, a --tf-* option given without
  /// token-filter in --method is an error too.
  void resolve(const po::variables_map* vm = nullptr, bool read_calibration = true);
  bool sparse() const { return mopt.method != sparsity::Method::Dense; }
};

/// The Token Filtering gate for `eng` (nullptr without token-filter), checked against the
/// model and the length of the sequences it will see (the warm-up must be shorter).
template <class E>
std::unique_ptr<gating::TokenFilter<E>> make_token_filter(const MethodArgs& a, Engine<E>& eng,
                                                          int seq_len) {
  if (!a.token_filter) return nullptr;
  const AttnShape sh = eng.cache().shape(0);
  a.tf.validate(eng.config().n_layer);
  require(a.tf.warmup < seq_len,
          "--tf-warmup {} is not shorter than the sequences of {} tokens: nothing would be decided",
          a.tf.warmup, seq_len);
  auto g = std::make_unique<gating::TokenFilter<E>>(a.tf, eng.config().n_layer, sh.n_kv_head,
                                                    sh.qk_dim, sh.v_dim, eng.max_seqs());
  eng.set_token_gate(g.get());
  return g;
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
  return {{"target", o.ratio},
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
}

/// For a sparse method: checks that the calibration belongs to the model, builds the plan and,
/// for rotated plans, replaces `w` by the WINA-rotated model stored as `storage`. For dense, the
/// plan only carries the options.
template <class E>
sparsity::Plan prepare_method(const MethodArgs& a, const ModelInfo& mi,
                              std::shared_ptr<const Weights<E>>& w, DType storage) {
  sparsity::Plan plan;
  plan.opt = a.mopt;
  if (a.cal) {
    a.cal->check_model(mi.fingerprint, w->cfg, mi.path);
    plan = sparsity::make_plan(*a.cal, a.mopt);
    if (plan.rotated) {
      Stopwatch sw;
      w = sparsity::apply_rotation(*w, sparsity::rotation_from(*a.cal), storage);
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
