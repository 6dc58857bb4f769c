#include "transforms/slimgpt.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/host_tasks.hpp"
#include "transforms/detail/select.hpp"
#include "transforms/flap.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sparsim::pruning {

namespace {
using std::size_t;
}  // namespace

SlimGptSchedule parse_slimgpt_schedule(const std::string& s) {
  if (s == "log") return SlimGptSchedule::Log;
  if (s == "uniform") return SlimGptSchedule::Uniform;
  throw OptionError("slimgpt.schedule", "SlimGPT's layer schedule",
                    fmt::format("'{}' is not log or uniform", s));
}

const char* schedule_name(SlimGptSchedule s) {
  return s == SlimGptSchedule::Log ? "log" : "uniform";
}

void SlimGptOptions::validate() const {
  require_setting(std::isfinite(ratio) && ratio >= 0 && ratio < 1, "slimgpt.ratio",
                  "SlimGPT's pruning ratio",
                  "must be in [0, 1) for slimgpt (the share of the block parameters removed), "
                  "got {}",
                  ratio);
  require_setting(std::isfinite(damp) && damp >= 0, "slimgpt.damp", "SlimGPT's damping λ",
                  "must be a finite number >= 0 (the share of the mean diagonal added to the "
                  "Hessian), got {}",
                  damp);
  require_setting(ffn_group >= 1, "slimgpt.ffn_group", "SlimGPT's FFN group",
                  "must be >= 1, got {}", ffn_group);
  require_setting(windows >= 1, "slimgpt.windows", "SlimGPT's calibration windows",
                  "must be >= 1, got {}", windows);
  require_setting(tokens >= 2, "slimgpt.tokens", "SlimGPT's tokens per window",
                  "must be >= 2, got {}", tokens);
}

std::string SlimGptOptions::recipe() const {
  return fmt::format(
      "hessian={} unit=kv-group schedule={} damp={:g} ffn_group={} ratio={:g} windows={} "
      "tokens={}",
      sequential ? "sequential" : "dense-once", schedule_name(schedule), damp, ffn_group, ratio,
      windows, tokens);
}

// ---------------------------------------------------------------------------------------------
// Statistics

namespace {

/// The Gram matrices of the W_o / W_down inputs of the layers `want` (every layer when empty) of
/// model `w` over the windows; the other layers' matrices are left empty.
template <class E>
SlimGptGrams gather_grams(std::shared_ptr<const Weights<E>> w,
                          const std::vector<std::vector<int>>& windows, std::vector<int> want,
                          const std::function<void(int, int)>& progress) {
  const Config& c = w->cfg;
  require(!windows.empty(), "SlimGPT statistics: no calibration windows");
  std::size_t T = 0;
  for (const auto& win : windows) {
    require(!win.empty(), "SlimGPT statistics: an empty calibration window");
    T = std::max(T, win.size());
  }
  require(static_cast<int>(T) <= c.context_length,
          "SlimGPT statistics: windows of {} tokens, the model's context is {}", T,
          c.context_length);
  const auto L = static_cast<size_t>(c.n_layer);
  if (want.empty()) {
    want.resize(L);
    std::iota(want.begin(), want.end(), 0);
  }
  std::vector<char> wanted(L, 0);
  for (int l : want) wanted[static_cast<size_t>(l)] = 1;
  const int q = c.q_dim(), f = c.d_ff;
  SlimGptGrams g;
  g.n_layer = c.n_layer;
  g.q_dim = q;
  g.d_ff = f;
  g.o.resize(L);
  g.down.resize(L);
  for (int l : want) {
    g.o[static_cast<size_t>(l)].assign(static_cast<size_t>(q) * q, 0.0);
    g.down[static_cast<size_t>(l)].assign(static_cast<size_t>(f) * f, 0.0);
  }
  // The inputs of a few windows are buffered per layer and site, then every Gram matrix takes
  // them in one dsyrk, the matrices spread over the host threads (one BLAS thread each).
  constexpr std::int64_t kFlushRows = 512;
  std::vector<std::vector<double>> buf(2 * L);  // [layer·2 + site]: rows × width
  std::int64_t buffered = 0;
  auto flush = [&] {
    if (buffered == 0) return;
    SingleThreadedBlas single;
    parallel_tasks(static_cast<int>(2 * want.size()), [&](int i) {
      const auto l = static_cast<size_t>(want[static_cast<size_t>(i / 2)]);
      auto& m = i % 2 == 0 ? g.o[l] : g.down[l];
      const int d = i % 2 == 0 ? q : f;
      const auto& x = buf[l * 2 + static_cast<size_t>(i % 2)];
      const int n = static_cast<int>(x.size() / static_cast<size_t>(d));
      cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, n, 1.0, x.data(), d, 1.0, m.data(), d);
    });
    for (auto& x : buf) x.clear();
    g.tokens += buffered;
    buffered = 0;
  };
  Engine<E> eng(w, 1, static_cast<int>(T));
  std::vector<float> host;
  eng.set_observer([&](int layer, Site site, const CMat<E>& v) {
    if ((site != Site::O && site != Site::Down) || !wanted[static_cast<size_t>(layer)]) return;
    host.resize(v.extent(0) * v.extent(1));
    Kokkos::View<float**, Layout, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
        host.data(), v.extent(0), v.extent(1));
    Kokkos::deep_copy(h, v);
    auto& x = buf[static_cast<size_t>(layer) * 2 + (site == Site::O ? 0 : 1)];
    x.insert(x.end(), host.begin(), host.end());
  });
  const int n = static_cast<int>(windows.size());
  for (int i = 0; i < n; ++i) {
    eng.forward_tail({windows[static_cast<size_t>(i)]}, 0, 1);
    buffered += static_cast<std::int64_t>(windows[static_cast<size_t>(i)].size());
    if (buffered >= kFlushRows) flush();
    if (progress) progress(i + 1, n);
  }
  flush();
  eng.set_observer({});
  require(g.tokens >= 1, "SlimGPT statistics: no calibration tokens reached the model");
  for (auto* set : {&g.o, &g.down})
    for (auto& m : *set) {
      const int d = static_cast<int>(std::lround(std::sqrt(static_cast<double>(m.size()))));
      for (int i = 0; i < d; ++i)
        for (int j = i; j < d; ++j) {
          double& u = m[static_cast<size_t>(i) * d + j];
          require(std::isfinite(u), "SlimGPT statistics: a non-finite activation");
          u /= static_cast<double>(g.tokens);
          m[static_cast<size_t>(j) * d + i] = u;
        }
    }
  return g;
}

