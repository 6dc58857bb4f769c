// SlimGPT: the compensated layer against the least-squares optimum for the same kept columns, the
// greedy against brute force (its first step always; the whole search where the units are
// independent and greedy is optimal), the layer ratios, ratio 0 giving the dense model bitwise,
// the pruned GGUF round trip, the command end to end (thread-count independent output) and its
// bad input.
#include "backends.hpp"
#include "cli_fixture.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "model/loader.hpp"
#include "transforms/slimgpt.hpp"

#include <lapacke.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>

namespace sparsim::test {
namespace {

using pruning::ObsPruned;
using pruning::SlimGptOptions;
using pruning::SlimGptSchedule;

std::vector<double> random_matrix(int m, int n, std::uint64_t seed) {
  SynthRng r(seed);
  std::vector<double> x(static_cast<std::size_t>(m) * n);
  for (double& v : x) v = r.normal();
  return x;
}

/// G = XᵀX / n of X [n][d].
std::vector<double> gram_of(const std::vector<double>& x, int n, int d) {
  std::vector<double> g(static_cast<std::size_t>(d) * d, 0.0);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j)
        g[static_cast<std::size_t>(i) * d + j] +=
            x[static_cast<std::size_t>(t) * d + i] * x[static_cast<std::size_t>(t) * d + j] / n;
  return g;
}

/// The columns of the kept units, ascending.
std::vector<int> kept_columns(const std::vector<int>& kept_units, int unit) {
  std::vector<int> k;
  for (int u : kept_units)
    for (int i = 0; i < unit; ++i) k.push_back(u * unit + i);
  return k;
}

/// argmin over W' ([rows][K]) of ‖X_K W'ᵀ − X Wᵀ‖_F, by LAPACK's QR least squares (dgels).
std::vector<double> least_squares(const std::vector<double>& w, int rows, int cols,
                                  const std::vector<double>& x, int n,
                                  const std::vector<int>& keep) {
  const int k = static_cast<int>(keep.size());
  std::vector<double> a(static_cast<std::size_t>(n) * k), b(static_cast<std::size_t>(n) * rows);
  for (int t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j)
      a[static_cast<std::size_t>(t) * k + j] = x[static_cast<std::size_t>(t) * cols + keep[j]];
    for (int r = 0; r < rows; ++r) {
      double s = 0;
      for (int c = 0; c < cols; ++c)
        s += x[static_cast<std::size_t>(t) * cols + c] * w[static_cast<std::size_t>(r) * cols + c];
      b[static_cast<std::size_t>(t) * rows + r] = s;
    }
  }
  EXPECT_EQ(LAPACKE_dgels(LAPACK_ROW_MAJOR, 'N', n, k, rows, a.data(), k, b.data(), rows), 0);
  std::vector<double> out(static_cast<std::size_t>(rows) * k);  // W'[r][j] = solution[j][r]
  for (int j = 0; j < k; ++j)
    for (int r = 0; r < rows; ++r)
      out[static_cast<std::size_t>(r) * k + j] = b[static_cast<std::size_t>(j) * rows + r];
  return out;
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0, s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    e += (a[i] - b[i]) * (a[i] - b[i]);
    s += b[i] * b[i];
  }
  return std::sqrt(e / s);
}

/// ‖(W' − W) X‖² / n with W' zero outside the kept columns.
double output_error(const std::vector<double>& w, const std::vector<double>& wk, int rows, int cols,
                    const std::vector<int>& keep, const std::vector<double>& x, int n) {
  std::vector<double> full(static_cast<std::size_t>(rows) * cols, 0.0);
  for (int r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < keep.size(); ++j)
      full[static_cast<std::size_t>(r) * cols + keep[j]] = wk[r * keep.size() + j];
  double e = 0;
  for (int t = 0; t < n; ++t)
    for (int r = 0; r < rows; ++r) {
      double s = 0;
      for (int c = 0; c < cols; ++c)
        s += (full[static_cast<std::size_t>(r) * cols + c] -
              w[static_cast<std::size_t>(r) * cols + c]) *
             x[static_cast<std::size_t>(t) * cols + c];
      e += s * s;
    }
  return e / n;
}

