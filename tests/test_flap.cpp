// FLAP: the running moments and the scores against a direct computation from the dense model's
// own activations, the bias compensation giving the dense layer's mean output on the calibration
// tokens, the structurally pruned model against the dense one with the same heads and channels
// zeroed plus the biases (prefill and decode), the pruned GGUF round trip, the command end to
// end and its bad input.
#include "backends.hpp"
#include "cli_fixture.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "model/loader.hpp"
#include "transforms/flap.hpp"
#include "transforms/pruned_gguf.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

namespace sparsim::test {
namespace {

using pruning::FlapScores;
using pruning::FlapStats;
using pruning::PruneMethod;
using pruning::PruneOptions;

std::vector<std::vector<int>> windows(const Config& c, int n, int T, int seed) {
  std::vector<std::vector<int>> w(static_cast<std::size_t>(n));
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < T; ++t) w[s].push_back(3 + (t * 37 + s * 91 + seed * 13) % (c.vocab - 3));
  return w;
}

/// Every row the dense model feeds W_o and W_down over the windows, [layer] → rows × width.
template <class E>
struct Inputs {
  std::vector<std::vector<double>> o, down;
  std::int64_t rows = 0;
};
template <class E>
Inputs<E> dense_inputs(std::shared_ptr<const Weights<E>> w,
                       const std::vector<std::vector<int>>& wins) {
  const Config& c = w->cfg;
  Inputs<E> in;
  in.o.resize(c.n_layer);
  in.down.resize(c.n_layer);
  Engine<E> eng(w, 1, static_cast<int>(wins[0].size()));
  eng.set_observer([&](int layer, Site site, const CMat<E>& x) {
    if (site != Site::O && site != Site::Down) return;
    std::vector<float> h(x.extent(0) * x.extent(1));
    Kokkos::View<float**, Layout, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> hv(
        h.data(), x.extent(0), x.extent(1));
    Kokkos::deep_copy(hv, x);
    auto& dst = site == Site::O ? in.o[layer] : in.down[layer];
    dst.insert(dst.end(), h.begin(), h.end());
  });
  for (const auto& win : wins) eng.forward_tail({win}, 0, 1);
  in.rows = static_cast<std::int64_t>(in.o[0].size() / c.q_dim());
  return in;
}

/// Host values of a weight matrix stored in fp32.
template <class E>
std::vector<double> values(const Matrix<E>& m) {
  const std::vector<float> v = to_host(m.f32);
  return std::vector<double>(v.begin(), v.end());
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / scale;
}

PruneOptions flap_options(double ratio) {
  PruneOptions o;
  o.method = PruneMethod::Flap;
  o.ratio = ratio;
  o.source_fingerprint = "0123456789abcdef";
  o.calibration = "test windows";
  return o;
}

TEST(Flap, RunningMomentsEqualTwoPassMoments) {
  const int d = 7;
  SynthRng r(3);
  std::vector<float> x(static_cast<std::size_t>(50) * d);
  for (float& v : x) v = static_cast<float>(3.0 + 2.0 * r.normal());
  pruning::ChannelMoments m(d);
  m.add(x.data(), 11);
  m.add(x.data() + 11 * d, 1);
  m.add(x.data() + 12 * d, 38);
  ASSERT_EQ(m.count(), 50);
  const std::vector<double> var = m.variance();
  for (int c = 0; c < d; ++c) {
    double mean = 0, v = 0;
    for (int i = 0; i < 50; ++i) mean += x[static_cast<std::size_t>(i) * d + c];
    mean /= 50;
    for (int i = 0; i < 50; ++i) {
      const double e = x[static_cast<std::size_t>(i) * d + c] - mean;
      v += e * e;
    }
    EXPECT_NEAR(m.mean()[c], mean, 1e-12);
    EXPECT_NEAR(var[c], v / 50, 1e-10);
  }
}

TEST(Flap, BadOptionsAreNamed) {
  for (double ratio : {0.0, 1.0, -0.2, 1.5, std::nan("")}) {
    try {
      flap_options(ratio).validate();
      ADD_FAILURE() << ratio;
    } catch (const OptionError& e) {  // the command line says "--ratio must be in (0, 1)"
      EXPECT_EQ(e.key(), "prune.ratio");
      EXPECT_NE(std::string(e.what()).find("FLAP's pruning ratio must be in (0, 1)"),
                std::string::npos)
          << e.what();
    }
  }
  flap_options(0.5).validate();
}

template <class E>
class FlapModel : public ::testing::Test {};
TYPED_TEST_SUITE(FlapModel, Backends, BackendName);

// Scores from the dense model's own activations and weights, computed here directly: WIFV
// (squared for W_o), standardised per layer and module, heads averaged over their group.
TYPED_TEST(FlapModel, ScoresMatchDirectComputation) {
  using E = TypeParam;
  TempDir dir;
  for (bool mha : {false, true}) {
    SynthSpec spec = tiny_spec(51);
    if (mha) spec.cfg.n_kv_head = spec.cfg.n_head;
    std::shared_ptr<const Weights<E>> w =
        load_model<E>(make_model(dir, mha ? "mha.gguf" : "m.gguf", spec), LoadOptions{});
    const Config& c = w->cfg;
    const auto wins = windows(c, 3, 20, 1);
    const FlapStats st = pruning::flap_statistics<E>(w, wins);
    const FlapScores sc = pruning::flap_scores(*w, st);
    const Inputs<E> in = dense_inputs<E>(w, wins);
    ASSERT_EQ(st.tokens, in.rows);
    const int group = c.n_head / c.n_kv_head, Q = c.q_dim(), F = c.d_ff, D = c.head_dim;
    EXPECT_EQ(sc.units, c.n_kv_head);
    EXPECT_DOUBLE_EQ(sc.unit_weight, (2.0 * group + 2) * D / 3);
    for (int l = 0; l < c.n_layer; ++l) {
      auto direct = [&](const std::vector<double>& x, const std::vector<double>& wt, int cols,
                        bool square) {
        std::vector<double> s(static_cast<std::size_t>(cols));
        const std::int64_t n = in.rows;
        for (int j = 0; j < cols; ++j) {
          double mean = 0, var = 0, norm = 0;
          for (std::int64_t t = 0; t < n; ++t) mean += x[t * cols + j];
          mean /= static_cast<double>(n);
          for (std::int64_t t = 0; t < n; ++t)
            var += (x[t * cols + j] - mean) * (x[t * cols + j] - mean);
          var /= static_cast<double>(n);
          for (int r = 0; r < c.d_model; ++r)
            norm += wt[static_cast<std::size_t>(r) * cols + j] *
                    wt[static_cast<std::size_t>(r) * cols + j];
          s[j] = square ? (var * norm) * (var * norm) : var * norm;
        }
        double m = 0, sd = 0;
        for (double v : s) m += v;
        m /= cols;
        for (double v : s) sd += (v - m) * (v - m);
        sd = std::sqrt(sd / (cols - 1));
        for (double& v : s) v = (v - m) / sd;
        return s;
      };
      const auto zo = direct(in.o[l], values(w->layers[l].wo), Q, true);
      const auto zf = direct(in.down[l], values(w->layers[l].w_down), F, false);
      for (int j = 0; j < F; ++j)
        EXPECT_NEAR(sc.ffn[static_cast<std::size_t>(l) * F + j], zf[j], 1e-6) << l << " " << j;
      for (int u = 0; u < c.n_kv_head; ++u) {
        double m = 0;
        for (int i = 0; i < group * D; ++i) m += zo[u * group * D + i];
        EXPECT_NEAR(sc.unit[static_cast<std::size_t>(l) * c.n_kv_head + u], m / (group * D), 1e-6)
            << "mha " << mha << " layer " << l << " unit " << u;
      }
    }
  }
}

// The kept structure: the global ranking's best units up to the parameter ratio, every layer
// keeping something; the removed share of the block parameters close to the ratio.
TYPED_TEST(FlapModel, StructureSearchMeetsTheRatio) {
  using E = TypeParam;
  TempDir dir;
  SynthSpec spec = tiny_spec(52);
  spec.cfg.n_layer = 4;
  spec.cfg.n_kv_head = spec.cfg.n_head;  // units of one head: a fine-grained budget
  std::shared_ptr<const Weights<E>> w =
      load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const Config& c = w->cfg;
  const FlapStats st = pruning::flap_statistics<E>(w, windows(c, 2, 24, 2));
  const FlapScores sc = pruning::flap_scores(*w, st);
  for (double ratio : {0.2, 0.5}) {
    const Config p = pruning::plan_flap(c, sc, flap_options(ratio));
    ASSERT_TRUE(p.structured());
    const pruning::FlapReport rep = pruning::flap_report(c, p, ratio);
    // within two attention units' weight of the target (the unit at the cut is removed)
    const double total = c.n_layer * (c.n_kv_head * sc.unit_weight + c.d_ff);
    EXPECT_NEAR(rep.ratio_realised, ratio, 2 * sc.unit_weight / total) << ratio;
    EXPECT_EQ(p.prune.method, "flap");
    // every kept unit scores at least as well as every removed one
    double worst_kept = 1e300, best_removed = -1e300;
    for (int l = 0; l < c.n_layer; ++l) {
      const auto& st2 = p.structure[l];
      for (int u = 0; u < c.n_kv_head; ++u) {
        const bool kept = std::find(st2.q_heads.begin(), st2.q_heads.end(), u) != st2.q_heads.end();
        const double s = sc.unit[static_cast<std::size_t>(l) * c.n_kv_head + u];
        (kept ? worst_kept : best_removed) =
            kept ? std::min(worst_kept, s) : std::max(best_removed, s);
      }
      for (int f = 0; f < c.d_ff; ++f) {
        const bool kept = std::binary_search(st2.ffn.begin(), st2.ffn.end(), f);
        const double s = sc.ffn[static_cast<std::size_t>(l) * c.d_ff + f];
        (kept ? worst_kept : best_removed) =
            kept ? std::min(worst_kept, s) : std::max(best_removed, s);
      }
    }
    EXPECT_GE(worst_kept, best_removed) << ratio;
  }
}

// W_o and W_down of the pruned layer plus the bias give, averaged over the calibration tokens,
// the dense projections' mean output.
TYPED_TEST(FlapModel, BiasGivesTheDenseMeanOutput) {
  using E = TypeParam;
  TempDir dir;
  std::shared_ptr<const Weights<E>> w =
      load_model<E>(make_model(dir, "m.gguf", tiny_spec(53)), LoadOptions{});
  const Config& c = w->cfg;
  const auto wins = windows(c, 3, 16, 3);
  const FlapStats st = pruning::flap_statistics<E>(w, wins);
  const Config p = pruning::plan_flap(c, pruning::flap_scores(*w, st), flap_options(0.4));
  const pruning::OutputBiases b = pruning::flap_biases(*w, p, st);
  const Inputs<E> in = dense_inputs<E>(w, wins);
  const int d = c.d_model, D = c.head_dim;
  for (int l = 0; l < c.n_layer; ++l) {
    auto check = [&](const std::vector<double>& x, const std::vector<double>& wt, int cols,
                     const std::vector<int>& kept, const std::vector<float>& bias,
                     const char* what) {
      std::vector<char> on(static_cast<std::size_t>(cols), 0);
      for (int k : kept) on[k] = 1;
      double err = 0, scale = 0;
      for (int r = 0; r < d; ++r) {
        double dense = 0, pruned = 0;
        for (std::int64_t t = 0; t < in.rows; ++t)
          for (int j = 0; j < cols; ++j) {
            const double y = wt[static_cast<std::size_t>(r) * cols + j] * x[t * cols + j];
            dense += y;
            if (on[j]) pruned += y;
          }
        dense /= static_cast<double>(in.rows);
        pruned = pruned / static_cast<double>(in.rows) + bias[r];
        err = std::max(err, std::fabs(dense - pruned));
        scale = std::max(scale, std::fabs(dense));
      }
      EXPECT_LE(err, 1e-5 * scale) << what << " layer " << l;
    };
    std::vector<int> oc;
    for (int h : p.structure[l].q_heads)
      for (int i = 0; i < D; ++i) oc.push_back(h * D + i);
    check(in.o[l], values(w->layers[l].wo), c.q_dim(), oc, b.o[l], "W_o");
    check(in.down[l], values(w->layers[l].w_down), c.d_ff, p.structure[l].ffn, b.down[l], "W_down");
  }
}

/// The dense model with the removed heads' W_o columns and the removed channels' W_down columns
/// zeroed, and the biases added to those projections' outputs.
template <class E>
std::shared_ptr<Weights<E>> zeroed(const Weights<E>& full, const Config& p,
                                   const pruning::OutputBiases& b) {
  auto out = std::make_shared<Weights<E>>(full);
  const int D = full.cfg.head_dim;
  for (int l = 0; l < full.cfg.n_layer; ++l) {
    auto& lw = out->layers[l];
    for (int which = 0; which < 2; ++which) {
      const Matrix<E>& src = which == 0 ? lw.wo : lw.w_down;
      std::vector<char> keep(static_cast<std::size_t>(src.cols), 0);
      if (which == 0) {
        for (int h : p.structure[l].q_heads)
          for (int i = 0; i < D; ++i) keep[h * D + i] = 1;
      } else {
        for (int f : p.structure[l].ffn) keep[f] = 1;
      }
      Matrix<E> m = src;
      m.f32 = decltype(m.f32)("zeroed", src.rows, src.cols);
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), src.f32);
      for (int r = 0; r < src.rows; ++r)
        for (int j = 0; j < src.cols; ++j)
          if (!keep[j]) h(r, j) = 0;
      Kokkos::deep_copy(m.f32, h);
      (which == 0 ? lw.wo : lw.w_down) = m;
    }
    for (int which = 0; which < 2; ++which) {
      const std::vector<float>& x = which == 0 ? b.o[l] : b.down[l];
      Kokkos::View<float*, DeviceOf<E>> v("bias", x.size());
      auto h = Kokkos::create_mirror_view(v);
      for (std::size_t i = 0; i < x.size(); ++i) h(i) = x[i];
      Kokkos::deep_copy(v, h);
      (which == 0 ? lw.o_bias : lw.down_bias) = v;
    }
  }
  return out;
}

