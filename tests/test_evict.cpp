// KV-cache token eviction (StreamingLLM, H2O, SnapKV, PyramidKV): each policy's kept set against
// a direct computation (brute force over subsets, votes recomputed in double precision), a
// budget covering the prompt bit for bit dense, attention over an evicted cache against
// attention over the kept tokens alone, decode against the reference model with the evicted
// tokens left out (alone and composed with GRACE), the ledger, and the command line.
#include "backends.hpp"
#include "cli_fixture.hpp"
#include "compare_helpers.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "eval/perplexity.hpp"
#include "io/hdf5.hpp"
#include "kernels/attention.hpp"
#include "kernels/cached_attention.hpp"
#include "model/loader.hpp"
#include "policies/k_channel_selector.hpp"
#include "policies/token_eviction.hpp"
#include "policies/token_filter.hpp"
#include "reference_llama.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>

namespace sparsim::test {
namespace {

using pruning::EvictMethod;
using pruning::EvictOptions;
using pruning::EvictPool;

/// PyTorch's pooling of SnapKV's code written out: pad k/2 on each side (zeros for the
/// average, which then divides by k; nothing for the maximum), slide a window of k.
std::vector<double> pooled_direct(const std::vector<double>& v, int k, EvictPool pool) {
  const int n = static_cast<int>(v.size()), half = k / 2;
  std::vector<double> padded(static_cast<std::size_t>(n + 2 * half), 0.0);
  std::vector<char> real(padded.size(), 0);
  for (int i = 0; i < n; ++i) padded[i + half] = v[i], real[i + half] = 1;
  std::vector<double> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    double s = 0, m = -1e300;
    for (int j = i; j < i + k; ++j) {
      s += padded[j];
      if (real[j]) m = std::max(m, padded[j]);
    }
    out[i] = pool == EvictPool::Avg ? s / k : m;
  }
  return out;
}

/// Adds to votes[p], p < np, the weight (in double) of position p in the softmax of the query
/// `q` (d values) over the keys keys[p·stride …] scaled by `scale`; positions gone(p) take no
/// part. The direct computation of H2O's and SnapKV's votes.
template <class Gone>
void add_softmax_weights(const float* q, const float* keys, int stride, int d, int np, double scale,
                         Gone gone, std::vector<double>& votes) {
  std::vector<double> sc(static_cast<std::size_t>(np), -1e300);
  double mx = -1e300, z = 0;
  for (int p = 0; p < np; ++p) {
    if (gone(p)) continue;
    double a = 0;
    for (int j = 0; j < d; ++j) a += double(q[j]) * keys[static_cast<std::size_t>(p) * stride + j];
    sc[p] = a * scale;
    mx = std::max(mx, sc[p]);
  }
  for (int p = 0; p < np; ++p) z += std::exp(sc[p] - mx);
  for (int p = 0; p < np; ++p) votes[p] += std::exp(sc[p] - mx) / z;
}

/// The best subset of `k` of the candidate positions below n by total score, by enumeration.
std::vector<int> best_subset(const std::vector<double>& score, int n, int k,
                             const std::vector<char>& cand) {
  std::vector<int> pool;
  for (int p = 0; p < n; ++p)
    if (cand.empty() || cand[p]) pool.push_back(p);
  k = std::min<int>(k, static_cast<int>(pool.size()));
  std::vector<int> best;
  double best_s = -1e300;
  const int m = static_cast<int>(pool.size());
  for (unsigned mask = 0; mask < (1u << m); ++mask) {
    if (__builtin_popcount(mask) != k) continue;
    double s = 0;
    std::vector<int> set;
    for (int i = 0; i < m; ++i)
      if (mask >> i & 1u) s += score[pool[i]], set.push_back(pool[i]);
    if (s > best_s) best_s = s, best = set;
  }
  return best;
}

TEST(Evict, PoolingMatchesPaddedWindows) {
  const std::vector<double> v = {0.3, 1.2, 0.1, 0.0, 2.5, 0.7, 0.4, 0.9, 0.05};
  for (int k : {1, 3, 5, 7, 11})
    for (EvictPool p : {EvictPool::Avg, EvictPool::Max}) {
      const auto a = pruning::pool_votes(v, k, p), b = pooled_direct(v, k, p);
      for (std::size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-15) << k << " " << i;
    }
}

// Every policy's kept set on small prompts against the definition: streaming by its two
// ranges, the scored ones as the best subset (by enumeration) of the pooled (SnapKV) or raw
// (H2O) votes plus the window; a budget covering the prompt keeps everything.
TEST(Evict, ChooseTokensAgainstBruteForce) {
  SynthRng r(5);
  for (int trial = 0; trial < 20; ++trial) {
    const int T = 14 + trial % 5;
    std::vector<double> votes(static_cast<std::size_t>(T));
    for (auto& x : votes) x = r.uniform() * (r.uniform() < 0.2 ? 5.0 : 1.0);
    std::vector<char> cand(static_cast<std::size_t>(T), 1);
    if (trial % 3 == 0) cand[3] = cand[7] = 0;  // positions a gate dropped
    for (EvictMethod m : {EvictMethod::Streaming, EvictMethod::H2O, EvictMethod::SnapKV}) {
      EvictOptions o;
      o.method = m;
      o.window = 2 + trial % 3;
      o.sinks = trial % 4;
      o.kernel = trial % 2 ? 3 : 5;
      o.pool = trial % 4 < 2 ? EvictPool::Avg : EvictPool::Max;
      for (int C : {1, 3, 6, 9, T - 1, T, T + 4}) {
        const auto got = pruning::choose_tokens(o, T, C, votes, cand);
        std::vector<int> want;
        if (C >= T) {
          want.resize(T);
          std::iota(want.begin(), want.end(), 0);
        } else if (m == EvictMethod::Streaming) {
          const int s = std::min(o.sinks, C);
          for (int p = 0; p < T; ++p)
            if (p < s || p >= T - (C - s)) want.push_back(p);
        } else {
          const int w = std::min(o.window, C), n = T - w;
          std::vector<double> pre(votes.begin(), votes.begin() + n);
          if (m == EvictMethod::SnapKV) pre = pooled_direct(pre, o.kernel, o.pool);
          want = best_subset(pre, n, C - w, cand);
          for (int p = n; p < T; ++p) want.push_back(p);
        }
        EXPECT_EQ(got, want) << pruning::to_string(m) << " T " << T << " C " << C;
        if (C < T) {
          EXPECT_LE(static_cast<int>(got.size()), C);
        }
      }
    }
  }
}

TEST(Evict, BudgetsAndPyramidSchedule) {
  EvictOptions o;
  o.budget = 0.5;
  EXPECT_EQ(o.budget_tokens(100), 50);
  EXPECT_EQ(o.budget_tokens(101), 51);  // ⌈b·T⌉
  o.budget = 0.3;
  EXPECT_EQ(o.budget_tokens(10), 3);  // 0.3·10 is 3 up to rounding
  o.budget = 64;
  EXPECT_EQ(o.budget_tokens(1000), 64);
  // PyramidKV: C = 512 of T = 4096, w = 32, L = 32 layers: B = 480, min = 24, max = 936,
  // steps = 29; layer l keeps 936 − 29·l + 32; the mean stays near C
  o.method = EvictMethod::PyramidKV;
  o.budget = 512;
  o.window = 32;
  EXPECT_EQ(pruning::layer_budget(o, 0, 32, 4096), 968);
  EXPECT_EQ(pruning::layer_budget(o, 31, 32, 4096), 968 - 29 * 31);
  double mean = 0;
  for (int l = 0; l < 32; ++l) {
    const int b = pruning::layer_budget(o, l, 32, 4096);
    if (l > 0) {
      EXPECT_LT(b, pruning::layer_budget(o, l - 1, 32, 4096));
    }
    mean += b / 32.0;
  }
  EXPECT_NEAR(mean, 512, 0.06 * 512);
  // a prompt shorter than twice the prefix budget: every layer gets C (PyramidKV's code)
  EXPECT_EQ(pruning::layer_budget(o, 5, 32, 900), 512);
  // the deepest layer's budget capped by the prompt: max = T − w
  EXPECT_EQ(pruning::layer_budget(o, 0, 32, 965), 965);
  o.method = EvictMethod::SnapKV;
  EXPECT_EQ(pruning::layer_budget(o, 5, 32, 4096), 512);
  // bad values
  for (double b : {0.0, -0.5, 2.5, std::nan("")}) {
    EvictOptions x;
    x.budget = b;
    EXPECT_THROW(x.validate(), Error) << b;
  }
  EvictOptions x;
  x.budget = 16;
  x.window = 16;
  EXPECT_THROW(x.validate(), Error);
  x.window = 8;
  x.kernel = 4;
  EXPECT_THROW(x.validate(), Error);
  EXPECT_THROW(pruning::parse_evict_method("snap"), Error);
}

template <class E>
class EvictEngine : public ::testing::Test {};
TYPED_TEST_SUITE(EvictEngine, Backends, BackendName);

// The device votes (dropped positions excluded) give the kept sets that votes recomputed here
// in double precision give, for every policy, two sequences and every KV head.
TYPED_TEST(EvictEngine, VotesMatchDirectComputation) {
  using E = TypeParam;
  Config c = tiny_config();
  c.n_layer = 1;
  const int n_seq = 2, T = 30, d = c.head_dim, nkv = c.n_kv_head, nh = c.n_head;
  const int kw = nkv * d, g = nh / nkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  KVCache<E> cache(c, n_seq, T);
  const auto K = random_vec(n_seq * T * kw, 31), V = random_vec(n_seq * T * kw, 32);
  cache.store(E(), 0, CMat<E>(to_device<E>(K, n_seq * T, kw)),
              CMat<E>(to_device<E>(V, n_seq * T, kw)), n_seq, T, 0);
  auto dropped = [](int s, int p) { return (s == 0 && p % 9 == 4) || (s == 1 && p == 11); };
  IVec<E> skip("skip", n_seq * T);
  auto hs = Kokkos::create_mirror_view(skip);
  for (int s = 0; s < n_seq; ++s)
    for (int p = 0; p < T; ++p) hs(s * T + p) = dropped(s, p) ? 1 : 0;
  Kokkos::deep_copy(skip, hs);
  cache.set_dropped(E(), 0, skip, n_seq, T, 0);
  const auto Qall = random_vec(n_seq * T * nh * d, 33, 2.0f);  // queries of every position
  for (EvictMethod m : {EvictMethod::Streaming, EvictMethod::H2O, EvictMethod::SnapKV}) {
    EvictOptions o;
    o.method = m;
    o.budget = 12;
    o.window = 4;
    o.sinks = 2;
    o.kernel = 3;
    pruning::TokenEvictorPolicy<E> ev(o, 1, nkv, n_seq);
    const int w = ev.observation_window(T);
    EXPECT_EQ(w, m == EvictMethod::Streaming ? 0 : m == EvictMethod::H2O ? T : 4);
    std::vector<float> q(static_cast<std::size_t>(std::max(1, n_seq * w) * nh * d), 0.0f);
    for (int s = 0; s < n_seq; ++s)
      for (int i = 0; i < w; ++i)
        std::copy_n(&Qall[((s * T) + T - w + i) * nh * d], nh * d, &q[(s * w + i) * nh * d]);
    IVec<E> ok("ok", std::max(1, n_seq * w));
    Kokkos::deep_copy(ok, 1);
    const KeptTokens kept = ev.select(E(), 0, cache.layer(0), cache.shape(0),
                                      CMat<E>(to_device<E>(q, std::max(1, n_seq * w), nh * d)),
                                      IVec<E>(ok.data(), n_seq * w), n_seq, T);
    ASSERT_EQ(kept.idx.size(), static_cast<std::size_t>(n_seq)) << pruning::to_string(m);
    EXPECT_EQ(kept.budget, 12);
    for (int s = 0; s < n_seq; ++s)
      for (int h = 0; h < nkv; ++h) {
        std::vector<double> votes(T, 0.0);
        std::vector<char> cand(T, 1);
        for (int p = 0; p < T; ++p) cand[p] = dropped(s, p) ? 0 : 1;
        if (m != EvictMethod::Streaming)
          for (int gg = 0; gg < g; ++gg)
            for (int i = 0; i < w; ++i)
              add_softmax_weights(
                  &q[(s * w + i) * nh * d + (h * g + gg) * d], &K[s * T * kw + h * d], kw, d,
                  T - w + i + 1, scale, [&](int p) { return dropped(s, p); }, votes);
        std::vector<int> want;
        if (m == EvictMethod::Streaming) {
          want = {0, 1};
          for (int p = T - 10; p < T; ++p) want.push_back(p);
        } else {
          std::vector<double> pre(votes.begin(), votes.begin() + T - 4);
          if (m == EvictMethod::SnapKV) pre = pooled_direct(pre, 3, EvictPool::Avg);
          std::vector<int> order;
          for (int p = 0; p < T - 4; ++p)
            if (cand[p]) order.push_back(p);
          std::stable_sort(order.begin(), order.end(),
                           [&](int a, int b) { return pre[a] > pre[b]; });
          want.assign(order.begin(), order.begin() + 8);
          std::sort(want.begin(), want.end());
          for (int p = T - 4; p < T; ++p) want.push_back(p);
        }
        EXPECT_EQ(kept.idx[s][h], want) << pruning::to_string(m) << " s " << s << " h " << h;
      }
    if (m != EvictMethod::Streaming) {
      EXPECT_GT(kept.flops, 0.0);
    }
    EXPECT_EQ(ev.selections(), static_cast<std::uint64_t>(n_seq * nkv));
    EXPECT_NEAR(ev.kept_fraction(), 12.0 / T, 1e-12);
  }
}

// H2O's votes summed inside the host prefill attention (KeyMass): against the softmax weights
// recomputed here in double precision, with and without earlier cached positions (p0), over a
// partial last tile; the attention's output is bitwise the same with and without the sums.
TYPED_TEST(EvictEngine, PrefillKeyMassEqualsDirectSums) {
  using E = TypeParam;
  if constexpr (!Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                            typename E::memory_space>::accessible) {
    GTEST_SKIP() << "the key mass is summed by the host attention";
  } else {
    const int n_seq = 2, nh = 4, nkv = 2, d = 8, g = nh / nkv, kw = nkv * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    for (const int p0 : {0, 20}) {
      SCOPED_TRACE("p0 " + std::to_string(p0));
      const int T = 150, ctx = p0 + T;
      const auto K = random_vec(n_seq * ctx * kw, 51, 1.5f), V = random_vec(n_seq * ctx * kw, 52);
      const auto Q = random_vec(n_seq * T * nh * d, 53, 1.5f);
      Cache<E> kc("k", n_seq, ctx, kw), vc("v", n_seq, ctx, kw);
      {
        auto hk = Kokkos::create_mirror_view(kc);
        auto hv = Kokkos::create_mirror_view(vc);
        for (int s = 0; s < n_seq; ++s)
          for (int p = 0; p < ctx; ++p)
            for (int i = 0; i < kw; ++i) {
              hk(s, p, i) = K[(s * ctx + p) * kw + i];
              hv(s, p, i) = V[(s * ctx + p) * kw + i];
            }
        Kokkos::deep_copy(kc, hk);
        Kokkos::deep_copy(vc, hv);
      }
      const auto q = to_device<E>(Q, n_seq * T, nh * d);
      Mat<E> plain("plain", n_seq * T, nh * d), fused("fused", n_seq * T, nh * d);
      KeyMass<E> mass;
      mass.votes = Kokkos::View<double***, Layout, DeviceOf<E>>("votes", n_seq, nkv, ctx + 7);
      attention(E(), CMat<E>(q), kc, vc, plain, n_seq, T, p0, nh, nkv, d, d, scale);
      attention(E(), CMat<E>(q), kc, vc, fused, n_seq, T, p0, nh, nkv, d, d, scale, &mass);
      EXPECT_TRUE(same_bits(to_host(plain), to_host(fused)));
      EXPECT_GT(mass.seconds, 0.0);
      auto hm = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), mass.votes);
      double worst = 0, total = 0;
      for (int s = 0; s < n_seq; ++s)
        for (int h = 0; h < nkv; ++h) {
          std::vector<double> want(static_cast<std::size_t>(ctx), 0.0);
          for (int gg = 0; gg < g; ++gg)
            for (int t = 0; t < T; ++t)
              add_softmax_weights(
                  &Q[(s * T + t) * nh * d + (h * g + gg) * d], &K[s * ctx * kw + h * d], kw, d,
                  p0 + t + 1, scale, [](int) { return false; }, want);
          for (int p = 0; p < ctx; ++p) {
            worst = std::max(worst, std::abs(hm(s, h, p) - want[p]) / std::max(1.0, want[p]));
            total += hm(s, h, p);
          }
        }
      EXPECT_LT(worst, 1e-5);
      // every row's weights sum to one: the votes add up to rows × query heads
      EXPECT_NEAR(total, double(n_seq) * T * nh, 1e-3);
    }
  }
}