// With no damping, the compensated kept columns are the least-squares fit of the dense layer's
// outputs from the kept inputs; the greedy's step errors add up to the output error left.
TEST(SlimGpt, CompensationIsTheLeastSquaresOptimum) {
  struct Case {
    int rows, cols, unit, remove, step;
  };
  for (const Case& k : {Case{7, 12, 3, 2, 1}, Case{5, 16, 4, 3, 1}, Case{6, 13, 1, 6, 1},
                        Case{6, 13, 1, 6, 4}, Case{4, 20, 1, 11, 64}}) {
    const int n = 3 * k.cols + 5;
    const std::vector<double> w = random_matrix(k.rows, k.cols, 11 + k.cols);
    std::vector<double> x = random_matrix(n, k.cols, 23 + k.remove);
    for (int t = 0; t < n; ++t)  // correlated inputs, so the compensation matters
      for (int c = 1; c < k.cols; ++c)
        x[static_cast<std::size_t>(t) * k.cols + c] +=
            0.7 * x[static_cast<std::size_t>(t) * k.cols + c - 1];
    const std::vector<double> g = gram_of(x, n, k.cols);
    const ObsPruned r = pruning::obs_prune_units(w, k.rows, k.cols, g, k.unit, k.remove, k.step, 0);
    ASSERT_EQ(static_cast<int>(r.removed.size()), k.remove);
    ASSERT_EQ(static_cast<int>(r.kept.size()), k.cols / k.unit - k.remove);
    const std::vector<int> keep = kept_columns(r.kept, k.unit);
    const std::vector<double> ls = least_squares(w, k.rows, k.cols, x, n, keep);
    EXPECT_LE(rel_diff(r.w, ls), 1e-6) << k.cols << " " << k.unit << " " << k.step;
    const double total = std::accumulate(r.step_error.begin(), r.step_error.end(), 0.0);
    const double direct = output_error(w, r.w, k.rows, k.cols, keep, x, n);
    EXPECT_NEAR(total, direct, 1e-9 * direct);
    EXPECT_NEAR(pruning::obs_removal_error(w, k.rows, k.cols, g, k.unit, r.removed, 0), direct,
                1e-9 * direct);
  }
}

// With damping λ the compensation is the optimum of the damped problem: W' = W H_{:,K} H_KK⁻¹.
TEST(SlimGpt, DampedCompensationSolvesTheDampedProblem) {
  const int rows = 5, cols = 10, n = 40;
  const std::vector<double> w = random_matrix(rows, cols, 3), x = random_matrix(n, cols, 4);
  const std::vector<double> g = gram_of(x, n, cols);
  const double lambda = 0.05;
  const ObsPruned r = pruning::obs_prune_units(w, rows, cols, g, 2, 2, 1, lambda);
  std::vector<double> h = g;
  double mean = 0;
  for (int i = 0; i < cols; ++i) mean += g[static_cast<std::size_t>(i) * cols + i] / cols;
  for (int i = 0; i < cols; ++i) h[static_cast<std::size_t>(i) * cols + i] += lambda * mean;
  const std::vector<int> keep = kept_columns(r.kept, 2);
  const int k = static_cast<int>(keep.size());
  // solve H_KK Y = H_K,: Wᵀ, W' = Yᵀ
  std::vector<double> hkk(static_cast<std::size_t>(k) * k), rhs(static_cast<std::size_t>(k) * rows);
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < k; ++j)
      hkk[static_cast<std::size_t>(i) * k + j] =
          h[static_cast<std::size_t>(keep[i]) * cols + keep[j]];
    for (int rr = 0; rr < rows; ++rr) {
      double s = 0;
      for (int c = 0; c < cols; ++c)
        s += h[static_cast<std::size_t>(keep[i]) * cols + c] *
             w[static_cast<std::size_t>(rr) * cols + c];
      rhs[static_cast<std::size_t>(i) * rows + rr] = s;
    }
  }
  ASSERT_EQ(LAPACKE_dposv(LAPACK_ROW_MAJOR, 'L', k, rows, hkk.data(), k, rhs.data(), rows), 0);
  std::vector<double> want(static_cast<std::size_t>(rows) * k);
  for (int i = 0; i < k; ++i)
    for (int rr = 0; rr < rows; ++rr)
      want[static_cast<std::size_t>(rr) * k + i] = rhs[static_cast<std::size_t>(i) * rows + rr];
  EXPECT_LE(rel_diff(r.w, want), 1e-9);
}

