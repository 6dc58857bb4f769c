#include "transforms/kv_weight_pruning.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "io/summary_columns.hpp"
#include "transforms/detail/select.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sparsim::pruning {

const char* method_name(PruneMethod m) {
  switch (m) {
    case PruneMethod::Rap:
      return "rap";
    case PruneMethod::KvPruner:
      return "kvpruner";
    case PruneMethod::KvPrunerNaive:
      return "kvpruner-naive";
    case PruneMethod::Flap:
      return "flap";
  }
  return "?";
}

PruneMethod parse_prune_method(const std::string& s) {
  if (s == "rap") return PruneMethod::Rap;
  if (s == "kvpruner") return PruneMethod::KvPruner;
  if (s == "kvpruner-naive") return PruneMethod::KvPrunerNaive;
  if (s == "flap") return PruneMethod::Flap;
  fail("pruning method '{}' is not rap, kvpruner, kvpruner-naive or flap", s);
}

ScoreSource parse_score_source(const std::string& s) {
  if (s == "fisher") return ScoreSource::Fisher;
  if (s == "magnitude") return ScoreSource::Magnitude;
  fail("channel score '{}' is not fisher or magnitude", s);
}

LayerBudget parse_layer_budget(const std::string& s) {
  if (s == "adaptive") return LayerBudget::Adaptive;
  if (s == "uniform") return LayerBudget::Uniform;
  fail("layer budget '{}' is not adaptive or uniform", s);
}

KvBudget parse_kv_budget(const std::string& s) {
  if (s == "balanced") return KvBudget::Balanced;
  if (s == "pooled") return KvBudget::Pooled;
  fail("K/V budget '{}' is not balanced or pooled", s);
}

PairScore parse_pair_score(const std::string& s) {
  if (s == "joint") return PairScore::Joint;
  if (s == "additive") return PairScore::Additive;
  fail("pair score '{}' is not joint or additive", s);
}

std::string PruneOptions::recipe() const {
  return fmt::format("score={} budget={} pair={} k_share={} kv={}",
                     score == ScoreSource::Fisher ? "fisher" : "magnitude",
                     budget == LayerBudget::Adaptive ? "adaptive" : "uniform",
                     pair_score == PairScore::Joint ? "joint" : "additive", k_share,
                     kv_budget == KvBudget::Balanced ? "balanced" : "pooled");
}

void PruneOptions::validate() const {
  if (method == PruneMethod::Flap) {
    // FLAP removes whole heads and FFN channels: a share of the block parameters, not a
    // retain ratio of K/V channels
    require_setting(ratio > 0 && ratio < 1 && std::isfinite(ratio), "prune.ratio",
                    "FLAP's pruning ratio",
                    "must be in (0, 1) for flap (the share of the block parameters removed), "
                    "got {}",
                    ratio);
    require_setting(flap_windows >= 1, "prune.flap_windows", "FLAP's calibration windows",
                    "must be >= 1, got {}", flap_windows);
    require_setting(flap_tokens >= 2, "prune.flap_tokens", "FLAP's tokens per window",
                    "must be >= 2, got {}", flap_tokens);
    return;
  }
  constexpr const char* kShare = "the K share of the kept channels";
  require_setting(retain > 0 && retain <= 1 && std::isfinite(retain), "prune.retain",
                  "the retain ratio ρ", "must be in (0, 1], got {}", retain);
  require_setting(k_share > 0 && k_share < 1 && std::isfinite(k_share), "prune.k_share", kShare,
                  "must be in (0, 1), got {}", k_share);
  const double rk = 2 * k_share * retain, rv = 2 * (1 - k_share) * retain;
  require_setting(rk <= 1 + 1e-12 && rv <= 1 + 1e-12, "prune.k_share", kShare,
                  "{} at retain ratio {} asks {} to keep more than all its channels ({:.3f} of "
                  "them)",
                  k_share, retain, rk > 1 ? "K" : "V", std::max(rk, rv));
  require_setting(kv_budget == KvBudget::Balanced || k_share == 0.5, "prune.k_share", kShare,
                  "applies to balanced budgets only: pooled budgets set the K/V split "
                  "themselves (got {})",
                  k_share);
}