// Attention of decode rows over a cache with per-head evictions (and dropped positions) equals
// attention computed over a cache that holds only each head's kept tokens.
TYPED_TEST(EvictEngine, AttentionOverEvictedCacheEqualsKeptTokensAlone) {
  using E = TypeParam;
  Config c = tiny_config();
  c.n_layer = 1;
  const int n_seq = 2, P = 26, d = c.head_dim, nkv = c.n_kv_head, nh = c.n_head, g = nh / nkv;
  const int kw = nkv * d, ctx = P + 1;
  KVCache<E> cache(c, n_seq, ctx);
  const auto K = random_vec(n_seq * ctx * kw, 41), V = random_vec(n_seq * ctx * kw, 42);
  cache.store(E(), 0, CMat<E>(to_device<E>(K, n_seq * ctx, kw)),
              CMat<E>(to_device<E>(V, n_seq * ctx, kw)), n_seq, ctx, 0);
  KeptTokens kt;
  kt.positions = P;
  SynthRng r(9);
  kt.idx.resize(n_seq);
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < nkv; ++h) {
      std::vector<int> keep;
      for (int p = 0; p < P; ++p)
        if (r.uniform() < 0.45 || p == P - 1) keep.push_back(p);
      kt.idx[s].push_back(keep);
    }
  cache.evict(E(), 0, kt);
  EXPECT_TRUE(cache.layer(0).has_evictions());
  const auto Q = random_vec(n_seq * nh * d, 43, 2.0f);
  IVec<E> rs("rs", n_seq), rp("rp", n_seq);
  auto hrs = Kokkos::create_mirror_view(rs);
  auto hrp = Kokkos::create_mirror_view(rp);
  for (int s = 0; s < n_seq; ++s) hrs(s) = s, hrp(s) = P;  // the decode row at position P
  Kokkos::deep_copy(rs, hrs);
  Kokkos::deep_copy(rp, hrp);
  Mat<E> out("out", n_seq, nh * d);
  cached_attention(E(), CMat<E>(to_device<E>(Q, n_seq, nh * d)), rs, rp, cache.layer(0),
                   cache.shape(0), out, ctx);
  const auto got = to_host(out);
  // per (sequence, KV head): a one-head cache of only the kept tokens and the decode token
  Config c1 = c;
  c1.n_head = g;
  c1.n_kv_head = 1;
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < nkv; ++h) {
      std::vector<int> pos = kt.idx[s][h];
      pos.push_back(P);
      const int n = static_cast<int>(pos.size());
      std::vector<float> k1, v1,
          q1(Q.begin() + (s * nh + h * g) * d, Q.begin() + (s * nh + (h + 1) * g) * d);
      for (int p : pos)
        for (int j = 0; j < d; ++j) {
          k1.push_back(K[(s * ctx + p) * kw + h * d + j]);
          v1.push_back(V[(s * ctx + p) * kw + h * d + j]);
        }
      KVCache<E> small(c1, 1, n);
      small.store(E(), 0, CMat<E>(to_device<E>(k1, n, d)), CMat<E>(to_device<E>(v1, n, d)), 1, n,
                  0);
      IVec<E> r1("r1", 1), p1("p1", 1);
      Kokkos::deep_copy(p1, n - 1);
      Mat<E> o1("o1", 1, g * d);
      cached_attention(E(), CMat<E>(to_device<E>(q1, 1, g * d)), r1, p1, small.layer(0),
                       small.shape(0), o1, n);
      const auto want = to_host(o1);
      for (int i = 0; i < g * d; ++i)
        EXPECT_NEAR(got[s * nh * d + h * g * d + i], want[i], 1e-5 * (1 + std::fabs(want[i])))
            << "s " << s << " h " << h << " i " << i;
    }
  // the device decode kernel reads the mask alike
  attn::DecodeWorkspace<E> ws;
  ws.ensure(n_seq, nh, nkv, d, ctx);
  Mat<E> out2("out2", n_seq, nh * d);
  attention_decode_split(E(), CMat<E>(to_device<E>(Q, n_seq, nh * d)), cache.layer(0), rp, out2,
                         n_seq, cache.shape(0), ws);
  const auto got2 = to_host(out2);
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got2[i], got[i], 1e-5 * (1 + std::fabs(got[i]))) << i;
}

