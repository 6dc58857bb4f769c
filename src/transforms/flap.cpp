#include "transforms/flap.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "transforms/detail/select.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sparsim::pruning {

// ---------------------------------------------------------------------------------------------
// Statistics

ChannelMoments::ChannelMoments(int d)
    : d_(d), mean_(static_cast<std::size_t>(d), 0.0), m2_(static_cast<std::size_t>(d), 0.0) {}

void ChannelMoments::add(const float* x, std::int64_t n) {
  if (n <= 0) return;
  const auto d = static_cast<std::size_t>(d_);
  std::vector<double> bm(d, 0.0), bm2(d, 0.0);
  for (std::int64_t r = 0; r < n; ++r)
    for (std::size_t c = 0; c < d; ++c) bm[c] += x[static_cast<std::size_t>(r) * d + c];
  for (double& v : bm) v /= static_cast<double>(n);
  for (std::int64_t r = 0; r < n; ++r)
    for (std::size_t c = 0; c < d; ++c) {
      const double e = x[static_cast<std::size_t>(r) * d + c] - bm[c];
      bm2[c] += e * e;
    }
  // merge the batch's moments into the running ones
  const double na = static_cast<double>(n_), nb = static_cast<double>(n), nt = na + nb;
  for (std::size_t c = 0; c < d; ++c) {
    const double delta = bm[c] - mean_[c];
    mean_[c] += delta * nb / nt;
    m2_[c] += bm2[c] + delta * delta * na * nb / nt;
  }
  n_ += n;
}

std::vector<double> ChannelMoments::variance() const {
  std::vector<double> v(m2_.size(), 0.0);
  if (n_ == 0) return v;
  for (std::size_t c = 0; c < v.size(); ++c) v[c] = m2_[c] / static_cast<double>(n_);
  return v;
}