/// Every subset of `size` units of n, as index lists.
std::vector<std::vector<int>> subsets(int n, int size) {
  std::vector<std::vector<int>> out;
  for (int mask = 0; mask < (1 << n); ++mask) {
    if (__builtin_popcount(static_cast<unsigned>(mask)) != size) continue;
    std::vector<int> s;
    for (int i = 0; i < n; ++i)
      if (mask & (1 << i)) s.push_back(i);
    out.push_back(s);
  }
  return out;
}

// The greedy's first step removes the unit whose OBS error is the smallest of all single units
// (brute force over the units), in general correlated layers.
TEST(SlimGpt, FirstGreedyStepIsTheBestSingleUnit) {
  for (int seed = 0; seed < 12; ++seed)
    for (int unit : {1, 2, 4}) {
      const int cols = 6 * unit, rows = 5, n = 3 * cols;
      const std::vector<double> w = random_matrix(rows, cols, 100 + seed);
      std::vector<double> x = random_matrix(n, cols, 200 + seed);
      for (int t = 0; t < n; ++t)
        for (int c = 1; c < cols; ++c)
          x[static_cast<std::size_t>(t) * cols + c] +=
              0.5 * x[static_cast<std::size_t>(t) * cols + c - 1];
      const std::vector<double> g = gram_of(x, n, cols);
      const ObsPruned r = pruning::obs_prune_units(w, rows, cols, g, unit, 3, 1, 0.01);
      int best = -1;
      double best_e = 0;
      for (int u = 0; u < cols / unit; ++u) {
        const double e = pruning::obs_removal_error(w, rows, cols, g, unit, {u}, 0.01);
        if (best < 0 || e < best_e) {
          best = u;
          best_e = e;
        }
      }
      EXPECT_EQ(r.removed[0], best) << seed << " " << unit;
      EXPECT_NEAR(r.step_error[0], best_e, 1e-9 * best_e);
      // the whole search never beats the best subset of its size
      double brute = -1;
      for (const auto& s : subsets(cols / unit, 3)) {
        const double e = pruning::obs_removal_error(w, rows, cols, g, unit, s, 0.01);
        if (brute < 0 || e < brute) brute = e;
      }
      const double total = std::accumulate(r.step_error.begin(), r.step_error.end(), 0.0);
      EXPECT_GE(total, brute * (1 - 1e-9));
    }
}