void require_whole(const Config& c, bool rotated) {
  require(!c.pruned() && !c.structured() && !c.low_rank_kv() && !rotated,
          "SlimGPT needs the whole model ({} is {})", c.name,
          c.prune.method.empty() ? "rotated" : c.prune.method);
}

}  // namespace

template <class E>
SlimGptGrams slimgpt_grams(std::shared_ptr<const Weights<E>> w,
                           const std::vector<std::vector<int>>& windows,
                           const std::function<void(int, int)>& progress) {
  require_whole(w->cfg, w->rotated());
  return gather_grams(w, windows, {}, progress);
}

std::vector<double> slimgpt_layer_ratios(int n_layer, double ratio, SlimGptSchedule s) {
  require(n_layer >= 1, "SlimGPT layer ratios: {} layers", n_layer);
  require(std::isfinite(ratio) && ratio >= 0 && ratio < 1,
          "SlimGPT layer ratios: ratio {} outside [0, 1)", ratio);
  const auto L = static_cast<size_t>(n_layer);
  if (s == SlimGptSchedule::Uniform || ratio == 0) return std::vector<double>(L, ratio);
  std::vector<double> f(L);
  for (size_t l = 0; l < L; ++l) f[l] = std::log(static_cast<double>(l) + 2.0);
  auto ratios = [&](double scale) {
    std::vector<double> r(L);
    for (size_t l = 0; l < L; ++l) r[l] = std::min(1.0, scale * f[l]);
    return r;
  };
  auto mean = [&](double scale) {
    const std::vector<double> r = ratios(scale);
    return std::accumulate(r.begin(), r.end(), 0.0) / static_cast<double>(L);
  };
  // mean(min(1, s·f)) rises continuously from 0 (s = 0) to 1 (s = 1/f_0): bisect for the target
  double lo = 0, hi = 1.0 / f[0];
  for (int it = 0; it < 200 && hi - lo > 1e-17 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    (mean(mid) < ratio ? lo : hi) = mid;
  }
  return ratios(0.5 * (lo + hi));
}

// ---------------------------------------------------------------------------------------------
// Optimal Brain Surgeon on one matrix