template <class E>
FlapStats flap_statistics(std::shared_ptr<const Weights<E>> w,
                          const std::vector<std::vector<int>>& windows,
                          const std::function<void(int, int)>& progress) {
  const Config& c = w->cfg;
  require(!c.pruned() && !c.structured() && !c.low_rank_kv() && !w->rotated(),
          "FLAP statistics need the whole model ({} is {})", c.name,
          c.prune.method.empty() ? "rotated" : c.prune.method);
  require(!windows.empty(), "FLAP statistics: no calibration windows");
  std::size_t T = 0;
  for (const auto& win : windows) T = std::max(T, win.size());
  require(T >= 1 && static_cast<int>(T) <= c.context_length,
          "FLAP statistics: windows of {} tokens, the model's context is {}", T, c.context_length);
  const auto L = static_cast<std::size_t>(c.n_layer);
  std::vector<ChannelMoments> o(L, ChannelMoments(c.q_dim())), down(L, ChannelMoments(c.d_ff));
  Engine<E> eng(w, 1, static_cast<int>(T));
  std::vector<float> host;
  eng.set_observer([&](int layer, Site site, const CMat<E>& x) {
    if (site != Site::O && site != Site::Down) return;
    host.resize(x.extent(0) * x.extent(1));
    Kokkos::View<float**, Layout, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
        host.data(), x.extent(0), x.extent(1));
    Kokkos::deep_copy(h, x);
    auto& m = site == Site::O ? o[static_cast<std::size_t>(layer)]
                              : down[static_cast<std::size_t>(layer)];
    m.add(host.data(), static_cast<std::int64_t>(x.extent(0)));
  });
  const int n = static_cast<int>(windows.size());
  for (int i = 0; i < n; ++i) {
    eng.forward_tail({windows[static_cast<std::size_t>(i)]}, 0, 1);
    if (progress) progress(i + 1, n);
  }
  eng.set_observer({});
  FlapStats s;
  s.n_layer = c.n_layer;
  s.q_dim = c.q_dim();
  s.d_ff = c.d_ff;
  s.tokens = o[0].count();
  for (std::size_t l = 0; l < L; ++l) {
    s.o_mean.insert(s.o_mean.end(), o[l].mean().begin(), o[l].mean().end());
    const auto ov = o[l].variance();
    s.o_var.insert(s.o_var.end(), ov.begin(), ov.end());
    s.down_mean.insert(s.down_mean.end(), down[l].mean().begin(), down[l].mean().end());
    const auto dv = down[l].variance();
    s.down_var.insert(s.down_var.end(), dv.begin(), dv.end());
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Scores

namespace {

/// (x − mean) / std of one layer's values (std with n − 1; a constant layer gives zeros).
void standardise(const double* x, std::size_t n, double* out) {
  double m = 0;
  for (std::size_t i = 0; i < n; ++i) m += x[i];
  m /= static_cast<double>(n);
  double v = 0;
  for (std::size_t i = 0; i < n; ++i) v += (x[i] - m) * (x[i] - m);
  const double sd = n > 1 ? std::sqrt(v / static_cast<double>(n - 1)) : 0.0;
  for (std::size_t i = 0; i < n; ++i) out[i] = sd > 0 ? (x[i] - m) / sd : 0.0;
}

/// Σ_r w(r, c)² of every column c of a [rows][cols] matrix.
std::vector<double> column_norms2(const std::vector<double>& w, int rows, int cols) {
  std::vector<double> n(static_cast<std::size_t>(cols), 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const double x = w[static_cast<std::size_t>(r) * cols + c];
      n[static_cast<std::size_t>(c)] += x * x;
    }
  return n;
}

void check_stats(const Config& full, const FlapStats& s) {
  const auto L = static_cast<std::size_t>(full.n_layer);
  require(s.n_layer == full.n_layer && s.q_dim == full.q_dim() && s.d_ff == full.d_ff &&
              s.o_mean.size() == L * s.q_dim && s.o_var.size() == L * s.q_dim &&
              s.down_mean.size() == L * s.d_ff && s.down_var.size() == L * s.d_ff,
          "FLAP statistics of {} layers (W_o inputs {}, W_down inputs {}) do not fit the model "
          "({} layers, {}, {})",
          s.n_layer, s.q_dim, s.d_ff, full.n_layer, full.q_dim(), full.d_ff);
  require(s.tokens >= 2, "FLAP statistics over {} tokens: at least 2 are needed", s.tokens);
}

}  // namespace

FlapScores flap_scores(const Config& full, const FlapStats& s, const std::vector<double>& o_norm2,
                       const std::vector<double>& down_norm2) {
  check_stats(full, s);
  const auto L = static_cast<std::size_t>(full.n_layer), Q = static_cast<std::size_t>(s.q_dim),
             F = static_cast<std::size_t>(s.d_ff);
  require(o_norm2.size() == L * Q && down_norm2.size() == L * F,
          "FLAP scores: column norms of {} and {} entries, expected {} and {}", o_norm2.size(),
          down_norm2.size(), L * Q, L * F);
  FlapScores sc;
  sc.n_layer = full.n_layer;
  sc.units = full.n_kv_head;
  sc.unit_heads = full.n_head / full.n_kv_head;
  sc.d_ff = full.d_ff;
  sc.unit_weight = (2.0 * sc.unit_heads + 2.0) * full.head_dim / 3.0;
  sc.o_raw.resize(L * Q);
  sc.down_raw.resize(L * F);
  for (std::size_t i = 0; i < L * Q; ++i) {
    const double m = s.o_var[i] * o_norm2[i];
    sc.o_raw[i] = m * m;  // the reference squares W_o's fluctuation metric
  }
  for (std::size_t i = 0; i < L * F; ++i) sc.down_raw[i] = s.down_var[i] * down_norm2[i];
  std::vector<double> zo(L * Q);
  sc.ffn.resize(L * F);
  sc.unit.resize(L * static_cast<std::size_t>(sc.units));
  const std::size_t uw = static_cast<std::size_t>(sc.unit_heads) * full.head_dim;
  for (std::size_t l = 0; l < L; ++l) {
    standardise(&sc.o_raw[l * Q], Q, &zo[l * Q]);
    standardise(&sc.down_raw[l * F], F, &sc.ffn[l * F]);
    for (std::size_t u = 0; u < static_cast<std::size_t>(sc.units); ++u) {
      double m = 0;
      for (std::size_t i = 0; i < uw; ++i) m += zo[l * Q + u * uw + i];
      sc.unit[l * sc.units + u] = m / static_cast<double>(uw);
    }
  }
  return sc;
}

template <class E>
FlapScores flap_scores(const Weights<E>& full, const FlapStats& s) {
  const Config& c = full.cfg;
  std::vector<double> on, dn;
  for (const auto& lw : full.layers) {
    const auto a = column_norms2(detail::host_values(lw.wo), lw.wo.rows, lw.wo.cols);
    const auto b = column_norms2(detail::host_values(lw.w_down), lw.w_down.rows, lw.w_down.cols);
    on.insert(on.end(), a.begin(), a.end());
    dn.insert(dn.end(), b.begin(), b.end());
  }
  return flap_scores(c, s, on, dn);
}

// ---------------------------------------------------------------------------------------------
// Structure search (AL-AM)

Config plan_flap(const Config& full, const FlapScores& sc, const PruneOptions& opt) {
  require(!full.pruned() && !full.structured() && !full.low_rank_kv(),
          "the model is already pruned ({}); prune the full model", full.prune.method);
  require(opt.method == PruneMethod::Flap, "plan_flap: the options are not FLAP's");
  opt.validate();
  const auto L = static_cast<std::size_t>(full.n_layer), U = static_cast<std::size_t>(sc.units),
             F = static_cast<std::size_t>(sc.d_ff);
  require(sc.n_layer == full.n_layer && sc.units == full.n_kv_head && sc.d_ff == full.d_ff &&
              sc.unit.size() == L * U && sc.ffn.size() == L * F,
          "FLAP scores do not fit the model");
  // every unit of the model: attention units first (index < L·U), then FFN channels
  const std::size_t na = L * U, n = na + L * F;
  std::vector<double> score(n);
  std::copy(sc.unit.begin(), sc.unit.end(), score.begin());
  std::copy(sc.ffn.begin(), sc.ffn.end(), score.begin() + static_cast<std::ptrdiff_t>(na));
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  // best first; ties to the lower index (deterministic)
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return score[a] > score[b]; });
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) total += i < na ? sc.unit_weight : 1.0;
  const double target = total * (1.0 - opt.ratio);
  // the position whose cumulative weight comes closest to the target (the first of equals)
  double cum = 0, best = -1;
  std::size_t at = 0;
  for (std::size_t k = 0; k < n; ++k) {
    cum += order[k] < na ? sc.unit_weight : 1.0;
    const double gap = std::fabs(cum - target);
    if (best < 0 || gap < best) {
      best = gap;
      at = k;
    }
  }
  // the reference keeps the scores above the one at that position: the first `at` units
  std::vector<char> keep(n, 0);
  for (std::size_t k = 0; k < at; ++k) keep[order[k]] = 1;
  Config p = full;
  p.structure.assign(L, LayerStructure{});
  const int group = full.n_head / full.n_kv_head;
  for (std::size_t l = 0; l < L; ++l) {
    LayerStructure& st = p.structure[l];
    for (std::size_t u = 0; u < U; ++u)
      if (keep[l * U + u])
        for (int g = 0; g < group; ++g) st.q_heads.push_back(static_cast<int>(u) * group + g);
    for (std::size_t f = 0; f < F; ++f)
      if (keep[na + l * F + f]) st.ffn.push_back(static_cast<int>(f));
    require(
        !st.q_heads.empty(),
        "FLAP at pruning ratio {}: the global ranking removes every attention head of layer {}; a "
        "smaller ratio keeps at least one",
        opt.ratio, l);
    require(!st.ffn.empty(),
            "FLAP at pruning ratio {}: the global ranking removes every FFN channel of layer {}; a "
            "smaller "
            "ratio keeps at least one",
            opt.ratio, l);
  }
  p.prune = PruneRecord{};
  p.prune.method = "flap";
  p.prune.retain = 1.0 - opt.ratio;
  p.prune.flops_context = opt.flops_context;
  p.prune.source_fingerprint = opt.source_fingerprint;
  p.prune.calibration = opt.calibration;
  p.prune.recipe = fmt::format(
      "metric=wifv structure=al-am unit=kv-group bias=baseline ratio={:g} windows={} tokens={}",
      opt.ratio, opt.flap_windows, opt.flap_tokens);
  p.validate();
  return p;
}

