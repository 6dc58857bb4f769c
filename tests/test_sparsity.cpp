// Activation sparsity inside the engine: calibration statistics against brute force, the
// realised sparsity of each masking rule, and the column-skipping decode path.
#include "backends.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "model/loader.hpp"
#include "sparsity/calibrate.hpp"
#include "sparsity/detail/greedy_block.hpp"
#include "sparsity/plan.hpp"
#include "sparsity/rotation.hpp"

#include <array>
#include <cfloat>
#include <cmath>
#include <map>
#include <tuple>

namespace sparsim::test {
namespace {

using sparsity::CalibrateOptions;
using sparsity::CalibrationVariant;

template <class E>
class SparsityTest : public ::testing::Test {};
TYPED_TEST_SUITE(SparsityTest, Backends, BackendName);

std::vector<int> token_stream(int n, int vocab, std::uint64_t seed) {
  SynthRng r(seed);
  std::vector<int> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = 3 + static_cast<int>(r.next() % static_cast<std::uint64_t>(vocab - 3));
  return t;
}

SynthSpec three_layer_spec() {
  SynthSpec s = tiny_spec(11);
  s.cfg.n_layer = 3;
  return s;
}

CalibrateOptions small_options() {
  CalibrateOptions o;
  o.context = 128;
  o.max_windows = 4;
  o.greedy_seqs = 2;
  o.greedy_tokens = 32;
  o.alpha = 0.05;
  o.range_values = 4096;
  return o;
}

template <class E>
std::vector<float> host_rows(const CMat<E>& x) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  return std::vector<float>(h.data(), h.data() + h.size());
}

// e_i from calibrate_variant (block i run alone on captured inputs) against a brute-force
// computation: whole-model forward passes, dense and with only block i masked, reading block
// i's output as the input of block i + 1; over every position and over positions ≥ 4.
TYPED_TEST(SparsityTest, SensitivityMatchesBruteForce) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = three_layer_spec();
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const auto stream = token_stream(1024, spec.cfg.vocab, 5);
  const CalibrateOptions opt = small_options();
  CalibrationVariant var;
  sparsity::calibrate_variant<E>(w, stream, opt, sparsity::ProbeMasking::Threshold, var);
  ASSERT_EQ(var.sensitivity.size(), 2u);  // threshold masks, positions ≥ 0 and ≥ 4
  const sparsity::Sensitivity* all =
      var.find_sensitivity(sparsity::ProbeRule::Threshold, 0, false, 0);
  const sparsity::Sensitivity* late =
      var.find_sensitivity(sparsity::ProbeRule::Threshold, 0, false, 4);
  ASSERT_TRUE(all && late);
  ASSERT_EQ(all->e.size(), opt.probes.size());

  const int G = opt.greedy_seqs, T = opt.greedy_tokens, D = spec.cfg.d_model;
  std::vector<std::vector<int>> seqs;
  for (int s = 0; s < G; ++s)
    seqs.emplace_back(stream.begin() + s * T, stream.begin() + (s + 1) * T);
  for (int l = 0; l + 1 < spec.cfg.n_layer; ++l)
    for (std::size_t k = 0; k < opt.probes.size(); ++k) {
      Engine<E> eng(w, G, T);
      std::vector<float> out;
      eng.set_observer([&](int layer, Site site, const CMat<E>& x) {
        if (layer == l + 1 && site == Site::BlockIn) out = host_rows<E>(x);
      });
      eng.forward_tail(seqs, 0, 1);
      const std::vector<float> dense = out;
      sparsity::ActivationMasker<E> m(spec.cfg.n_layer);
      const auto& row = var.greedy[static_cast<std::size_t>(l)].nearest(opt.probes[k]);
      for (int i = 0; i < kNumProj; ++i) {
        const Proj p = static_cast<Proj>(i);
        const double pi = std::min(row[static_cast<std::size_t>(i) + 1], 0.999);
        if (pi <= 0) continue;
        const auto& h =
            var.histograms[static_cast<std::size_t>(l)]
                          [static_cast<std::size_t>(sparsity::histogram_slot(site_of(p)))];
        MaskParams prm;
        prm.rule = MaskRule::Threshold;
        prm.tau = static_cast<float>(h.threshold(pi));
        m.set(l, p, prm);
      }
      eng.set_masker(&m);
      eng.set_sparse_from(0);
      eng.forward_tail(seqs, 0, 1);
      for (int from : {0, 4}) {
        double e = 0;
        for (int s = 0; s < G; ++s) {
          double num = 0, den = 0;
          for (int j = (s * T + from) * D; j < (s + 1) * T * D; ++j) {
            num +=
                (static_cast<double>(dense[j]) - out[j]) * (static_cast<double>(dense[j]) - out[j]);
            den += static_cast<double>(dense[j]) * dense[j];
          }
          e += std::sqrt(num) / (std::sqrt(den) + 1e-6);
        }
        e /= G;
        const double got = (from == 0 ? all : late)->e[k][static_cast<std::size_t>(l)];
        EXPECT_NEAR(got, e, 1e-4 * e + 1e-7)
            << "layer " << l << " probe " << opt.probes[k] << " from " << from;
        EXPECT_GT(e, 0.0);
      }
    }
  // Sensitivity grows with the probe level.
  for (int l = 0; l < spec.cfg.n_layer; ++l)
    EXPECT_LT(all->e.front()[static_cast<std::size_t>(l)],
              all->e.back()[static_cast<std::size_t>(l)]);
}

