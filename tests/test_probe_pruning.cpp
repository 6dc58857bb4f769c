// Probe Pruning: the probe size, kept counts and top-k by hand; bad options refused; ratio 0
// bitwise dense; probe rows, statistics, scores and kept sets against a direct computation on a
// tiny model; the pruned run against the model with those heads and channels zeroed by hand.
#include "backends.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "model/loader.hpp"
#include "policies/probe_pruning.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

namespace sparsim::test {
namespace {

using pruning::ProbePruner;
using pruning::ProbePruningOptions;

template <class E>
class ProbePruningTest : public ::testing::Test {};
TYPED_TEST_SUITE(ProbePruningTest, Backends, BackendName);

TEST(ProbePruningMaths, ProbeSizeKeptCountsAndTopK) {
  EXPECT_EQ(pruning::probe_rows(100, 0.05), 5);
  EXPECT_EQ(pruning::probe_rows(101, 0.05), 6);
  EXPECT_EQ(pruning::probe_rows(10, 0.05), 2);  // at least two rows
  EXPECT_EQ(pruning::probe_rows(1, 0.05), 1);
  EXPECT_EQ(pruning::probe_rows(8, 1.0), 8);
  EXPECT_EQ(pruning::kept_units(3, 0.5), 2);  // round(1.5)
  EXPECT_EQ(pruning::kept_units(3, 0.2), 2);  // round(2.4)
  EXPECT_EQ(pruning::kept_units(3, 0.9), 1);  // at least one
  EXPECT_EQ(pruning::kept_units(1536, 0.5), 768);
  EXPECT_EQ(pruning::kept_units(4, 0.0), 4);
  const std::vector<double> v = {0.5, 3.0, 1.0, 3.0, -1.0};
  EXPECT_EQ(pruning::top_indices(v, 2), (std::vector<int>{1, 3}));
  EXPECT_EQ(pruning::top_indices(v, 3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(pruning::top_indices(v, 1), (std::vector<int>{1}));  // ties: the lower index
}

TEST(ProbePruningMaths, BadOptionsAreRefused) {
  for (double r : {1.5, -0.1, 1.0, std::nan("")}) {
    ProbePruningOptions o;
    o.ratio = r;
    EXPECT_THROW(o.validate(), Error) << r;
  }
  for (double p : {0.0, -0.5, 1.5}) {
    ProbePruningOptions o;
    o.probe = p;
    EXPECT_THROW(o.validate(), Error) << p;
  }
  ProbePruningOptions ok;
  ok.ratio = 0.0;
  EXPECT_NO_THROW(ok.validate());
}

template <class E>
std::shared_ptr<const Weights<E>> pp_model(const TempDir& dir, int layers, int seed) {
  SynthSpec s = tiny_spec(seed);
  s.cfg.n_layer = layers;
  return load_model<E>(make_model(dir, "m.gguf", s), LoadOptions{});
}

std::vector<int> pp_tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t[i] = 3 + static_cast<int>(x % (vocab - 3));
  }
  return t;
}

template <class E>
std::vector<float> host_matrix(const Matrix<E>& m) {
  EXPECT_EQ(m.dtype, DType::F32);
  return to_host(m.f32);
}

/// The indices of the k largest values, ties to the lower index, ascending (by plain sorting).
std::vector<int> brute_top(const std::vector<double>& v, int k) {
  std::vector<std::pair<double, int>> p;
  for (std::size_t i = 0; i < v.size(); ++i) p.push_back({-v[i], static_cast<int>(i)});
  std::sort(p.begin(), p.end());
  std::vector<int> out;
  for (int i = 0; i < k; ++i) out.push_back(p[static_cast<std::size_t>(i)].second);
  std::sort(out.begin(), out.end());
  return out;
}

TYPED_TEST(ProbePruningTest, RatioZeroIsBitwiseDense) {
  using E = TypeParam;
  TempDir dir;
  auto w = pp_model<E>(dir, 3, 31);
  const Config& c = w->cfg;
  const int T = 20;
  const auto s0 = pp_tokens(T, c.vocab, 1), s1 = pp_tokens(T, c.vocab, 2);
  ProbePruningOptions o;
  o.ratio = 0.0;
  ProbePruner<E> pp(o, *w);
  Engine<E> pruned(w, 2, T + 4), dense(w, 2, T + 4);
  pruned.set_structured_pruner(&pp);
  const auto a = to_host(pruned.forward({s0, s1}, 0, true));
  const auto b = to_host(dense.forward({s0, s1}, 0, true));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  for (int t = 0; t < 4; ++t) {
    const auto x = to_host(pruned.forward({{5 + t}, {9 + t}}, T + t, false));
    const auto y = to_host(dense.forward({{5 + t}, {9 + t}}, T + t, false));
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << t;
  }
  EXPECT_TRUE(pp.batches().empty());
  EXPECT_EQ(pp.head_ratio(), 0.0);
  EXPECT_EQ(pp.channel_ratio(), 0.0);
}

TYPED_TEST(ProbePruningTest, ScoresKeptSetsAndHandZeroedModel) {
  using E = TypeParam;
  TempDir dir;
  auto w = pp_model<E>(dir, 2, 32);
  const Config& c = w->cfg;
  const int T = 24, S = 2, n = S * T, d = c.d_model, F = c.d_ff;
  const int Q = c.n_head * c.head_dim, group = c.n_head / c.n_kv_head;
  const auto s0 = pp_tokens(T, c.vocab, 3), s1 = pp_tokens(T, c.vocab, 4);
  ProbePruningOptions o;
  o.ratio = 0.5;
  o.probe = 0.2;
  ProbePruner<E> pp(o, *w);
  Engine<E> eng(w, S, T + 3);
  eng.set_structured_pruner(&pp);
  std::map<std::pair<int, int>, std::vector<float>> seen;  // (layer, site) → unpruned input
  eng.set_observer([&](int l, Site s, const CMat<E>& x) {
    if (s == Site::BlockIn || s == Site::O || s == Site::Down)
      seen[{l, static_cast<int>(s)}] = to_host(x);
  });
  const auto a = to_host(eng.forward({s0, s1}, 0, true));
  eng.set_observer({});
  ASSERT_EQ(pp.batches().size(), 1u);
  const int k = pruning::probe_rows(n, o.probe);
  EXPECT_EQ(k, 10);
  EXPECT_EQ(pp.batches()[0].probe, k);

  auto norms = [&](const std::vector<float>& x) {
    std::vector<double> r(static_cast<std::size_t>(n), 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j) r[i] += double(x[i * d + j]) * x[i * d + j];
    return r;
  };
  auto check_site = [&](int l, Site site, const std::vector<float>& resid,
                        const std::vector<float>& in, const std::vector<float>& wmat, int width,
                        int per_unit) -> std::vector<int> {
    const std::vector<int> rows = brute_top(norms(resid), k);
    EXPECT_EQ(pp.last_probe(l, site), rows) << l;
    std::vector<double> stat(width, 0.0), score(width), unit(width / per_unit, 0.0);
    for (int j = 0; j < width; ++j) {
      for (int r : rows) stat[j] += double(in[r * width + j]) * in[r * width + j];
      stat[j] /= k;
      double wn = 0;
      for (int i = 0; i < d; ++i) wn += double(wmat[i * width + j]) * wmat[i * width + j];
      score[j] = wn * stat[j];
      unit[j / per_unit] += score[j];
    }
    const auto& ps = pp.last_stat(l, site);
    const auto& sc = pp.last_scores(l, site);
    const auto& us = pp.last_unit_scores(l, site);
    EXPECT_EQ(ps.size(), stat.size());
    if (ps.size() != stat.size() || us.size() != unit.size()) return {};
    for (int j = 0; j < width; ++j) {
      EXPECT_NEAR(ps[j], stat[j], 1e-12 * (1 + stat[j])) << l << " " << j;
      EXPECT_NEAR(sc[j], score[j], 1e-9 * (1 + score[j])) << l << " " << j;
    }
    for (std::size_t u = 0; u < unit.size(); ++u) EXPECT_NEAR(us[u], unit[u], 1e-9 * (1 + unit[u]));
    const int keep = pruning::kept_units(static_cast<int>(unit.size()), o.ratio);
    EXPECT_EQ(pp.last_kept(l, site), brute_top(unit, keep)) << l;
    return pp.last_kept(l, site);
  };

  // the model with the pruned W_o / W_down columns zeroed by hand
  auto zeroed = std::make_shared<Weights<E>>(*w);
  for (int l = 0; l < c.n_layer; ++l) {
    const auto wo = host_matrix(w->layers[l].wo), wd = host_matrix(w->layers[l].w_down);
    const auto& x_in = seen[{l, static_cast<int>(Site::BlockIn)}];
    const auto& att = seen[{l, static_cast<int>(Site::O)}];
    const auto kept_o = check_site(l, Site::O, x_in, att, wo, Q, group * c.head_dim);
    EXPECT_EQ(static_cast<int>(kept_o.size()), pruning::kept_units(c.n_kv_head, o.ratio));
    std::vector<char> ko(Q, 0);
    for (int u : kept_o)
      for (int j = u * group * c.head_dim; j < (u + 1) * group * c.head_dim; ++j) ko[j] = 1;
    // the residual feeding the MLP: x + (attention with the pruned heads zeroed)·W_oᵀ
    std::vector<float> x_mid(x_in);
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < d; ++i) {
        float acc = 0;
        for (int j = 0; j < Q; ++j)
          if (ko[j]) acc += att[r * Q + j] * wo[i * Q + j];
        x_mid[r * d + i] += acc;
      }
    const auto kept_f =
        check_site(l, Site::Down, x_mid, seen[{l, static_cast<int>(Site::Down)}], wd, F, 1);
    EXPECT_EQ(static_cast<int>(kept_f.size()), F / 2);
    EXPECT_EQ(pp.batches()[0].heads_kept[l], static_cast<int>(kept_o.size()));
    EXPECT_EQ(pp.batches()[0].channels_kept[l], static_cast<int>(kept_f.size()));
    std::vector<char> kf(F, 0);
    for (int u : kept_f) kf[u] = 1;
    std::vector<float> wo2(wo), wd2(wd);
    for (int i = 0; i < d; ++i) {
      for (int j = 0; j < Q; ++j)
        if (!ko[j]) wo2[i * Q + j] = 0;
      for (int j = 0; j < F; ++j)
        if (!kf[j]) wd2[i * F + j] = 0;
    }
    auto& lw = zeroed->layers[l];
    lw.wo.f32 = to_device<E>(wo2, d, Q);
    lw.w_down.f32 = to_device<E>(wd2, d, F);
  }
  EXPECT_NEAR(pp.head_ratio(), 0.5, 1e-12);
  EXPECT_NEAR(pp.channel_ratio(), 0.5, 1e-12);