double ChannelScores::sigma(int l, int h, int j) const {
  return std::sqrt(pair[(static_cast<std::size_t>(l) * n_kv_head + h) * (head_dim / 2) + j]);
}

namespace {

/// The first channel of RoPE pair j of a head (its partner: Config::rope_partner).
int pair_channel(const Config& c, int j) {
  return c.rope_layout == RopeLayout::Adjacent ? 2 * j : j;
}

/// pair = F_c + F_c' of every pair from the per-channel scores k.
void additive_pairs(ChannelScores& s, const Config& full) {
  const int D = s.head_dim, half = D / 2;
  s.pair.assign(static_cast<std::size_t>(s.n_layer) * s.n_kv_head * half, 0.0);
  for (int l = 0; l < s.n_layer; ++l)
    for (int h = 0; h < s.n_kv_head; ++h)
      for (int j = 0; j < half; ++j) {
        const std::size_t base = (static_cast<std::size_t>(l) * s.n_kv_head + h) * D;
        const int c0 = pair_channel(full, j);
        s.pair[(static_cast<std::size_t>(l) * s.n_kv_head + h) * half + j] =
            s.k[base + c0] + s.k[base + full.rope_partner(c0)];
      }
}

}  // namespace

ChannelScores fisher_channel_scores(const FisherScores& f, const Config& full, PairScore ps) {
  ChannelScores s{f.n_layer, f.n_kv_head, f.head_dim, f.k, f.v, f.pair};
  if (ps == PairScore::Additive) additive_pairs(s, full);
  return s;
}

ChannelScores magnitude_channel_scores(const Config& full, std::vector<double> k_rows2,
                                       std::vector<double> v_rows2) {
  const std::size_t n = static_cast<std::size_t>(full.n_layer) * full.n_kv_head * full.head_dim;
  require(k_rows2.size() == n && v_rows2.size() == n,
          "magnitude scores: {} K and {} V rows for {} channels", k_rows2.size(), v_rows2.size(),
          n);
  ChannelScores s{full.n_layer,       full.n_kv_head,     full.head_dim,
                  std::move(k_rows2), std::move(v_rows2), {}};
  additive_pairs(s, full);
  return s;
}

std::vector<double> layer_sigma(const FisherScores& f) {
  std::vector<double> s(static_cast<std::size_t>(f.n_layer), 0.0);
  for (int l = 0; l < f.n_layer; ++l)
    for (int h = 0; h < f.n_kv_head; ++h)
      for (int j = 0; j < f.head_dim / 2; ++j) s[static_cast<std::size_t>(l)] += f.sigma(l, h, j);
  return s;
}