// TEAL: a threshold calibrated for p drops a fraction p of its own calibration activations.
TYPED_TEST(SparsityTest, TealThresholdRealisesTargetOnItsCalibrationData) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(3);
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const auto stream = token_stream(1024, spec.cfg.vocab, 9);
  CalibrateOptions opt = small_options();
  opt.probes = {0.4};
  CalibrationVariant var;
  sparsity::calibrate_variant<E>(w, stream, opt, sparsity::ProbeMasking::Threshold, var);
  for (double p : {0.3, 0.5, 0.7}) {
    Engine<E> eng(w, 1, opt.context);
    sparsity::ActivationMasker<E> m(spec.cfg.n_layer);
    for (Proj pr : {Proj::Q, Proj::Gate})  // inputs the masks of layer 0 do not change
      if (pr == Proj::Q) {
        MaskParams prm;
        prm.rule = MaskRule::Threshold;
        prm.tau = static_cast<float>(var.histograms[0][0].threshold(p));
        m.set(0, pr, prm);
      }
    eng.set_masker(&m);
    eng.set_sparse_from(0);
    for (int i = 0; i < opt.max_windows; ++i)
      eng.forward_tail({std::vector<int>(stream.begin() + i * opt.context,
                                         stream.begin() + (i + 1) * opt.context)},
                       0, 1);
    const auto& st = m.stats(0, Proj::Q);
    ASSERT_EQ(st.tokens, static_cast<std::uint64_t>(opt.max_windows * opt.context));
    const double realised = 1.0 - static_cast<double>(st.kept) / static_cast<double>(st.total);
    EXPECT_NEAR(realised, p, 0.005) << "target " << p;
  }
}