std::vector<int> tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 89 + seed * 37 + (i * i) % 11) % (vocab - 3);
  return t;
}

// A budget that covers the prompt (fraction 1, or as many tokens as the prompt) evicts
// nothing: prefill, decode and the perplexity protocol give the dense bits, and the device
// path too.
TYPED_TEST(EvictEngine, BudgetCoveringPromptIsBitwiseDense) {
  using E = TypeParam;
  TempDir dir;
  auto w = load_model<E>(make_model(dir, "m.gguf", tiny_spec(61)), LoadOptions{});
  const Config& c = w->cfg;
  const int P = 50;
  const auto s0 = tokens(60, c.vocab, 3), s1 = tokens(60, c.vocab, 4);
  const std::vector<std::vector<int>> pr = {std::vector<int>(s0.begin(), s0.begin() + P),
                                            std::vector<int>(s1.begin(), s1.begin() + P)};
  for (EvictMethod m :
       {EvictMethod::Streaming, EvictMethod::H2O, EvictMethod::SnapKV, EvictMethod::PyramidKV})
    for (double b : {1.0, double(P)})
      for (bool device : {false, true}) {
        SCOPED_TRACE(std::string(pruning::to_string(m)) + " budget " + std::to_string(b));
        EvictOptions o;
        o.method = m;
        o.budget = b;
        o.window = 8;
        pruning::TokenEvictorPolicy<E> ev(o, c.n_layer, c.n_kv_head, 2);
        Engine<E> a(w, 2, 96), d(w, 2, 96);
        a.set_device_path(device);
        d.set_device_path(device);
        a.set_token_evictor(&ev);
        EXPECT_TRUE(same_bits(to_host(a.forward(pr, 0, true)), to_host(d.forward(pr, 0, true))));
        EXPECT_FALSE(a.cache().layer(0).has_evictions());
        for (int t = P; t < 60; ++t)
          EXPECT_TRUE(same_bits(to_host(a.forward({{s0[t]}, {s1[t]}}, t, false)),
                                to_host(d.forward({{s0[t]}, {s1[t]}}, t, false))));
        EXPECT_DOUBLE_EQ(ev.kept_fraction(), 1.0);
        EXPECT_DOUBLE_EQ(ev.kv_bytes_kept(), ev.kv_bytes_dense());
        if (device) continue;
        const std::vector<int> stream = tokens(400, c.vocab, 5);
        PplOptions po;
        po.context = 96;
        po.stride = 64;
        po.score = 32;
        po.batch = 2;
        o.budget = 1.0;
        pruning::TokenEvictorPolicy<E> ev2(o, c.n_layer, c.n_kv_head, 2);
        a.set_token_evictor(&ev2);
        const PplResult ra = perplexity(a, stream, po), rb = perplexity(d, stream, po);
        EXPECT_TRUE(same_bits(ra.window_nll, rb.window_nll));
      }
}