std::vector<int> layer_pair_budgets(const std::vector<double>& sigma, double retain,
                                    int max_pairs) {
  const int L = static_cast<int>(sigma.size());
  require(L >= 1 && max_pairs >= 1, "pair budgets: {} layers, {} pairs per head", L, max_pairs);
  require(retain > 0 && retain <= 1 && std::isfinite(retain),
          "the retain ratio must be in (0, 1], got {}", retain);
  double total_sigma = 0;
  for (int l = 0; l < L; ++l) {
    require(std::isfinite(sigma[l]) && sigma[l] >= 0, "pair budgets: σ of layer {} is {}", l,
            sigma[l]);
    total_sigma += sigma[l];
  }
  const long budget = std::max<long>(L, std::lround(retain * L * max_pairs));
  std::vector<double> w(sigma);
  if (total_sigma <= 0) std::fill(w.begin(), w.end(), 1.0);
  // real-valued targets r_ℓ = clamp(λ·w_ℓ, 1, max) with Σ r_ℓ = budget (λ by bisection)
  auto total = [&](double lambda) {
    double t = 0;
    for (double x : w) t += std::clamp(lambda * x, 1.0, static_cast<double>(max_pairs));
    return t;
  };
  double lo = 0, hi = 1;
  while (total(hi) < budget && hi < 1e300) hi *= 2;
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (total(mid) < budget ? lo : hi) = mid;
  }
  std::vector<double> r(static_cast<std::size_t>(L));
  std::vector<int> m(static_cast<std::size_t>(L));
  long assigned = 0;
  for (int l = 0; l < L; ++l) {
    r[l] = std::clamp(hi * w[l], 1.0, static_cast<double>(max_pairs));
    m[l] = static_cast<int>(std::floor(r[l] + 1e-9));
    m[l] = std::clamp(m[l], 1, max_pairs);
    assigned += m[l];
  }
  // hand out what rounding left (or take back what it over-gave), largest remainder first
  std::vector<int> order(static_cast<std::size_t>(L));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return (r[a] - m[a]) > (r[b] - m[b]); });
  for (std::size_t i = 0; assigned < budget; i = (i + 1) % order.size()) {
    const int l = order[i];
    if (m[l] < max_pairs) {
      ++m[l];
      ++assigned;
    }
  }
  for (std::size_t i = order.size(); assigned > budget;) {
    i = i == 0 ? order.size() - 1 : i - 1;
    const int l = order[i];
    if (m[l] > 1) {
      --m[l];
      --assigned;
    }
  }
  return m;
}