// WINA keeps exactly ⌊d(1−p)⌋ entries of every token; TopK-Guided stays within p ± δ (plus the
// rounding of ⌊·⌋) for every token and projection.
TYPED_TEST(SparsityTest, WinaIsExactAndGuidedStaysInItsBand) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(4);
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const auto stream = token_stream(1024, spec.cfg.vocab, 2);
  CalibrateOptions opt = small_options();
  opt.delta = 0.05;  // the guided probes' δ must be the evaluation's
  sparsity::Calibration cal;
  cal.n_layer = spec.cfg.n_layer;
  cal.probe_levels = opt.probes;
  cal.rotated.emplace();
  sparsity::calibrate_variant<E>(w, stream, opt, sparsity::ProbeMasking::Guided, *cal.rotated);
  for (const auto method : {sparsity::Method::Wina, sparsity::Method::TopkGuided}) {
    sparsity::MethodOptions mo;
    mo.method = method;
    mo.sparsity = 0.5;
    mo.delta = 0.05;
    const sparsity::Plan plan = sparsity::make_plan(cal, mo);
    sparsity::ActivationMasker<E> m(spec.cfg.n_layer);
    sparsity::configure_masker(m, plan, *w);
    Engine<E> eng(w, 1, 128);
    eng.set_masker(&m);
    eng.set_sparse_from(0);
    eng.forward_tail({std::vector<int>(stream.begin(), stream.begin() + 128)}, 0, 1);
    // per-token sparsity: FLOP-weighted over every projection, unmasked ones as dense
    double skipped = 0, all = 0;
    for (int l = 0; l < spec.cfg.n_layer; ++l)
      for (int i = 0; i < kNumProj; ++i) {
        const auto& wm = w->layers[static_cast<std::size_t>(l)].proj(static_cast<Proj>(i));
        const double p = plan.p[static_cast<std::size_t>(l)][static_cast<std::size_t>(i)];
        const double f = static_cast<double>(wm.rows) * wm.cols;
        all += f;
        if (p > 0) skipped += f * (1.0 - std::floor(wm.cols * (1.0 - p)) / wm.cols);
      }
    const auto& tok = m.token_sparsity();
    ASSERT_EQ(tok.size(), 128u);
    int varying = 0;
    for (double t : tok) {
      if (method == sparsity::Method::Wina)
        EXPECT_NEAR(t, skipped / all, 1e-12);
      else
        EXPECT_NEAR(t, skipped / all, mo.delta + 0.05);
    }
    for (int l = 0; l < spec.cfg.n_layer; ++l)
      for (int i = 0; i < kNumProj; ++i) {
        const Proj pr = static_cast<Proj>(i);
        const double p = plan.p[static_cast<std::size_t>(l)][static_cast<std::size_t>(i)];
        if (p <= 0) continue;
        const auto& st = m.stats(l, pr);
        const int d = w->layers[static_cast<std::size_t>(l)].proj(pr).cols;
        ASSERT_EQ(st.tokens, 128u);
        if (method == sparsity::Method::Wina) {
          const double exact = 1.0 - std::floor(d * (1.0 - p)) / d;
          EXPECT_DOUBLE_EQ(st.min, exact) << proj_name(pr) << " layer " << l;
          EXPECT_DOUBLE_EQ(st.max, exact) << proj_name(pr) << " layer " << l;
        } else {
          EXPECT_GE(st.min, p - mo.delta - 1e-9) << proj_name(pr) << " layer " << l;
          EXPECT_LE(st.max, p + mo.delta + 1.0 / d + 1e-9) << proj_name(pr) << " layer " << l;
          if (st.max > st.min) ++varying;
        }
      }
    // TopK-Guided adapts per token inside its band (WINA cannot)
    if (method == sparsity::Method::TopkGuided) {
      EXPECT_GT(varying, 0);
    }
  }
}

// Single-token decode through the column-skipping GEMV gives the masked dense result.
TYPED_TEST(SparsityTest, ColumnSkippingDecodeMatchesMaskedDense) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(6);
  const std::string path = make_model(dir, "m.gguf", spec);
  for (DType st : {DType::F32, DType::BF16}) {
    LoadOptions lo;
    lo.storage = st;
    auto w = load_model<E>(path, lo);
    sparsity::ActivationMasker<E> m(spec.cfg.n_layer);
    for (int l = 0; l < spec.cfg.n_layer; ++l)
      for (int i = 0; i < kNumProj; ++i) {
        MaskParams prm;
        prm.rule = i % 2 ? MaskRule::TopK : MaskRule::Guided;
        prm.p = 0.3f + 0.05f * i;
        prm.tau = 0.5f;
        prm.delta = 0.02f;
        m.set(l, static_cast<Proj>(i), prm);
      }
    Engine<E> a(w, 1, 64), b(w, 1, 64);
    b.use_column_skipping(true);
    a.set_masker(&m);
    b.set_masker(&m);
    const auto prompt = token_stream(12, spec.cfg.vocab, 8);
    const auto la = host_rows<E>(CMat<E>(a.forward({prompt}, 0, false)));
    const auto lb = host_rows<E>(CMat<E>(b.forward({prompt}, 0, false)));
    EXPECT_EQ(la, lb);  // prefill is dense in both
    for (int t = 0; t < 4; ++t) {
      const int tok = 5 + 7 * t;
      const auto da = host_rows<E>(CMat<E>(a.forward({{tok}}, 12 + t, false)));
      const auto db = host_rows<E>(CMat<E>(b.forward({{tok}}, 12 + t, false)));
      double err = 0, scale = 0;
      for (std::size_t j = 0; j < da.size(); ++j) {
        err = std::max(err, std::fabs(static_cast<double>(da[j]) - db[j]));
        scale = std::max(scale, std::fabs(static_cast<double>(da[j])));
      }
      EXPECT_LT(err / scale, 1e-5) << to_string(st) << " step " << t;
    }
  }
}

