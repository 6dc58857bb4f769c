#include "method_setup.hpp"

#include "core/method_name.hpp"

#include <cmath>

namespace sparsim::app {

void MethodArgs::add_options(po::options_description& d) {
  d.add_options()("method", po::value(&method)->default_value("dense"),
                  "dense, teal (thresholds), wina (TopK on weight-informed scores), topk-guided, "
                  "token-filter (skip attention of similar tokens), think or grace (prune K-cache "
                  "channels after prefill), probe-pruning (heads and FFN channels per batch, "
                  "alone), or one of each family joined by '+' (e.g. "
                  "topk-guided+token-filter+grace)")(
      "sparsity,s", po::value(&mopt.sparsity)->default_value(0.5),
      "target activation sparsity s in [0, 1) (sparse methods)")(
      "calibration", po::value(&calib_path), "calibration file from sparsim calibrate")(
      "delta", po::value(&mopt.delta)->default_value(0.01), "TopK-Guided clip margin δ")(
      "probe", po::value(&mopt.probe)->default_value(0.4),
      "TopK-Guided sensitivity probe s̄ (a calibrated level)")(
      "lambda", po::value(&mopt.lambda)->default_value(0.4),
      "TopK-Guided budget redistribution strength λ")(
      "budget", po::value(&budget_mode)->default_value("sensitivity"),
      "TopK-Guided block budgets: sensitivity or uniform (ablation)")(
      "masking", po::value(&masking_mode)->default_value("guided"),
      "TopK-Guided masking: guided or topk (WINA's TopK; ablation)")(
      "no-rotation", po::bool_switch(&no_rotation),
      "WINA / TopK-Guided on the unrotated model (uses the plain calibration)")(
      "wina-norms", po::value(&norms_mode)->default_value("kg"),
      "projections scored with column norms: kg (k and gate, WINA's code) or all (WINA's "
      "paper)")("greedy-lookup", po::value(&lookup_mode)->default_value("nearest"),
                "greedy-table row of each block budget: nearest (the paper) or interpolate "
                "(between the two rows around it, so the block's P equals its budget)")(
      "sensitivity-from", po::value(&mopt.sensitivity_from)->default_value(0),
      "TopK-Guided: the calibrated sensitivities over positions ≥ this of each sequence (0: "
      "all; calibrate --sensitivity-from lists those available)")(
      "rotation-storage", po::value(&rotation_storage)->default_value("f32"),
      "WINA / TopK-Guided: storage of the online re-rotation matrices, f32 or bf16")(
      "tf-ratio", po::value(&tf.ratio)->default_value(0.2),
      "Token Filtering: model-wide fraction r in [0, 1) of (token, layer) attention blocks to "
      "skip")("tf-criterion", po::value(&tf_criterion)->default_value("kv"),
              "Token Filtering similarity: key, value or kv (variance-aware fusion)")(
      "tf-anchor", po::value(&tf_anchor)->default_value("mean"),
      "Token Filtering anchor: mean of the previous tokens, or ema")(
      "tf-gamma", po::value(&tf.gamma)->default_value(0.9),
      "Token Filtering EMA anchor weight γ on the old anchor")(
      "tf-keys", po::value(&tf_keys)->default_value("post-rope"),
      "Token Filtering keys compared: post-rope (as cached) or pre-rope")(
      "tf-warmup", po::value(&tf.warmup)->default_value(16),
      "Token Filtering warm-up W: the first W tokens of a sequence are never skipped")(
      "tf-eta", po::value(&tf.eta)->default_value(0.01),
      "Token Filtering threshold controller gain η")(
      "tf-layers", po::value(&tf_layers)->default_value("tail"),
      "Token Filtering gated layers: tail (the last N), head (the first N) or uniform")(
      "tf-num-layers", po::value(&tf.num_layers)->default_value(0),
      "Token Filtering gated layer count N (0: 3/4 of the layers, rounded up, sparsim's choice: "
      "the paper gives no default count); each aims at "
      "r·L/N")("tf-drop-skipped", po::bool_switch(&tf.drop_skipped),
               "Token Filtering: skipped tokens also leave the KV cache and the anchor")(
      "tf-drop-mode", po::value(&tf_drop_mode)->default_value("auto"),
      "Token Filtering with --tf-drop-skipped: compact (gated layers keep only the kept tokens, "
      "their cache bytes freed), mask (dropped positions stay allocated, given no attention) or "
      "auto (compact, or mask where think, grace or --evict also runs)")(
      "tf-trace", po::value(&tf.trace_sequences)->default_value(4),
      "Token Filtering: sequences whose per-token similarity, threshold and decisions go to the "
      "run file")("kv-prune", po::value(&kv.lambda)->default_value(0.5),
                  "ThinK / GRACE: pruned fraction λ in [0, 1) of every head's key channels "
                  "(⌊λ·d⌋ channels pruned per head, as ThinK's reference code)")(
      "kv-window", po::value(&kv.window)->default_value(32),
      "ThinK / GRACE: observation window w, the last w queries of the prompt")(
      "kv-protect", po::value(&kv_protect)->default_value(kv_protect),
      "GRACE: bounds a,b of the share of salient key channels protected from pruning "
      "(0 <= a <= b < 1)")("kv-guard", po::value(&kv_guard)->default_value(kv_guard),
                           "GRACE: off (MIES alone, the published method) or on (take ThinK's "
                           "choice among the unprotected channels when it scores lower than MIES "
                           "on the objective)")(
      "kv-recent", po::value(&kv.recent)->default_value(32),
      "ThinK / GRACE: the last N prompt keys stay at full width, only the keys before them are "
      "compacted (ThinK's reference code keeps recent_size = 32; 0: compact the whole prompt)")(
      "kv-trace", po::value(&kv_trace)->default_value(1),
      "ThinK / GRACE: sequences whose kept channels go to the run file")(
      "evict", po::value(&evict_method),
      "KV-cache token eviction after prefill, per layer and KV head: streaming (attention sinks "
      "+ recent window), h2o (accumulated attention + recent window), snapkv (observation-window "
      "votes, pooled) or pyramidkv (snapkv with budgets falling with depth); composes with "
      "--method (default: none)")("evict-budget", po::value(&ev.budget)->default_value(0.5),
                                  "token eviction: tokens kept per head and layer, a fraction "
                                  "of the prompt in (0, 1] or a whole number of tokens > 1")(
      "evict-window", po::value(&ev.window)->default_value(32),
      "token eviction: the last w prompt tokens, always kept; SnapKV / PyramidKV's observation "
      "window (their queries vote), H2O's recent window")(
      "evict-sinks", po::value(&ev.sinks)->default_value(4),
      "token eviction, streaming: attention sinks, the first tokens always kept")(
      "evict-kernel", po::value(&ev.kernel)->default_value(5),
      "token eviction, snapkv / pyramidkv: pooling kernel size (odd; SnapKV's code: 5)")(
      "evict-pool", po::value(&evict_pool)->default_value(evict_pool),
      "token eviction, snapkv / pyramidkv: vote pooling, avg or max")(
      "evict-beta", po::value(&ev.beta)->default_value(20),
      "token eviction, pyramidkv: ratio of the deepest layer's budget to the shallowest's "
      "(PyramidKV's code: 20)")("pp-ratio", po::value(&pp.ratio)->default_value(0.5),
                                "Probe Pruning: pruned fraction in [0, 1) of every layer's "
                                "attention units (KV groups) and FFN channels, per batch")(
      "pp-probe", po::value(&pp.probe)->default_value(0.05),
      "Probe Pruning: the probe's share in (0, 1] of a batch's rows (at least 2 rows), chosen by "
      "residual norm");
}

void MethodArgs::validate(const Config& c) const {
  if (token_filter) check_as_options([&] { tf.validate(c.n_layer); });
  if (kv_prune) {
    require_uniform_key_width(c);
    check_as_options([&] { kv.validate(attn_shape(c, 0).qk_dim); });
  }
}

void MethodArgs::resolve(const po::variables_map* vm, bool read_calibration) {
  // --method: at most one activation method and token-filter, joined by '+'
  std::string act;
  token_filter = false;
  for (const std::string& part : method_parts(method)) {
    if (part == "token-filter") {
      require(!token_filter, "--method names token-filter twice");
      token_filter = true;
    } else if (part == "probe-pruning") {
      require(!probe_pruning, "--method names probe-pruning twice");
      probe_pruning = true;
    } else if (part == "think" || part == "grace") {
      require(!kv_prune, "--method names more than one of think and grace");
      kv_prune = true;
      kv.method = part == "think" ? pruning::KvMethod::Think : pruning::KvMethod::Grace;
    } else {
      require(act.empty() && !part.empty(),
              "--method '{}': join at most one of dense, teal, wina, topk-guided with "
              "token-filter and one of think, grace by '+'",
              method);
      act = part;
    }
  }
  if (act.empty()) act = "dense";
  if (vm && !token_filter)
    for (const auto& [name, value] : *vm)
      require(name.rfind("tf-", 0) != 0 || value.defaulted(),
              "--{} is a Token Filtering option: add token-filter to --method", name);
  if (vm && !kv_prune)
    for (const auto& [name, value] : *vm)
      require(name.rfind("kv-", 0) != 0 || value.defaulted(),
              "--{} is a K-cache channel pruning option: add think or grace to --method", name);
  if (vm && !evict())
    for (const auto& [name, value] : *vm)
      require(name.rfind("evict-", 0) != 0 || value.defaulted(),
              "--{} is a token eviction option: add --evict streaming|h2o|snapkv|pyramidkv", name);
  if (vm && !probe_pruning)
    for (const auto& [name, value] : *vm)
      require(name.rfind("pp-", 0) != 0 || value.defaulted(),
              "--{} is a Probe Pruning option: add probe-pruning to --method", name);
  if (probe_pruning) {
    require(act == "dense" && !token_filter && !kv_prune && !evict(),
            "--method probe-pruning runs alone (not joined with other methods or --evict)");
    check_as_options([&] { pp.validate(); });
  }
  if (evict()) {
    check_as_options([&] { ev.method = pruning::parse_evict_method(evict_method); });
    require(evict_pool == "avg" || evict_pool == "max", "--evict-pool must be avg or max, got '{}'",
            evict_pool);
    ev.pool = evict_pool == "avg" ? pruning::EvictPool::Avg : pruning::EvictPool::Max;
    check_as_options([&] { ev.validate(); });
  }
  if (kv_prune) {
    const std::vector<double> ab = parse_double_list(kv_protect, "--kv-protect");
    require(ab.size() == 2, "--kv-protect takes two numbers a,b, got '{}'", kv_protect);
    kv.protect_lo = ab[0];
    kv.protect_hi = ab[1];
    require(kv_guard == "on" || kv_guard == "off", "--kv-guard must be on or off, got '{}'",
            kv_guard);
    kv.guard = kv_guard == "on";
    require(kv_trace >= 0, "--kv-trace must be non-negative, got {}", kv_trace);
    // what does not depend on the model (⌊λ·d⌋ < d is checked once the model is loaded)
    check_as_options([&] { kv.check_values(); });
  }
  if (token_filter) {
    check_as_options([&] {
      tf.criterion = gating::parse_criterion(tf_criterion);
      tf.anchor = gating::parse_anchor(tf_anchor);
      tf.layers = gating::parse_layer_set(tf_layers);
    });
    require(tf_keys == "post-rope" || tf_keys == "pre-rope",
            "--tf-keys must be post-rope or pre-rope, got '{}'", tf_keys);
    tf.pre_rope = tf_keys == "pre-rope";
    // what does not depend on the model (r·L/N is checked once the model is loaded)
    check_as_options([&] { tf.check_values(); });
    require(tf_drop_mode == "auto" || tf_drop_mode == "compact" || tf_drop_mode == "mask",
            "--tf-drop-mode must be auto, compact or mask, got '{}'", tf_drop_mode);
    require(tf.drop_skipped || tf_drop_mode == "auto",
            "--tf-drop-mode {} says where dropped tokens go: add --tf-drop-skipped", tf_drop_mode);
    require(!(tf.drop_skipped && tf_drop_mode == "compact" && (kv_prune || evict())),
            "--tf-drop-mode compact cannot run with think, grace or --evict: they read the "
            "prompt's cache at its positions, so dropped tokens can only be masked there "
            "(--tf-drop-mode mask or auto)");
  }
  check_as_options([&] {
    mopt.method = sparsity::parse_method(act);
    mopt.validate();
  });
  require(budget_mode == "sensitivity" || budget_mode == "uniform",
          "--budget must be sensitivity or uniform, got '{}'", budget_mode);
  require(masking_mode == "guided" || masking_mode == "topk",
          "--masking must be guided or topk, got '{}'", masking_mode);
  require(norms_mode == "kg" || norms_mode == "all", "--wina-norms must be kg or all, got '{}'",
          norms_mode);
  mopt.sensitivity_budget = budget_mode == "sensitivity";
  mopt.guided_masking = masking_mode == "guided";
  mopt.rotate = !no_rotation;
  mopt.wina_norms_all = norms_mode == "all";
  check_as_options([&] { mopt.lookup = sparsity::parse_lookup(lookup_mode); });
  require(rotation_storage == "f32" || rotation_storage == "bf16",
          "--rotation-storage must be f32 or bf16, got '{}'", rotation_storage);
  mopt.rotation_storage = rotation_storage == "bf16" ? DType::BF16 : DType::F32;
  check_as_options([&] { mopt.validate(); });
  require(!mopt.needs_calibration() || !calib_path.empty(),
          "--method {} needs --calibration FILE (made by sparsim calibrate)", method);
  require(mopt.needs_calibration() || probe_pruning || calib_path.empty(),
          "--calibration is only used by the sparse methods (--method teal, wina, topk-guided) "
          "and by probe-pruning (its historical states)");
  if (!calib_path.empty() && read_calibration) {
    cal = sparsity::read_calibration(calib_path);
    require(!probe_pruning || cal->probe_history.has_value(),
            "--calibration {} holds no Probe Pruning history (make one with sparsim calibrate "
            "--pp-history)",
            calib_path);
  }
}

}  // namespace sparsim::app