namespace {

/// Indices of the `k` largest scores (ties: lower index first), returned ascending.
std::vector<int> top_k(const std::vector<double>& score, int k) {
  std::vector<int> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return score[a] > score[b]; });
  idx.resize(static_cast<std::size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

Config plan_pruning(const Config& full, const FisherScores& f, const PruneOptions& opt) {
  require(opt.score == ScoreSource::Fisher,
          "plan_pruning: magnitude scores come from the weights (magnitude_channel_scores)");
  require(f.n_layer == full.n_layer && f.n_kv_head == full.n_kv_head && f.head_dim == full.head_dim,
          "the Fisher scores are for {} layers of {} KV heads of width {}, the model has {} of {} "
          "of width {}",
          f.n_layer, f.n_kv_head, f.head_dim, full.n_layer, full.n_kv_head, full.head_dim);
  require(f.rope_layout == rope_layout_name(full.rope_layout),
          "the Fisher scores pair channels in the '{}' RoPE layout, the model uses '{}'",
          f.rope_layout, rope_layout_name(full.rope_layout));
  return plan_pruning(full, fisher_channel_scores(f, full, opt.pair_score), opt);
}

Config plan_pruning(const Config& full, const ChannelScores& sc, const PruneOptions& opt) {
  require(!full.pruned(), "the model is already pruned ({}); prune the full model",
          full.prune.method);
  opt.validate();
  require(opt.method != PruneMethod::Flap,
          "plan_pruning plans K/V channel pruning; FLAP's plan is pruning::plan_flap");
  const double rk = 2 * opt.k_share * opt.retain, rv = 2 * (1 - opt.k_share) * opt.retain;
  require(
      sc.n_layer == full.n_layer && sc.n_kv_head == full.n_kv_head && sc.head_dim == full.head_dim,
      "channel scores for {} layers of {} KV heads of width {}, the model has {} of {} of "
      "width {}",
      sc.n_layer, sc.n_kv_head, sc.head_dim, full.n_layer, full.n_kv_head, full.head_dim);
  require(opt.method != PruneMethod::KvPrunerNaive || !full.rope_scaling.enabled,
          "kvpruner-naive re-pairs the kept channels as a smaller head with plain RoPE; this "
          "model scales its RoPE frequencies (rope_scaling)");
  const int D = full.head_dim, half = D / 2, H = full.n_kv_head;
  // σ_ℓ = Σ_h Σ_j σ_p: the layer weights of the adaptive budgets (uniform: equal weights)
  std::vector<double> w(static_cast<std::size_t>(full.n_layer), 1.0);
  if (opt.budget == LayerBudget::Adaptive)
    for (int l = 0; l < full.n_layer; ++l) {
      w[static_cast<std::size_t>(l)] = 0;
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < half; ++j) w[static_cast<std::size_t>(l)] += sc.sigma(l, h, j);
    }
  std::vector<int> mk = layer_pair_budgets(w, std::min(1.0, rk), half);
  std::vector<int> mv = layer_pair_budgets(w, std::min(1.0, rv), half);
  if (opt.kv_budget == KvBudget::Pooled) {
    // one allocation over K and V: each layer's kept channels split by their root-score mass
    for (int l = 0; l < full.n_layer; ++l) {
      double sk = 0, sv = 0;
      for (int i = 0; i < H * D; ++i) {
        sk += std::sqrt(sc.k[static_cast<std::size_t>(l) * H * D + i]);
        sv += std::sqrt(sc.v[static_cast<std::size_t>(l) * H * D + i]);
      }
      const std::size_t li = static_cast<std::size_t>(l);
      const int t = mk[li] + mv[li];
      const double share = sk + sv > 0 ? sk / (sk + sv) : 0.5;
      mk[li] = std::clamp(static_cast<int>(std::lround(share * t)), std::max(1, t - half),
                          std::min(half, t - 1));
      mv[li] = t - mk[li];
    }
  }
  Config c = full;
  c.attn.assign(static_cast<std::size_t>(full.n_layer), LayerAttention{});
  for (int l = 0; l < full.n_layer; ++l) {
    LayerAttention& a = c.attn[static_cast<std::size_t>(l)];
    const int mkl = mk[static_cast<std::size_t>(l)], mvl = mv[static_cast<std::size_t>(l)];
    a.qk_dim = 2 * mkl;
    a.v_dim = 2 * mvl;
    for (int h = 0; h < H; ++h) {
      const std::size_t base = (static_cast<std::size_t>(l) * H + h) * D;
      std::vector<double> fk(sc.k.begin() + static_cast<std::ptrdiff_t>(base),
                             sc.k.begin() + static_cast<std::ptrdiff_t>(base + D));
      std::vector<double> fv(sc.v.begin() + static_cast<std::ptrdiff_t>(base),
                             sc.v.begin() + static_cast<std::ptrdiff_t>(base + D));
      std::vector<int> kept_k;
      if (opt.method == PruneMethod::Rap) {
        std::vector<double> fp(static_cast<std::size_t>(half));
        for (int j = 0; j < half; ++j) fp[static_cast<std::size_t>(j)] = sc.sigma(l, h, j);
        for (int j : top_k(fp, mkl)) {  // both channels of every kept pair
          const int c0 = pair_channel(full, j);
          kept_k.push_back(c0);
          kept_k.push_back(full.rope_partner(c0));
        }
        std::sort(kept_k.begin(), kept_k.end());
      } else {
        kept_k = top_k(fk, 2 * mkl);
      }
      const std::vector<int> kept_v = top_k(fv, 2 * mvl);
      a.k_channels.insert(a.k_channels.end(), kept_k.begin(), kept_k.end());
      a.v_channels.insert(a.v_channels.end(), kept_v.begin(), kept_v.end());
    }
  }
  c.prune.method = method_name(opt.method);
  c.prune.retain = opt.retain;
  c.prune.flops_context = opt.flops_context;
  c.prune.source_fingerprint = opt.source_fingerprint;
  c.prune.calibration = opt.calibration;
  c.prune.recipe = opt.recipe();
  c.validate();
  return c;
}

// ---------------------------------------------------------------------------------------------
// Fusion

using detail::select_matrix;