// ---------------------------------------------------------------------------------------------
// Bias compensation and the reduced weights

template <class E>
OutputBiases flap_biases(const Weights<E>& full, const Config& plan, const FlapStats& s) {
  const Config& c = full.cfg;
  check_stats(c, s);
  require(plan.structured() && plan.n_layer == c.n_layer, "flap_biases: the plan is not FLAP's");
  const int d = c.d_model, D = c.head_dim;
  OutputBiases b;
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerStructure& st = plan.structure[static_cast<std::size_t>(l)];
    const LayerWeights<E>& lw = full.layers[static_cast<std::size_t>(l)];
    // b = W · m̃ with m̃ the calibration mean on the removed inputs and 0 on the kept ones
    auto bias = [&](const Matrix<E>& w, const double* mean, const std::vector<int>& kept_cols) {
      std::vector<double> m(mean, mean + w.cols);
      for (int k : kept_cols) m[static_cast<std::size_t>(k)] = 0.0;
      const std::vector<double> wv = detail::host_values(w);
      std::vector<double> y(static_cast<std::size_t>(d), 0.0);
      cblas_dgemv(CblasRowMajor, CblasNoTrans, w.rows, w.cols, 1.0, wv.data(), w.cols, m.data(), 1,
                  0.0, y.data(), 1);
      return std::vector<float>(y.begin(), y.end());
    };
    std::vector<int> o_cols;
    for (int h : st.q_heads)
      for (int i = 0; i < D; ++i) o_cols.push_back(h * D + i);
    b.o.push_back(bias(lw.wo, &s.o_mean[static_cast<std::size_t>(l) * s.q_dim], o_cols));
    b.down.push_back(bias(lw.w_down, &s.down_mean[static_cast<std::size_t>(l) * s.d_ff], st.ffn));
  }
  return b;
}

