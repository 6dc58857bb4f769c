// Token Filtering: fusion, quantile, layer selection and the controller against hand-computed
// values and an independent host implementation; teacher-forced against token-by-token runs;
// r = 0 against dense; the realised model-wide skip ratio against the target.
#include "backends.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "kernels/gather.hpp"
#include "model/loader.hpp"
#include "policies/token_filter.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sparsim::test {
namespace {

using gating::AnchorKind;
using gating::Criterion;
using gating::LayerSet;
using gating::TokenFilter;
using gating::TokenFilterOptions;

template <class E>
class TokenFilterTest : public ::testing::Test {};
TYPED_TEST_SUITE(TokenFilterTest, Backends, BackendName);

TEST(TokenFilterMaths, FusionQuantileAndLayerSetsByHand) {
  // lower variance gets the larger weight: (0.03·0.8 + 0.01·0.6) / 0.04
  EXPECT_DOUBLE_EQ(gating::fuse_kv(0.8, 0.01, 0.6, 0.03), 0.75);
  EXPECT_DOUBLE_EQ(gating::fuse_kv(0.8, 0.0, 0.6, 0.0), 0.7);  // both 0: equal weights
  EXPECT_DOUBLE_EQ(gating::fuse_kv(0.8, 0.0, 0.6, 0.5), 0.8);  // a zero-variance key wins
  const double v[] = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(gating::sorted_quantile(v, 4, 0.75), 3.25);
  EXPECT_DOUBLE_EQ(gating::sorted_quantile(v, 4, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(gating::sorted_quantile(v, 4, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(gating::sorted_quantile(v, 1, 0.3), 1.0);
  EXPECT_EQ(gating::select_layers(LayerSet::Tail, 3, 8), (std::vector<int>{5, 6, 7}));
  EXPECT_EQ(gating::select_layers(LayerSet::Head, 3, 8), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(gating::select_layers(LayerSet::Uniform, 3, 8), (std::vector<int>{1, 4, 6}));
  EXPECT_EQ(gating::select_layers(LayerSet::Uniform, 8, 8),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  TokenFilterOptions o;
  o.ratio = 0.5;
  EXPECT_EQ(o.gated_layers(30), 23);  // ⌈3L/4⌉
  EXPECT_DOUBLE_EQ(o.layer_target(30), 0.5 * 30 / 23);
}

TEST(TokenFilterMaths, BadOptionsAreRefused) {
  auto bad = [](auto change) {
    TokenFilterOptions o;
    change(o);
    EXPECT_THROW(o.validate(8), Error);
  };
  bad([](TokenFilterOptions& o) { o.ratio = 1.0; });
  bad([](TokenFilterOptions& o) { o.ratio = -0.1; });
  bad([](TokenFilterOptions& o) { o.ratio = std::nan(""); });
  bad([](TokenFilterOptions& o) { o.ratio = 0.6, o.num_layers = 4; });  // r·L/N = 1.2
  bad([](TokenFilterOptions& o) { o.num_layers = 9; });
  bad([](TokenFilterOptions& o) { o.warmup = 1; });
  bad([](TokenFilterOptions& o) { o.eta = -1; });
  bad([](TokenFilterOptions& o) { o.gamma = 1.0; });
  EXPECT_THROW(gating::parse_criterion("kq"), Error);
  EXPECT_THROW(gating::parse_layer_set("middle"), Error);
  EXPECT_THROW(gating::parse_anchor("median"), Error);
  TokenFilterOptions ok;
  ok.ratio = 0.5;
  ok.num_layers = 4;  // r·L/N = 1 exactly is allowed
  EXPECT_NO_THROW(ok.validate(8));
}

/// The gate written out plainly for one (layer, sequence): what the kernel must compute.
struct HostGate {
  TokenFilterOptions o;
  double target;
  int nkv, qk, vd;
  std::vector<double> ak, av;
  int count = 0, decided = 0, skipped = 0;
  std::vector<double> warm;
  double tau = 0;

  HostGate(const TokenFilterOptions& opt, double tgt, int n_kv, int q, int v)
      : o(opt), target(tgt), nkv(n_kv), qk(q), vd(v), ak(n_kv * q, 0.0), av(n_kv * v, 0.0) {}

  static double cosine(const float* x, const std::vector<double>& a, int off, int d, double div) {
    double dot = 0, nx = 0, na = 0;
    for (int j = 0; j < d; ++j) {
      const double an = a[off + j] / div;
      dot += x[j] * an;
      nx += double(x[j]) * x[j];
      na += an * an;
    }
    return nx > 0 && na > 0 ? dot / std::sqrt(nx * na) : 0.0;
  }

  /// Returns (S, τ after, skip); S is NaN without an anchor.
  std::tuple<double, double, int> step(const float* k, const float* v, int pos) {
    double S = std::nan("");
    int sk = 0;
    if (count > 0) {
      const double div = o.anchor == AnchorKind::Mean ? count : 1.0;
      std::vector<double> ck, cv;
      for (int h = 0; h < nkv; ++h) {
        ck.push_back(cosine(k + h * qk, ak, h * qk, qk, div));
        cv.push_back(cosine(v + h * vd, av, h * vd, vd, div));
      }
      auto mean = [&](const std::vector<double>& c) {
        double m = 0;
        for (double x : c) m += x;
        return m / c.size();
      };
      auto var = [&](const std::vector<double>& c, double m) {
        double s = 0;
        for (double x : c) s += (x - m) * (x - m);
        return s / c.size();
      };
      const double mk = mean(ck), mv = mean(cv), vk = var(ck, mk), vv = var(cv, mv);
      S = o.criterion == Criterion::Key     ? mk
          : o.criterion == Criterion::Value ? mv
          : (vk + vv > 0)                   ? (vv * mk + vk * mv) / (vk + vv)
                                            : 0.5 * (mk + mv);
      if (pos < o.warmup) {
        warm.push_back(S);
        std::vector<double> s = warm;
        std::sort(s.begin(), s.end());
        const double p = (1 - target) * (s.size() - 1);
        const std::size_t lo = static_cast<std::size_t>(p), hi = std::min(lo + 1, s.size() - 1);
        tau = s[lo] + (p - lo) * (s[hi] - s[lo]);
      } else {
        sk = target > 0 && S > tau;
        ++decided;
        skipped += sk;
        tau += o.eta * (double(skipped) / decided - target);
      }
    }
    if (!(o.drop_skipped && sk)) {
      for (int j = 0; j < nkv * qk; ++j)
        ak[j] = o.anchor == AnchorKind::Mean ? ak[j] + k[j]
                : count == 0                 ? k[j]
                                             : o.gamma * ak[j] + (1 - o.gamma) * k[j];
      for (int j = 0; j < nkv * vd; ++j)
        av[j] = o.anchor == AnchorKind::Mean ? av[j] + v[j]
                : count == 0                 ? v[j]
                                             : o.gamma * av[j] + (1 - o.gamma) * v[j];
      ++count;
    }
    return {S, tau, sk};
  }
};

TYPED_TEST(TokenFilterTest, TwoHandComputedTokens) {
  using E = TypeParam;
  TokenFilterOptions o;
  o.ratio = 0.5;
  o.num_layers = 1;
  o.warmup = 3;
  TokenFilter<E> tf(o, 1, 2, 2, 2, 1);
  // t0: k = [(1,0),(0,1)], v = [(1,0),(1,0)];  t1: k = [(1,0),(1,0)], v = [(0,1),(1,0)]
  const std::vector<float> k = {1, 0, 0, 1, 1, 0, 1, 0}, v = {1, 0, 1, 0, 0, 1, 1, 0};
  IVec<E> skip("skip", 2);
  PolicyCost cost;
  tf.begin_call(E(), 1, 2, 0);
  tf.decide(E(), 0, CMat<E>(to_device<E>(k, 2, 4)), CMat<E>(to_device<E>(v, 2, 4)), skip, cost);
  const auto& tr = tf.traces().at(0).at(0);
  EXPECT_TRUE(std::isnan(tr.similarity[0]));  // no anchor yet
  // c_k = (1, 0), c_v = (0, 1): μ = 0.5, σ² = 0.25 each → S = 0.5; τ = quantile of {0.5}
  EXPECT_FLOAT_EQ(tr.similarity[1], 0.5f);
  EXPECT_FLOAT_EQ(tr.threshold[1], 0.5f);
  EXPECT_GT(cost.flops, 0.0);
}

template <class E>
void check_against_host(const TokenFilterOptions& o, const std::string& tag) {
  const int nkv = 2, qk = 4, vd = 4, n_seq = 2, T = 24;
  TokenFilter<E> tf(o, 1, nkv, qk, vd, n_seq), step(o, 1, nkv, qk, vd, n_seq);
  // keys drift slowly so that similarities vary around the threshold
  std::vector<float> k(n_seq * T * nkv * qk), v(n_seq * T * nkv * vd);
  const auto nk = random_vec(k.size(), 41), nv = random_vec(v.size(), 42);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = 1.0f + 0.6f * nk[i];
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * (i % 3) + 0.7f * nv[i];
  IVec<E> skip("skip", n_seq * T);
  PolicyCost cost;
  tf.begin_call(E(), n_seq, T, 0);
  tf.decide(E(), 0, CMat<E>(to_device<E>(k, n_seq * T, nkv * qk)),
            CMat<E>(to_device<E>(v, n_seq * T, nkv * vd)), skip, cost);
  // token by token: rows (s, t) of the teacher-forced call become calls of one token
  for (int t = 0; t < T; ++t) {
    std::vector<float> kt, vt;
    for (int s = 0; s < n_seq; ++s) {
      kt.insert(kt.end(), k.begin() + (s * T + t) * nkv * qk,
                k.begin() + (s * T + t + 1) * nkv * qk);
      vt.insert(vt.end(), v.begin() + (s * T + t) * nkv * vd,
                v.begin() + (s * T + t + 1) * nkv * vd);
    }
    IVec<E> sk("sk", n_seq);
    step.begin_call(E(), n_seq, 1, t);
    step.decide(E(), 0, CMat<E>(to_device<E>(kt, n_seq, nkv * qk)),
                CMat<E>(to_device<E>(vt, n_seq, nkv * vd)), sk, cost);
  }
  int skips = 0;
  for (int s = 0; s < n_seq; ++s) {
    HostGate ref(o, o.layer_target(1), nkv, qk, vd);
    const auto& a = tf.traces().at(s).at(0);
    const auto& b = step.traces().at(s).at(0);
    for (int t = 0; t < T; ++t) {
      const auto [S, tau, sk] = ref.step(&k[(s * T + t) * nkv * qk], &v[(s * T + t) * nkv * vd], t);
      skips += sk;
      EXPECT_EQ(a.skipped[t], sk) << tag << " s " << s << " t " << t;
      EXPECT_EQ(b.skipped[t], sk) << tag << " s " << s << " t " << t;
      if (t == 0) continue;
      EXPECT_NEAR(a.similarity[t], S, 1e-6) << tag << " t " << t;
      EXPECT_NEAR(a.threshold[t], tau, 1e-6) << tag << " t " << t;
      EXPECT_EQ(std::memcmp(&a.similarity[t], &b.similarity[t], sizeof(float)), 0) << tag;
      EXPECT_EQ(std::memcmp(&a.threshold[t], &b.threshold[t], sizeof(float)), 0) << tag;
    }
  }
  EXPECT_GT(skips, 0) << tag << ": the case should skip something";
  EXPECT_EQ(tf.realised(), step.realised());
}

TYPED_TEST(TokenFilterTest, KernelEqualsHostImplementationAllVariants) {
  TokenFilterOptions o;
  o.ratio = 0.4;
  o.num_layers = 1;
  o.warmup = 5;
  o.eta = 0.05;
  for (Criterion c : {Criterion::Key, Criterion::Value, Criterion::KV})
    for (AnchorKind a : {AnchorKind::Mean, AnchorKind::Ema})
      for (bool drop : {false, true}) {
        o.criterion = c;
        o.anchor = a;
        o.drop_skipped = drop;
        check_against_host<TypeParam>(o, std::string(gating::to_string(c)) + "/" +
                                             gating::to_string(a) + (drop ? "/drop" : ""));
      }
}

Config filter_config(int layers, int ctx) {
  Config c = tiny_config();
  c.n_layer = layers;
  c.context_length = ctx;
  return c;
}

template <class E>
std::shared_ptr<const Weights<E>> filter_model(const TempDir& dir, int layers, int ctx, int seed) {
  SynthSpec s = tiny_spec(seed);
  s.cfg = filter_config(layers, ctx);
  return load_model<E>(make_model(dir, "m.gguf", s), LoadOptions{});
}

std::vector<int> seq_tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t[i] = 3 + static_cast<int>(x % (vocab - 3));
  }
  return t;
}

TYPED_TEST(TokenFilterTest, TeacherForcedAndTokenByTokenAgree) {
  using E = TypeParam;
  TempDir dir;
  auto w = filter_model<E>(dir, 4, 128, 21);
  const Config& c = w->cfg;
  const int T = 48;
  const auto s0 = seq_tokens(T, c.vocab, 1), s1 = seq_tokens(T, c.vocab, 2);
  for (bool pre : {false, true}) {
    TokenFilterOptions o;
    o.ratio = 0.4;
    o.num_layers = 3;
    o.warmup = 6;
    o.pre_rope = pre;
    TokenFilter<E> ga(o, c.n_layer, c.n_kv_head, c.head_dim, c.head_dim, 2),
        gb(o, c.n_layer, c.n_kv_head, c.head_dim, c.head_dim, 2);
    Engine<E> tf(w, 2, T), dec(w, 2, T);
    tf.set_token_gate(&ga);
    dec.set_token_gate(&gb);
    const auto a = to_host(tf.forward({s0, s1}, 0, true));
    const int V = c.vocab;
    double worst = 0;
    for (int t = 0; t < T; ++t) {
      const auto b = to_host(dec.forward({{s0[t]}, {s1[t]}}, t, true));
      for (int s = 0; s < 2; ++s) {
        double scale = 0, err = 0;
        for (int x = 0; x < V; ++x) {
          scale = std::max(scale, double(std::fabs(a[(s * T + t) * V + x])));
          err = std::max(err, double(std::fabs(a[(s * T + t) * V + x] - b[s * V + x])));
        }
        worst = std::max(worst, err / scale);
      }
    }
    EXPECT_LE(worst, 1e-5) << "pre-RoPE " << pre;
    for (int s = 0; s < 2; ++s)
      for (std::size_t l = 0; l < ga.layers().size(); ++l)
        EXPECT_EQ(ga.traces()[s][l].skipped, gb.traces()[s][l].skipped) << "s " << s << " l " << l;
    EXPECT_GT(ga.realised(), 0.1);
    EXPECT_EQ(ga.realised(), gb.realised());
    EXPECT_EQ(ga.decided_tokens(), 2u * (T - o.warmup));
  }
}

// The kept-row lists against a loop over the flags: random flags, with and without the masker's
// row flags, a call of several sequences at a later position.
TYPED_TEST(TokenFilterTest, KeptRowListsMatchTheFlags) {
  using E = TypeParam;
  const int n_seq = 5, T = 7, p0 = 11, n = n_seq * T;
  std::uint64_t x = 12345;
  std::vector<int> skip(n), sparse(n);
  for (int r = 0; r < n; ++r) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    skip[r] = x % 3 == 0;
    sparse[r] = (x >> 8) % 2;
  }
  const auto dev = [](const std::vector<int>& h) {
    IVec<E> d("flags", h.size());
    auto m = Kokkos::create_mirror_view(d);
    for (std::size_t i = 0; i < h.size(); ++i) m(i) = h[i];
    Kokkos::deep_copy(d, m);
    return d;
  };
  const IVec<E> dskip = dev(skip), dsparse = dev(sparse);
  for (bool with_flags : {false, true}) {
    std::vector<int> rows, seqs, pos, flags;
    for (int r = 0; r < n; ++r)
      if (!skip[r]) {
        rows.push_back(r);
        seqs.push_back(r / T);
        pos.push_back(p0 + r % T);
        flags.push_back(with_flags ? sparse[r] : 0);
      }
    const int k = static_cast<int>(rows.size());
    IVec<E> kr("rows", k), ks("seqs", k), kp("pos", k), kf("flags", k);
    list_kept_rows(E(), dskip, with_flags ? dsparse : IVec<E>(), T, p0, kr, ks, kp, kf);
    const auto host = [](const IVec<E>& d) {
      auto m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
      return std::vector<int>(m.data(), m.data() + m.extent(0));
    };
    EXPECT_EQ(host(kr), rows);
    EXPECT_EQ(host(ks), seqs);
    EXPECT_EQ(host(kp), pos);
    EXPECT_EQ(host(kf), flags);
  }
}

// Every deep copy (Kokkos Tools' callback) whose source or destination is one of the gate's
// per-row buffers: the flags, the kept-row lists, the gate's per-row output.
std::vector<std::string>& gate_row_copies() {
  static std::vector<std::string> seen;
  return seen;
}

void note_copy(Kokkos::Tools::SpaceHandle, const char* dst, const void*, Kokkos::Tools::SpaceHandle,
               const char* src, const void*, std::uint64_t) {
  for (const char* name : {dst, src}) {
    const std::string s = name ? name : "";
    if (s.find("sparsim::gate::") != std::string::npos ||
        s.find("sparsim::token_filter::out") != std::string::npos)
      gate_row_copies().push_back(s);
  }
}

TYPED_TEST(TokenFilterTest, DecisionsStayOnTheDeviceUnlessTheHostNeedsThem) {
  using E = TypeParam;
  TempDir dir;
  auto w = filter_model<E>(dir, 4, 64, 24);
  const Config& c = w->cfg;
  const int T = 24, steps = 12;
  const auto s0 = seq_tokens(T + steps, c.vocab, 6), s1 = seq_tokens(T + steps, c.vocab, 7);
  TokenFilterOptions o;
  o.ratio = 0.4;
  o.num_layers = 3;
  o.warmup = 6;
  o.trace_sequences = 0;
  // the same gate and model, without and with a FLOP ledger (which reads each row's decision)
  TokenFilter<E> ga(o, c.n_layer, c.n_kv_head, c.head_dim, c.head_dim, 2),
      gb(o, c.n_layer, c.n_kv_head, c.head_dim, c.head_dim, 2);
  Engine<E> lean(w, 2, T + steps), counted(w, 2, T + steps);
  flops::Ledger ledger(c.n_layer);
  lean.set_token_gate(&ga);
  counted.set_token_gate(&gb);
  counted.set_ledger(&ledger);
  const auto prompt = [&](const std::vector<int>& s) {
    return std::vector<int>(s.begin(), s.begin() + T);
  };
  const auto a0 = to_host(lean.forward({prompt(s0), prompt(s1)}, 0, false));
  const auto b0 = to_host(counted.forward({prompt(s0), prompt(s1)}, 0, false));
  EXPECT_EQ(0, std::memcmp(a0.data(), b0.data(), a0.size() * sizeof(float)));
  std::size_t lean_copies = 0, counted_copies = 0;
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(note_copy);
  for (int t = T; t < T + steps; ++t) {
    gate_row_copies().clear();
    const auto a = to_host(lean.forward({{s0[t]}, {s1[t]}}, t, false));
    lean_copies += gate_row_copies().size();
    gate_row_copies().clear();
    const auto b = to_host(counted.forward({{s0[t]}, {s1[t]}}, t, false));
    counted_copies += gate_row_copies().size();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "step " << t;
  }
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(nullptr);
  // the decode steps skipped rows (the kept-rows path ran) and both runs decided alike
  EXPECT_GT(ga.realised(), 0.1);
  EXPECT_EQ(ga.realised(), gb.realised());
  for (int l : ga.layers()) EXPECT_EQ(ga.skipped(l), gb.skipped(l)) << l;
  EXPECT_EQ(ga.similarity_mean(c.n_layer - 1), gb.similarity_mean(c.n_layer - 1));
  EXPECT_EQ(lean_copies, 0u) << "a per-row buffer of the gate was copied without a host reader";
  EXPECT_GT(counted_copies, 0u) << "the ledger's copies of the decisions were not seen";
}

TYPED_TEST(TokenFilterTest, RatioZeroIsBitwiseDense) {
  using E = TypeParam;
  TempDir dir;
  auto w = filter_model<E>(dir, 3, 64, 22);
  const Config& c = w->cfg;
  const int T = 30;
  const auto s0 = seq_tokens(T, c.vocab, 3);
  TokenFilterOptions o;
  o.ratio = 0.0;
  o.warmup = 4;
  TokenFilter<E> g(o, c.n_layer, c.n_kv_head, c.head_dim, c.head_dim, 1);
  Engine<E> gated(w, 1, T + 4), dense(w, 1, T + 4), fused(w, 1, T + 4);
  gated.set_token_gate(&g);
  // A gated layer runs op by op: the dense engine it must equal bit for bit does too. (On a
  // device the dense decode otherwise takes the fused kernels, whose sums are ordered otherwise:
  // equal within fp32 reordering, checked below.)
  dense.set_fused_decode(false);
  const auto a = to_host(gated.forward({s0}, 0, true));
  const auto b = to_host(dense.forward({s0}, 0, true));
  fused.forward({s0}, 0, true);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  for (int t = 0; t < 4; ++t) {
    const auto x = to_host(gated.forward({{5 + t}}, T + t, false));
    const auto y = to_host(dense.forward({{5 + t}}, T + t, false));
    const auto z = to_host(fused.forward({{5 + t}}, T + t, false));
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << t;
    float mx = 0, diff = 0;
    for (std::size_t i = 0; i < z.size(); ++i) {
      mx = std::max(mx, std::fabs(y[i]));
      diff = std::max(diff, std::fabs(z[i] - y[i]));
    }
    EXPECT_LE(diff, 1e-5f * mx) << t;
  }
  EXPECT_EQ(g.realised(), 0.0);
  EXPECT_GT(g.decided_tokens(), 0u);
}

// Over 1,000 decoded tokens after the warm-up the model-wide skip ratio lands within ±2% of r.
// (a property of the controller, not of the backend: run once, on the host)
TEST(TokenFilterStats, RealisedRatioTracksTarget) {
#ifdef KOKKOS_ENABLE_SERIAL
  using E = Kokkos::Serial;
#else
  using E = Kokkos::DefaultHostExecutionSpace;
#endif
  TempDir dir;
  const int W = 16, N = 1000;
  auto w = filter_model<E>(dir, 4, W + N + 8, 23);
  const Config& c = w->cfg;
  const auto toks = seq_tokens(W + N, c.vocab, 4), toks2 = seq_tokens(W + N, c.vocab, 5);
  for (double r : {0.4}) {
    TokenFilterOptions o;
    o.ratio = r;
    o.warmup = W;
    o.trace_sequences = 0;
    TokenFilter<E> g(o, c.n_layer, c.n_kv_head, c.head_dim, c.head_dim, 2);
    Engine<E> eng(w, 2, W + N);
    eng.set_token_gate(&g);
    eng.forward({std::vector<int>(toks.begin(), toks.begin() + W),
                 std::vector<int>(toks2.begin(), toks2.begin() + W)},
                0, false);
    for (int t = W; t < W + N; ++t) eng.forward({{toks[t]}, {toks2[t]}}, t, false);
    EXPECT_EQ(g.decided_tokens(), 2u * N);
    EXPECT_NEAR(g.realised(), r, 0.02) << "r = " << r;
    for (int l : g.layers()) EXPECT_NEAR(g.realised(l), g.layer_target(), 0.05) << l;
  }
}

}  // namespace
}  // namespace sparsim::test