/// Dense block inputs of `seqs` (all sequences of one length), per layer.
template <class E>
std::vector<Mat<E>> block_inputs(std::shared_ptr<const Weights<E>> w,
                                 const std::vector<std::vector<int>>& seqs) {
  const int G = static_cast<int>(seqs.size()), T = static_cast<int>(seqs[0].size());
  Engine<E> eng(w, G, T);
  std::vector<Mat<E>> x(static_cast<std::size_t>(w->cfg.n_layer));
  eng.set_observer([&](int layer, Site site, const CMat<E>& v) {
    if (site != Site::BlockIn) return;
    Mat<E> c("x_in", v.extent(0), v.extent(1));
    Kokkos::deep_copy(c, v);
    x[static_cast<std::size_t>(layer)] = c;
  });
  eng.forward_tail(seqs, 0, 1);
  return x;
}

/// Output of block l run by the engine on x with the given masks on every row.
template <class E>
std::vector<float> engine_block(std::shared_ptr<const Weights<E>> w, int l, const Mat<E>& x, int G,
                                int T, const std::array<MaskParams, kNumProj>& m) {
  Engine<E> eng(w, G, T);
  sparsity::ActivationMasker<E> mk(w->cfg.n_layer);
  for (int i = 0; i < kNumProj; ++i)
    mk.set(l, static_cast<Proj>(i), m[static_cast<std::size_t>(i)]);
  eng.set_masker(&mk);
  eng.set_sparse_from(0);
  Mat<E> work("work", x.extent(0), x.extent(1));
  Kokkos::deep_copy(work, x);
  eng.run_block(l, work, G, T, 0);
  return host_rows<E>(CMat<E>(work));
}

/// ‖a − b‖₂ over the rows t ≥ t0 of each of G sequences of T rows (a: all rows; b: scored rows
/// only when `b_scored`).
double scored_distance(const std::vector<float>& a, const std::vector<float>& b, int G, int T,
                       int t0, int D, bool b_scored) {
  double s = 0;
  for (int q = 0; q < G; ++q)
    for (int t = t0; t < T; ++t)
      for (int j = 0; j < D; ++j) {
        const std::size_t ia = (static_cast<std::size_t>(q) * T + t) * D + j;
        const std::size_t ib =
            b_scored ? (static_cast<std::size_t>(q) * (T - t0) + (t - t0)) * D + j : ia;
        const double d = static_cast<double>(a[ia]) - b[ib];
        s += d * d;
      }
  return std::sqrt(s);
}