// When the units' inputs are uncorrelated with each other (G block-diagonal over units), the
// errors add up and removing one unit changes no other's: the greedy, one unit per step or all
// in one batch, finds the best subset of every size (brute force).
TEST(SlimGpt, GreedyEqualsBruteForceForIndependentUnits) {
  for (int seed = 0; seed < 6; ++seed)
    for (int unit : {1, 3}) {
      const int nu = 7, cols = nu * unit, rows = 4, n = 5 * cols;
      const std::vector<double> w = random_matrix(rows, cols, 300 + seed);
      std::vector<double> x = random_matrix(n, cols, 400 + seed);
      std::vector<double> g = gram_of(x, n, cols);
      for (int i = 0; i < cols; ++i)  // keep the blocks of the units on the diagonal only
        for (int j = 0; j < cols; ++j)
          if (i / unit != j / unit) g[static_cast<std::size_t>(i) * cols + j] = 0;
      for (int k = 1; k < nu; ++k) {
        double brute = -1;
        std::vector<int> best;
        for (const auto& s : subsets(nu, k)) {
          const double e = pruning::obs_removal_error(w, rows, cols, g, unit, s, 0);
          if (brute < 0 || e < brute) {
            brute = e;
            best = s;
          }
        }
        for (int step : {1, k}) {
          ObsPruned r = pruning::obs_prune_units(w, rows, cols, g, unit, k, step, 0);
          std::sort(r.removed.begin(), r.removed.end());
          EXPECT_EQ(r.removed, best) << seed << " unit " << unit << " k " << k << " step " << step;
          const double total = std::accumulate(r.step_error.begin(), r.step_error.end(), 0.0);
          EXPECT_NEAR(total, brute, 1e-9 * brute);
        }
      }
    }
}

TEST(SlimGpt, NothingRemovedKeepsTheValuesAndDeadInputsAreZeroed) {
  const int rows = 3, cols = 8;
  const std::vector<double> w = random_matrix(rows, cols, 5);
  std::vector<double> x = random_matrix(30, cols, 6);
  for (int t = 0; t < 30; ++t) x[static_cast<std::size_t>(t) * cols + 5] = 0;  // a dead input
  const std::vector<double> g = gram_of(x, 30, cols);
  const ObsPruned none = pruning::obs_prune_units(w, rows, cols, g, 2, 0, 1, 0.01);
  EXPECT_EQ(none.w, w);
  EXPECT_EQ(none.kept, (std::vector<int>{0, 1, 2, 3}));
  const ObsPruned one = pruning::obs_prune_units(w, rows, cols, g, 1, 1, 1, 0.01);
  EXPECT_EQ(one.removed, std::vector<int>{5});  // free to remove: its error is 0
  EXPECT_EQ(one.step_error[0], 0.0);
}

TEST(SlimGpt, LayerRatiosRiseWithDepthAndAverageTheTarget) {
  for (int L : {2, 5, 30})
    for (double p : {0.0, 0.1, 0.2, 0.5, 0.8, 0.95}) {
      const auto r = pruning::slimgpt_layer_ratios(L, p, SlimGptSchedule::Log);
      ASSERT_EQ(static_cast<int>(r.size()), L);
      EXPECT_NEAR(std::accumulate(r.begin(), r.end(), 0.0) / L, p, 1e-12) << L << " " << p;
      for (int l = 0; l < L; ++l) {
        EXPECT_GE(r[l], 0.0);
        EXPECT_LE(r[l], 1.0);
        if (l > 0) {
          EXPECT_GE(r[l], r[l - 1]);
        }
      }
      if (p > 0 && p < 0.5) {  // unclamped: r_l ∝ ln(l + 2)
        EXPECT_NEAR(r[L - 1] / r[0], std::log(L + 1.0) / std::log(2.0), 1e-9);
      }
      const auto u = pruning::slimgpt_layer_ratios(L, p, SlimGptSchedule::Uniform);
      EXPECT_EQ(u, std::vector<double>(static_cast<std::size_t>(L), p));
    }
}