// The reduced model (in memory and read back from its GGUF) gives the logits of the dense model
// with the same heads and channels zeroed plus the biases: prefill, then decode steps, two
// sequences, op-by-op and device path; its KV cache and ledger are the reduced ones.
TYPED_TEST(FlapModel, PrunedEqualsDenseWithZeroedHeadsPlusBiases) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(54));
  std::shared_ptr<const Weights<E>> w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const FlapStats st = pruning::flap_statistics<E>(w, windows(c, 2, 24, 4));
  const Config p = pruning::plan_flap(c, pruning::flap_scores(*w, st), flap_options(0.45));
  const pruning::OutputBiases b = pruning::flap_biases(*w, p, st);
  const std::string out = dir.file("flap.gguf");
  pruning::write_pruned_gguf(path, p, out, {}, &b);
  std::shared_ptr<const Weights<E>> mem = pruning::fuse_structured(*w, p, b);
  std::shared_ptr<const Weights<E>> file = load_model<E>(out, LoadOptions{});
  std::shared_ptr<const Weights<E>> ref = zeroed(*w, p, b);
  bool fewer_kv = false;
  for (int l = 0; l < c.n_layer; ++l) fewer_kv |= p.n_kv_head_at(l) < c.n_kv_head;
  for (const auto& pruned : {mem, file})
    for (bool device : {false, true}) {
      flops::Ledger la(c.n_layer), lr(c.n_layer);
      Engine<E> a(pruned, 2, 40, &la), r(ref, 2, 40, &lr);
      a.set_device_path(device);
      r.set_device_path(device);
      std::vector<std::vector<int>> pr(2);
      for (int s = 0; s < 2; ++s)
        for (int t = 0; t < 16; ++t) pr[s].push_back(3 + (t * 41 + s * 87) % (c.vocab - 3));
      EXPECT_LE(max_rel(to_host(a.forward(pr, 0, true)), to_host(r.forward(pr, 0, true))), 1e-5)
          << "device " << device;
      for (int step = 0; step < 4; ++step) {
        const std::vector<std::vector<int>> next = {{4 + step * 11}, {7 + step * 19}};
        EXPECT_LE(max_rel(to_host(a.forward(next, 16 + step, false)),
                          to_host(r.forward(next, 16 + step, false))),
                  1e-5)
            << "device " << device << " step " << step;
      }
      // the reduced shapes are what ran and what the ledger counts
      EXPECT_LT(la.by_op(flops::Op::DownProj).flops_realised,
                lr.by_op(flops::Op::DownProj).flops_realised);
      EXPECT_LT(la.by_op(flops::Op::OProj).flops_realised,
                lr.by_op(flops::Op::OProj).flops_realised);
      EXPECT_LT(la.by_op(flops::Op::SwiGLU).flops_realised,
                lr.by_op(flops::Op::SwiGLU).flops_realised);
      if (fewer_kv) {
        EXPECT_LT(a.cache().bytes(), r.cache().bytes());
      }
    }
}