// The greedy search's block evaluator (scored rows only, incremental per projection) gives the
// errors and outputs of whole-block engine runs with the same masks, on the plain and on the
// rotated model, through a sequence of committed steps on every projection.
TYPED_TEST(SparsityTest, GreedyBlockMatchesEngineBlockRuns) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(12);
  std::shared_ptr<const Weights<E>> plain =
      load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  std::shared_ptr<const Weights<E>> rotated =
      sparsity::apply_rotation(*plain, sparsity::compute_rotation(*plain), DType::F32);
  const int G = 2, T = 24, t0 = 18, D = spec.cfg.d_model, l = 1;
  const auto stream = token_stream(G * T, spec.cfg.vocab, 31);
  std::vector<std::vector<int>> seqs;
  for (int q = 0; q < G; ++q)
    seqs.emplace_back(stream.begin() + q * T, stream.begin() + (q + 1) * T);
  for (auto w : {plain, rotated}) {
    const auto x = block_inputs<E>(w, seqs);
    sparsity::detail::GreedyBlock<E> gb(*w, l, CMat<E>(x[l]), G, T, t0);
    std::array<MaskParams, kNumProj> committed{};
    const std::vector<float> dense = engine_block<E>(w, l, x[l], G, T, committed);
    const std::vector<float> gdense = host_rows<E>(gb.dense_output());
    EXPECT_LT(
        scored_distance(dense, gdense, G, T, t0, D, true),
        1e-5 * scored_distance(dense, std::vector<float>(dense.size(), 0.f), G, T, t0, D, false));
    // thresholds that drop a growing share of |x|: a few multiples of a small scale
    auto mask = [](int step) {
      MaskParams m;
      m.rule = MaskRule::Threshold;
      m.tau = 0.02f * static_cast<float>(step);
      return m;
    };
    std::array<int, kNumProj> steps{};
    for (int round = 0; round < 9; ++round) {
      for (int i = 0; i < kNumProj; ++i) {
        std::array<MaskParams, kNumProj> m = committed;
        m[static_cast<std::size_t>(i)] = mask(steps[static_cast<std::size_t>(i)] + 1);
        const double ref =
            scored_distance(dense, engine_block<E>(w, l, x[l], G, T, m), G, T, t0, D, false);
        const double got = gb.error(i, m[static_cast<std::size_t>(i)]);
        EXPECT_NEAR(got, ref, 1e-4 * ref + 1e-6)
            << (w->rotated() ? "rotated" : "plain") << " round " << round << " proj " << i;
      }
      // commit each projection in turn, re-evaluating it last so its scratch is current
      const int c = (round * 3) % kNumProj;
      committed[static_cast<std::size_t>(c)] = mask(++steps[static_cast<std::size_t>(c)]);
      (void)gb.error(c, committed[static_cast<std::size_t>(c)]);
      gb.commit(c);
      const std::vector<float> now = engine_block<E>(w, l, x[l], G, T, committed);
      EXPECT_LT(
          scored_distance(now, host_rows<E>(gb.output()), G, T, t0, D, true),
          1e-4 * scored_distance(now, std::vector<float>(now.size(), 0.f), G, T, t0, D, false))
          << "round " << round;
    }
  }
}

// The greedy tables of calibrate_variant (incremental evaluator) equal those of the search with
// whole-block engine runs for every candidate (Algorithm 1 as written).
TYPED_TEST(SparsityTest, GreedyTablesEqualTheWholeBlockSearch) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(13);
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const auto stream = token_stream(1024, spec.cfg.vocab, 17);
  CalibrateOptions opt = small_options();
  opt.alpha = 0.1;
  opt.probes = {0.4};
  opt.sensitivity_from = {0};
  CalibrationVariant var;
  sparsity::calibrate_variant<E>(w, stream, opt, sparsity::ProbeMasking::Threshold, var);
  const int G = opt.greedy_seqs, T = opt.greedy_tokens, D = spec.cfg.d_model;
  const int t0 = T - static_cast<int>(std::lround(T * opt.score_fraction));
  std::vector<std::vector<int>> seqs;
  for (int q = 0; q < G; ++q)
    seqs.emplace_back(stream.begin() + q * T, stream.begin() + (q + 1) * T);
  const auto x = block_inputs<E>(w, seqs);
  for (int l = 0; l < spec.cfg.n_layer; ++l) {
    const std::vector<float> dense = engine_block<E>(w, l, x[l], G, T, {});
    std::vector<double> f;
    for (int i = 0; i < kNumProj; ++i) {
      const auto& m = w->layers[static_cast<std::size_t>(l)].proj(static_cast<Proj>(i));
      f.push_back(static_cast<double>(m.rows) * m.cols);
    }
    const auto ref =
        sparsity::greedy_allocate(f, opt.alpha, opt.cap, [&](const std::vector<double>& p) {
          std::array<MaskParams, kNumProj> m{};
          for (int i = 0; i < kNumProj; ++i) {
            const double pi = p[static_cast<std::size_t>(i)];
            if (pi <= 0) continue;
            m[static_cast<std::size_t>(i)].rule = MaskRule::Threshold;
            m[static_cast<std::size_t>(i)].tau =
                pi >= 1 ? FLT_MAX
                        : static_cast<float>(
                              var
                                  .histograms[static_cast<std::size_t>(l)][static_cast<std::size_t>(
                                      sparsity::histogram_slot(site_of(static_cast<Proj>(i))))]
                                  .threshold(pi));
          }
          return scored_distance(dense, engine_block<E>(w, l, x[l], G, T, m), G, T, t0, D, false);
        });
    EXPECT_EQ(var.greedy[static_cast<std::size_t>(l)].rows, ref.rows) << "layer " << l;
  }
}

