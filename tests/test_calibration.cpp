// Activation-sparsity calibration on the host: histogram thresholds (TEAL), the greedy
// per-projection allocation (paper 000, Appendix D), sensitivity budgets (Eq. 5) and the
// calibration file.
#include "core/error.hpp"
#include "helpers.hpp"
#include "io/hdf5.hpp"
#include "sparsity/calibration.hpp"
#include "sparsity/histogram.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using sparsim::Config;
using sparsim::Error;
using sparsim::kNumProj;
using sparsim::Proj;
using sparsim::Site;
using sparsim::sparsity::block_budgets;
using sparsim::sparsity::Calibration;
using sparsim::sparsity::CalibrationVariant;
using sparsim::sparsity::greedy_allocate;
using sparsim::sparsity::GreedyTable;
using sparsim::sparsity::Histogram;
using sparsim::sparsity::histogram_slot;
using sparsim::sparsity::read_calibration;
using sparsim::sparsity::write_calibration;
namespace fs = std::filesystem;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

/// Deterministic uniform double in [0, 1) from a 64-bit generator.
double unit(std::mt19937_64& g) {
  return static_cast<double>(g() >> 11) * 0x1.0p-53;
}

std::vector<float> uniform_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(-1.0 + 2.0 * unit(g));
  return v;
}

constexpr double kTwoPi = 6.283185307179586476925286766559;

/// Standard normal values by Box–Muller.
std::vector<float> gaussian_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; i += 2) {
    const double u1 = 1.0 - unit(g);  // (0, 1]
    const double u2 = unit(g);
    const double r = std::sqrt(-2.0 * std::log(u1));
    v[i] = static_cast<float>(r * std::cos(kTwoPi * u2));
    if (i + 1 < n) v[i + 1] = static_cast<float>(r * std::sin(kTwoPi * u2));
  }
  return v;
}

double fraction_abs_below(const std::vector<float>& v, double tau) {
  std::size_t k = 0;
  for (float x : v) k += std::abs(static_cast<double>(x)) < tau;
  return static_cast<double>(k) / static_cast<double>(v.size());
}

// ---------------------------------------------------------------------------------------------
// Histogram

TEST(Histogram, UniformThresholdIsP) {
  const auto v = uniform_values(1000000, 1);
  Histogram h;
  h.add(v);
  EXPECT_FALSE(h.finished());  // 1e6 < 2^20 values: still buffering
  h.finish();
  ASSERT_TRUE(h.finished());
  EXPECT_EQ(h.count(), v.size());
  EXPECT_NEAR(h.lo(), -0.98, 2e-3);
  EXPECT_NEAR(h.hi(), 0.98, 2e-3);
  EXPECT_EQ(h.threshold(0.0), 0.0);
  for (double p : {0.01, 0.1, 0.25, 0.4, 0.5, 0.7, 0.9, 0.95, 0.99, 0.999})
    EXPECT_NEAR(h.threshold(p), p, 1e-3) << "p = " << p;
  // fraction_abs_below inverts threshold.
  for (double p : {0.1, 0.5, 0.9}) EXPECT_NEAR(h.fraction_abs_below(h.threshold(p)), p, 1e-9);
  EXPECT_EQ(h.fraction_abs_below(0.0), 0.0);
  EXPECT_EQ(h.fraction_abs_below(5.0), 1.0);
}

TEST(Histogram, GaussianThresholdMatchesBruteForceQuantile) {
  const auto v = gaussian_values(1000000, 7);
  // A range buffer smaller than the data: the rest is binned directly.
  Histogram h(std::size_t{1} << 16);
  for (std::size_t i = 0; i < v.size(); i += 4096)
    h.add(v.data() + i, std::min<std::size_t>(4096, v.size() - i));
  EXPECT_TRUE(h.finished());
  h.finish();
  EXPECT_EQ(h.count(), v.size());
  std::vector<double> a(v.size());
  std::transform(v.begin(), v.end(), a.begin(), [](float x) { return std::abs(double(x)); });
  std::sort(a.begin(), a.end());
  for (double p : {0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95}) {
    const double brute = a[static_cast<std::size_t>(p * double(a.size() - 1))];
    EXPECT_NEAR(h.threshold(p) / brute, 1.0, 2e-3) << "p = " << p;
  }
}

