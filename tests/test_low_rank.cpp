// PaLU and SVD-LLM: the truncated factorisation's error against its discarded singular values
// (plain and whitened, with the singular values checked against an independent eigen-solve),
// rank allocation, the latent-cache model against the full-width model with the rebuilt
// weights, and the low-rank GGUF round trip.
#include "backends.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "low_rank_helpers.hpp"
#include "model/loader.hpp"
#include "transforms/low_rank.hpp"

#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sparsim::test {
namespace {

using pruning::Factors;
using pruning::LowRankMethod;
using pruning::LowRankOptions;

std::vector<double> random_matrix(int m, int n, std::uint64_t seed) {
  SynthRng r(seed);
  std::vector<double> x(static_cast<std::size_t>(m) * n);
  for (double& v : x) v = r.normal();
  return x;
}

/// A·B (A m×k, B k×n), plain loops.
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int m, int k,
                           int n) {
  std::vector<double> c(static_cast<std::size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p)
      for (int j = 0; j < n; ++j)
        c[static_cast<std::size_t>(i) * n + j] +=
            a[static_cast<std::size_t>(i) * k + p] * b[static_cast<std::size_t>(p) * n + j];
  return c;
}

double frob2(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return s;
}

/// Eigenvalues of the symmetric m×m matrix s, descending (LAPACK dsyev: another routine than the
/// SVD under test).
std::vector<double> eigenvalues(std::vector<double> s, int m) {
  std::vector<double> ev(static_cast<std::size_t>(m));
  EXPECT_EQ(LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'U', m, s.data(), m, ev.data()), 0);
  std::sort(ev.rbegin(), ev.rend());
  return ev;
}

std::vector<double> transpose(const std::vector<double>& a, int m, int n) {
  std::vector<double> t(a.size());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      t[static_cast<std::size_t>(j) * m + i] = a[static_cast<std::size_t>(i) * n + j];
  return t;
}

TEST(LowRank, PlainTruncationErrorIsTheDiscardedSingularValues) {
  const int m = 12, d = 20;
  const auto w = random_matrix(m, d, 3);
  // σ² are the eigenvalues of W·Wᵀ
  const auto ev = eigenvalues(matmul(w, transpose(w, m, d), m, d, m), m);
  for (int r : {1, 4, 11, 12}) {
    const Factors f = pruning::truncated_svd(w, m, d, r);
    ASSERT_EQ(f.sv.size(), static_cast<std::size_t>(m));
    for (int i = 0; i < m; ++i) EXPECT_NEAR(f.sv[i] * f.sv[i], ev[i], 1e-9 * ev[0]);
    auto approx = matmul(f.b, f.a, m, r, d);
    for (std::size_t i = 0; i < w.size(); ++i) approx[i] = w[i] - approx[i];
    double tail = 0;
    for (int i = r; i < m; ++i) tail += ev[i];
    EXPECT_NEAR(frob2(approx), f.discarded(), 1e-9 * frob2(w)) << r;
    EXPECT_NEAR(f.discarded(), tail, 1e-9 * frob2(w)) << r;
  }
}