/// Wraps the masker and records every mask the engine applies: per call, per masked projection,
/// the kept entries of each row (dense rows: all of them).
template <class E>
class RecordingMasker final : public ProjectionMasker<E> {
 public:
  struct Use {
    int call, layer;
    Proj proj;
    int d;
    std::vector<char> sparse;            ///< per row: masked (1) or copied (0)
    std::vector<std::vector<int>> kept;  ///< per row: kept indices with x_j != 0
    std::vector<int> kept_count;         ///< per row: kept entries
  };
  explicit RecordingMasker(sparsity::ActivationMasker<E>& in) : in_(in) {}
  bool active(int layer, Proj p) const override { return in_.active(layer, p); }
  void begin_call(int n) override {
    in_.begin_call(n);
    rows.push_back(n);
  }
  CMat<E> apply(const E& ex, int layer, Proj p, const CMat<E>& x, const SparseRows<E>& r,
                int& ticket) override {
    const CMat<E> y = in_.apply(ex, layer, p, x, r, ticket);
    ex.fence();
    const auto hx = host_rows<E>(x), hy = host_rows<E>(y);
    const int n = static_cast<int>(x.extent(0)), d = static_cast<int>(x.extent(1));
    Use u{static_cast<int>(rows.size()) - 1, layer, p, d, {}, {}, {}};
    for (int q = 0; q < n; ++q) {
      const bool sp = r.flags.extent(0) == 0 || r.host_flags(q);
      u.sparse.push_back(sp ? 1 : 0);
      std::vector<int> k;
      int cnt = 0;
      for (int j = 0; j < d; ++j) {
        const std::size_t e = static_cast<std::size_t>(q) * d + j;
        if (hy[e] != 0.0f) ++cnt;
        if (hy[e] != 0.0f && hx[e] != 0.0f) k.push_back(j);
      }
      u.kept.push_back(k);
      u.kept_count.push_back(sp ? cnt : d);
    }
    uses.push_back(std::move(u));
    return y;
  }
  IVec<E> indices(const E& ex, int layer, Proj p, const CMat<E>& x, const IVec<E>& idx,
                  const Vec<E>& xm, int& ticket) override {
    const IVec<E> cnt = in_.indices(ex, layer, p, x, idx, xm, ticket);
    ex.fence();
    const auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cnt);
    const auto hi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), idx);
    const auto hx = host_rows<E>(x);
    Use u{static_cast<int>(rows.size()) - 1,
          layer,
          p,
          static_cast<int>(x.extent(1)),
          {1},
          {},
          {hc(0)}};
    std::vector<int> k;
    for (int i = 0; i < hc(0); ++i)
      if (hx[static_cast<std::size_t>(hi(i))] != 0.0f) k.push_back(hi(i));
    u.kept.push_back(k);
    uses.push_back(std::move(u));
    return cnt;
  }
  void end_call(const E& ex) override { in_.end_call(ex); }
  long long kept(int ticket) const override { return in_.kept(ticket); }

  std::vector<int> rows;  ///< rows of each forward call
  std::vector<Use> uses;

 private:
  sparsity::ActivationMasker<E>& in_;
};

/// A masker configured for `rule` on every projection of every layer (scores with column norms
/// on k and gate), thresholds from a few tokens' activations of each site.
template <class E>
void configure_all(sparsity::ActivationMasker<E>& m, const Weights<E>& w, MaskRule rule) {
  const E exec;
  for (int l = 0; l < w.cfg.n_layer; ++l)
    for (int i = 0; i < kNumProj; ++i) {
      const Proj p = static_cast<Proj>(i);
      MaskParams prm;
      prm.rule = rule;
      prm.p = 0.3f + 0.05f * static_cast<float>(i);
      prm.tau = 0.05f + 0.01f * static_cast<float>(i);
      prm.delta = rule == MaskRule::Guided ? 0.05f : 0.0f;
      CVec<E> norms;
      if (rule != MaskRule::Threshold && sparsity::wina_uses_norms(p, false))
        norms = sparsity::column_norms(exec, w.layers[static_cast<std::size_t>(l)].proj(p));
      const auto& wm = w.layers[static_cast<std::size_t>(l)].proj(p);
      m.set(l, p, prm, norms, wm.rows, wm.cols);
    }
}

