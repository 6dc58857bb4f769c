#include "transforms/low_rank.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/host_tasks.hpp"
#include "engine/engine.hpp"
#include "model/gguf.hpp"
#include "model/gguf_config.hpp"
#include "model/gguf_writer.hpp"
#include "model/pruned_layout.hpp"
#include "transforms/detail/select.hpp"
#include "transforms/kv_weight_pruning.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace sparsim::pruning {

namespace {
using std::size_t;
}  // namespace

double Factors::discarded() const {
  double s = 0;
  for (size_t i = static_cast<size_t>(rank); i < sv.size(); ++i) s += sv[i] * sv[i];
  return s;
}

Factors truncated_svd(const std::vector<double>& w, int m, int d, int rank,
                      const std::vector<double>& gram) {
  require(m >= 1 && d >= 1 && w.size() == static_cast<size_t>(m) * d,
          "truncated SVD: a {}×{} matrix given {} values", m, d, w.size());
  const int k = std::min(m, d);
  require(rank >= 1 && rank <= k, "truncated SVD: rank {} of a {}×{} matrix must be in 1 … {}",
          rank, m, d, k);
  for (double x : w) require(std::isfinite(x), "truncated SVD: the matrix has a non-finite value");
  Factors f;
  f.m = m;
  f.d = d;
  f.rank = rank;
  std::vector<double> a = w;  // W, or W·S when whitened
  std::vector<double> S;      // lower Cholesky factor of G
  if (!gram.empty()) {
    require(gram.size() == static_cast<size_t>(d) * d,
            "truncated SVD: a Gram matrix of {} values for {} inputs", gram.size(), d);
    double mean_diag = 0;
    for (int i = 0; i < d; ++i) mean_diag += gram[static_cast<size_t>(i) * d + i];
    mean_diag /= d;
    require(std::isfinite(mean_diag) && mean_diag > 0,
            "truncated SVD: the Gram matrix of the calibration inputs is zero or not finite");
    for (int attempt = 0;; ++attempt) {
      S = gram;
      for (int i = 0; i < d; ++i) S[static_cast<size_t>(i) * d + i] += f.ridge;
      if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', d, S.data(), d) == 0) break;
      require(attempt < 12, "truncated SVD: the Gram matrix stays indefinite with a ridge of {}",
              f.ridge);
      f.ridge = f.ridge > 0 ? f.ridge * 10 : 1e-6 * mean_diag;
    }
    for (int i = 0; i < d; ++i)
      for (int j = i + 1; j < d; ++j) S[static_cast<size_t>(i) * d + j] = 0;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, d, 1.0, w.data(), d, S.data(), d,
                0.0, a.data(), d);
  }
  std::vector<double> s(static_cast<size_t>(k)), u(static_cast<size_t>(m) * k),
      vt(static_cast<size_t>(k) * d);
  const int info =
      LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', m, d, a.data(), d, s.data(), u.data(), k, vt.data(), d);
  require(info == 0, "truncated SVD: LAPACK dgesdd failed (info {})", info);
  f.sv = s;
  f.b.assign(static_cast<size_t>(m) * rank, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < rank; ++j)
      f.b[static_cast<size_t>(i) * rank + j] = u[static_cast<size_t>(i) * k + j] * s[j];
  f.a.assign(vt.begin(), vt.begin() + static_cast<std::ptrdiff_t>(rank) * d);
  if (!S.empty())  // A = V_rᵀ S⁻¹: solve X·S = V_rᵀ
    cblas_dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasNoTrans, CblasNonUnit, rank, d, 1.0,
                S.data(), d, f.a.data(), d);
  return f;
}

const char* method_name(LowRankMethod m) {
  return m == LowRankMethod::Palu ? "palu" : "svd-llm";
}

int LowRankOptions::group_of(const Config& full) const {
  if (group > 0) return group;
  if (method == LowRankMethod::SvdLlm) return full.n_kv_head;
  // PaLU's G-LRD default: groups of 4 heads (fewer when the model has fewer KV heads, or 4 does
  // not divide them: the largest divisor below 4)
  for (int g = std::min(4, full.n_kv_head); g >= 1; --g)
    if (full.n_kv_head % g == 0) return g;
  return 1;
}

void LowRankOptions::validate(const Config& full) const {
  require(std::isfinite(retain) && retain > 0 && retain <= 1,
          "the KV-cache budget ρ = {} is outside (0, 1]", retain);
  const int g = group_of(full);
  require(g >= 1 && g <= full.n_kv_head && full.n_kv_head % g == 0,
          "a low-rank group of {} KV heads does not divide the model's {} KV heads", g,
          full.n_kv_head);
}