// SVD-LLM's whitening: the loss on the calibration inputs, ‖(W − B·A)·X‖², equals the discarded
// singular values of W·S; and it is no larger than plain truncation's loss on the same inputs.
TEST(LowRank, WhitenedLossOnTheCalibrationInputsIsTheDiscardedSingularValues) {
  const int m = 10, d = 16, n = 64;
  const auto w = random_matrix(m, d, 5);
  auto x = random_matrix(d, n, 6);
  for (int i = 0; i < d; ++i)  // correlated, unevenly scaled inputs
    for (int t = 0; t < n; ++t)
      x[i * n + t] = (1 + i) * x[i * n + t] + 0.5 * x[((i + 1) % d) * n + t];
  const auto gram = matmul(x, transpose(x, d, n), d, n, d);
  // σ² of W·S are the eigenvalues of W·G·Wᵀ
  const auto ev = eigenvalues(matmul(matmul(w, gram, m, d, d), transpose(w, m, d), m, d, m), m);
  for (int r : {2, 5, 9}) {
    const Factors f = pruning::truncated_svd(w, m, d, r, gram);
    EXPECT_EQ(f.ridge, 0.0);
    for (int i = 0; i < m; ++i) EXPECT_NEAR(f.sv[i] * f.sv[i], ev[i], 1e-8 * ev[0]);
    auto err = matmul(f.b, f.a, m, r, d);
    for (std::size_t i = 0; i < w.size(); ++i) err[i] = w[i] - err[i];
    const double loss = frob2(matmul(err, x, m, d, n));
    EXPECT_NEAR(loss, f.discarded(), 1e-8 * ev[0]) << r;
    const Factors p = pruning::truncated_svd(w, m, d, r);
    auto perr = matmul(p.b, p.a, m, r, d);
    for (std::size_t i = 0; i < w.size(); ++i) perr[i] = w[i] - perr[i];
    EXPECT_LE(loss, frob2(matmul(perr, x, m, d, n)) * (1 + 1e-12)) << r;
  }
  // a rank-deficient Gram matrix (fewer inputs than dimensions) is regularised, not refused
  const auto thin = random_matrix(d, 4, 8);
  const Factors f =
      pruning::truncated_svd(w, m, d, 3, matmul(thin, transpose(thin, d, 4), d, 4, d));
  EXPECT_GT(f.ridge, 0.0);
  for (double v : f.a) EXPECT_TRUE(std::isfinite(v));
}

TEST(LowRank, BadInputIsNamed) {
  const auto w = random_matrix(4, 6, 1);
  EXPECT_THROW(pruning::truncated_svd(w, 4, 6, 0), Error);
  EXPECT_THROW(pruning::truncated_svd(w, 4, 6, 5), Error);
  EXPECT_THROW(pruning::truncated_svd(w, 5, 6, 2), Error);
  auto bad = w;
  bad[3] = std::nan("");
  EXPECT_THROW(pruning::truncated_svd(bad, 4, 6, 2), Error);
  const Config c = tiny_spec(1).cfg;
  LowRankOptions o;
  for (double rho : {0.0, -0.5, 1.5, std::nan("")}) {
    o.retain = rho;
    try {
      pruning::plan_low_rank(c, o, nullptr);
      ADD_FAILURE() << rho;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("(0, 1]"), std::string::npos) << e.what();
    }
  }
  o.retain = 0.5;
  o.group = 3;  // the tiny model has 2 KV heads
  EXPECT_THROW(pruning::plan_low_rank(c, o, nullptr), Error);
  o.group = 0;
  o.method = LowRankMethod::Palu;
  try {
    pruning::plan_low_rank(c, o, nullptr);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Fisher"), std::string::npos) << e.what();
  }
}

