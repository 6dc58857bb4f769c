// Activation sparsity inside the engine: calibration statistics against brute force, the
// realised sparsity of each masking rule, and the column-skipping decode path.
#include "backends.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "model/loader.hpp"
#include "sparsity/calibrate.hpp"
#include "sparsity/plan.hpp"

#include <cmath>

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
// i's output as the input of block i + 1.
TYPED_TEST(SparsityTest, SensitivityMatchesBruteForce) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = three_layer_spec();
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const auto stream = token_stream(1024, spec.cfg.vocab, 5);
  const CalibrateOptions opt = small_options();
  CalibrationVariant var;
  sparsity::calibrate_variant<E>(w, stream, opt, sparsity::ProbeMasking::Threshold, var);
  ASSERT_EQ(var.sensitivity.size(), opt.probes.size());

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
        const double pi = row[static_cast<std::size_t>(i) + 1];
        if (pi <= 0) continue;
        const auto& h =
            var.histograms[static_cast<std::size_t>(l)]
                          [static_cast<std::size_t>(sparsity::histogram_slot(site_of(p)))];
        MaskParams prm;
        prm.rule = MaskRule::Threshold;
        prm.tau = pi >= 1 ? 3.0e38f : static_cast<float>(h.threshold(pi));
        m.set(l, p, prm);
      }
      eng.set_masker(&m);
      eng.set_sparse_from(0);
      eng.forward_tail(seqs, 0, 1);
      double e = 0;
      for (int s = 0; s < G; ++s) {
        double num = 0, den = 0;
        for (int j = s * T * D; j < (s + 1) * T * D; ++j) {
          num +=
              (static_cast<double>(dense[j]) - out[j]) * (static_cast<double>(dense[j]) - out[j]);
          den += static_cast<double>(dense[j]) * dense[j];
        }
        e += std::sqrt(num) / (std::sqrt(den) + 1e-6);
      }
      e /= G;
      EXPECT_NEAR(var.sensitivity[k][static_cast<std::size_t>(l)], e, 1e-4 * e + 1e-7)
          << "layer " << l << " probe " << opt.probes[k];
      EXPECT_GT(e, 0.0);
    }
  // Sensitivity grows with the probe level.
  for (int l = 0; l < spec.cfg.n_layer; ++l)
    EXPECT_LT(var.sensitivity.front()[static_cast<std::size_t>(l)],
              var.sensitivity.back()[static_cast<std::size_t>(l)]);
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
  const CalibrateOptions opt = small_options();
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
        }
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

}  // namespace
}  // namespace sparsim::test