Config plan_low_rank(const Config& full, const LowRankOptions& o,
                     const calibration::FisherScores* fisher) {
  require(!full.pruned() && !full.low_rank_kv(),
          "the model is already pruned ({}); use the full "
          "model",
          full.prune.method);
  o.validate(full);
  const int g = o.group_of(full), G = full.n_kv_head / g, gd = g * full.head_dim;
  const int L = full.n_layer;
  // one weight per (layer, K/V, group)
  std::vector<double> weight(static_cast<size_t>(L) * 2 * G, 1.0);
  if (o.method == LowRankMethod::Palu) {
    require(fisher != nullptr,
            "palu allocates ranks by Fisher score: it needs a calibration file with Fisher scores "
            "(sparsim calibrate --fisher)");
    require(
        fisher->n_layer == L && fisher->n_kv_head == full.n_kv_head &&
            fisher->head_dim == full.head_dim,
        "the Fisher scores are for {} layers of {} KV heads of width {}, the model has {} of {} "
        "of width {}",
        fisher->n_layer, fisher->n_kv_head, fisher->head_dim, L, full.n_kv_head, full.head_dim);
    const size_t kv = static_cast<size_t>(full.kv_dim());
    for (int l = 0; l < L; ++l)
      for (int which = 0; which < 2; ++which)
        for (int q = 0; q < G; ++q) {
          const std::vector<double>& F = which == 0 ? fisher->k : fisher->v;
          double s = 0;
          for (int c = q * gd; c < (q + 1) * gd; ++c) s += std::sqrt(F[l * kv + c]);
          weight[(static_cast<size_t>(l) * 2 + which) * G + q] = s / gd;
        }
  }
  const std::vector<int> ranks = layer_pair_budgets(weight, o.retain, gd);
  Config c = full;
  c.lr_group = g;
  c.low_rank.assign(static_cast<size_t>(L), LayerLowRank{});
  for (int l = 0; l < L; ++l)
    for (int q = 0; q < G; ++q) {
      c.low_rank[static_cast<size_t>(l)].k_ranks.push_back(
          ranks[(static_cast<size_t>(l) * 2 + 0) * G + q]);
      c.low_rank[static_cast<size_t>(l)].v_ranks.push_back(
          ranks[(static_cast<size_t>(l) * 2 + 1) * G + q]);
    }
  c.prune = PruneRecord{};
  c.prune.method = method_name(o.method);
  c.prune.retain = o.retain;
  c.prune.flops_context = o.flops_context;
  c.prune.source_fingerprint = o.source_fingerprint;
  c.prune.calibration = o.calibration;
  c.prune.recipe = fmt::format("group={} whiten={} ranks={}", g, o.whiten ? "yes" : "no",
                               o.method == LowRankMethod::Palu ? "fisher" : "uniform");
  c.validate();
  return c;
}

LowRankReport low_rank_summary(const Config& lr) {
  require(lr.low_rank_kv(), "low-rank summary: the model has no low-rank layout");
  Config full = lr;
  full.low_rank.clear();
  full.lr_group = 0;
  full.prune = PruneRecord{};
  LowRankReport rep;
  rep.method = lr.prune.method;
  rep.retain = lr.prune.retain;
  rep.group = lr.lr_group;
  rep.whiten = lr.prune.recipe.find("whiten=no") == std::string::npos;
  rep.flops_context = lr.prune.flops_context > 0 ? lr.prune.flops_context : 2048;
  double kv = 0, kv_full = 0, par = 0, par_full = 0, ap = 0, ap_full = 0;
  double fl = 0, fl_full = 0, dec = 0, dec_full = 0;
  for (int l = 0; l < lr.n_layer; ++l) {
    const LayerLowRank& r = lr.low_rank[static_cast<size_t>(l)];
    rep.layers.push_back({r.k_rank(), r.v_rank(), 0.0, 0.0});
    kv += lr.k_cache_width(l) + lr.v_cache_width(l);
    kv_full += full.k_dim(l) + full.v_dim(l);
    par += static_cast<double>(lr.kv_params(l));
    par_full += static_cast<double>(full.kv_params(l));
    ap += attention_params(lr, l);
    ap_full += attention_params(full, l);
    fl += attention_flops(lr, l, rep.flops_context);
    fl_full += attention_flops(full, l, rep.flops_context);
    dec += attention_decode_flops(lr, l, rep.flops_context);
    dec_full += attention_decode_flops(full, l, rep.flops_context);
  }
  rep.retain_realised = kv / kv_full;
  rep.kv_bytes_fraction = kv / kv_full;  // fp32 cache: bytes ∝ widths
  rep.kv_params_fraction = par / par_full;
  rep.params_fraction = static_cast<double>(lr.n_params()) / static_cast<double>(full.n_params());
  rep.attn_params_fraction = ap / ap_full;
  rep.attn_flops_fraction = fl / fl_full;
  rep.attn_decode_flops_fraction = dec / dec_full;
  return rep;
}