/// Tokens from .. to of a sequence.
std::vector<int> part(const std::vector<int>& s, int from, int to) {
  return std::vector<int>(s.begin() + from, s.begin() + to);
}

/// An evictor, with or without GRACE after it.
struct EvictCase {
  EvictMethod m;
  bool grace;
};

// Prefill with each policy (and with SnapKV ∘ GRACE), then decode: against the reference model
// that leaves each head's evicted tokens (and GRACE's pruned channels) out of every later score,
// and the device path against the op-by-op path; teacher-forced scoring of the decoded tokens
// against token by token; the ledger's realised attention below dense and the selection op.
TYPED_TEST(EvictEngine, DecodeEqualsReferenceOverKeptTokens) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(62));
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const int n_seq = 2, P = 40, D = 6, V = c.vocab, d = c.head_dim;
  const auto s0 = tokens(P + D, V, 1), s1 = tokens(P + D, V, 2);
  for (const EvictCase cs :
       {EvictCase{EvictMethod::Streaming, false}, EvictCase{EvictMethod::H2O, false},
        EvictCase{EvictMethod::SnapKV, false}, EvictCase{EvictMethod::PyramidKV, false},
        EvictCase{EvictMethod::SnapKV, true}, EvictCase{EvictMethod::H2O, true}}) {
    SCOPED_TRACE(std::string(pruning::to_string(cs.m)) + (cs.grace ? " + grace" : ""));
    EvictOptions o;
    o.method = cs.m;
    o.budget = 0.5;
    o.window = 8;
    o.sinks = 3;
    o.beta = 4;
    pruning::TokenEvictorPolicy<E> ev(o, c.n_layer, c.n_kv_head, n_seq),
        ev2(o, c.n_layer, c.n_kv_head, n_seq), ev3(o, c.n_layer, c.n_kv_head, n_seq);
    pruning::KvPruneOptions ko;
    ko.method = pruning::KvMethod::Grace;
    ko.lambda = 0.5;
    ko.window = 8;
    ko.recent = 4;
    pruning::KvChannelPruner<E> sel(ko, c.n_layer, c.n_kv_head, d, n_seq, n_seq),
        sel2(ko, c.n_layer, c.n_kv_head, d, n_seq, n_seq),
        sel3(ko, c.n_layer, c.n_kv_head, d, n_seq, n_seq);
    flops::Ledger led(c.n_layer);
    Engine<E> a(w, n_seq, 64, &led), b(w, n_seq, 64), tf(w, n_seq, 64);
    b.set_device_path(true);
    a.set_token_evictor(&ev);
    b.set_token_evictor(&ev2);
    tf.set_token_evictor(&ev3);
    if (cs.grace) {
      a.set_channel_selector(&sel);
      b.set_channel_selector(&sel2);
      tf.set_channel_selector(&sel3);
    }
    a.forward({part(s0, 0, P), part(s1, 0, P)}, 0, false);
    b.forward({part(s0, 0, P), part(s1, 0, P)}, 0, false);
    tf.forward({part(s0, 0, P), part(s1, 0, P)}, 0, false);
    for (int l = 0; l < c.n_layer; ++l) {
      ASSERT_TRUE(a.cache().layer(l).has_evictions()) << l;
      EXPECT_EQ(a.cache().layer(l).compacted(), cs.grace);
      EXPECT_EQ(a.cache().kept_tokens(l), b.cache().kept_tokens(l));
      const int budget = pruning::layer_budget(o, l, c.n_layer, P);
      for (const auto& seq : a.cache().kept_tokens(l))
        for (const auto& head : seq) EXPECT_EQ(static_cast<int>(head.size()), budget);
    }
    if (cs.m == EvictMethod::PyramidKV) {
      EXPECT_GT(a.cache().kept_tokens(0)[0][0].size(), a.cache().kept_tokens(1)[0][0].size());
    }
    EXPECT_LT(ev.kv_bytes_kept(), ev.kv_bytes_dense());
    ReferenceLlama r0(path), r1(path);
    for (int t = 0; t < P; ++t) r0.step(s0[t]), r1.step(s1[t]);
    auto evicted = [&](int s) {
      return [&, s](int l, int t, int h) {
        if (t >= P) return false;
        const auto& k = a.cache().kept_tokens(l)[s][h];
        return !std::binary_search(k.begin(), k.end(), t);
      };
    };
    r0.evicted = evicted(0);
    r1.evicted = evicted(1);
    if (cs.grace) {
      const int PC = P - ko.recent;
      auto keep = [&](int s) {
        return [&, s, PC](int l, int t, int h, int j) {
          return t >= PC || sel.kept_mask(s)[(l * c.n_kv_head + h) * d + j] != 0;
        };
      };
      r0.keep = keep(0);
      r1.keep = keep(1);
    }
    const auto tfl = to_host(tf.forward({part(s0, P, P + D), part(s1, P, P + D)}, P, true));
    for (int t = P; t < P + D; ++t) {
      const auto x = to_host(a.forward({{s0[t]}, {s1[t]}}, t, false));
      const auto y = to_host(b.forward({{s0[t]}, {s1[t]}}, t, false));
      EXPECT_LE(rel_err(y, x), 1e-5) << "device path, position " << t;
      EXPECT_LE(rel_err(std::vector<float>(x.begin(), x.begin() + V), r0.step(s0[t])), 2e-5) << t;
      EXPECT_LE(rel_err(std::vector<float>(x.begin() + V, x.end()), r1.step(s1[t])), 2e-5) << t;
      for (int s = 0; s < n_seq; ++s) {
        const int i = s * D + (t - P);
        EXPECT_LE(rel_err(std::vector<float>(tfl.begin() + i * V, tfl.begin() + (i + 1) * V),
                          std::vector<float>(x.begin() + s * V, x.begin() + (s + 1) * V)),
                  1e-5)
            << "teacher-forced, s " << s << " t " << t;
      }
    }
    const auto att = led.by_op(flops::Op::AttnScore);
    EXPECT_LT(att.flops_realised, att.flops_dense);
    const auto sel_op = led.by_op(flops::Op::TokenEvict);
    if (cs.m != EvictMethod::Streaming) {
      EXPECT_GT(sel_op.flops_realised, 0.0);
    }
    EXPECT_EQ(sel_op.flops_dense, 0.0);
  }
}