namespace {

/// G with its dead inputs (diag 0) set to 1 on the diagonal, and λ · mean(diag) added; the
/// columns of W on dead inputs zeroed.
void prepare(std::vector<double>& w, int rows, int cols, std::vector<double>& h, double damp) {
  double mean = 0;
  for (int j = 0; j < cols; ++j) {
    double& d = h[static_cast<size_t>(j) * cols + j];
    if (d == 0) {
      d = 1;
      for (int r = 0; r < rows; ++r) w[static_cast<size_t>(r) * cols + j] = 0;
    }
    mean += d;
  }
  mean /= cols;
  for (int j = 0; j < cols; ++j) h[static_cast<size_t>(j) * cols + j] += damp * mean;
}

/// The inverse of the symmetric positive definite h[idx][idx] (dpotrf, dpotri), both triangles.
std::vector<double> inverse_of(const std::vector<double>& h, int cols,
                               const std::vector<int>& idx) {
  const int m = static_cast<int>(idx.size());
  std::vector<double> a(static_cast<size_t>(m) * m);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < m; ++j)
      a[static_cast<size_t>(i) * m + j] =
          h[static_cast<size_t>(idx[static_cast<size_t>(i)]) * cols + idx[static_cast<size_t>(j)]];
  const int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', m, a.data(), m);
  require(info == 0,
          "SlimGPT: the damped Hessian of {} inputs is not positive definite (minor {}); a larger "
          "damping λ or more calibration tokens",
          m, info);
  require(LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'L', m, a.data(), m) == 0,
          "SlimGPT: the Hessian of {} inputs could not be inverted", m);
  for (int i = 0; i < m; ++i)
    for (int j = i + 1; j < m; ++j)
      a[static_cast<size_t>(i) * m + j] = a[static_cast<size_t>(j) * m + i];
  return a;
}

/// tr(W_Q B⁻¹ W_Qᵀ) for B = hinv[pos][pos] (the positions `pos` of an m-wide inverse) and
/// W_Q = the columns `pos` of w ([rows][m]): ‖L⁻¹ W_Qᵀ‖² with B = L·Lᵀ.
double block_error(const std::vector<double>& w, int rows, const std::vector<double>& hinv, int m,
                   const std::vector<int>& pos) {
  const int q = static_cast<int>(pos.size());
  if (q == 1) {
    const auto p = static_cast<size_t>(pos[0]);
    double s = 0;
    for (int r = 0; r < rows; ++r) {
      const double x = w[static_cast<size_t>(r) * m + p];
      s += x * x;
    }
    return s / hinv[p * m + p];
  }
  std::vector<double> b(static_cast<size_t>(q) * q), z(static_cast<size_t>(q) * rows);
  for (int i = 0; i < q; ++i) {
    for (int j = 0; j < q; ++j)
      b[static_cast<size_t>(i) * q + j] =
          hinv[static_cast<size_t>(pos[static_cast<size_t>(i)]) * m + pos[static_cast<size_t>(j)]];
    for (int r = 0; r < rows; ++r)
      z[static_cast<size_t>(i) * rows + r] =
          w[static_cast<size_t>(r) * m + pos[static_cast<size_t>(i)]];
  }
  require(LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', q, b.data(), q) == 0,
          "SlimGPT: a block of the inverse Hessian is not positive definite");
  cblas_dtrsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, q, rows, 1.0,
              b.data(), q, z.data(), rows);
  double s = 0;
  for (double v : z) s += v * v;
  return s;
}

void check_shapes(const std::vector<double>& w, int rows, int cols, const std::vector<double>& g,
                  int unit) {
  require(rows >= 1 && cols >= 1 && w.size() == static_cast<size_t>(rows) * cols,
          "SlimGPT: a {}×{} matrix given {} values", rows, cols, w.size());
  require(g.size() == static_cast<size_t>(cols) * cols,
          "SlimGPT: a Hessian of {} values for {} inputs", g.size(), cols);
  require(unit >= 1 && cols % unit == 0, "SlimGPT: units of {} columns in {} columns", unit, cols);
  for (double x : w) require(std::isfinite(x), "SlimGPT: the weights hold a non-finite value");
}

}  // namespace