  Engine<E> hand(zeroed, S, T + 3);
  const auto b = to_host(hand.forward({s0, s1}, 0, true));
  ASSERT_EQ(a.size(), b.size());
  auto close = [](const std::vector<float>& x, const std::vector<float>& y) {
    float mx = 0, diff = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      mx = std::max(mx, std::fabs(y[i]));
      diff = std::max(diff, std::fabs(x[i] - y[i]));
    }
    return diff / mx;
  };
  EXPECT_LE(close(a, b), 1e-5f);
  // decode steps reuse the prefill's masks
  for (int t = 0; t < 3; ++t) {
    const auto x = to_host(eng.forward({{7 + t}, {11 + t}}, T + t, false));
    const auto y = to_host(hand.forward({{7 + t}, {11 + t}}, T + t, false));
    EXPECT_LE(close(x, y), 1e-5f) << t;
  }
  EXPECT_EQ(pp.batches().size(), 1u);
  EXPECT_EQ(pp.reused_calls(), 3u);
  // a new prefill selects again
  eng.forward({s1, s0}, 0, true);
  EXPECT_EQ(pp.batches().size(), 2u);
}

// The history from collect_probe_history (three sequences, two per call) against the mean of x²
// over the sequences run one by one; then the pruner with that history: per position of its
// probe rows the probe's mean square fused with the history's (0 beyond the 16 positions it
// covers) by the dynamic ratio, summed over the positions, written out here; the kept units
// are the top of the scores it gives. Without history the statistic is the probe's mean.
TYPED_TEST(ProbePruningTest, HistoryIsTheMeanSquareAndIsFusedPerPosition) {
  using E = TypeParam;
  TempDir dir;
  auto w = pp_model<E>(dir, 2, 33);
  const Config& c = w->cfg;
  const int H = 16, Q = c.q_dim(), F = c.d_ff, L = c.n_layer;
  std::vector<std::vector<int>> cal;
  for (int i = 0; i < 3; ++i) cal.push_back(pp_tokens(H, c.vocab, 10 + i));
  const calibration::ProbeHistory h = pruning::collect_probe_history<E>(w, cal, 2);
  ASSERT_EQ(h.tokens, H);
  ASSERT_EQ(h.sequences, 3);
  {
    std::vector<double> want_o(static_cast<std::size_t>(L) * H * Q, 0.0),
        want_d(static_cast<std::size_t>(L) * H * F, 0.0);
    for (const auto& s : cal) {
      Engine<E> one(w, 1, H);
      one.set_observer([&](int l, Site site, const CMat<E>& x) {
        if (site != Site::O && site != Site::Down) return;
        const auto hx = to_host(x);
        const int width = site == Site::O ? Q : F;
        auto& want = site == Site::O ? want_o : want_d;
        for (int t = 0; t < H; ++t)
          for (int j = 0; j < width; ++j)
            want[(static_cast<std::size_t>(l) * H + t) * width + j] +=
                double(hx[t * width + j]) * hx[t * width + j] / 3.0;
      });
      one.forward({s}, 0, false);
    }
    double worst = 0;
    for (std::size_t i = 0; i < want_o.size(); ++i)
      worst = std::max(worst, std::abs(h.o[i] - want_o[i]) / (1e-6 + want_o[i]));
    for (std::size_t i = 0; i < want_d.size(); ++i)
      worst = std::max(worst, std::abs(h.down[i] - want_d[i]) / (1e-6 + want_d[i]));
    EXPECT_LT(worst, 1e-5);
  }

  const int T = 24, S = 2, n = S * T;
  const auto s0 = pp_tokens(T, c.vocab, 5), s1 = pp_tokens(T, c.vocab, 6);
  ProbePruningOptions o;
  o.ratio = 0.5;
  o.probe = 0.25;
  ProbePruner<E> pp(o, *w, &h), plain(o, *w);
  EXPECT_TRUE(pp.has_history());
  Engine<E> eng(w, S, T), eng_plain(w, S, T);
  eng.set_structured_pruner(&pp);
  eng_plain.set_structured_pruner(&plain);
  std::map<std::pair<int, int>, std::vector<float>> seen;
  eng.set_observer([&](int l, Site s, const CMat<E>& x) {
    if (s == Site::O || s == Site::Down) seen[{l, static_cast<int>(s)}] = to_host(x);
  });
  eng.forward({s0, s1}, 0, false);
  eng_plain.forward({s0, s1}, 0, false);
  const int k = pruning::probe_rows(n, o.probe);
  bool beyond = false;
  for (int l = 0; l < L; ++l)
    for (const Site site : {Site::O, Site::Down}) {
      const bool down = site == Site::Down;
      const int width = down ? F : Q;
      const auto& in = seen[{l, static_cast<int>(site)}];
      const std::vector<int>& rows = pp.last_probe(l, site);
      ASSERT_EQ(static_cast<int>(rows.size()), k);
      std::map<int, std::vector<int>> at;  // position → probe rows
      for (int r : rows) at[r % T].push_back(r);
      beyond = beyond || at.rbegin()->first >= H;
      std::vector<double> stat(width, 0.0);
      for (const auto& [t, rs] : at)
        for (int j = 0; j < width; ++j) {
          double p = 0;
          for (int r : rs) p += double(in[r * width + j]) * in[r * width + j];
          p /= static_cast<double>(rs.size());
          const double hv = t < H ? h.row(l, down, t)[j] : 0.0;
          const double ratio = p / (p + hv + 1e-6);
          stat[j] += (1 - ratio) * hv + ratio * p;
        }
      const auto& got = pp.last_stat(l, site);
      ASSERT_EQ(got.size(), stat.size());
      for (int j = 0; j < width; ++j)
        EXPECT_NEAR(got[j], stat[j], 1e-9 * (1 + stat[j])) << l << " " << j << " " << down;
      EXPECT_EQ(pp.last_kept(l, site),
                brute_top(pp.last_unit_scores(l, site),
                          pruning::kept_units(static_cast<int>(pp.last_unit_scores(l, site).size()),
                                              o.ratio)));
      // layer 0's block input is the same in both engines: the same probe, the probe's own
      // statistic without history
      if (l == 0 && !down) {
        EXPECT_EQ(plain.last_probe(l, site), rows);
        for (int j = 0; j < width; ++j) {
          double p = 0;
          for (int r : rows) p += double(in[r * width + j]) * in[r * width + j];
          EXPECT_NEAR(plain.last_stat(l, site)[j], p / k, 1e-12 * (1 + p / k));
        }
      }
    }
  EXPECT_TRUE(beyond) << "some probe row lies beyond the history's positions";
  // ratio 0 with history: still bitwise dense
  ProbePruningOptions z;
  z.ratio = 0.0;
  ProbePruner<E> zero(z, *w, &h);
  Engine<E> ez(w, S, T), dense(w, S, T);
  ez.set_structured_pruner(&zero);
  const auto a = to_host(ez.forward({s0, s1}, 0, true)),
             b = to_host(dense.forward({s0, s1}, 0, true));
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

}  // namespace
}  // namespace sparsim::test