TEST(Histogram, ThresholdRealisesTargetOnItsOwnData) {
  // TEAL's property: masking |h| < τ(p) zeroes a fraction p of the calibration data (±0.5%).
  auto v = gaussian_values(400000, 3);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = v[i] * 0.3f + (i % 5 == 0 ? 0.05f : 0.0f);
  Histogram h(100000);
  h.add(v);
  h.finish();
  for (double p : {0.1, 0.3, 0.5, 0.7, 0.9})
    EXPECT_NEAR(fraction_abs_below(v, h.threshold(p)), p, 0.005) << "p = " << p;
}

TEST(Histogram, StatisticsAndDeterminism) {
  const auto v = gaussian_values(50000, 11);
  Histogram a(1000), b(1000);
  a.add(v);
  for (std::size_t i = 0; i < v.size(); i += 333)
    b.add(v.data() + i, std::min<std::size_t>(333, v.size() - i));
  a.finish();
  b.finish();
  EXPECT_EQ(a.counts(), b.counts());
  EXPECT_EQ(a.lo(), b.lo());
  EXPECT_EQ(a.hi(), b.hi());
  EXPECT_EQ(a.sum(), b.sum());
  EXPECT_EQ(a.threshold(0.5), b.threshold(0.5));
  double sum = 0, sumsq = 0;
  for (float x : v) {
    sum += x;
    sumsq += double(x) * double(x);
  }
  EXPECT_EQ(a.sum(), sum);
  EXPECT_EQ(a.sumsq(), sumsq);
  EXPECT_EQ(a.min(), *std::min_element(v.begin(), v.end()));
  EXPECT_EQ(a.max(), *std::max_element(v.begin(), v.end()));
  std::uint64_t total = 0;
  for (auto c : a.counts()) total += c;
  EXPECT_EQ(total, v.size());
  EXPECT_EQ(a.counts().size(), Histogram::kNumBins);
  // About 1% in each tail (the range comes from the first 1000 values only).
  EXPECT_NEAR(double(a.counts().front()) / double(v.size()), 0.01, 0.005);
  EXPECT_NEAR(double(a.counts().back()) / double(v.size()), 0.01, 0.005);
}