// Written as a GGUF and read back: the same structure and record, bitwise the same logits as the
// reduced model in memory; a layout that contradicts the tensors is named.
TYPED_TEST(FlapModel, GgufRoundTrip) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(55));
  std::shared_ptr<const Weights<E>> w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const FlapStats st = pruning::flap_statistics<E>(w, windows(c, 2, 16, 5));
  const Config p = pruning::plan_flap(c, pruning::flap_scores(*w, st), flap_options(0.3));
  const pruning::OutputBiases b = pruning::flap_biases(*w, p, st);
  const std::string out = dir.file("flap.gguf");
  pruning::write_pruned_gguf(path, p, out, {}, &b);
  auto back = load_model<E>(out, LoadOptions{});
  const Config& q = back->cfg;
  ASSERT_TRUE(q.structured());
  EXPECT_EQ(q.prune.method, "flap");
  EXPECT_EQ(q.prune.recipe, p.prune.recipe);
  EXPECT_DOUBLE_EQ(q.prune.retain, p.prune.retain);
  for (int l = 0; l < c.n_layer; ++l) {
    EXPECT_EQ(q.structure[l].q_heads, p.structure[l].q_heads);
    EXPECT_EQ(q.structure[l].ffn, p.structure[l].ffn);
    EXPECT_EQ(to_host(back->layers[l].o_bias), b.o[l]);
    EXPECT_EQ(to_host(back->layers[l].down_bias), b.down[l]);
  }
  EXPECT_EQ(q.n_params(), p.n_params());
  EXPECT_LT(q.n_params(), c.n_params());
  auto mem = pruning::fuse_structured(*w, p, b);
  std::vector<int> tok = {3, 8, 13, 21, 34, 55, 89};
  Engine<E> e1(mem, 1, 16), e2(back, 1, 16);
  EXPECT_EQ(to_host(e1.forward({tok}, 0, false)), to_host(e2.forward({tok}, 0, false)));

  // a head list that contradicts the tensors: the loader names the tensor and the layout
  const std::string bad = dir.file("bad.gguf");
  rewrite_gguf(out, bad, [&](std::vector<gguf::KeyValue>& kv, std::vector<TensorCopy>&) {
    for (auto& e : kv)
      if (e.key == "sparsim.structure.ffn_length_per_layer") {
        std::vector<std::uint32_t> fw;
        for (int l = 0; l < c.n_layer; ++l)
          fw.push_back(static_cast<std::uint32_t>(p.d_ff_at(l)) - (l == 0 ? 1 : 0));
        e.value = gguf::Value::array_u32(fw);
      }
  });
  try {
    load_model<E>(bad, LoadOptions{});
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("structural layout"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// The command

class FlapCli : public TinyModelCli<FlapCli> {
 protected:
  static void SetUpTestSuite() { make_tiny({56, 5, 3000, 9}); }
  static std::string prune(const std::string& ratio, const std::string& out,
                           const std::string& extra = "") {
    return on_tiny("prune --method flap",
                   "--ratio " + ratio + " --flap-windows 4 --flap-tokens 48 --out " + out, extra);
  }
};

TEST_F(FlapCli, PrunesAndEveryCommandRunsTheModel) {
  const std::string out = dir_->file("flap.gguf"), js = dir_->file("flap.json");
  const RunResult r = run_cmd(prune("0.3", out, "--json " + js));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pruned flap"), std::string::npos) << r.output;
  const auto j = read_json(js);
  EXPECT_EQ(j.at("method"), "flap");
  EXPECT_DOUBLE_EQ(j.at("ratio").get<double>(), 0.3);
  EXPECT_NEAR(j.at("ratio_realised").get<double>(), 0.3, 0.1);
  EXPECT_LT(j.at("n_params").get<double>(), j.at("n_params_full").get<double>());
  EXPECT_EQ(j.at("calibration").at("tokens").get<int>(), 4 * 48);
  EXPECT_EQ(j.at("layers").size(), 2u);

  const std::string ejs = dir_->file("eval.json");
  const RunResult e = run_cmd(eval_of(out, "--json " + ejs));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_TRUE(std::isfinite(read_json(ejs).at("perplexity").get<double>()));
  const RunResult g = run_cmd(generate_of(out));
  EXPECT_EQ(g.exit_code, 0) << g.output;
  const RunResult b =
      run_cmd(sparsim_bin() + " bench --model " + out + " --prompt 16 --decode 4 --reps 1");
  EXPECT_EQ(b.exit_code, 0) << b.output;
  const RunResult i = run_cmd(sparsim_bin() + " inspect " + out);
  ASSERT_EQ(i.exit_code, 0) << i.output;
  EXPECT_NE(i.output.find("structured flap"), std::string::npos) << i.output;
}

TEST_F(FlapCli, BadInputIsNamedAndWritesNothing) {
  const std::string out = dir_->file("bad.gguf");
  const std::string tiny = write_short_corpus();
  const BadCases cases = {
      {prune("0", out), "--ratio must be in (0, 1)"},
      {prune("1", out), "--ratio must be in (0, 1)"},
      {prune("1.5", out), "--ratio must be in (0, 1)"},
      {prune("0.3", out, "--retain 0.5"), "--retain applies to K/V channel pruning"},
      {sparsim_bin() + " prune --method flap --model " + model_ + " --corpus " + tiny +
           " --ratio 0.3 --out " + out,
       "need"},
      {prune("0.97", out), "removes every"},
  };
  expect_each_fails(cases, {out});
}

}  // namespace
}  // namespace sparsim::test