TEST(SlimGpt, BadOptionsAreNamed) {
  for (double ratio : {1.0, -0.2, 1.5, std::nan("")}) {
    SlimGptOptions o;
    o.ratio = ratio;
    try {
      o.validate();
      ADD_FAILURE() << ratio;
    } catch (const OptionError& e) {  // the command line says "--ratio must be in [0, 1)"
      EXPECT_EQ(e.key(), "slimgpt.ratio");
      EXPECT_NE(std::string(e.what()).find("SlimGPT's pruning ratio must be in [0, 1)"),
                std::string::npos)
          << e.what();
    }
  }
  SlimGptOptions o;
  o.ratio = 0;
  o.validate();
  o.damp = -1;
  EXPECT_THROW(o.validate(), Error);
  o.damp = 0.01;
  o.ffn_group = 0;
  EXPECT_THROW(o.validate(), Error);
  EXPECT_THROW(pruning::parse_slimgpt_schedule("linear"), Error);
  // a singular Hessian without damping is named
  const std::vector<double> w = random_matrix(2, 4, 1);
  std::vector<double> g(16, 0.0);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) g[static_cast<std::size_t>(i) * 4 + j] = 1.0;  // rank 1
  try {
    pruning::obs_prune_units(w, 2, 4, g, 1, 1, 1, 0);
    ADD_FAILURE() << "singular";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not positive definite"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// The model

std::vector<std::vector<int>> windows(const Config& c, int n, int T, int seed) {
  std::vector<std::vector<int>> w(static_cast<std::size_t>(n));
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < T; ++t) w[s].push_back(3 + (t * 37 + s * 91 + seed * 13) % (c.vocab - 3));
  return w;
}

SlimGptOptions options(double ratio) {
  SlimGptOptions o;
  o.ratio = ratio;
  o.ffn_group = 8;
  o.source_fingerprint = "0123456789abcdef";
  o.calibration = "test windows";
  return o;
}

template <class E>
class SlimGptModel : public ::testing::Test {};
TYPED_TEST_SUITE(SlimGptModel, Backends, BackendName);

// The Gram matrices are the dense model's own W_o / W_down inputs' second moments.
TYPED_TEST(SlimGptModel, GramsAreTheInputsSecondMoments) {
  using E = TypeParam;
  TempDir dir;
  std::shared_ptr<const Weights<E>> w =
      load_model<E>(make_model(dir, "m.gguf", tiny_spec(61)), LoadOptions{});
  const Config& c = w->cfg;
  const auto wins = windows(c, 2, 12, 1);
  const pruning::SlimGptGrams g = pruning::slimgpt_grams<E>(w, wins);
  EXPECT_EQ(g.tokens, 24);
  std::vector<std::vector<double>> o(c.n_layer), down(c.n_layer);
  Engine<E> eng(w, 1, 12);
  eng.set_observer([&](int layer, Site site, const CMat<E>& x) {
    if (site != Site::O && site != Site::Down) return;
    const std::vector<float> h = to_host(x);
    auto& dst = site == Site::O ? o[layer] : down[layer];
    dst.insert(dst.end(), h.begin(), h.end());
  });
  for (const auto& win : wins) eng.forward_tail({win}, 0, 1);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::vector<double> xo(o[l].begin(), o[l].end()), xd(down[l].begin(), down[l].end());
    EXPECT_LE(rel_diff(g.o[l], gram_of(xo, 24, c.q_dim())), 1e-12);
    EXPECT_LE(rel_diff(g.down[l], gram_of(xd, 24, c.d_ff)), 1e-12);
  }
}

// Ratio 0 removes nothing: the structured model (in memory and written) gives the dense
// model's logits bitwise.
TYPED_TEST(SlimGptModel, RatioZeroIsTheDenseModelBitwise) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(62));
  std::shared_ptr<const Weights<E>> w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const auto g = pruning::slimgpt_grams<E>(w, windows(c, 2, 16, 2));
  const pruning::SlimGptResult r = pruning::slimgpt_prune(*w, g, options(0));
  ASSERT_TRUE(r.plan.structured());
  EXPECT_EQ(r.plan.n_head_at(0), c.n_head);
  EXPECT_EQ(r.plan.d_ff_at(1), c.d_ff);
  const std::string out = dir.file("slim0.gguf");
  const pruning::OutputBiases b = pruning::zero_biases(r.plan);
  const pruning::WrittenModel wm = pruning::write_pruned_gguf(path, r.plan, out, {}, &b, &r.values);
  EXPECT_TRUE(wm.changed.empty());
  std::shared_ptr<const Weights<E>> mem = pruning::fuse_slimgpt(*w, r);
  std::shared_ptr<const Weights<E>> file = load_model<E>(out, LoadOptions{});
  std::vector<std::vector<int>> pr(2);
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < 12; ++t) pr[s].push_back(3 + (t * 41 + s * 87) % (c.vocab - 3));
  Engine<E> dense(w, 2, 32);
  const std::vector<float> want = to_host(dense.forward(pr, 0, true));
  for (const auto& m : {mem, file}) {
    Engine<E> e(m, 2, 32);
    EXPECT_EQ(to_host(e.forward(pr, 0, true)), want);
  }
}