double obs_removal_error(const std::vector<double>& w0, int rows, int cols,
                         const std::vector<double>& gram, int unit, const std::vector<int>& units,
                         double damp) {
  check_shapes(w0, rows, cols, gram, unit);
  std::vector<double> w = w0, h = gram;
  prepare(w, rows, cols, h, damp);
  std::vector<int> all(static_cast<size_t>(cols));
  std::iota(all.begin(), all.end(), 0);
  const std::vector<double> hinv = inverse_of(h, cols, all);
  std::vector<int> pos;
  for (int u : units) {
    require(u >= 0 && u < cols / unit, "SlimGPT: unit {} of {}", u, cols / unit);
    for (int i = 0; i < unit; ++i) pos.push_back(u * unit + i);
  }
  return pos.empty() ? 0.0 : block_error(w, rows, hinv, cols, pos);
}

ObsPruned obs_prune_units(const std::vector<double>& w0, int rows, int cols,
                          const std::vector<double>& gram, int unit, int remove, int step,
                          double damp) {
  check_shapes(w0, rows, cols, gram, unit);
  const int n_units = cols / unit;
  require(remove >= 0 && remove < n_units, "SlimGPT: removing {} of {} units keeps none", remove,
          n_units);
  require(step >= 1, "SlimGPT: {} units per greedy step", step);
  require(std::isfinite(damp) && damp >= 0, "SlimGPT: damping {}", damp);
  ObsPruned out;
  out.kept.resize(static_cast<size_t>(n_units));
  std::iota(out.kept.begin(), out.kept.end(), 0);
  if (remove == 0) {  // nothing to compensate: the values as they are
    out.w = w0;
    return out;
  }
  std::vector<double> w = w0, h = gram;
  prepare(w, rows, cols, h, damp);
  // wk: the current (compensated) kept columns, [rows][m], in the order of out.kept
  std::vector<double> wk = w;
  while (static_cast<int>(out.removed.size()) < remove) {
    const int nk = static_cast<int>(out.kept.size()), m = nk * unit;
    std::vector<int> idx;
    for (int u : out.kept)
      for (int i = 0; i < unit; ++i) idx.push_back(u * unit + i);
    const std::vector<double> hinv = inverse_of(h, cols, idx);
    // every kept unit's error, cheapest first (ties to the lower unit)
    std::vector<double> err(static_cast<size_t>(nk));
    std::vector<int> pos(static_cast<size_t>(unit));
    for (int k = 0; k < nk; ++k) {
      for (int i = 0; i < unit; ++i) pos[static_cast<size_t>(i)] = k * unit + i;
      err[static_cast<size_t>(k)] = block_error(wk, rows, hinv, m, pos);
    }
    std::vector<int> order(static_cast<size_t>(nk));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return err[static_cast<size_t>(a)] < err[static_cast<size_t>(b)];
    });
    const int t = std::min(step, remove - static_cast<int>(out.removed.size()));
    std::vector<char> gone(static_cast<size_t>(nk), 0);
    for (int i = 0; i < t; ++i) gone[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
    std::vector<int> qp, rp;  // positions (in wk / hinv) of the removed and remaining columns
    std::vector<int> kept;
    for (int k = 0; k < nk; ++k) {
      for (int i = 0; i < unit; ++i)
        (gone[static_cast<size_t>(k)] ? qp : rp).push_back(k * unit + i);
      if (gone[static_cast<size_t>(k)])
        out.removed.push_back(out.kept[static_cast<size_t>(k)]);
      else
        kept.push_back(out.kept[static_cast<size_t>(k)]);
    }
    const int q = static_cast<int>(qp.size()), r = static_cast<int>(rp.size());
    // Eᵀ = B⁻¹ W_Qᵀ with B = H⁻¹_QQ; W_R ← W_R − E · H⁻¹_QR
    std::vector<double> b(static_cast<size_t>(q) * q), et(static_cast<size_t>(q) * rows),
        hqr(static_cast<size_t>(q) * r), wr(static_cast<size_t>(rows) * r);
    for (int i = 0; i < q; ++i) {
      const auto pi = static_cast<size_t>(qp[static_cast<size_t>(i)]);
      for (int j = 0; j < q; ++j)
        b[static_cast<size_t>(i) * q + j] = hinv[pi * m + qp[static_cast<size_t>(j)]];
      for (int j = 0; j < r; ++j)
        hqr[static_cast<size_t>(i) * r + j] = hinv[pi * m + rp[static_cast<size_t>(j)]];
      for (int row = 0; row < rows; ++row)
        et[static_cast<size_t>(i) * rows + row] = wk[static_cast<size_t>(row) * m + pi];
    }
    for (int row = 0; row < rows; ++row)
      for (int j = 0; j < r; ++j)
        wr[static_cast<size_t>(row) * r + j] =
            wk[static_cast<size_t>(row) * m + rp[static_cast<size_t>(j)]];
    const std::vector<double> wq = et;
    require(LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', q, b.data(), q) == 0,
            "SlimGPT: a block of the inverse Hessian is not positive definite");
    require(LAPACKE_dpotrs(LAPACK_ROW_MAJOR, 'L', q, rows, b.data(), q, et.data(), rows) == 0,
            "SlimGPT: the compensation solve failed");
    double e = 0;
    for (size_t i = 0; i < et.size(); ++i) e += et[i] * wq[i];
    out.step_error.push_back(e);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, r, q, -1.0, et.data(), rows,
                hqr.data(), r, 1.0, wr.data(), r);
    wk = std::move(wr);
    out.kept = std::move(kept);
  }
  out.w = std::move(wk);
  return out;
}