/// The tiny model with a context of 1,024 tokens: prompts long enough for whole 256-slot chunks.
template <class E>
std::shared_ptr<const Weights<E>> long_context_model(const TempDir& dir, int seed) {
  SynthSpec spec = tiny_spec(seed);
  spec.cfg.context_length = 1024;
  return load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
}

/// Decodes positions P … P + D − 1 of s0 and s1 on `a` (kept tokens moved, host path), `b` (the
/// same, device path) and `m` (evicted positions kept in place): each step's logits of a and b
/// against m's to 1e−5. Returns a's logits of each step.
template <class E>
std::vector<std::vector<float>> decode_as_masked(Engine<E>& a, Engine<E>& b, Engine<E>& m,
                                                 const std::vector<int>& s0,
                                                 const std::vector<int>& s1, int P, int D) {
  std::vector<std::vector<float>> out;
  for (int t = P; t < P + D; ++t) {
    out.push_back(to_host(a.forward({{s0[t]}, {s1[t]}}, t, false)));
    const auto y = to_host(b.forward({{s0[t]}, {s1[t]}}, t, false));
    const auto z = to_host(m.forward({{s0[t]}, {s1[t]}}, t, false));
    EXPECT_LE(rel_err(out.back(), z), 1e-5) << "host path, position " << t;
    EXPECT_LE(rel_err(y, z), 1e-5) << "device path, position " << t;
  }
  return out;
}