// A window scored teacher-forced (all its tokens in one call, the scored rows masked) gives the
// logits and the masks of decoding its scored tokens one by one after a dense prefill: for
// TEAL's thresholds, WINA's TopK and TopK-Guided, on the plain and the rotated model, through
// the masked dense kernels and through the column-skipping GEMV.
TYPED_TEST(SparsityTest, TeacherForcedRowsEqualTokenByTokenDecode) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(14);
  std::shared_ptr<const Weights<E>> plain =
      load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  std::shared_ptr<const Weights<E>> rotated =
      sparsity::apply_rotation(*plain, sparsity::compute_rotation(*plain), DType::F32);
  const int N = 20, t0 = 12;
  const auto toks = token_stream(N, spec.cfg.vocab, 41);
  for (auto w : {plain, rotated})
    for (MaskRule rule : {MaskRule::Threshold, MaskRule::TopK, MaskRule::Guided})
      for (bool skipping : {false, true}) {
        const std::string tag = std::string(w->rotated() ? "rotated" : "plain") + " rule " +
                                std::to_string(static_cast<int>(rule)) +
                                (skipping ? " column skipping" : " masked dense");
        sparsity::ActivationMasker<E> ma(spec.cfg.n_layer), mb(spec.cfg.n_layer);
        configure_all(ma, *w, rule);
        configure_all(mb, *w, rule);
        RecordingMasker<E> ra(ma), rb(mb);
        Engine<E> a(w, 1, N), b(w, 1, N);
        a.set_masker(&ra);
        a.set_sparse_from(t0);
        const auto la = host_rows<E>(CMat<E>(a.forward_tail({toks}, 0, N - t0)));
        b.set_masker(&rb);
        if (skipping) b.use_column_skipping(true);
        b.forward({std::vector<int>(toks.begin(), toks.begin() + t0)}, 0, false);
        std::vector<float> lb;
        for (int t = t0; t < N; ++t) {
          const auto step =
              host_rows<E>(CMat<E>(b.forward({{toks[static_cast<std::size_t>(t)]}}, t, false)));
          lb.insert(lb.end(), step.begin(), step.end());
        }
        ASSERT_EQ(la.size(), lb.size());
        double err = 0, scale = 0;
        for (std::size_t j = 0; j < la.size(); ++j) {
          err = std::max(err, std::fabs(static_cast<double>(la[j]) - lb[j]));
          scale = std::max(scale, std::fabs(static_cast<double>(la[j])));
        }
        EXPECT_LE(err / scale, 1e-5) << tag;
        // the masks: teacher-forced row t of (layer, proj) against decode step t
        std::map<std::tuple<int, int, int>, std::vector<int>> ma_rows, mb_rows;
        for (const auto& u : ra.uses)
          for (int q = 0; q < static_cast<int>(u.sparse.size()); ++q)
            if (u.sparse[static_cast<std::size_t>(q)])
              ma_rows[{q, u.layer, static_cast<int>(u.proj)}] = u.kept[static_cast<std::size_t>(q)];
        for (const auto& u : rb.uses)
          if (u.call >= 1)  // decode steps (call 0 is the dense prefill)
            mb_rows[{t0 + u.call - 1, u.layer, static_cast<int>(u.proj)}] = u.kept[0];
        EXPECT_EQ(ma_rows.size(), static_cast<std::size_t>((N - t0) * spec.cfg.n_layer * kNumProj))
            << tag;
        EXPECT_TRUE(ma_rows == mb_rows) << tag;
        // and the per-token statistics the maskers keep
        for (int l = 0; l < spec.cfg.n_layer; ++l)
          for (int i = 0; i < kNumProj; ++i) {
            EXPECT_EQ(ma.stats(l, static_cast<Proj>(i)).kept,
                      mb.stats(l, static_cast<Proj>(i)).kept)
                << tag;
            EXPECT_EQ(ma.stats(l, static_cast<Proj>(i)).tokens, static_cast<std::uint64_t>(N - t0))
                << tag;
          }
      }
}