template <class E>
std::shared_ptr<Weights<E>> fuse_structured(const Weights<E>& full, const Config& plan,
                                            const OutputBiases& b) {
  const Config& c = full.cfg;
  require(!c.pruned() && !c.structured() && !c.low_rank_kv() && !full.rotated(),
          "fuse: the model is already transformed");
  require(plan.structured() && plan.n_layer == c.n_layer && plan.n_head == c.n_head &&
              plan.n_kv_head == c.n_kv_head && plan.d_ff == c.d_ff && plan.d_model == c.d_model,
          "fuse: the structured config does not belong to this model");
  const auto L = static_cast<std::size_t>(c.n_layer);
  require(b.o.size() == L && b.down.size() == L, "fuse: biases for {} layers, the model has {}",
          b.o.size(), L);
  plan.validate();
  auto out = std::make_shared<Weights<E>>(full);  // shares every view
  out->cfg = plan;
  const int D = c.head_dim;
  auto vec = [](const std::vector<float>& x, const std::string& name) {
    Kokkos::View<float*, DeviceOf<E>> v(Kokkos::view_alloc(name, Kokkos::WithoutInitializing),
                                        x.size());
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < x.size(); ++i) h(i) = x[i];
    Kokkos::deep_copy(v, h);
    return v;
  };
  for (int l = 0; l < c.n_layer; ++l) {
    std::vector<int> q, kv;
    for (int h : plan.structure[static_cast<std::size_t>(l)].q_heads)
      for (int i = 0; i < D; ++i) q.push_back(h * D + i);
    for (int h : plan.kv_heads_at(l))
      for (int i = 0; i < D; ++i) kv.push_back(h * D + i);
    const std::vector<int>& ff = plan.structure[static_cast<std::size_t>(l)].ffn;
    const LayerWeights<E>& src = full.layers[static_cast<std::size_t>(l)];
    LayerWeights<E>& dst = out->layers[static_cast<std::size_t>(l)];
    const std::string p = fmt::format("blk.{}.", l);
    using detail::select_matrix;
    dst.wq = select_matrix(src.wq, q, {}, p + "attn_q.weight.flap");
    dst.wk = select_matrix(src.wk, kv, {}, p + "attn_k.weight.flap");
    dst.wv = select_matrix(src.wv, kv, {}, p + "attn_v.weight.flap");
    dst.wo = select_matrix(src.wo, {}, q, p + "attn_output.weight.flap");
    dst.w_gate = select_matrix(src.w_gate, ff, {}, p + "ffn_gate.weight.flap");
    dst.w_up = select_matrix(src.w_up, ff, {}, p + "ffn_up.weight.flap");
    dst.w_down = select_matrix(src.w_down, {}, ff, p + "ffn_down.weight.flap");
    dst.o_bias = vec(b.o[static_cast<std::size_t>(l)], p + "attn_output.bias");
    dst.down_bias = vec(b.down[static_cast<std::size_t>(l)], p + "ffn_down.bias");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Report

FlapReport flap_report(const Config& full, const Config& plan, double ratio) {
  require(plan.structured(), "flap_report: the model is not structurally pruned");
  FlapReport r;
  r.ratio = ratio;
  double all = 0, kept = 0, kv_all = 0, kv_kept = 0;
  const double d = full.d_model;
  for (int l = 0; l < full.n_layer; ++l) {
    all += d * (2.0 * full.q_dim(l) + 2.0 * full.k_dim(l) + 3.0 * full.d_ff_at(l));
    kept += d * (2.0 * plan.q_dim(l) + 2.0 * plan.k_dim(l) + 3.0 * plan.d_ff_at(l));
    kv_all += 2.0 * full.k_dim(l);
    kv_kept += 2.0 * plan.k_dim(l);
    r.layers.push_back({plan.n_head_at(l), plan.n_kv_head_at(l), plan.d_ff_at(l)});
  }
  r.ratio_realised = 1.0 - kept / all;
  r.params_fraction = static_cast<double>(plan.n_params()) / static_cast<double>(full.n_params());
  r.kv_bytes_fraction = kv_kept / kv_all;
  return r;
}

nlohmann::json FlapReport::json() const {
  nlohmann::json ls = nlohmann::json::array();
  for (const Layer& l : layers)
    ls.push_back({{"q_heads", l.q_heads}, {"kv_heads", l.kv_heads}, {"d_ff", l.d_ff}});
  return {{"method", "flap"},
          {"ratio", ratio},
          {"ratio_realised", ratio_realised},
          {"params_fraction", params_fraction},
          {"kv_bytes_fraction", kv_bytes_fraction},
          {"layers", ls}};
}

std::string FlapReport::table() const {
  std::string s = fmt::format(
      "  ratio {:g} (block projection parameters removed: {:.4f}), parameters {:.4f} of the "
      "full model, KV cache {:.4f}\n  {:>5} {:>8} {:>9} {:>6}\n",
      ratio, ratio_realised, params_fraction, kv_bytes_fraction, "layer", "q_heads", "kv_heads",
      "d_ff");
  for (std::size_t l = 0; l < layers.size(); ++l)
    s += fmt::format("  {:>5} {:>8} {:>9} {:>6}\n", l, layers[l].q_heads, layers[l].kv_heads,
                     layers[l].d_ff);
  return s;
}

#define SPARSIM_INSTANTIATE_FLAP(E)                                                         \
  template FlapStats flap_statistics<E>(std::shared_ptr<const Weights<E>>,                  \
                                        const std::vector<std::vector<int>>&,               \
                                        const std::function<void(int, int)>&);              \
  template FlapScores flap_scores<E>(const Weights<E>&, const FlapStats&);                  \
  template OutputBiases flap_biases<E>(const Weights<E>&, const Config&, const FlapStats&); \
  template std::shared_ptr<Weights<E>> fuse_structured<E>(const Weights<E>&, const Config&, \
                                                          const OutputBiases&);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_FLAP)

}  // namespace sparsim::pruning