// ---------------------------------------------------------------------------------------------
// The model

namespace {

/// tr(W G Wᵀ) of w [rows][cols].
double energy(const std::vector<double>& w, int rows, int cols, const std::vector<double>& g) {
  std::vector<double> wg(static_cast<size_t>(rows) * cols);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, cols, cols, 1.0, w.data(), cols,
              g.data(), cols, 0.0, wg.data(), cols);
  double s = 0;
  for (size_t i = 0; i < wg.size(); ++i) s += wg[i] * w[i];
  return s;
}

template <class E>
Matrix<E> f32_matrix(const std::vector<float>& x, int rows, int cols, const std::string& name) {
  Matrix<E> m;
  m.dtype = DType::F32;
  m.rows = rows;
  m.cols = cols;
  m.f32 = decltype(m.f32)(Kokkos::view_alloc(name, Kokkos::WithoutInitializing), rows, cols);
  auto h = Kokkos::create_mirror_view(m.f32);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) h(r, c) = x[static_cast<size_t>(r) * cols + c];
  Kokkos::deep_copy(m.f32, h);
  return m;
}

}  // namespace

namespace {

/// One matrix of one layer to prune: W_o (which = 0) or W_down (1).
struct Job {
  int layer = 0, which = 0;
  std::vector<double> w;
  ObsPruned r;
  double energy = 0;
  std::string error;
};

template <class E>
std::vector<Job> layer_jobs(const Weights<E>& full, int l) {
  std::vector<Job> jobs(2);
  for (int which = 0; which < 2; ++which) {
    Job& j = jobs[static_cast<size_t>(which)];
    j.layer = l;
    j.which = which;
    const LayerWeights<E>& lw = full.layers[static_cast<size_t>(l)];
    j.w = detail::host_values(which == 0 ? lw.wo : lw.w_down);
  }
  return jobs;
}

/// The greedy on every job's matrix, one task (one BLAS thread) each.
void run_jobs(const Config& c, const std::vector<double>& ratios, const SlimGptGrams& g,
              const SlimGptOptions& o, std::vector<Job>& jobs) {
  const int d = c.d_model, D = c.head_dim, group = c.n_head / c.n_kv_head, U = c.n_kv_head,
            F = c.d_ff;
  SingleThreadedBlas single;
  parallel_tasks(static_cast<int>(jobs.size()), [&](int i) {
    Job& j = jobs[static_cast<size_t>(i)];
    const auto l = static_cast<size_t>(j.layer);
    const double r = ratios[l];
    try {
      if (j.which == 0) {
        const int remove = std::min(static_cast<int>(std::lround(r * U)), U - 1);
        j.r = obs_prune_units(j.w, d, c.q_dim(), g.o[l], group * D, remove, 1, o.damp);
        j.energy = energy(j.w, d, c.q_dim(), g.o[l]);
      } else {
        const int remove = std::min(static_cast<int>(std::lround(r * F)), F - 1);
        j.r = obs_prune_units(j.w, d, F, g.down[l], 1, remove, o.ffn_group, o.damp);
        j.energy = energy(j.w, d, F, g.down[l]);
      }
    } catch (const std::exception& e) {
      j.error = fmt::format("layer {} {}: {}", j.layer, j.which == 0 ? "W_o" : "W_down", e.what());
    }
  });
  for (const Job& j : jobs) require(j.error.empty(), "{}", j.error);
}

/// A result for every layer of `c`: whole structure, no values yet.
SlimGptResult empty_result(const Config& c, const SlimGptOptions& o) {
  const auto L = static_cast<size_t>(c.n_layer);
  SlimGptResult res;
  res.layer_ratio = slimgpt_layer_ratios(c.n_layer, o.ratio, o.schedule);
  res.plan = c;
  LayerStructure whole;
  whole.q_heads.resize(static_cast<size_t>(c.n_head));
  std::iota(whole.q_heads.begin(), whole.q_heads.end(), 0);
  whole.ffn.resize(static_cast<size_t>(c.d_ff));
  std::iota(whole.ffn.begin(), whole.ffn.end(), 0);
  res.plan.structure.assign(L, whole);
  res.o_error.assign(L, 0.0);
  res.down_error.assign(L, 0.0);
  res.o_energy.assign(L, 0.0);
  res.down_energy.assign(L, 0.0);
  res.values.o.resize(L);
  res.values.down.resize(L);
  return res;
}

/// The jobs' kept units, values and errors into their layers of `res`.
void collect(const Config& c, std::vector<Job>& jobs, SlimGptResult& res) {
  const int group = c.n_head / c.n_kv_head;
  for (Job& j : jobs) {
    const auto l = static_cast<size_t>(j.layer);
    LayerStructure& st = res.plan.structure[l];
    const double e = std::accumulate(j.r.step_error.begin(), j.r.step_error.end(), 0.0);
    std::vector<float> v(j.r.w.begin(), j.r.w.end());
    if (j.which == 0) {
      st.q_heads.clear();
      for (int u : j.r.kept)
        for (int h = 0; h < group; ++h) st.q_heads.push_back(u * group + h);
      res.o_error[l] = e;
      res.o_energy[l] = j.energy;
      res.values.o[l] = std::move(v);
    } else {
      st.ffn = j.r.kept;
      res.down_error[l] = e;
      res.down_energy[l] = j.energy;
      res.values.down[l] = std::move(v);
    }
    j.w.clear();
    j.r.w.clear();
  }
}

void finish(SlimGptResult& res, const SlimGptOptions& o) {
  Config& p = res.plan;
  p.prune = PruneRecord{};
  p.prune.method = "slimgpt";
  p.prune.retain = 1.0 - o.ratio;
  p.prune.source_fingerprint = o.source_fingerprint;
  p.prune.calibration = o.calibration;
  p.prune.recipe = o.recipe();
  p.validate();
}

}  // namespace