// A long prompt: the cache moves each head's kept tokens to its first slots and the kernels skip
// the whole chunks no head uses (KVLayer::gap_begin … gap_end). Decode on the host path and on
// the device path (its split-K kernel), and a multi-row call after the prompt, give the logits
// of a cache that keeps the evicted positions in place, masked (an engine recording attention
// mass does not move them), to ≤ 1e-5 (the sums run over other chunks), with and without
// GRACE's compact keys, and the ledger counts the same attention work.
TYPED_TEST(EvictEngine, MovedTokensDecodeAsTheMaskedCache) {
  using E = TypeParam;
  TempDir dir;
  auto w = long_context_model<E>(dir, 63);
  const Config& c = w->cfg;
  const int n_seq = 2, P = 600, D = 4, V = c.vocab, d = c.head_dim;
  const auto s0 = tokens(P + D, V, 3), s1 = tokens(P + D, V, 4);
  for (const EvictCase cs :
       {EvictCase{EvictMethod::SnapKV, false}, EvictCase{EvictMethod::H2O, false},
        EvictCase{EvictMethod::Streaming, false}, EvictCase{EvictMethod::SnapKV, true}}) {
    SCOPED_TRACE(std::string(pruning::to_string(cs.m)) + (cs.grace ? " + grace" : ""));
    EvictOptions o;
    o.method = cs.m;
    o.budget = 0.25;  // 150 tokens per head: the chunks from 256 to 512 hold none
    o.window = 16;
    o.sinks = 4;
    std::vector<std::unique_ptr<pruning::TokenEvictorPolicy<E>>> evs;
    std::vector<std::unique_ptr<pruning::KvChannelPruner<E>>> sels;
    pruning::KvPruneOptions ko;
    ko.method = pruning::KvMethod::Grace;
    ko.lambda = 0.5;
    ko.window = 16;
    flops::Ledger la(c.n_layer), lm(c.n_layer);
    Engine<E> a(w, n_seq, P + D, &la), b(w, n_seq, P + D), m(w, n_seq, P + D, &lm),
        tf(w, n_seq, P + D);
    b.set_device_path(true);
    m.record_attention_mass(true);
    for (Engine<E>* e : {&a, &b, &m, &tf}) {
      evs.push_back(
          std::make_unique<pruning::TokenEvictorPolicy<E>>(o, c.n_layer, c.n_kv_head, n_seq));
      e->set_token_evictor(evs.back().get());
      if (cs.grace) {
        sels.push_back(std::make_unique<pruning::KvChannelPruner<E>>(ko, c.n_layer, c.n_kv_head, d,
                                                                     n_seq, n_seq));
        e->set_channel_selector(sels.back().get());
      }
      e->forward({part(s0, 0, P), part(s1, 0, P)}, 0, false);
    }
    for (int l = 0; l < c.n_layer; ++l) {
      EXPECT_EQ(a.cache().kept_tokens(l), m.cache().kept_tokens(l)) << l;
      EXPECT_EQ(b.cache().kept_tokens(l), m.cache().kept_tokens(l)) << l;
      for (Engine<E>* e : {&a, &b}) {
        EXPECT_EQ(e->cache().layer(l).gap_begin, 256) << l;
        EXPECT_EQ(e->cache().layer(l).gap_end, 512) << l;
      }
      EXPECT_FALSE(m.cache().layer(l).has_gap()) << "recording attention mass: kept in place";
      EXPECT_EQ(a.cache().layer(l).compacted(), cs.grace);
    }
    const auto many = to_host(tf.forward({part(s0, P, P + D), part(s1, P, P + D)}, P, true));
    const auto steps = decode_as_masked(a, b, m, s0, s1, P, D);
    for (int t = P; t < P + D; ++t) {
      const auto& x = steps[static_cast<std::size_t>(t - P)];
      for (int s = 0; s < n_seq; ++s) {
        const int i = s * D + (t - P);
        EXPECT_LE(rel_err(std::vector<float>(many.begin() + i * V, many.begin() + (i + 1) * V),
                          std::vector<float>(x.begin() + s * V, x.begin() + (s + 1) * V)),
                  1e-5)
            << "rows after the prompt in one call, s " << s << " t " << t;
      }
    }
    for (auto op : {flops::Op::AttnScore, flops::Op::AttnValue})
      EXPECT_DOUBLE_EQ(la.by_op(op).flops_realised, lm.by_op(op).flops_realised);
    // the move: every kept key (at its region's width) and value read and written once
    double moved = 0;
    for (int l = 0; l < c.n_layer; ++l) {
      const auto& kept = m.cache().kept_tokens(l);
      const int base = m.cache().layer(l).k_base;
      for (int s = 0; s < n_seq; ++s)
        for (int h = 0; h < c.n_kv_head; ++h)
          for (int p : kept[s][h]) {
            const int kw = p < base ? m.cache().kept_counts(l)[s][h] : d;
            moved += 8.0 * (kw + d);
          }
    }
    EXPECT_DOUBLE_EQ(la.by_op(flops::Op::TokenEvict).bytes_realised -
                         lm.by_op(flops::Op::TokenEvict).bytes_realised,
                     moved);
    // a new prompt starts from the dense layout
    a.forward({part(s0, 0, 32), part(s1, 0, 32)}, 0, false);
    EXPECT_FALSE(a.cache().layer(0).has_gap());
  }
}

// With Token Filtering gating the prompt (skipped tokens dropped from the cache, or kept and
// masked only in the similarity test), eviction still moves the kept tokens together: decode and
// the gate's later calls over the moved cache equal those over the cache that keeps the evicted
// (and dropped) positions in place, on the host and the device path.
TYPED_TEST(EvictEngine, MovedTokensWithATokenGateDecodeAsTheMaskedCache) {
  using E = TypeParam;
  TempDir dir;
  auto w = long_context_model<E>(dir, 64);
  const Config& c = w->cfg;
  const int n_seq = 2, P = 600, D = 4, d = c.head_dim;
  const auto s0 = tokens(P + D, c.vocab, 5), s1 = tokens(P + D, c.vocab, 6);
  for (const bool drop : {true, false}) {
    SCOPED_TRACE(drop ? "dropping gate" : "masking gate");
    EvictOptions o;
    o.method = EvictMethod::SnapKV;
    o.budget = 0.25;
    o.window = 16;
    gating::TokenFilterOptions to;
    to.ratio = 0.3;
    to.num_layers = c.n_layer;
    to.drop_skipped = drop;
    Engine<E> a(w, n_seq, P + D), b(w, n_seq, P + D), m(w, n_seq, P + D);
    b.set_device_path(true);
    m.record_attention_mass(true);  // keeps the evicted positions in place
    std::vector<std::unique_ptr<pruning::TokenEvictorPolicy<E>>> evs;
    std::vector<std::unique_ptr<gating::TokenFilter<E>>> gates;
    for (Engine<E>* e : {&a, &b, &m}) {
      evs.push_back(
          std::make_unique<pruning::TokenEvictorPolicy<E>>(o, c.n_layer, c.n_kv_head, n_seq));
      gates.push_back(
          std::make_unique<gating::TokenFilter<E>>(to, c.n_layer, c.n_kv_head, d, d, n_seq));
      e->set_token_evictor(evs.back().get());
      e->set_token_gate(gates.back().get());
      e->forward({part(s0, 0, P), part(s1, 0, P)}, 0, false);
    }
    bool moved = false;
    for (int l = 0; l < c.n_layer; ++l) {
      EXPECT_EQ(a.cache().kept_tokens(l), m.cache().kept_tokens(l)) << l;
      EXPECT_EQ(a.cache().layer(l).has_drops(), drop) << l;
      moved = moved || a.cache().layer(l).has_gap();
      EXPECT_FALSE(m.cache().layer(l).has_gap());
    }
    EXPECT_TRUE(moved) << "the kept tokens were moved together";
    decode_as_masked(a, b, m, s0, s1, P, D);
    for (int l = 0; l < c.n_layer; ++l) {
      EXPECT_EQ(gates[0]->skipped(l), gates[2]->skipped(l)) << l;
      if (l > 0) {
        EXPECT_GT(gates[0]->skipped(l), 0u) << l;
      }
    }
  }
}