template <class E>
std::shared_ptr<Weights<E>> fuse_pruned(const Weights<E>& full, const Config& pruned) {
  const Config& c = full.cfg;
  require(!c.pruned(), "fuse: the model is already pruned");
  require(!full.rotated(), "fuse: a WINA-rotated model cannot be pruned");
  require(pruned.pruned() && pruned.n_layer == c.n_layer && pruned.n_head == c.n_head &&
              pruned.n_kv_head == c.n_kv_head && pruned.head_dim == c.head_dim &&
              pruned.d_model == c.d_model && pruned.rope_layout == c.rope_layout,
          "fuse: the pruned config does not belong to this model");
  pruned.validate();
  auto out = std::make_shared<Weights<E>>(full);  // shares every view
  out->cfg = pruned;
  const int D = c.head_dim, group = c.n_head / c.n_kv_head;
  for (int l = 0; l < c.n_layer; ++l) {
    std::vector<int> q_rows, k_rows, v_rows, o_cols;
    for (int h = 0; h < c.n_head; ++h) {
      const int kvh = h / group;
      for (int i = 0; i < pruned.qk_head_dim(l); ++i)
        q_rows.push_back(h * D + pruned.k_channel(l, kvh, i));
      for (int i = 0; i < pruned.v_head_dim(l); ++i)
        o_cols.push_back(h * D + pruned.v_channel(l, kvh, i));
    }
    for (int h = 0; h < c.n_kv_head; ++h) {
      for (int i = 0; i < pruned.qk_head_dim(l); ++i)
        k_rows.push_back(h * D + pruned.k_channel(l, h, i));
      for (int i = 0; i < pruned.v_head_dim(l); ++i)
        v_rows.push_back(h * D + pruned.v_channel(l, h, i));
    }
    const LayerWeights<E>& src = full.layers[static_cast<std::size_t>(l)];
    LayerWeights<E>& dst = out->layers[static_cast<std::size_t>(l)];
    const std::string p = fmt::format("blk.{}.", l);
    dst.wq = select_matrix(src.wq, q_rows, {}, p + "attn_q.weight.pruned");
    dst.wk = select_matrix(src.wk, k_rows, {}, p + "attn_k.weight.pruned");
    dst.wv = select_matrix(src.wv, v_rows, {}, p + "attn_v.weight.pruned");
    dst.wo = select_matrix(src.wo, {}, o_cols, p + "attn_output.weight.pruned");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Costs

double attention_params(const Config& c, int l) {
  // W_q and W_o, and W_k, W_v (or their low-rank factors)
  return static_cast<double>(c.d_model) * (c.q_dim(l) + c.att_dim(l)) +
         static_cast<double>(c.kv_params(l));
}

namespace {
/// Rebuilding K and V of `rows` cached positions from their latents (block-diagonal up factors)
/// and rotating the rebuilt keys: the ledger's kv_reconstruct; 0 for a model without latents.
double reconstruct_flops(const Config& c, int l, double rows) {
  if (!c.low_rank_kv()) return 0;
  const LayerLowRank& r = c.low_rank[static_cast<std::size_t>(l)];
  const double gd = static_cast<double>(c.lr_group) * c.head_dim;
  return 2.0 * rows * gd * (r.k_rank() + r.v_rank()) + 3.0 * rows * c.kv_dim();
}
/// RoPE of n tokens' queries and keys (a low-rank model rotates its keys as it rebuilds them).
double rope_flops(const Config& c, int l, double n) {
  return 3.0 * n * (static_cast<double>(c.q_dim(l)) + (c.low_rank_kv() ? 0 : c.k_dim(l)));
}
}  // namespace

double attention_flops(const Config& c, int l, int context) {
  const double n = context;
  const double pairs = n * (n + 1) / 2;  // (query, key) pairs of a causal prefill
  const double nh = c.n_head;
  const double proj = 2.0 * n * attention_params(c, l);
  const double score = 2.0 * pairs * nh * c.qk_head_dim(l);
  const double softmax = 5.0 * pairs * nh;
  const double value = 2.0 * pairs * nh * c.v_head_dim(l);
  return proj + rope_flops(c, l, n) + reconstruct_flops(c, l, n) + score + softmax + value;
}

double attention_decode_flops(const Config& c, int l, int context) {
  const double n = context, nh = c.n_head;
  const double proj = 2.0 * attention_params(c, l);
  const double attend =
      2.0 * n * nh * c.qk_head_dim(l) + 5.0 * n * nh + 2.0 * n * nh * c.v_head_dim(l);
  return proj + rope_flops(c, l, 1) + reconstruct_flops(c, l, n) + attend;
}

PruneReport prune_report(const Config& pruned) {
  require(pruned.pruned(), "prune report: the model is not pruned");
  Config full = pruned;
  full.attn.clear();
  PruneReport r;
  r.method = pruned.prune.method;
  r.recipe = pruned.prune.recipe;
  r.retain = pruned.prune.retain;
  r.flops_context = pruned.prune.flops_context > 0 ? pruned.prune.flops_context : 2048;
  double kv = 0, kv_full = 0, par = 0, par_full = 0, fl = 0, fl_full = 0, kept_k = 0, orphans = 0;
  double dec = 0, dec_full = 0;
  for (int l = 0; l < pruned.n_layer; ++l) {
    dec += attention_decode_flops(pruned, l, r.flops_context);
    dec_full += attention_decode_flops(full, l, r.flops_context);
    LayerCost lc;
    lc.qk_dim = pruned.qk_head_dim(l);
    lc.v_dim = pruned.v_head_dim(l);
    for (int h = 0; h < pruned.n_kv_head; ++h) {
      std::vector<char> kept(static_cast<std::size_t>(pruned.head_dim), 0);
      for (int i = 0; i < lc.qk_dim; ++i)
        kept[static_cast<std::size_t>(pruned.k_channel(l, h, i))] = 1;
      for (int i = 0; i < lc.qk_dim; ++i) {
        const int ch = pruned.k_channel(l, h, i);
        if (!kept[static_cast<std::size_t>(pruned.rope_partner(ch))])
          ++lc.orphans;
        else if (pruned.rope_first(ch))
          ++lc.pairs;
      }
    }
    lc.k_channels = pruned.k_dim(l);
    const double kvl = pruned.k_dim(l) + pruned.v_dim(l), kvf = full.k_dim(l) + full.v_dim(l);
    lc.kv_bytes_fraction = kvl / kvf;
    lc.attn_params_fraction = attention_params(pruned, l) / attention_params(full, l);
    lc.attn_flops_fraction =
        attention_flops(pruned, l, r.flops_context) / attention_flops(full, l, r.flops_context);
    kv += kvl;
    kv_full += kvf;
    par += attention_params(pruned, l);
    par_full += attention_params(full, l);
    fl += attention_flops(pruned, l, r.flops_context);
    fl_full += attention_flops(full, l, r.flops_context);
    kept_k += lc.k_channels;
    orphans += lc.orphans;
    r.layers.push_back(lc);
  }
  r.retain_realised = kv / kv_full;
  r.kv_bytes_fraction = kv / kv_full;  // fp32 cache: bytes ∝ channels
  r.attn_params_fraction = par / par_full;
  r.attn_flops_fraction = fl / fl_full;
  r.attn_decode_flops_fraction = dec / dec_full;
  r.orphan_ratio = kept_k > 0 ? orphans / kept_k : 0.0;
  return r;
}

nlohmann::json PruneReport::json() const {
  nlohmann::json j = {{"method", method},
                      {"recipe", recipe},
                      {"retain", retain},
                      {"retain_realised", retain_realised},
                      {"orphan_ratio", orphan_ratio},
                      {"kv_bytes_fraction", kv_bytes_fraction},
                      {"attn_params_fraction", attn_params_fraction},
                      {"attn_flops_fraction", attn_flops_fraction},
                      {"attn_decode_flops_fraction", attn_decode_flops_fraction},
                      {"flops_context", flops_context}};
  nlohmann::json ls = nlohmann::json::array();
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const LayerCost& c = layers[l];
    ls.push_back(
        {{"layer", l},
         {"qk_head_dim", c.qk_dim},
         {"v_head_dim", c.v_dim},
         {"pairs", c.pairs},
         {"orphans", c.orphans},
         {"orphan_ratio", c.k_channels ? static_cast<double>(c.orphans) / c.k_channels : 0.0},
         {"kv_bytes_fraction", c.kv_bytes_fraction},
         {"attn_params_fraction", c.attn_params_fraction},
         {"attn_flops_fraction", c.attn_flops_fraction}});
  }
  j["layers"] = ls;
  return j;
}

void PruneReport::add_columns(io::SummaryColumns& cols) const {
  cols.add("prune_method", method, "", "attention pruning method of the model (rap, kvpruner)");
  cols.add("prune_retain", retain, "1", "nominal retain ratio ρ the model was pruned to");
  cols.add("prune_recipe", recipe, "",
           "selection recipe: scores, layer budgets, pair score, K share (\"\": the default, "
           "recorded before the switches existed)");
  cols.add("prune_retain_realised", retain_realised, "1",
           "kept K and V channels over all, over the model");
  cols.add("orphan_ratio", orphan_ratio, "1",
           "kept K channels whose RoPE partner was cut, over kept K channels");
  cols.add("kv_bytes_fraction", kv_bytes_fraction, "1",
           "KV-cache bytes of the pruned model over the full model's");
  cols.add("attn_params_fraction", attn_params_fraction, "1",
           "attention parameters (W_q, W_k, W_v, W_o) over the full model's");
  cols.add("attn_flops_fraction", attn_flops_fraction, "1",
           "attention FLOPs of a prefill of the summary's pruned.flops_context tokens over the "
           "full model's");
}

std::string PruneReport::table() const {
  std::string s = fmt::format("  {:>5} {:>5} {:>5} {:>6} {:>7} {:>8} {:>8} {:>8}\n", "layer", "qk",
                              "v", "pairs", "orphans", "kv", "params", "flops");
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const LayerCost& c = layers[l];
    s += fmt::format("  {:>5} {:>5} {:>5} {:>6} {:>7} {:>8.3f} {:>8.3f} {:>8.3f}\n", l, c.qk_dim,
                     c.v_dim, c.pairs, c.orphans, c.kv_bytes_fraction, c.attn_params_fraction,
                     c.attn_flops_fraction);
  }
  s += fmt::format(
      "  method {}, retain {:.3f} (realised {:.4f}), orphan ratio {:.4f}\n"
      "  KV cache {:.4f}, attention parameters {:.4f}, attention FLOPs {:.4f} of the full model "
      "(prefill of {} tokens), {:.4f} (one decode step at that context)\n",
      method, retain, retain_realised, orphan_ratio, kv_bytes_fraction, attn_params_fraction,
      attn_flops_fraction, flops_context, attn_decode_flops_fraction);
  return s;
}