template <class E>
SlimGptResult slimgpt_prune(const Weights<E>& full, const SlimGptGrams& g,
                            const SlimGptOptions& o) {
  const Config& c = full.cfg;
  o.validate();
  require(!o.sequential,
          "slimgpt_prune prunes on one-pass statistics; the sequential form is "
          "slimgpt_prune_sequential");
  require_whole(c, full.rotated());
  const auto L = static_cast<size_t>(c.n_layer);
  require(g.n_layer == c.n_layer && g.q_dim == c.q_dim() && g.d_ff == c.d_ff && g.o.size() == L &&
              g.down.size() == L,
          "SlimGPT statistics of {} layers (W_o inputs {}, W_down inputs {}) do not fit the model "
          "({} layers, {}, {})",
          g.n_layer, g.q_dim, g.d_ff, c.n_layer, c.q_dim(), c.d_ff);
  require(g.tokens >= 1, "SlimGPT statistics over no tokens");
  SlimGptResult res = empty_result(c, o);
  std::vector<Job> jobs;
  for (int l = 0; l < c.n_layer; ++l)
    for (Job& j : layer_jobs(full, l)) jobs.push_back(std::move(j));
  run_jobs(c, res.layer_ratio, g, o, jobs);
  collect(c, jobs, res);
  finish(res, o);
  return res;
}