// A pruned model: the structure follows the layer ratios, its layers hold the compensated
// values, and it reads back from its GGUF bitwise.
TYPED_TEST(SlimGptModel, PrunedModelRoundTrip) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(63));
  std::shared_ptr<const Weights<E>> w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const auto g = pruning::slimgpt_grams<E>(w, windows(c, 3, 48, 3));
  const pruning::SlimGptResult r = pruning::slimgpt_prune(*w, g, options(0.4));
  const Config& p = r.plan;
  EXPECT_EQ(p.prune.method, "slimgpt");
  EXPECT_DOUBLE_EQ(p.prune.retain, 0.6);
  for (int l = 0; l < c.n_layer; ++l) {
    const double rl = r.layer_ratio[l];
    EXPECT_EQ(
        p.n_kv_head_at(l),
        c.n_kv_head - std::min(static_cast<int>(std::lround(rl * c.n_kv_head)), c.n_kv_head - 1));
    EXPECT_EQ(p.d_ff_at(l), c.d_ff - static_cast<int>(std::lround(rl * c.d_ff)));
    EXPECT_GT(r.down_error[l], 0.0);
    EXPECT_LT(r.down_error[l], r.down_energy[l]);
  }
  EXPECT_LT(r.layer_ratio[0], r.layer_ratio[1]);
  const std::string out = dir.file("slim.gguf");
  const pruning::OutputBiases b = pruning::zero_biases(p);
  pruning::write_pruned_gguf(path, p, out, {}, &b, &r.values);
  auto back = load_model<E>(out, LoadOptions{});
  ASSERT_TRUE(back->cfg.structured());
  EXPECT_EQ(back->cfg.prune.method, "slimgpt");
  EXPECT_EQ(back->cfg.prune.recipe, p.prune.recipe);
  for (int l = 0; l < c.n_layer; ++l) {
    EXPECT_EQ(back->cfg.structure[l].q_heads, p.structure[l].q_heads);
    EXPECT_EQ(back->cfg.structure[l].ffn, p.structure[l].ffn);
    EXPECT_EQ(to_host(back->layers[l].w_down.f32), r.values.down[l]);
  }
  auto mem = pruning::fuse_slimgpt(*w, r);
  std::vector<int> tok = {3, 8, 13, 21, 34, 55, 89};
  Engine<E> e1(mem, 1, 16), e2(back, 1, 16);
  EXPECT_EQ(to_host(e1.forward({tok}, 0, false)), to_host(e2.forward({tok}, 0, false)));
}