/// Hands the policy's inputs through and keeps a host copy of the observed queries per layer.
template <class E>
class RecordingEvictor final : public TokenEvictor<E> {
 public:
  explicit RecordingEvictor(TokenEvictor<E>& inner) : in_(inner) {}
  int observation_window(int T) const override { return in_.observation_window(T); }
  bool evicts(int T) const override { return in_.evicts(T); }
  KeptTokens select(const E& exec, int layer, const KVLayer<E>& cache, const AttnShape& shape,
                    const CMat<E>& q_obs, const IVec<E>& q_ok, int n_seq, int T) override {
    Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> h("q", q_obs.extent(0),
                                                                    q_obs.extent(1));
    Kokkos::deep_copy(h, q_obs);
    if (static_cast<int>(q.size()) <= layer) q.resize(static_cast<std::size_t>(layer + 1));
    q[static_cast<std::size_t>(layer)].assign(h.data(), h.data() + h.size());
    return in_.select(exec, layer, cache, shape, q_obs, q_ok, n_seq, T);
  }
  void account(int layer, double dense, double kept) override { in_.account(layer, dense, kept); }
  std::vector<std::vector<float>> q;  ///< [layer][row·n_head·qk]

 private:
  TokenEvictor<E>& in_;
};

// The engine gathers the observation queries from its own prefill (each sequence's last w rows,
// after RoPE; the host attention path and the device path's tiled prefill): the queries it hands
// the policy are the reference model's queries of those positions, and its kept sets are the
// ones that votes computed here from the reference's queries and keys (double precision) give.
TYPED_TEST(EvictEngine, KeptSetsFromPrefillMatchReferenceQueriesAndKeys) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(64));
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const int n_seq = 2, P = 40, d = c.head_dim, nh = c.n_head, nkv = c.n_kv_head, g = nh / nkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const std::vector<std::vector<int>> prompts = {tokens(P, c.vocab, 5), tokens(P, c.vocab, 6)};
  // the reference's post-RoPE queries and keys: [seq][layer][pos][channel]
  std::vector<std::vector<std::vector<std::vector<double>>>> rq(n_seq), rk(n_seq);
  for (int s = 0; s < n_seq; ++s) {
    ReferenceLlama r(path);
    rq[s].resize(c.n_layer);
    rk[s].resize(c.n_layer);
    r.on_qk = [&, s](int l, int, const std::vector<double>& q, const std::vector<double>& k) {
      rq[s][l].push_back(q);
      rk[s][l].push_back(k);
    };
    for (int t = 0; t < P; ++t) r.step(prompts[s][t]);
  }
  struct Case {
    EvictMethod m;
    EvictPool pool;
  };
  for (const Case cs :
       {Case{EvictMethod::H2O, EvictPool::Avg}, Case{EvictMethod::SnapKV, EvictPool::Avg},
        Case{EvictMethod::SnapKV, EvictPool::Max}, Case{EvictMethod::PyramidKV, EvictPool::Avg}})
    for (bool device : {false, true}) {
      SCOPED_TRACE(std::string(pruning::to_string(cs.m)) + " " + pruning::to_string(cs.pool) +
                   (device ? " device path" : " host path"));
      EvictOptions o;
      o.method = cs.m;
      o.pool = cs.pool;
      o.budget = 0.5;
      o.window = 8;
      o.kernel = 3;
      o.beta = 4;
      pruning::TokenEvictorPolicy<E> ev(o, c.n_layer, nkv, n_seq);
      RecordingEvictor<E> rec(ev);
      Engine<E> a(w, n_seq, 64);
      a.set_device_path(device);
      a.set_token_evictor(&rec);
      a.forward(prompts, 0, false);
      const int wn = ev.observation_window(P);
      ASSERT_EQ(static_cast<int>(rec.q.size()), c.n_layer);
      for (int l = 0; l < c.n_layer; ++l) {
        ASSERT_TRUE(a.cache().layer(l).has_evictions()) << l;
        const auto& q = rec.q[static_cast<std::size_t>(l)];
        ASSERT_EQ(q.size(), static_cast<std::size_t>(n_seq * wn * nh * d)) << l;
        for (int s = 0; s < n_seq; ++s) {
          // the observed rows are the reference's queries of positions P − w … P − 1
          double err = 0, ref = 0;
          for (int i = 0; i < wn; ++i)
            for (int j = 0; j < nh * d; ++j) {
              const double want = rq[s][l][P - wn + i][j];
              err = std::max(err, std::abs(q[(s * wn + i) * nh * d + j] - want));
              ref = std::max(ref, std::abs(want));
            }
          EXPECT_LE(err, 1e-5 * std::max(1.0, ref)) << "layer " << l << " s " << s;
          const int C = pruning::layer_budget(o, l, c.n_layer, P);
          for (int h = 0; h < nkv; ++h) {
            std::vector<double> votes(P, 0.0);
            for (int gg = 0; gg < g; ++gg)
              for (int i = 0; i < wn; ++i) {
                const int t = P - wn + i, hq = h * g + gg;
                std::vector<double> sc(t + 1);
                double mx = -1e300, z = 0;
                for (int p = 0; p <= t; ++p) {
                  double x = 0;
                  for (int j = 0; j < d; ++j) x += rq[s][l][t][hq * d + j] * rk[s][l][p][h * d + j];
                  sc[p] = x * scale;
                  mx = std::max(mx, sc[p]);
                }
                for (int p = 0; p <= t; ++p) z += std::exp(sc[p] - mx);
                for (int p = 0; p <= t; ++p) votes[p] += std::exp(sc[p] - mx) / z;
              }
            EXPECT_EQ(a.cache().kept_tokens(l)[s][h], pruning::choose_tokens(o, P, C, votes))
                << "layer " << l << " s " << s << " kv head " << h;
          }
        }
      }
    }
}

// A new prompt at position 0 ends the evictions of the previous one.
TYPED_TEST(EvictEngine, NewPromptResetsEvictions) {
  using E = TypeParam;
  TempDir dir;
  auto w = load_model<E>(make_model(dir, "m.gguf", tiny_spec(63)), LoadOptions{});
  const Config& c = w->cfg;
  EvictOptions o;
  o.method = EvictMethod::SnapKV;
  o.budget = 0.5;
  o.window = 4;
  pruning::TokenEvictorPolicy<E> ev(o, c.n_layer, c.n_kv_head, 1);
  Engine<E> a(w, 1, 64), d(w, 1, 64);
  a.set_token_evictor(&ev);
  const auto s = tokens(40, c.vocab, 8);
  a.forward({s}, 0, false);
  EXPECT_TRUE(a.cache().layer(0).has_evictions());
  // a single-token prompt is not a prefill: nothing is evicted, and the mask is gone
  EXPECT_TRUE(
      same_bits(to_host(a.forward({{s[0]}}, 0, false)), to_host(d.forward({{s[0]}}, 0, false))));
  EXPECT_FALSE(a.cache().layer(0).has_evictions());
  EXPECT_EQ(ev.prefills(), 1u);
}

// ---- the command line ----

namespace fs = std::filesystem;