TEST(LowRank, RanksMeetTheBudgetUniformOrByFisherScore) {
  const Config c = tiny_spec(2).cfg;
  const int gd = c.n_kv_head * c.head_dim;
  LowRankOptions o;
  o.retain = 0.5;
  const Config u = pruning::plan_low_rank(c, o, nullptr);
  ASSERT_EQ(u.lr_group, c.n_kv_head);
  int total = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    EXPECT_EQ(u.k_cache_width(l), gd / 2);
    EXPECT_EQ(u.v_cache_width(l), gd / 2);
    total += u.k_cache_width(l) + u.v_cache_width(l);
  }
  EXPECT_EQ(total, c.n_layer * gd);  // ρ of 2·n_kv·D per layer
  // PaLU: ranks follow the groups' mean √F (one group per KV head here), on the same budget
  calibration::FisherScores f;
  f.n_layer = c.n_layer;
  f.n_kv_head = c.n_kv_head;
  f.head_dim = c.head_dim;
  for (int l = 0; l < c.n_layer; ++l)
    for (int i = 0; i < c.kv_dim(); ++i) {
      const double s = (l + 1) * (i < c.head_dim ? 4.0 : 1.0);
      f.k.push_back(s * s);
      f.v.push_back(s * s / 4);
    }
  o.method = LowRankMethod::Palu;
  o.group = 1;
  const Config p = pruning::plan_low_rank(c, o, &f);
  ASSERT_EQ(p.lr_group, 1);
  int ptotal = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerLowRank& r = p.low_rank[l];
    ptotal += r.k_rank() + r.v_rank();
    EXPECT_GE(r.k_ranks[0], r.k_ranks[1]) << l;  // head 0 scores 4× head 1
    EXPECT_GE(r.k_ranks[0], r.v_ranks[0]) << l;  // K scores 2× V
    if (l > 0) {                                 // deeper layers score more
      EXPECT_GE(r.k_ranks[1], p.low_rank[l - 1].k_ranks[1]);
    }
  }
  EXPECT_EQ(ptotal, total);
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / scale;
}

/// Gram matrices of random correlated inputs, one per layer.
std::vector<std::vector<double>> random_grams(const Config& c, std::uint64_t seed) {
  std::vector<std::vector<double>> g;
  for (int l = 0; l < c.n_layer; ++l) {
    const int d = c.d_model, n = 3 * d;
    const auto x = random_matrix(d, n, seed + l);
    g.push_back(matmul(x, transpose(x, d, n), d, n, d));
  }
  return g;
}

template <class E>
class LowRankModel : public ::testing::Test {};
TYPED_TEST_SUITE(LowRankModel, Backends, BackendName);

// The latent cache (keys rebuilt, then rotated, at every step) gives the logits of the full-width
// model whose W_k and W_v are B·A: prefill then decode, two sequences, op-by-op and device
// path, PaLU groups of one KV head and SVD-LLM's whole projection.
TYPED_TEST(LowRankModel, LatentCacheDecodeEqualsRebuiltFullWidthDecode) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(41));
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  for (int group : {1, c.n_kv_head}) {
    LowRankOptions o;
    o.retain = 0.4;
    o.group = group;
    const Config plan = pruning::plan_low_rank(c, o, nullptr);
    pruning::LowRankReport rep;
    auto lr = pruning::factorise(*w, plan, random_grams(c, 9), &rep);
    EXPECT_NEAR(rep.kv_bytes_fraction, 0.4, 0.05);
    EXPECT_LT(rep.params_fraction, 1.0);
    auto full = rebuilt(*lr, *w);
    for (bool device : {false, true}) {
      Engine<E> a(lr, 2, 40), b(full, 2, 40);
      a.set_device_path(device);
      b.set_device_path(device);
      std::vector<std::vector<int>> pr(2);
      for (int s = 0; s < 2; ++s)
        for (int t = 0; t < 16; ++t) pr[s].push_back(3 + (t * 37 + s * 91) % (c.vocab - 3));
      EXPECT_LE(max_rel(to_host(a.forward(pr, 0, false)), to_host(b.forward(pr, 0, false))), 1e-5)
          << group << " device " << device;
      for (int step = 0; step < 4; ++step) {
        const std::vector<std::vector<int>> next = {{4 + step * 11}, {7 + step * 19}};
        EXPECT_LE(max_rel(to_host(a.forward(next, 16 + step, false)),
                          to_host(b.forward(next, 16 + step, false))),
                  1e-5)
            << group << " device " << device << " step " << step;
      }
      // the cache really holds the latents
      EXPECT_EQ(a.cache().layer(0).k.extent(2), static_cast<std::size_t>(plan.k_cache_width(0)));
      EXPECT_LT(a.cache().bytes(), b.cache().bytes());
    }
    // and the factorised model is not the dense one
    Engine<E> a(lr, 1, 40), d(w, 1, 40);
    std::vector<std::vector<int>> one = {{5, 9, 13, 17, 21, 25}};
    EXPECT_GT(max_rel(to_host(a.forward(one, 0, false)), to_host(d.forward(one, 0, false))), 1e-4);
  }
}