TEST(Histogram, EdgeCasesAndErrors) {
  Histogram h;
  EXPECT_NE(error_of([&] { (void)h.threshold(0.5); }).find("finish"), std::string::npos);
  h.finish();
  EXPECT_NE(error_of([&] { (void)h.threshold(0.5); }).find("no values"), std::string::npos);
  const std::vector<float> bad = {1.0f, std::nanf("")};
  EXPECT_NE(error_of([&] { h.add(bad); }).find("non-finite"), std::string::npos);
  EXPECT_EQ(h.count(), 0u);

  // All values equal: a point mass, thresholds land on it.
  Histogram c(10);
  c.add(std::vector<float>(100, 0.5f));
  c.finish();
  EXPECT_GT(c.hi(), c.lo());
  EXPECT_NEAR(c.threshold(0.5), 0.5, 1e-5);
  EXPECT_EQ(c.fraction_abs_below(0.4), 0.0);
  EXPECT_EQ(c.fraction_abs_below(0.6), 1.0);

  Histogram u;
  u.add(uniform_values(1000, 2));
  u.finish();
  EXPECT_NE(error_of([&] { (void)u.threshold(1.0); }).find("[0, 1)"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)u.threshold(-0.1); }).find("[0, 1)"), std::string::npos);
  // Monotone in p.
  double prev = 0;
  for (int i = 1; i < 100; ++i) {
    const double t = u.threshold(i / 100.0);
    EXPECT_GE(t, prev);
    prev = t;
  }

  // restore() reproduces the histogram and checks its state.
  const Histogram r = Histogram::restore(u.lo(), u.hi(), u.counts(), u.min(), u.max(), u.count(),
                                         u.sum(), u.sumsq());
  EXPECT_EQ(r.threshold(0.37), u.threshold(0.37));
  EXPECT_NE(error_of([&] {
              (void)Histogram::restore(u.lo(), u.hi(), u.counts(), u.min(), u.max(), u.count() + 1,
                                       u.sum(), u.sumsq());
            }).find("count"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              (void)Histogram::restore(u.hi(), u.lo(), u.counts(), u.min(), u.max(), u.count(),
                                       u.sum(), u.sumsq());
            }).find("range"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Greedy allocation

TEST(CalibGreedy, PaperTable4Toy) {
  // Appendix D, Table 4: f_A = 100, f_B = 400, α = 0.1 → steps δ_A = 0.5, δ_B = 0.125.
  const std::map<std::pair<double, double>, double> errors = {
      {{0.5, 0.0}, 2.0},   {{0.0, 0.125}, 0.5},  // step 1 → B
      {{0.5, 0.125}, 2.0}, {{0.0, 0.25}, 1.3},   // step 2 → B
      {{0.5, 0.25}, 2.0},  {{0.0, 0.375}, 2.5},  // step 3 → A
  };
  int calls = 0;
  auto err = [&](const std::vector<double>& p) {
    ++calls;
    const auto it = errors.find({p.at(0), p.at(1)});
    if (it == errors.end()) throw std::runtime_error("unscripted p");
    return it->second;
  };
  const GreedyTable t = greedy_allocate({100.0, 400.0}, 0.1, 0.3, err);
  EXPECT_EQ(calls, 6);
  ASSERT_EQ(t.n, 2u);
  const std::vector<std::vector<double>> want = {
      {0.0, 0.0, 0.0}, {0.1, 0.0, 0.125}, {0.2, 0.0, 0.25}, {0.3, 0.5, 0.25}};
  ASSERT_EQ(t.rows.size(), want.size());
  for (std::size_t r = 0; r < want.size(); ++r)
    for (std::size_t j = 0; j < 3; ++j) EXPECT_NEAR(t.rows[r][j], want[r][j], 1e-12) << r << j;
  EXPECT_EQ(t.nearest(0.14)[0], t.rows[1][0]);
  EXPECT_EQ(t.nearest(0.15)[0], t.rows[1][0]);  // tie → the lower P
  EXPECT_EQ(t.nearest(0.26)[0], t.rows[3][0]);
  EXPECT_EQ(t.nearest(-1.0)[0], 0.0);
  EXPECT_EQ(t.nearest(5.0)[0], t.rows[3][0]);
}

TEST(CalibGreedy, RunsToCapClipsAndSkipsAbsentMatrices) {
  // Seven matrices, one absent; error = Σ w_i p_i² so cheaper matrices move first.
  const std::vector<double> f = {10, 20, 20, 10, 0, 30, 30};
  const std::vector<double> w = {5, 1, 1, 2, 1, 3, 0.5};
  auto err = [&](const std::vector<double>& p) {
    double e = 0;
    for (std::size_t i = 0; i < p.size(); ++i) e += w[i] * p[i] * p[i];
    return e;
  };
  const GreedyTable t = greedy_allocate(f, 0.025, 1.0, err);
  ASSERT_GE(t.rows.size(), 2u);
  EXPECT_EQ(t.n, 7u);
  const auto& last = t.rows.back();
  EXPECT_NEAR(last[0], 1.0, 1e-12);  // everything present reaches p = 1
  EXPECT_EQ(last[1 + 4], 0.0);       // the absent matrix never moves
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    ASSERT_EQ(t.rows[r].size(), 8u);
    if (r > 0) {
      EXPECT_GE(t.rows[r][0], t.rows[r - 1][0]);
    }
    for (std::size_t j = 1; j < 8; ++j) EXPECT_LE(t.rows[r][j], 1.0);
  }
  // The first step goes to the least sensitive matrix (index 6).
  EXPECT_GT(t.rows[1][7], 0.0);
  const GreedyTable capped = greedy_allocate(f, 0.025, 0.5, err);
  EXPECT_GE(capped.rows.back()[0], 0.5);
  EXPECT_LT(capped.rows[capped.rows.size() - 2][0], 0.5);

  EXPECT_NE(error_of([&] {
              greedy_allocate({0.0, 0.0}, 0.1, 1.0, err);
            }).find("zero"),
            std::string::npos);
  EXPECT_NE(error_of([&] { greedy_allocate({1.0}, 0.0, 1.0, err); }).find("alpha"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              greedy_allocate({1.0, 2.0}, 0.1, 1.0,
                              [](const std::vector<double>&) { return std::nan(""); });
            }).find("NaN"),
            std::string::npos);
  EXPECT_NE(error_of([] { (void)GreedyTable{}.nearest(0.5); }).find("empty"), std::string::npos);
}