namespace {
/// Σ_i w(r, i)² of every row r of a matrix in its storage type, in double.
template <class View>
void append_row_norms2(const View& dev, std::vector<double>& out) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dev);
  for (std::size_t r = 0; r < h.extent(0); ++r) {
    double s = 0;
    for (std::size_t i = 0; i < h.extent(1); ++i) {
      const double x = to_f32(h(r, i));
      s += x * x;
    }
    out.push_back(s);
  }
}

template <class E>
void append_row_norms2(const Matrix<E>& m, std::vector<double>& out) {
  switch (m.dtype) {
    case DType::F32:
      return append_row_norms2(m.f32, out);
    case DType::BF16:
      return append_row_norms2(m.bf16, out);
    case DType::F16:
      return append_row_norms2(m.f16, out);
  }
}
}  // namespace

template <class E>
ChannelScores magnitude_channel_scores(const Weights<E>& w) {
  const Config& c = w.cfg;
  require(!c.pruned(), "magnitude scores: the model is already pruned");
  std::vector<double> k, v;
  for (const auto& lw : w.layers) {
    append_row_norms2(lw.wk, k);
    append_row_norms2(lw.wv, v);
  }
  return magnitude_channel_scores(c, std::move(k), std::move(v));
}

#define SPARSIM_INSTANTIATE_PRUNE(E)                                                     \
  template std::shared_ptr<Weights<E>> fuse_pruned<E>(const Weights<E>&, const Config&); \
  template ChannelScores magnitude_channel_scores<E>(const Weights<E>&);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_PRUNE)

}  // namespace sparsim::pruning