// The ledger counts the reconstruction of every cached position at each step.
TYPED_TEST(LowRankModel, LedgerCountsTheReconstruction) {
  using E = TypeParam;
  TempDir dir;
  auto w = load_model<E>(make_model(dir, "m.gguf", tiny_spec(42)), LoadOptions{});
  const Config& c = w->cfg;
  LowRankOptions o;
  o.retain = 0.5;
  const Config plan = pruning::plan_low_rank(c, o, nullptr);
  auto lr = pruning::factorise(*w, plan, {});
  flops::Ledger ledger(c.n_layer);
  Engine<E> e(lr, 1, 32, &ledger);
  std::vector<int> p(10);
  std::iota(p.begin(), p.end(), 3);
  e.forward({p}, 0, false);
  e.forward({{4}}, 10, false);
  const auto rec = ledger.by_op(flops::Op::KVReconstruct);
  // prefill rebuilds 10 positions, the decode step 11, each K and V at rank r over n_kv·D rows
  const double gd = c.kv_dim();
  double want = 0;
  for (int l = 0; l < c.n_layer; ++l)
    want += 2.0 * (10 + 11) * gd * (plan.k_cache_width(l) + plan.v_cache_width(l)) +
            6.0 * (10 + 11) * c.kv_dim() / 2;
  EXPECT_DOUBLE_EQ(rec.flops_realised, want);
  EXPECT_DOUBLE_EQ(ledger.by_op(flops::Op::KProj).flops_realised, [&] {
    double s = 0;
    for (int l = 0; l < c.n_layer; ++l) s += 2.0 * 11 * plan.k_cache_width(l) * c.d_model;
    return s;
  }());
}

/// Row-major host copy of an F32 matrix, in double.
template <class E>
std::vector<double> host_f32(const Matrix<E>& m) {
  EXPECT_EQ(m.dtype, DType::F32);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.f32);
  std::vector<double> out(static_cast<std::size_t>(m.rows) * m.cols);
  for (int i = 0; i < m.rows; ++i)
    for (int j = 0; j < m.cols; ++j) out[static_cast<std::size_t>(i) * m.cols + j] = h(i, j);
  return out;
}