// The paper's step α·F/f_i makes a small matrix all-or-nothing (GQA's k and v: f_k = F/32 on
// SmolLM2, a step of 0.8 at α = 0.025); a step cap lets it move in small steps. The evaluator
// form sees which matrix changed and every commit.
TEST(CalibGreedy, StepCapAndEvaluatorCallbacks) {
  const std::vector<double> f = {1, 31};  // F = 32: steps 0.8 and 0.0258 at α = 0.025
  const std::vector<double> w = {0.02, 1};
  std::vector<std::size_t> changed, committed;
  sparsim::sparsity::GreedyEvaluator ev;
  ev.error = [&](const std::vector<double>& p, std::size_t i) {
    changed.push_back(i);
    return w[0] * p[0] * p[0] + w[1] * p[1] * p[1];
  };
  ev.commit = [&](std::size_t i, const std::vector<double>&) { committed.push_back(i); };
  const GreedyTable paper = greedy_allocate(f, 0.025, 0.95, 0.0, ev);
  std::set<double> pk;
  for (const auto& r : paper.rows) pk.insert(r[1]);
  EXPECT_EQ(pk, (std::set<double>{0.0, 0.8, 1.0}));  // all-or-nothing
  EXPECT_EQ(committed.size(), paper.rows.size() - 1);
  // every step tries each matrix that can still move, one at a time
  EXPECT_GT(changed.size(), committed.size());
  EXPECT_LE(changed.size(), 2 * committed.size());
  for (std::size_t i : changed) EXPECT_LT(i, 2u);
  const GreedyTable capped = greedy_allocate(f, 0.025, 0.95, 0.1, ev);
  std::set<double> pc;
  for (const auto& r : capped.rows) pc.insert(std::round(r[1] * 1e9) / 1e9);
  EXPECT_EQ(pc.size(), 11u);  // 0, 0.1, …, 1.0
  EXPECT_DOUBLE_EQ(sparsim::sparsity::greedy_step(0.025, 32, 1, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(sparsim::sparsity::greedy_step(0.025, 32, 31, 0.1), 0.025 * 32 / 31);
  EXPECT_NE(error_of([&] { greedy_allocate(f, 0.025, 0.95, 1.5, ev); }).find("step_cap"),
            std::string::npos);
}

// interpolate: the point on the segment between the rows around P, whose P is exact.
TEST(CalibGreedy, InterpolateBetweenRows) {
  GreedyTable t;
  t.n = 2;
  t.rows = {{0.0, 0.0, 0.0}, {0.2, 0.0, 0.4}, {0.5, 0.6, 0.4}, {0.5, 0.6, 0.4}, {0.8, 0.6, 1.0}};
  const auto a = t.interpolate(0.1);
  EXPECT_DOUBLE_EQ(a[0], 0.1);
  EXPECT_DOUBLE_EQ(a[1], 0.0);
  EXPECT_DOUBLE_EQ(a[2], 0.2);
  const auto b = t.interpolate(0.35);
  EXPECT_DOUBLE_EQ(b[0], 0.35);
  EXPECT_DOUBLE_EQ(b[1], 0.3);
  EXPECT_DOUBLE_EQ(b[2], 0.4);
  EXPECT_EQ(t.interpolate(0.5), (std::vector<double>{0.5, 0.6, 0.4}));
  EXPECT_EQ(t.interpolate(-1), t.rows.front());
  EXPECT_EQ(t.interpolate(2), t.rows.back());
  EXPECT_EQ(t.nearest(0.35), t.rows[1]);  // the rounding interpolation avoids
  EXPECT_NE(error_of([&] { (void)t.interpolate(std::nan("")); }).find("NaN"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Budgets

TEST(CalibBudgets, Equation5WithClamping) {
  // ē = 0.25: s_i = 0.5 + 0.4 (0.25 − e_i).
  const auto b = block_budgets({0.1, 0.2, 0.3, 0.4}, 0.5, 0.4);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_NEAR(b[0], 0.56, 1e-12);
  EXPECT_NEAR(b[1], 0.52, 1e-12);
  EXPECT_NEAR(b[2], 0.48, 1e-12);
  EXPECT_NEAR(b[3], 0.44, 1e-12);
  // ē = 1: 0.9 + 0.4·1 = 1.3 → 0.95; 0.9 − 0.4 = 0.5; 0.9 + 0 = 0.9.
  const auto c = block_budgets({0.0, 2.0, 1.0}, 0.9, 0.4);
  EXPECT_NEAR(c[0], 0.95, 1e-12);
  EXPECT_NEAR(c[1], 0.5, 1e-12);
  EXPECT_NEAR(c[2], 0.9, 1e-12);
  // Lower clamp and custom bounds: ē = 5, 0.1 + 1·(5 − 10) = −4.9 → 0.2; 0.1 + 5 → 0.8.
  const auto d = block_budgets({10.0, 0.0}, 0.1, 1.0, 0.2, 0.8);
  EXPECT_NEAR(d[0], 0.2, 1e-12);
  EXPECT_NEAR(d[1], 0.8, 1e-12);
  EXPECT_EQ(block_budgets({0.3, 0.3}, 0.4, 0.4), (std::vector<double>{0.4, 0.4}));
  EXPECT_NE(error_of([] { block_budgets({}, 0.5, 0.4); }).find("no sensitivities"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              block_budgets({0.1, std::nan("")}, 0.5, 0.4);
            }).find("e[1]"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Calibration file

Config small_config() {
  Config c;
  c.n_layer = 2;
  c.d_model = 8;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.head_dim = 4;
  c.d_ff = 16;
  return c;
}

CalibrationVariant make_variant(const Calibration& c, std::uint64_t seed, bool rotated) {
  CalibrationVariant v;
  v.histograms.resize(static_cast<std::size_t>(c.n_layer));
  for (auto& layer : v.histograms)
    for (Histogram& h : layer) {
      h = Histogram(500);
      h.add(gaussian_values(2000, seed++));
      h.finish();
    }
  const std::vector<double> f = {64, 32, 32, 64, 128, 128, 128};
  for (int l = 0; l < c.n_layer; ++l)
    v.greedy.push_back(greedy_allocate(f, 0.1, 0.95, [l](const std::vector<double>& p) {
      double e = 0;
      for (std::size_t i = 0; i < p.size(); ++i) e += double(i + 1 + l) * p[i] * p[i];
      return e;
    }));
  sparsim::sparsity::Sensitivity a, b;
  a.rule = rotated ? sparsim::sparsity::ProbeRule::Guided : sparsim::sparsity::ProbeRule::Threshold;
  a.delta = rotated ? 0.01 : 0.0;
  a.e = {{0.1, 0.2}, {0.3, 0.4}};
  b = a;
  b.from = 4;
  b.e = {{0.05, 0.25}, {0.35, 0.45}};
  v.sensitivity = {a, b};
  if (rotated) {
    const auto L = static_cast<std::size_t>(c.n_layer), D = static_cast<std::size_t>(c.d_model);
    v.q_attn.resize((L + 1) * D * D);
    v.q_mlp.resize(L * D * D);
    for (std::size_t i = 0; i < v.q_attn.size(); ++i) v.q_attn[i] = std::sin(double(i));
    for (std::size_t i = 0; i < v.q_mlp.size(); ++i) v.q_mlp[i] = std::cos(double(i));
    for (int p = 0; p < kNumProj; ++p) {
      auto& cn = v.col_norms[static_cast<std::size_t>(p)];
      cn.resize(L * static_cast<std::size_t>(c.d_in(static_cast<Proj>(p))));
      for (std::size_t j = 0; j < cn.size(); ++j) cn[j] = 0.5f + float(j % 7);
    }
  }
  return v;
}

Calibration make_calibration() {
  const Config cfg = small_config();
  Calibration c;
  c.model_fingerprint = "0123456789abcdef";
  c.model_path = "models/tiny.gguf";
  c.corpus_fingerprint = "fedcba9876543210";
  c.corpus_path = "corpus/cal.txt";
  c.n_layer = cfg.n_layer;
  c.d_model = cfg.d_model;
  c.d_ff = cfg.d_ff;
  c.q_dim = cfg.q_dim();
  c.kv_dim = cfg.kv_dim();
  c.tokens = 8000;
  c.context = 256;
  c.windows = 4;
  c.alpha = 0.1;
  c.greedy_tokens = 1024;
  c.greedy_seqs = 4;
  c.greedy_seq_tokens = 256;
  c.greedy_step_cap = 0.1;
  c.timings = {{"histograms (plain)", 1.5, 2.75}, {"rotation", 0.25, 0.5}};
  c.histogram_range_values = 500;
  c.probe_levels = {0.2, 0.4};
  c.command = "sparsim calibrate --model models/tiny.gguf";
  c.plain = make_variant(c, 100, false);
  c.rotated = make_variant(c, 200, true);
  return c;
}

void expect_same_variant(const CalibrationVariant& a, const CalibrationVariant& b) {
  ASSERT_EQ(a.histograms.size(), b.histograms.size());
  for (std::size_t l = 0; l < a.histograms.size(); ++l)
    for (std::size_t s = 0; s < a.histograms[l].size(); ++s) {
      const Histogram& x = a.histograms[l][s];
      const Histogram& y = b.histograms[l][s];
      EXPECT_EQ(x.counts(), y.counts());
      EXPECT_EQ(x.lo(), y.lo());
      EXPECT_EQ(x.hi(), y.hi());
      EXPECT_EQ(x.min(), y.min());
      EXPECT_EQ(x.max(), y.max());
      EXPECT_EQ(x.count(), y.count());
      EXPECT_EQ(x.sum(), y.sum());
      EXPECT_EQ(x.sumsq(), y.sumsq());
      EXPECT_EQ(x.threshold(0.5), y.threshold(0.5));
    }
  ASSERT_EQ(a.greedy.size(), b.greedy.size());
  for (std::size_t l = 0; l < a.greedy.size(); ++l) {
    EXPECT_EQ(a.greedy[l].n, b.greedy[l].n);
    EXPECT_EQ(a.greedy[l].rows, b.greedy[l].rows);
  }
  ASSERT_EQ(a.sensitivity.size(), b.sensitivity.size());
  for (std::size_t i = 0; i < a.sensitivity.size(); ++i) {
    EXPECT_EQ(a.sensitivity[i].rule, b.sensitivity[i].rule);
    EXPECT_EQ(a.sensitivity[i].delta, b.sensitivity[i].delta);
    EXPECT_EQ(a.sensitivity[i].norms_all, b.sensitivity[i].norms_all);
    EXPECT_EQ(a.sensitivity[i].from, b.sensitivity[i].from);
    EXPECT_EQ(a.sensitivity[i].e, b.sensitivity[i].e);
  }
  EXPECT_EQ(a.q_attn, b.q_attn);
  EXPECT_EQ(a.q_mlp, b.q_mlp);
  EXPECT_EQ(a.col_norms, b.col_norms);
}

TEST(CalibFile, RoundTrip) {
  sparsim::test::TempDir dir;
  const Calibration c = make_calibration();
  const std::string path = dir.file("cal.h5");
  write_calibration(path, c);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
  const Calibration r = read_calibration(path);
  EXPECT_EQ(r.file, path);
  EXPECT_EQ(r.model_fingerprint, c.model_fingerprint);
  EXPECT_EQ(r.model_path, c.model_path);
  EXPECT_EQ(r.corpus_fingerprint, c.corpus_fingerprint);
  EXPECT_EQ(r.corpus_path, c.corpus_path);
  EXPECT_EQ(r.n_layer, c.n_layer);
  EXPECT_EQ(r.d_model, c.d_model);
  EXPECT_EQ(r.d_ff, c.d_ff);
  EXPECT_EQ(r.q_dim, c.q_dim);
  EXPECT_EQ(r.kv_dim, c.kv_dim);
  EXPECT_EQ(r.tokens, c.tokens);
  EXPECT_EQ(r.context, c.context);
  EXPECT_EQ(r.windows, c.windows);
  EXPECT_EQ(r.alpha, c.alpha);
  EXPECT_EQ(r.greedy_cap, c.greedy_cap);
  EXPECT_EQ(r.greedy_tokens, c.greedy_tokens);
  EXPECT_EQ(r.greedy_seqs, c.greedy_seqs);
  EXPECT_EQ(r.greedy_seq_tokens, c.greedy_seq_tokens);
  EXPECT_EQ(r.greedy_step_cap, c.greedy_step_cap);
  ASSERT_EQ(r.timings.size(), 2u);
  EXPECT_EQ(r.timings[0].stage, "histograms (plain)");
  EXPECT_EQ(r.timings[0].wall_seconds, 1.5);
  EXPECT_EQ(r.timings[1].cpu_seconds, 0.5);
  EXPECT_EQ(r.greedy_score_fraction, c.greedy_score_fraction);
  EXPECT_EQ(r.histogram_range_values, c.histogram_range_values);
  EXPECT_EQ(r.probe_levels, c.probe_levels);
  EXPECT_EQ(r.command, c.command);
  ASSERT_TRUE(r.plain && r.rotated);
  expect_same_variant(*c.plain, *r.plain);
  expect_same_variant(*c.rotated, *r.rotated);
  // the probing settings select a set; nothing else matches
  using sparsim::sparsity::ProbeRule;
  const auto* g4 = r.rotated->find_sensitivity(ProbeRule::Guided, 0.01, false, 4);
  ASSERT_NE(g4, nullptr);
  EXPECT_EQ(g4->e[0][0], 0.05);
  EXPECT_EQ(r.rotated->find_sensitivity(ProbeRule::Guided, 0.02, false, 0), nullptr);
  EXPECT_EQ(r.rotated->find_sensitivity(ProbeRule::Guided, 0.01, true, 0), nullptr);
  EXPECT_EQ(r.rotated->find_sensitivity(ProbeRule::TopK, 0.01, false, 0), nullptr);
  EXPECT_NE(r.plain->find_sensitivity(ProbeRule::Threshold, 0.3, true, 0), nullptr);
  EXPECT_EQ(g4->describe(), "guided δ = 0.01, norms on k,gate, positions ≥ 4");
  EXPECT_TRUE(r.plain->q_attn.empty());
  EXPECT_TRUE(r.plain->col_norms[0].empty());
  EXPECT_EQ(histogram_slot(Site::Down), 3);
  EXPECT_NE(error_of([] { histogram_slot(Site::BlockIn); }).find("block_in"), std::string::npos);

  // Optional parts: one variant only, no greedy / sensitivity / probes.
  Calibration m = make_calibration();
  m.rotated.reset();
  m.plain->greedy.clear();
  m.plain->sensitivity.clear();
  m.probe_levels.clear();
  write_calibration(path, m);  // replaces the old file
  const Calibration rm = read_calibration(path);
  EXPECT_FALSE(rm.rotated);
  ASSERT_TRUE(rm.plain);
  EXPECT_TRUE(rm.plain->greedy.empty());
  EXPECT_TRUE(rm.plain->sensitivity.empty());
  EXPECT_TRUE(rm.probe_levels.empty());
}

TEST(CalibFile, InvalidContentsAreRefusedAndLeaveNothing) {
  sparsim::test::TempDir dir;
  const std::string path = dir.file("cal.h5");
  auto expect_refused = [&](Calibration c, const std::string& needle) {
    EXPECT_NE(error_of([&] { write_calibration(path, c); }).find(needle), std::string::npos)
        << needle;
    EXPECT_TRUE(fs::is_empty(dir.path()));
  };
  Calibration c = make_calibration();
  c.plain->histograms.pop_back();
  expect_refused(c, "1 layers of histograms");
  c = make_calibration();
  c.rotated->histograms[1][2] = Histogram(10);
  expect_refused(c, "not finished");
  c = make_calibration();
  c.rotated->q_mlp.pop_back();
  expect_refused(c, "q_mlp");
  c = make_calibration();
  c.plain->sensitivity[0].e[1][0] = std::nan("");
  expect_refused(c, "sensitivity");
  c = make_calibration();
  c.rotated->sensitivity[1].from = 0;
  expect_refused(c, "the same settings");
  c = make_calibration();
  c.greedy_seqs = 3;
  expect_refused(c, "greedy sequences");
  c = make_calibration();
  c.probe_levels.pop_back();
  expect_refused(c, "probe levels");
  c = make_calibration();
  c.plain.reset();
  c.rotated.reset();
  expect_refused(c, "neither");
}

/// Writes a valid calibration to `path`, then lets `edit` damage it through the HDF5 layer.
template <class F>
std::string error_after_edit(const std::string& path, F&& edit) {
  write_calibration(path, make_calibration());
  {
    sparsim::io::H5File f = sparsim::io::H5File::open_rw(path);
    sparsim::io::Group root = f.root();
    edit(root);
    f.close();
  }
  return error_of([&] { read_calibration(path); });
}

void drop_link(sparsim::io::Group& g, const char* name) {
  ASSERT_GE(H5Ldelete(g.id(), name, H5P_DEFAULT), 0) << name;
}

TEST(CalibFile, CorruptFilesNameTheFileAndTheProblem) {
  sparsim::test::TempDir dir;
  const std::string path = dir.file("cal.h5");
  auto has = [](const std::string& msg, const std::string& needle) {
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
  };

  // Not HDF5 at all.
  {
    std::ofstream(dir.file("text.h5")) << "this is not an HDF5 file\n";
    const std::string m = error_of([&] { read_calibration(dir.file("text.h5")); });
    has(m, "invalid calibration file '" + dir.file("text.h5") + "'");
  }
  // Missing file.
  has(error_of([&] { read_calibration(dir.file("absent.h5")); }), "absent.h5");
  // Truncated file.
  {
    write_calibration(path, make_calibration());
    const auto size = fs::file_size(path);
    fs::resize_file(path, size / 2);
    has(error_of([&] { read_calibration(path); }), "invalid calibration file '" + path + "'");
  }
  // Another HDF5 file.
  {
    sparsim::io::H5File f = sparsim::io::H5File::create(dir.file("other.h5"));
    f.root().write("x", std::vector<double>{1.0});
    f.close();
    has(error_of([&] { read_calibration(dir.file("other.h5")); }),
        "not a sparsim calibration file");
  }
  has(error_after_edit(path, [](sparsim::io::Group& r) { r.set_attr("format", "sparsim-run"); }),
      "format 'sparsim-run'");
  has(error_after_edit(path, [](sparsim::io::Group& r) { r.set_attr("version", 1); }),
      "layout version 1 is not supported (this sparsim reads version 2; make the file again");
  has(error_after_edit(path,
                       [](sparsim::io::Group& r) { drop_link(r, "plain/histograms/o_in/lo"); }),
      "/plain/histograms/o_in/lo");
  has(error_after_edit(path, [](sparsim::io::Group& r) { drop_link(r, "rotated/histograms"); }),
      "/rotated/histograms");
  has(error_after_edit(path, [](sparsim::io::Group& r) { r.set_attr("n_layer", 3); }),
      "has shape [2][10002], expected [3][10002]");
  has(error_after_edit(path,
                       [](sparsim::io::Group& r) {
                         drop_link(r, "rotated/rotation/q_mlp");
                         r.write<double>("rotated/rotation/q_mlp",
                                         std::vector<double>(2 * 8 * 7).data(), {2, 8, 7});
                       }),
      "'/rotated/rotation/q_mlp' has shape [2][8][7], expected [2][8][8]");
  has(error_after_edit(path,
                       [](sparsim::io::Group& r) {
                         drop_link(r, "plain/sensitivity/1/e");
                         r.write<double>("plain/sensitivity/1/e",
                                         std::vector<double>{0.1, std::nan(""), 0.3, 0.4}.data(),
                                         {2, 2});
                       }),
      "'/plain/sensitivity/1/e' holds a non-finite value");
  has(error_after_edit(path,
                       [](sparsim::io::Group& r) {
                         r.open_group("rotated/sensitivity/0").set_attr("rule", "magic");
                       }),
      "probe masking 'magic'");
  has(error_after_edit(
          path,
          [](sparsim::io::Group& r) {
            drop_link(r, "rotated/histograms/mlp_in/hi");
            r.write("rotated/histograms/mlp_in/hi", std::vector<double>{1.0, std::nan("")});
          }),
      "non-finite");
  has(error_after_edit(
          path,
          [](sparsim::io::Group& r) {
            drop_link(r, "plain/histograms/attn_in/count");
            r.write("plain/histograms/attn_in/count", std::vector<std::uint64_t>{1, 2});
          }),
      "bins hold 2000 values but its count is 1");
  has(error_after_edit(path,
                       [](sparsim::io::Group& r) {
                         drop_link(r, "plain/greedy/row_count");
                         r.write("plain/greedy/row_count", std::vector<std::int64_t>{0, 3});
                       }),
      "layer 0 has 0 rows");
  has(error_after_edit(path,
                       [](sparsim::io::Group& r) {
                         drop_link(r, "plain/histograms/down_in/lo");
                         r.write("plain/histograms/down_in/lo", std::vector<float>{0.f, 0.f});
                       }),
      "holds float32 but float64 was requested");
}

TEST(CalibFile, WrongModelIsNamed) {
  sparsim::test::TempDir dir;
  const std::string path = dir.file("cal.h5");
  write_calibration(path, make_calibration());
  const Calibration c = read_calibration(path);
  const Config cfg = small_config();
  c.check_model("0123456789ABCDEF", cfg, "models/tiny.gguf");  // same model, any case
  c.check_model(std::uint64_t{0x0123456789abcdef}, cfg, "models/tiny.gguf");
  const std::string m =
      error_of([&] { c.check_model("00000000deadbeef", cfg, "models/other.gguf"); });
  EXPECT_EQ(m, "calibration file " + path +
                   " was made for model fingerprint 0123456789abcdef (path models/tiny.gguf), "
                   "this model (models/other.gguf) is 00000000deadbeef");
  Config wider = cfg;
  wider.d_ff = 32;
  EXPECT_NE(error_of([&] { c.check_model("0123456789abcdef", wider, "w.gguf"); }).find("d_ff 32"),
            std::string::npos);
}

}  // namespace