class CliEvict : public TinyModelCli<CliEvict> {
 protected:
  static void SetUpTestSuite() { make_tiny({64, 7, 6000, 13, 1024}); }
  // windows of 128 tokens, the last 32 scored: 95 tokens are prefilled and evicted from first
  static std::string eval(const std::string& extra) {
    return on_tiny("eval", "--context 128 --stride 128 --score 32 --max-windows 2 --progress never",
                   extra);
  }
};

TEST_F(CliEvict, EvalRecordsKeptTokensAndBytes) {
  const std::string dj = dir_->file("dense.json");
  RunResult r = run_cmd(eval("--json " + dj));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto dense = read_json(dj);
  const std::string js = dir_->file("snap.json"), out = dir_->file("snap.h5");
  r =
      run_cmd(eval("--method grace --kv-prune 0.5 --evict snapkv --evict-budget 0.5 "
                   "--evict-window 16 --json " +
                   js + " --out " + out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(js);
  const auto& e = j.at("evict");
  EXPECT_EQ(e.at("method"), "snapkv");
  EXPECT_EQ(e.at("window").get<int>(), 16);
  // 2 windows × 2 layers × 2 KV heads, ⌈0.5·95⌉ = 48 of 95 tokens kept in each
  EXPECT_EQ(e.at("selections").get<int>(), 8);
  EXPECT_EQ(e.at("prefills").get<int>(), 2);
  EXPECT_NEAR(e.at("kept_fraction").get<double>(), 48.0 / 95, 1e-12);
  EXPECT_LT(e.at("kv_bytes_fraction").get<double>(), 48.0 / 95);  // GRACE halves the keys too
  ASSERT_EQ(e.at("per_layer").size(), 2u);
  EXPECT_DOUBLE_EQ(e.at("per_layer")[0].at("budget_tokens_mean").get<double>(), 48);
  EXPECT_TRUE(j.contains("kv_prune"));
  EXPECT_NE(j.at("perplexity").get<double>(), dense.at("perplexity").get<double>());
  io::H5File f = io::H5File::open_read(out);
  io::Group g = f.root().open_group("evict");
  EXPECT_EQ(g.get_attr<std::string>("method"), "snapkv");
  EXPECT_EQ(g.read<double>("kept_tokens").size(), 4u);
  // passkey with H2O and generate with StreamingLLM run and report
  r = run_cmd(sparsim_bin() + " eval --model " + model_ + " --corpus " + corpus_ +
              " --no-perplexity --task passkey --retrieval-lengths 200 --progress never "
              "--evict h2o --evict-budget 64 --evict-window 8 --json " +
              dir_->file("pk.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_json(dir_->file("pk.json")).at("evict").at("method"), "h2o");
  r = run_cmd(sparsim_bin() + " generate --model " + model_ +
              " --prompt 'abc def ghi jkl mno pqr stu' -n 4 --evict streaming --evict-budget 0.5 "
              "--evict-sinks 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("token eviction (streaming"), std::string::npos) << r.output;
  r = run_cmd(sparsim_bin() + " bench --model " + model_ +
              " --prompt 64 --decode 3 --reps 1 --evict pyramidkv --evict-window 8 --json " +
              dir_->file("bench.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto bj = read_json(dir_->file("bench.json"));
  EXPECT_GT(bj.at("select_seconds").get<double>(), 0.0);
  EXPECT_EQ(bj.at("evict").at("method"), "pyramidkv");
  // the decode attention kernels' own time per step, profiled, for both engines
  EXPECT_GT(bj.at("decode_attention_seconds_dense").get<double>(), 0.0);
  EXPECT_GT(bj.at("decode_attention_seconds_method").get<double>(), 0.0);
  EXPECT_LT(bj.at("decode_attention_seconds_dense").get<double>(),
            bj.at("decode_step_seconds_dense").get<double>());
  // with a dropping Token Filtering gate beside the evictor
  r = run_cmd(sparsim_bin() + " bench --model " + model_ +
              " --prompt 64 --decode 3 --reps 1 --method token-filter --tf-drop-skipped "
              "--tf-warmup 8 --evict snapkv --evict-window 8 --json " +
              dir_->file("bench_tf.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto tj = read_json(dir_->file("bench_tf.json"));
  EXPECT_EQ(tj.at("evict").at("method"), "snapkv");
  EXPECT_TRUE(tj.contains("token_filter"));
  EXPECT_GT(tj.at("decode_attention_seconds_method").get<double>(), 0.0);
}

// H2O's votes come from the prefill attention's tiles (KeyMass): the run is the same with one
// OpenMP thread and with two, to the bit.
TEST_F(CliEvict, H2OIsTheSameForAnyThreadCount) {
  std::vector<std::vector<double>> kept;
  std::vector<double> ppl;
  for (const char* n : {"1", "2"}) {
    const std::string js = dir_->file(std::string("h2o") + n + ".json"),
                      out = dir_->file(std::string("h2o") + n + ".h5");
    const RunResult r = run_cmd(eval("--backend openmp --threads " + std::string(n) +
                                     " --evict h2o --evict-budget 0.4 --evict-window 8 --json " +
                                     js + " --out " + out));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ppl.push_back(read_json(js).at("perplexity").get<double>());
    io::H5File f = io::H5File::open_read(out);
    kept.push_back(f.root().open_group("evict").read<double>("kept_tokens"));
  }
  EXPECT_EQ(std::memcmp(&ppl[0], &ppl[1], sizeof(double)), 0) << ppl[0] << " vs " << ppl[1];
  EXPECT_TRUE(same_bits(kept[0], kept[1]));
}

TEST_F(CliEvict, BadInputFailsWithoutOutput) {
  const std::string js = dir_->file("bad.json"), out = dir_->file("bad.h5");
  const std::string sink = " --json " + js + " --out " + out;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--evict snap", "--evict must be"},
      {"--evict h2o --evict-budget 0", "--evict-budget"},
      {"--evict h2o --evict-budget -0.5", "--evict-budget"},
      {"--evict h2o --evict-budget nan", "--evict-budget"},
      {"--evict h2o --evict-budget 2.5", "whole number"},
      {"--evict snapkv --evict-window 0", "--evict-window"},
      {"--evict snapkv --evict-budget 16 --evict-window 16", "--evict-window"},
      {"--evict snapkv --evict-window 95", "not shorter than the prompt"},
      {"--evict streaming --evict-sinks 95", "not shorter than the prompt"},
      {"--evict streaming --evict-sinks -1", "--evict-sinks"},
      {"--evict snapkv --evict-kernel 4", "--evict-kernel"},
      {"--evict snapkv --evict-pool mean", "--evict-pool"},
      {"--evict pyramidkv --evict-beta 0", "--evict-beta"},
      {"--evict-budget 0.3", "add --evict"},
  };
  expect_each_fails(cases, [&](const std::string& a) { return eval(a + sink); }, {js, out});
}

}  // namespace
}  // namespace sparsim::test