nlohmann::json LowRankReport::json() const {
  nlohmann::json ls = nlohmann::json::array();
  for (const Layer& l : layers)
    ls.push_back(
        {{"k_rank", l.k_rank}, {"v_rank", l.v_rank}, {"k_loss", l.k_loss}, {"v_loss", l.v_loss}});
  return {{"method", method},
          {"retain", retain},
          {"retain_realised", retain_realised},
          {"group", group},
          {"whiten", whiten},
          {"kv_bytes_fraction", kv_bytes_fraction},
          {"kv_params_fraction", kv_params_fraction},
          {"params_fraction", params_fraction},
          {"attn_params_fraction", attn_params_fraction},
          {"attn_flops_fraction", attn_flops_fraction},
          {"attn_decode_flops_fraction", attn_decode_flops_fraction},
          {"flops_context", flops_context},
          {"layers", ls}};
}

std::string LowRankReport::text() const {
  std::string s = fmt::format(
      "{}: KV-cache budget ρ = {:.3f}, realised {:.4f}; groups of {} KV head{}; {}\n"
      "  KV cache {:.4f} of the full model's bytes, K/V parameters {:.4f}, all parameters "
      "{:.4f}\n  attention parameters {:.4f}, attention FLOPs {:.4f} (prefill of {} tokens), "
      "{:.4f} (one decode step at that context; K and V rebuilt)\n"
      "  layer  k_rank  v_rank  k_loss    v_loss\n",
      method, retain, retain_realised, group, group == 1 ? "" : "s",
      whiten ? "whitened (truncation-aware)" : "plain SVD", kv_bytes_fraction, kv_params_fraction,
      params_fraction, attn_params_fraction, attn_flops_fraction, flops_context,
      attn_decode_flops_fraction);
  for (size_t l = 0; l < layers.size(); ++l)
    s += fmt::format("  {:5d}  {:6d}  {:6d}  {:.6f}  {:.6f}\n", l, layers[l].k_rank,
                     layers[l].v_rank, layers[l].k_loss, layers[l].v_loss);
  return s;
}

namespace {

template <class E>
Matrix<E> f32_matrix(const std::vector<double>& x, int rows, int cols, const std::string& name) {
  Matrix<E> m;
  m.dtype = DType::F32;
  m.rows = rows;
  m.cols = cols;
  m.f32 = decltype(m.f32)(Kokkos::view_alloc(name, Kokkos::WithoutInitializing), rows, cols);
  auto h = Kokkos::create_mirror_view(m.f32);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      h(r, c) = static_cast<float>(x[static_cast<size_t>(r) * cols + c]);
  Kokkos::deep_copy(m.f32, h);
  return m;
}

/// The fp32 values of a matrix, row-major, as the GGUF writer wants them.
template <class E>
std::vector<float> f32_values(const Matrix<E>& m) {
  require(m.dtype == DType::F32, "low-rank factors are stored in F32");
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.f32);
  std::vector<float> out(static_cast<size_t>(m.rows) * m.cols);
  for (int r = 0; r < m.rows; ++r)
    for (int c = 0; c < m.cols; ++c) out[static_cast<size_t>(r) * m.cols + c] = h(r, c);
  return out;
}

}  // namespace