// The ledger's realised FLOPs of masked projections, their mask selection and the online
// re-rotation equal a count made independently from the masks the engine applied: per call,
// 2·out·(Σ kept entries of masked rows + d per copied row), unmasked projections dense,
// 2·2·n·D² per block for the re-rotation.
TYPED_TEST(SparsityTest, LedgerEqualsCountFromRecordedMasks) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(15);
  auto plain = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  std::shared_ptr<const Weights<E>> w =
      sparsity::apply_rotation(*plain, sparsity::compute_rotation(*plain), DType::F32);
  const Config& c = spec.cfg;
  const int N = 24, t0 = 16, D = c.d_model;
  const auto toks = token_stream(N, c.vocab, 43);
  for (bool skipping : {false, true}) {
    sparsity::ActivationMasker<E> m(c.n_layer);
    configure_all(m, *w, MaskRule::Guided);
    for (int l = 0; l < c.n_layer; ++l) m.set(l, Proj::V, MaskParams{});  // one unmasked
    RecordingMasker<E> rec(m);
    flops::Ledger ledger(c.n_layer);
    Engine<E> eng(w, 1, N + 4, &ledger);
    if (skipping) eng.use_column_skipping(true);
    eng.set_masker(&rec);
    eng.set_sparse_from(t0);
    eng.forward_tail({toks}, 0, N - t0);  // a window: rows t >= t0 masked
    eng.set_sparse_from(Engine<E>::kDecodeOnly);
    for (int s = 0; s < 4; ++s) eng.forward({{toks[static_cast<std::size_t>(s)]}}, N + s, false);

    std::array<double, kNumProj> fl{}, sel{};
    double rot = 0;
    for (std::size_t call = 0; call < rec.rows.size(); ++call) {
      const double n = rec.rows[call];
      rot += static_cast<double>(c.n_layer) * 2 * (2.0 * n * D * D);
      for (int l = 0; l < c.n_layer; ++l)
        for (int i = 0; i < kNumProj; ++i) {
          const auto& wm = w->layers[static_cast<std::size_t>(l)].proj(static_cast<Proj>(i));
          if (!m.active(l, static_cast<Proj>(i)))
            fl[static_cast<std::size_t>(i)] += 2.0 * n * wm.rows * wm.cols;
        }
    }
    for (const auto& u : rec.uses) {
      const auto& wm = w->layers[static_cast<std::size_t>(u.layer)].proj(u.proj);
      double kept = 0, masked_rows = 0;
      for (std::size_t q = 0; q < u.kept_count.size(); ++q) {
        kept += u.kept_count[q];
        masked_rows += u.sparse[q];
      }
      fl[static_cast<std::size_t>(u.proj)] += 2.0 * wm.rows * kept;
      sel[static_cast<std::size_t>(u.proj)] += masked_rows * u.d;
    }
    double sel_all = 0;
    for (int i = 0; i < kNumProj; ++i) {
      const flops::Op op = static_cast<flops::Op>(static_cast<int>(flops::Op::QProj) + i);
      EXPECT_NEAR(ledger.by_op(op).flops_realised, fl[static_cast<std::size_t>(i)],
                  1e-12 * fl[static_cast<std::size_t>(i)])
          << proj_name(static_cast<Proj>(i)) << (skipping ? " skipping" : "");
      sel_all += sel[static_cast<std::size_t>(i)];
    }
    EXPECT_NEAR(ledger.by_op(flops::Op::MaskSelect).flops_realised, sel_all, 1e-12 * sel_all);
    EXPECT_NEAR(ledger.by_op(flops::Op::Rotation).flops_realised, rot, 1e-12 * rot);
    EXPECT_EQ(ledger.by_op(flops::Op::Rotation).flops_dense, 0.0);
    EXPECT_GT(rec.uses.size(), 0u);
  }
}

}  // namespace
}  // namespace sparsim::test