template <class E>
SlimGptResult slimgpt_prune_sequential(std::shared_ptr<const Weights<E>> full,
                                       const std::vector<std::vector<int>>& windows,
                                       const SlimGptOptions& o,
                                       const std::function<void(int, int)>& progress) {
  const Config& c = full->cfg;
  o.validate();
  require(o.sequential, "slimgpt_prune_sequential: the options ask for one-pass statistics");
  require_whole(c, full->rotated());
  SlimGptResult res = empty_result(c, o);
  for (int l = 0; l < c.n_layer; ++l) {
    // the model up to layer l, the layers below it pruned and compensated
    Weights<E> upto = *full;  // shares every view
    upto.cfg.n_layer = l + 1;
    upto.layers.resize(static_cast<size_t>(l) + 1);
    std::shared_ptr<const Weights<E>> model;
    if (l == 0) {
      model = std::make_shared<const Weights<E>>(std::move(upto));
    } else {
      SlimGptResult part;
      part.plan = upto.cfg;
      part.plan.structure.assign(res.plan.structure.begin(), res.plan.structure.begin() + l + 1);
      part.values.o.assign(res.values.o.begin(), res.values.o.begin() + l + 1);
      part.values.down.assign(res.values.down.begin(), res.values.down.begin() + l + 1);
      model = fuse_slimgpt(upto, part);
    }
    const SlimGptGrams g = gather_grams(model, windows, {l}, {});
    std::vector<Job> jobs = layer_jobs(*full, l);
    run_jobs(c, res.layer_ratio, g, o, jobs);
    collect(c, jobs, res);
    if (progress) progress(l + 1, c.n_layer);
  }
  finish(res, o);
  return res;
}

OutputBiases zero_biases(const Config& c) {
  OutputBiases b;
  b.o.assign(static_cast<size_t>(c.n_layer), std::vector<float>(static_cast<size_t>(c.d_model)));
  b.down = b.o;
  return b;
}

template <class E>
std::shared_ptr<Weights<E>> fuse_slimgpt(const Weights<E>& full, const SlimGptResult& r) {
  const Config& p = r.plan;
  auto out = fuse_structured(full, p, zero_biases(p));
  const int d = p.d_model, D = p.head_dim;
  for (int l = 0; l < p.n_layer; ++l) {
    const auto ls = static_cast<size_t>(l);
    const int qc = static_cast<int>(p.structure[ls].q_heads.size()) * D,
              fc = static_cast<int>(p.structure[ls].ffn.size());
    require((qc == p.q_dim() || r.values.o[ls].size() == static_cast<size_t>(d) * qc) &&
                (fc == p.d_ff || r.values.down[ls].size() == static_cast<size_t>(d) * fc),
            "fuse_slimgpt: layer {} values do not fit its structure", l);
    // a matrix that lost nothing keeps its values (obs_prune_units returns them as they are)
    LayerWeights<E>& dst = out->layers[ls];
    if (qc < p.q_dim())
      dst.wo =
          f32_matrix<E>(r.values.o[ls], d, qc, fmt::format("blk.{}.attn_output.weight.slim", l));
    if (fc < p.d_ff)
      dst.w_down =
          f32_matrix<E>(r.values.down[ls], d, fc, fmt::format("blk.{}.ffn_down.weight.slim", l));
  }
  return out;
}

nlohmann::json slimgpt_layers_json(const SlimGptResult& r) {
  nlohmann::json ls = nlohmann::json::array();
  const Config& p = r.plan;
  auto rel = [](double e, double t) { return t > 0 ? e / t : 0.0; };
  for (int l = 0; l < p.n_layer; ++l) {
    const auto i = static_cast<size_t>(l);
    ls.push_back({{"ratio", r.layer_ratio[i]},
                  {"q_heads", p.n_head_at(l)},
                  {"kv_heads", p.n_kv_head_at(l)},
                  {"d_ff", p.d_ff_at(l)},
                  {"o_rel_error", rel(r.o_error[i], r.o_energy[i])},
                  {"down_rel_error", rel(r.down_error[i], r.down_energy[i])}});
  }
  return ls;
}

#define SPARSIM_INSTANTIATE_SLIMGPT(E)                                                           \
  template SlimGptGrams slimgpt_grams<E>(std::shared_ptr<const Weights<E>>,                      \
                                         const std::vector<std::vector<int>>&,                   \
                                         const std::function<void(int, int)>&);                  \
  template SlimGptResult slimgpt_prune<E>(const Weights<E>&, const SlimGptGrams&,                \
                                          const SlimGptOptions&);                                \
  template std::shared_ptr<Weights<E>> fuse_slimgpt<E>(const Weights<E>&, const SlimGptResult&); \
  template SlimGptResult slimgpt_prune_sequential<E>(                                            \
      std::shared_ptr<const Weights<E>>, const std::vector<std::vector<int>>&,                   \
      const SlimGptOptions&, const std::function<void(int, int)>&);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_SLIMGPT)

}  // namespace sparsim::pruning