// Sequential statistics: layer 0 sees the dense model's inputs (the same result as one-pass
// statistics, bitwise); layer 1 is the greedy on the Hessian of the inputs the pruned and
// compensated layer 0 gives.
TYPED_TEST(SlimGptModel, SequentialPrunesOnThePrunedLayersInputs) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(65));
  std::shared_ptr<const Weights<E>> w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const auto wins = windows(c, 3, 40, 6);
  SlimGptOptions o = options(0.4);
  const pruning::SlimGptResult dense =
      pruning::slimgpt_prune(*w, pruning::slimgpt_grams<E>(w, wins), o);
  o.sequential = true;
  const pruning::SlimGptResult seq = pruning::slimgpt_prune_sequential<E>(w, wins, o);
  EXPECT_NE(seq.plan.prune.recipe.find("hessian=sequential"), std::string::npos);
  EXPECT_EQ(seq.plan.structure[0].q_heads, dense.plan.structure[0].q_heads);
  EXPECT_EQ(seq.plan.structure[0].ffn, dense.plan.structure[0].ffn);
  EXPECT_EQ(seq.values.o[0], dense.values.o[0]);
  EXPECT_EQ(seq.values.down[0], dense.values.down[0]);
  // layer 1 by hand: the model with layer 0 pruned, its layer-1 inputs, the greedy on them
  pruning::SlimGptResult part = seq;
  part.plan.structure[1] = dense.plan.structure[1];
  part.plan.structure[1].q_heads.resize(static_cast<std::size_t>(c.n_head));
  std::iota(part.plan.structure[1].q_heads.begin(), part.plan.structure[1].q_heads.end(), 0);
  part.plan.structure[1].ffn.resize(static_cast<std::size_t>(c.d_ff));
  std::iota(part.plan.structure[1].ffn.begin(), part.plan.structure[1].ffn.end(), 0);
  part.values.o[1].clear();
  part.values.down[1].clear();
  std::shared_ptr<const Weights<E>> m = pruning::fuse_slimgpt(*w, part);
  std::vector<double> xo, xd;
  Engine<E> eng(m, 1, 40);
  eng.set_observer([&](int layer, Site site, const CMat<E>& x) {
    if (layer != 1 || (site != Site::O && site != Site::Down)) return;
    const std::vector<float> h = to_host(x);
    (site == Site::O ? xo : xd).insert((site == Site::O ? xo : xd).end(), h.begin(), h.end());
  });
  for (const auto& win : wins) eng.forward_tail({win}, 0, 1);
  const int n = 3 * 40, group = c.n_head / c.n_kv_head;
  auto host = [](const Matrix<E>& mat) {
    const std::vector<float> v = to_host(mat.f32);
    return std::vector<double>(v.begin(), v.end());
  };
  const int uo = c.n_kv_head - seq.plan.n_kv_head_at(1), uf = c.d_ff - seq.plan.d_ff_at(1);
  const ObsPruned ro =
      pruning::obs_prune_units(host(w->layers[1].wo), c.d_model, c.q_dim(),
                               gram_of(xo, n, c.q_dim()), group * c.head_dim, uo, 1, o.damp);
  const ObsPruned rd = pruning::obs_prune_units(host(w->layers[1].w_down), c.d_model, c.d_ff,
                                                gram_of(xd, n, c.d_ff), 1, uf, o.ffn_group, o.damp);
  EXPECT_EQ(rd.kept, seq.plan.structure[1].ffn);
  std::vector<int> heads;
  for (int u : ro.kept)
    for (int h = 0; h < group; ++h) heads.push_back(u * group + h);
  EXPECT_EQ(heads, seq.plan.structure[1].q_heads);
  const std::vector<double> so(seq.values.o[1].begin(), seq.values.o[1].end()),
      sd(seq.values.down[1].begin(), seq.values.down[1].end());
  EXPECT_LE(rel_diff(so, ro.w), 1e-6);
  EXPECT_LE(rel_diff(sd, rd.w), 1e-6);
  // and the inputs differ from the dense model's: the layer-1 result is not the one-pass one
  EXPECT_NE(seq.values.down[1], dense.values.down[1]);
}

// ---------------------------------------------------------------------------------------------
// The command

class SlimGptCli : public TinyModelCli<SlimGptCli> {
 protected:
  static void SetUpTestSuite() { make_tiny({64, 5, 3000, 9}); }
  static std::string prune(const std::string& ratio, const std::string& out,
                           const std::string& extra = "") {
    return on_tiny("prune --method slimgpt",
                   "--ratio " + ratio + " --slimgpt-windows 4 --slimgpt-tokens 48 --out " + out,
                   extra);
  }
};