template <class E>
std::vector<std::vector<double>> attention_input_grams(
    std::shared_ptr<const Weights<E>> w, const std::vector<std::vector<int>>& seqs,
    const std::function<void(int, int)>& progress) {
  require(!seqs.empty(), "attention input statistics: no calibration sequences");
  int T = 0;
  for (const auto& s : seqs) {
    require(!s.empty(), "attention input statistics: an empty calibration sequence");
    T = std::max(T, static_cast<int>(s.size()));
  }
  const Config& c = w->cfg;
  require(T <= c.context_length,
          "attention input statistics: sequences of {} tokens exceed the "
          "model's context of {}",
          T, c.context_length);
  const int L = c.n_layer, d = c.d_model;
  std::vector<std::vector<double>> g(static_cast<size_t>(L),
                                     std::vector<double>(static_cast<size_t>(d) * d, 0.0));
  std::int64_t n_tokens = 0;
  Engine<E> eng(w, 1, T);
  std::vector<float> host;
  std::vector<double> x;
  eng.set_observer([&](int layer, Site site, const CMat<E>& v) {
    if (site != Site::Attn) return;
    const int n = static_cast<int>(v.extent(0));
    host.resize(static_cast<size_t>(n) * d);
    Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace,
                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>
        h(host.data(), static_cast<size_t>(n), static_cast<size_t>(d));
    Kokkos::deep_copy(h, v);
    x.assign(host.begin(), host.end());
    SingleThreadedBlas single;
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, n, 1.0, x.data(), d, 1.0,
                g[static_cast<size_t>(layer)].data(), d);
  });
  int done = 0;
  for (const auto& s : seqs) {
    eng.forward_tail({s}, 0, 1);
    n_tokens += static_cast<std::int64_t>(s.size());
    if (progress) progress(++done, static_cast<int>(seqs.size()));
  }
  eng.set_observer({});
  for (auto& m : g) {
    for (int i = 0; i < d; ++i)
      for (int j = i; j < d; ++j) {
        double& u = m[static_cast<size_t>(i) * d + j];
        require(std::isfinite(u), "attention input statistics: a non-finite activation");
        u /= static_cast<double>(n_tokens);
        m[static_cast<size_t>(j) * d + i] = u;
      }
  }
  return g;
}

template <class E>
std::shared_ptr<Weights<E>> factorise(const Weights<E>& full, const Config& plan,
                                      const std::vector<std::vector<double>>& grams,
                                      LowRankReport* report) {
  const Config& c = full.cfg;
  require(plan.low_rank_kv(), "factorise: the plan has no low-rank layout");
  require(plan.n_layer == c.n_layer && plan.n_kv_head == c.n_kv_head &&
              plan.head_dim == c.head_dim && plan.d_model == c.d_model && !c.low_rank_kv() &&
              !c.pruned(),
          "factorise: the plan was made for another model shape");
  const bool whiten = !grams.empty();
  require(!whiten || static_cast<int>(grams.size()) == c.n_layer,
          "factorise: {} Gram matrices for {} layers", grams.size(), c.n_layer);
  const int L = c.n_layer, d = c.d_model, g = plan.lr_group, G = c.n_kv_head / g;
  const int gd = g * c.head_dim, kd = c.kv_dim();
  // one task per (layer, K/V, group): single-threaded LAPACK, so the thread count changes nothing
  struct Job {
    int l, which, q;
    Factors f;
    double total = 0;
  };
  std::vector<Job> jobs;
  for (int l = 0; l < L; ++l)
    for (int which = 0; which < 2; ++which)
      for (int q = 0; q < G; ++q) jobs.push_back({l, which, q, {}, 0});
  std::vector<std::vector<double>> wk(static_cast<size_t>(L)), wv(wk);
  for (int l = 0; l < L; ++l) {
    wk[static_cast<size_t>(l)] = detail::host_values(full.layers[static_cast<size_t>(l)].wk);
    wv[static_cast<size_t>(l)] = detail::host_values(full.layers[static_cast<size_t>(l)].wv);
  }
  {
    SingleThreadedBlas single;
    parallel_tasks(static_cast<int>(jobs.size()), [&](int i) {
      Job& j = jobs[static_cast<size_t>(i)];
      const auto& W = j.which == 0 ? wk[static_cast<size_t>(j.l)] : wv[static_cast<size_t>(j.l)];
      const LayerLowRank& r = plan.low_rank[static_cast<size_t>(j.l)];
      const int rank = (j.which == 0 ? r.k_ranks : r.v_ranks)[static_cast<size_t>(j.q)];
      std::vector<double> rows(W.begin() + static_cast<std::ptrdiff_t>(j.q) * gd * d,
                               W.begin() + static_cast<std::ptrdiff_t>(j.q + 1) * gd * d);
      j.f = truncated_svd(rows, gd, d, rank,
                          whiten ? grams[static_cast<size_t>(j.l)] : std::vector<double>{});
      for (double s : j.f.sv) j.total += s * s;
    });
  }
  auto out = std::make_shared<Weights<E>>(full);
  out->cfg = plan;
  LowRankReport rep = low_rank_summary(plan);
  rep.whiten = whiten;
  for (int l = 0; l < L; ++l) {
    const LayerLowRank& r = plan.low_rank[static_cast<size_t>(l)];
    for (int which = 0; which < 2; ++which) {
      const int R = which == 0 ? r.k_rank() : r.v_rank();
      std::vector<double> A(static_cast<size_t>(R) * d), B(static_cast<size_t>(kd) * R, 0.0);
      double disc = 0, tot = 0;
      int r0 = 0;
      for (const Job& j : jobs) {
        if (j.l != l || j.which != which) continue;
        const Factors& f = j.f;
        std::copy(f.a.begin(), f.a.end(), A.begin() + static_cast<std::ptrdiff_t>(r0) * d);
        for (int i = 0; i < gd; ++i)
          for (int k = 0; k < f.rank; ++k)
            B[static_cast<size_t>(j.q * gd + i) * R + r0 + k] =
                f.b[static_cast<size_t>(i) * f.rank + k];
        r0 += f.rank;
        disc += f.discarded();
        tot += j.total;
      }
      LayerWeights<E>& lw = out->layers[static_cast<size_t>(l)];
      const std::string tag = fmt::format("{}.{}", l, which == 0 ? "k" : "v");
      (which == 0 ? lw.wk : lw.wv) = f32_matrix<E>(A, R, d, "sparsim::low_rank::a." + tag);
      (which == 0 ? lw.k_up : lw.v_up) = f32_matrix<E>(B, kd, R, "sparsim::low_rank::b." + tag);
      (which == 0 ? rep.layers[static_cast<size_t>(l)].k_loss
                  : rep.layers[static_cast<size_t>(l)].v_loss) = tot > 0 ? disc / tot : 0.0;
    }
  }
  if (report) *report = rep;
  return out;
}