// The attention inputs' second moments gathered through the engine equal the mean of x·xᵀ over
// every observed row (plain loops), and on those inputs the whitened factorisation loses less
// than the plain SVD of the same rank in every layer (it is the optimum of that loss).
TYPED_TEST(LowRankModel, WhiteningOnTheModelsInputsBeatsPlainSvd) {
  using E = TypeParam;
  TempDir dir;
  auto w = load_model<E>(make_model(dir, "m.gguf", tiny_spec(44)), LoadOptions{});
  const Config& c = w->cfg;
  const int d = c.d_model, L = c.n_layer;
  std::vector<std::vector<int>> seqs(3);  // 120 rows: a positive definite 64×64 moment
  for (int s = 0; s < 3; ++s)
    for (int t = 0; t < 40; ++t) seqs[s].push_back(3 + (t * 53 + s * 17 + t * t) % (c.vocab - 3));
  const auto grams = pruning::attention_input_grams<E>(w, seqs);
  ASSERT_EQ(static_cast<int>(grams.size()), L);
  // reference: every row the observer sees, one sequence at a time, summed in plain loops
  std::vector<std::vector<double>> ref(L, std::vector<double>(static_cast<std::size_t>(d) * d));
  {
    Engine<E> e(w, 1, 40);
    e.set_observer([&](int l, Site site, const CMat<E>& x) {
      if (site != Site::Attn) return;
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
      for (std::size_t r = 0; r < h.extent(0); ++r)
        for (int i = 0; i < d; ++i)
          for (int j = 0; j < d; ++j)
            ref[l][static_cast<std::size_t>(i) * d + j] +=
                static_cast<double>(h(r, i)) * static_cast<double>(h(r, j)) / 120.0;
    });
    for (const auto& s : seqs) e.forward_tail({s}, 0, 1);
  }
  for (int l = 0; l < L; ++l) {
    double err = 0, scale = 0;
    for (std::size_t i = 0; i < ref[l].size(); ++i) {
      err = std::max(err, std::fabs(grams[l][i] - ref[l][i]));
      scale = std::max(scale, std::fabs(ref[l][i]));
    }
    EXPECT_LE(err, 1e-12 * scale) << l;
  }
  LowRankOptions o;
  o.retain = 0.3;
  const Config plan = pruning::plan_low_rank(c, o, nullptr);
  auto white = rebuilt(*pruning::factorise(*w, plan, grams), *w);
  auto plain = rebuilt(*pruning::factorise(*w, plan, {}), *w);
  // tr(Δ·G·Δᵀ): the mean squared output error over the observed inputs
  auto loss = [&](const std::vector<double>& full, const std::vector<double>& approx, int rows,
                  const std::vector<double>& g) {
    std::vector<double> delta(full.size());
    for (std::size_t i = 0; i < full.size(); ++i) delta[i] = full[i] - approx[i];
    const auto dg = matmul(delta, g, rows, d, d);
    double t = 0;
    for (std::size_t i = 0; i < delta.size(); ++i) t += dg[i] * delta[i];
    return t;
  };
  int strictly = 0;
  for (int l = 0; l < L; ++l)
    for (int which = 0; which < 2; ++which) {
      auto pick = [&](const Weights<E>& x) {
        return host_f32(which == 0 ? x.layers[l].wk : x.layers[l].wv);
      };
      const auto full = pick(*w);
      const double lw = loss(full, pick(*white), c.kv_dim(), grams[l]);
      const double lp = loss(full, pick(*plain), c.kv_dim(), grams[l]);
      EXPECT_LE(lw, lp * (1 + 1e-6)) << l << " " << which;
      strictly += lw < lp * (1 - 1e-3);
    }
  EXPECT_GT(strictly, 0);
}

// Written as a GGUF and read back: the same layout and bitwise the same logits; bad layouts are
// named.
TYPED_TEST(LowRankModel, GgufRoundTrip) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(43));
  auto w = load_model<E>(path, LoadOptions{});
  LowRankOptions o;
  o.retain = 0.6;
  o.group = 1;
  o.source_fingerprint = "0123456789abcdef";
  const Config plan = pruning::plan_low_rank(w->cfg, o, nullptr);
  auto lr = pruning::factorise(*w, plan, random_grams(w->cfg, 4));
  const std::string out = dir.file("lr.gguf");
  pruning::write_low_rank_gguf(path, *lr, out);
  auto back = load_model<E>(out, LoadOptions{});
  const Config& q = back->cfg;
  ASSERT_TRUE(q.low_rank_kv());
  EXPECT_EQ(q.prune.method, "svd-llm");
  EXPECT_EQ(q.lr_group, 1);
  for (int l = 0; l < q.n_layer; ++l) {
    EXPECT_EQ(q.low_rank[l].k_ranks, plan.low_rank[l].k_ranks);
    EXPECT_EQ(q.low_rank[l].v_ranks, plan.low_rank[l].v_ranks);
  }
  EXPECT_EQ(q.n_params(), plan.n_params());
  std::vector<int> p = {3, 8, 13, 21, 34, 55, 89};
  Engine<E> a(lr, 1, 16), b(back, 1, 16);
  EXPECT_EQ(to_host(a.forward({p}, 0, false)), to_host(b.forward({p}, 0, false)));
}

}  // namespace
}  // namespace sparsim::test