TEST_F(SlimGptCli, PrunesAndEvalRunsTheModel) {
  const std::string out = dir_->file("slim.gguf"), js = dir_->file("slim.json");
  const RunResult r = run_cmd(prune("0.3", out, "--json " + js + " --threads 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pruned slimgpt"), std::string::npos) << r.output;
  const auto j = read_json(js);
  EXPECT_EQ(j.at("method"), "slimgpt");
  EXPECT_DOUBLE_EQ(j.at("ratio").get<double>(), 0.3);
  EXPECT_EQ(j.at("schedule"), "log");
  EXPECT_LT(j.at("n_params").get<double>(), j.at("n_params_full").get<double>());
  EXPECT_EQ(j.at("calibration").at("tokens").get<int>(), 4 * 48);
  ASSERT_EQ(j.at("layers").size(), 2u);
  EXPECT_LT(j.at("layers")[0].at("ratio").get<double>(),
            j.at("layers")[1].at("ratio").get<double>());

  const std::string ejs = dir_->file("eval.json");
  const RunResult e = run_cmd(eval_of(out, "--json " + ejs));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_TRUE(std::isfinite(read_json(ejs).at("perplexity").get<double>()));
  const RunResult i = run_cmd(sparsim_bin() + " inspect " + out);
  ASSERT_EQ(i.exit_code, 0) << i.output;
  EXPECT_NE(i.output.find("structured slimgpt"), std::string::npos) << i.output;

  // one thread gives the same file
  const std::string out1 = dir_->file("slim1.gguf");
  const RunResult r1 = run_cmd(prune("0.3", out1, "--threads 1"));
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_TRUE(file_bytes(out1) == file_bytes(out));
}

TEST_F(SlimGptCli, SequentialHessiansWriteARunnableModel) {
  const std::string out = dir_->file("slimseq.gguf"), js = dir_->file("slimseq.json");
  const RunResult r = run_cmd(prune("0.3", out, "--slimgpt-hessian sequential --json " + js));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(js);
  EXPECT_EQ(j.at("hessian"), "sequential");
  EXPECT_NE(j.at("recipe").get<std::string>().find("hessian=sequential"), std::string::npos);
  const RunResult e = run_cmd(eval_of(out));
  EXPECT_EQ(e.exit_code, 0) << e.output;
}

TEST_F(SlimGptCli, BadInputIsNamedAndWritesNothing) {
  const std::string out = dir_->file("bad.gguf");
  const std::string tiny = write_short_corpus();
  const BadCases cases = {
      {prune("1", out), "--ratio must be in [0, 1)"},
      {prune("1.5", out), "--ratio must be in [0, 1)"},
      {prune("-0.1", out), "--ratio must be in [0, 1)"},
      {prune("0.3", out, "--retain 0.5"), "--retain does not apply to --method slimgpt"},
      {prune("0.3", out, "--slimgpt-damp -1"), "--slimgpt-damp"},
      {prune("0.3", out, "--slimgpt-schedule linear"), "not log or uniform"},
      {prune("0.3", out, "--slimgpt-hessian lazy"), "not dense or sequential"},
      {sparsim_bin() + " prune --method flap --model " + model_ + " --corpus " + corpus_ +
           " --ratio 0.3 --slimgpt-damp 0.1 --out " + out,
       "--slimgpt-damp applies to --method slimgpt only"},
      {sparsim_bin() + " prune --method slimgpt --model " + model_ + " --corpus " + tiny +
           " --ratio 0.3 --out " + out,
       "need"},
      {sparsim_bin() + " prune --method slimgpt --model " + model_ + " --corpus " +
           dir_->file("missing.txt") + " --ratio 0.3 --out " + out,
       "missing.txt"},
  };
  expect_each_fails(cases, {out});
}

}  // namespace
}  // namespace sparsim::test