template <class E>
void write_low_rank_gguf(const std::string& source, const Weights<E>& lr, const std::string& out) {
  const Config& c = lr.cfg;
  require(c.low_rank_kv(), "write_low_rank_gguf: the model is not low-rank");
  gguf::File f = gguf::File::open(source);
  const Config full = config_from_gguf(f);
  require(!full.pruned() && !full.low_rank_kv() && full.n_layer == c.n_layer &&
              full.kv_dim() == c.kv_dim() && full.d_model == c.d_model,
          "{}: the low-rank model was made from another model shape", source);
  gguf::Writer w;
  for (const gguf::KeyValue& kv : f.metadata()) {
    if (kv.key.rfind("sparsim.", 0) == 0) continue;
    if (kv.key == "general.alignment") {
      w.set_alignment(static_cast<std::uint32_t>(f.alignment()));
      continue;
    }
    w.set(kv.key, kv.value);
  }
  write_pruned_layout(w, c);
  auto add = [&](const std::string& name, const Matrix<E>& m) {
    const std::vector<float> v = f32_values(m);
    std::vector<std::uint8_t> bytes(v.size() * sizeof(float));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.add_tensor(name, {static_cast<std::uint64_t>(m.cols), static_cast<std::uint64_t>(m.rows)},
                 gguf::GGMLType::F32, std::move(bytes));
  };
  for (const gguf::TensorInfo& t : f.tensors()) {
    int l = -1;
    char which[8] = {};
    if (std::sscanf(t.name.c_str(), "blk.%d.attn_%1[kv].weight", &l, which) == 2 &&
        t.name == fmt::format("blk.{}.attn_{}.weight", l, which) && l >= 0 && l < c.n_layer) {
      const LayerWeights<E>& lw = lr.layers[static_cast<size_t>(l)];
      const bool k = which[0] == 'k';
      add(t.name, k ? lw.wk : lw.wv);
      add(fmt::format("blk.{}.attn_{}_up.weight", l, which), k ? lw.k_up : lw.v_up);
      continue;
    }
    w.add_tensor(t.name, t.ne, t.type, t.data, t.nbytes);
  }
  w.write(out);
}

#define SPARSIM_INSTANTIATE_LOW_RANK(E)                                                           \
  template std::vector<std::vector<double>> attention_input_grams<E>(                             \
      std::shared_ptr<const Weights<E>>, const std::vector<std::vector<int>>&,                    \
      const std::function<void(int, int)>&);                                                      \
  template std::shared_ptr<Weights<E>> factorise<E>(                                              \
      const Weights<E>&, const Config&, const std::vector<std::vector<double>>&, LowRankReport*); \
  template void write_low_rank_gguf<E>(const std::string&, const Weights<E>&, const std::string&);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_LOW_RANK)

}  // namespace sparsim::pruning
