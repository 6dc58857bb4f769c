// K-cache channel pruning (ThinK, GRACE): the objective against a direct computation, MIES
// against brute force over all subsets, the guard against ThinK, the device Grams against a
// double-precision reference, and the engine runs: compacted decode against a masked full-width
// decode and the reference model, λ = 0 bit for bit dense, teacher-forced against token by token.
#include "backends.hpp"
#include "compare_helpers.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "eval/perplexity.hpp"
#include "helpers.hpp"
#include "model/loader.hpp"
#include "policies/channel_scoring.hpp"
#include "policies/k_channel_selector.hpp"
#include "reference_llama.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace sparsim::test {
namespace {

using pruning::HeadGram;
using pruning::KvMethod;
using pruning::KvPruneOptions;

/// Q [m][d] and K [n][d] in double with the structure of real keys: a few outlier channels,
/// channels correlated in pairs (as RoPE pairs are), signs that let pairs cancel.
struct QK {
  int m, n, d;
  std::vector<double> q, k;
};

QK random_qk(int d, std::uint64_t seed, int m = 12, int n = 40) {
  SynthRng r(seed);
  QK x{m, n, d, std::vector<double>(static_cast<std::size_t>(m) * d),
       std::vector<double>(static_cast<std::size_t>(n) * d)};
  std::vector<double> qs(d), ks(d), mix(d);
  for (int j = 0; j < d; ++j) {
    qs[j] = 0.2 + 2.0 * r.uniform();
    ks[j] = (r.uniform() < 0.15 ? 6.0 : 0.3) + r.uniform();
    mix[j] = 1.6 * r.uniform() - 0.8;  // correlation with the channel's partner
  }
  auto fill = [&](std::vector<double>& v, int rows, const std::vector<double>& sc) {
    for (int t = 0; t < rows; ++t) {
      std::vector<double> z(d);
      for (int j = 0; j < d; ++j) z[j] = r.normal();
      for (int j = 0; j < d; ++j) {
        const int p = (j ^ 1) < d ? (j ^ 1) : j;
        v[static_cast<std::size_t>(t) * d + j] = sc[j] * (z[j] + mix[j] * z[p]);
      }
    }
  };
  fill(x.q, m, qs);
  fill(x.k, n, ks);
  return x;
}

/// ‖Q_P K_Pᵀ‖_F² by forming the m×n product of the pruned columns.
double direct_error(const QK& x, const std::vector<int>& P) {
  double e = 0;
  for (int a = 0; a < x.m; ++a)
    for (int b = 0; b < x.n; ++b) {
      double s = 0;
      for (int j : P)
        s +=
            x.q[static_cast<std::size_t>(a) * x.d + j] * x.k[static_cast<std::size_t>(b) * x.d + j];
      e += s * s;
    }
  return e;
}

std::vector<int> members(unsigned mask, int d) {
  std::vector<int> v;
  for (int j = 0; j < d; ++j)
    if (mask >> j & 1u) v.push_back(j);
  return v;
}

/// The minimum of the objective over all k-subsets of the candidates (brute force).
double brute_force_optimum(const HeadGram& g, int k, const std::vector<char>& cand) {
  double best = 1e300;
  for (unsigned mask = 0; mask < (1u << g.d); ++mask) {
    if (__builtin_popcount(mask) != k) continue;
    bool ok = true;
    for (int j = 0; j < g.d && ok; ++j)
      if ((mask >> j & 1u) && !cand.empty() && !cand[static_cast<std::size_t>(j)]) ok = false;
    if (ok) best = std::min(best, pruning::pruned_error(g, members(mask, g.d)));
  }
  return best;
}

TEST(KvPrune, GraceObjectiveIncrementalEqualsDirect) {
  for (int d : {8, 16, 64}) {
    const QK x = random_qk(d, 100 + d, 24, 200);
    const HeadGram g = pruning::gram_of(x.q, x.m, x.k, x.n, d);
    std::vector<int> all(static_cast<std::size_t>(d));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_NEAR(pruning::total_energy(g), direct_error(x, all), 1e-9 * pruning::total_energy(g));
    const auto r = pruning::mies(g, d - 1);
    std::vector<int> P;
    double acc = 0;
    for (std::size_t t = 0; t < r.pruned.size(); ++t) {
      P.push_back(r.pruned[t]);
      acc += r.increments[t];
      const double direct = direct_error(x, P);
      // the incremental objective, its Gram form and the explicit product agree
      EXPECT_NEAR(acc, direct, 1e-9 * std::max(1.0, direct)) << "d " << d << " step " << t;
      EXPECT_NEAR(pruning::pruned_error(g, P), direct, 1e-9 * std::max(1.0, direct));
    }
    EXPECT_NEAR(r.objective, acc, 1e-12 * std::max(1.0, acc));
    // node and edge weights are the paper's: ‖q_i‖²‖k_i‖² and 2(q_iᵀq_j)(k_iᵀk_j)
    double qi = 0, ki = 0, qq = 0, kk = 0;
    for (int a = 0; a < x.m; ++a) {
      qi += x.q[a * d + 2] * x.q[a * d + 2];
      qq += x.q[a * d + 2] * x.q[a * d + 5];
    }
    for (int b = 0; b < x.n; ++b) {
      ki += x.k[b * d + 2] * x.k[b * d + 2];
      kk += x.k[b * d + 2] * x.k[b * d + 5];
    }
    EXPECT_NEAR(g.node(2), qi * ki, 1e-9 * qi * ki);
    EXPECT_NEAR(g.edge(2, 5), 2 * qq * kk, 1e-9 * std::fabs(2 * qq * kk) + 1e-12);
  }
}

// For d ≤ 12: every MIES step is the best single addition (brute force over the candidates);
// the result is never below the optimum over all subsets; GRACE (guard on) is never worse than
// ThinK on the objective; on this family MIES is closer to the optimum than ThinK on average
// and strictly better in some cases. The counts are printed for the record.
TEST(KvPrune, MiesAgainstBruteForceAndThink) {
  int cases = 0, mies_opt = 0, think_opt = 0, mies_beats_think = 0, think_beats_mies = 0;
  double gap_mies = 0, gap_think = 0;
  for (int d : {6, 8, 10, 12})
    for (std::uint64_t seed = 1; seed <= 12; ++seed) {
      const QK x = random_qk(d, seed * 131 + d, 8, 30);
      const HeadGram g = pruning::gram_of(x.q, x.m, x.k, x.n, d);
      for (int k = 1; k < d; ++k) {
        const auto r = pruning::mies(g, k);
        // greedy step = brute-force best single addition, from the objective itself
        std::vector<int> P;
        for (int t = 0; t < k; ++t) {
          double best = 1e300;
          for (int c = 0; c < d; ++c) {
            if (std::find(P.begin(), P.end(), c) != P.end()) continue;
            auto Q = P;
            Q.push_back(c);
            best = std::min(best, pruning::pruned_error(g, Q) - pruning::pruned_error(g, P));
          }
          EXPECT_NEAR(r.increments[t], best, 1e-9 * std::max(1.0, std::fabs(best)));
          P.push_back(r.pruned[t]);
        }
        const double opt = brute_force_optimum(g, k, {});
        const double em = pruning::pruned_error(g, r.pruned);
        const double et = pruning::pruned_error(g, pruning::think_prune(g, k));
        EXPECT_GE(em, opt * (1 - 1e-12));
        EXPECT_GE(et, opt * (1 - 1e-12));
        if (k == 1) {
          EXPECT_NEAR(em, opt, 1e-12 * std::max(1.0, opt));  // one step is exact
        }
        KvPruneOptions o;
        o.method = KvMethod::Grace;
        o.lambda = (k + 0.5) / d;         // ⌊λd⌋ = k
        o.protect_lo = o.protect_hi = 0;  // no protection: GRACE against ThinK itself
        o.guard = true;
        const auto c = pruning::choose_channels(g, o);
        ASSERT_EQ(static_cast<int>(c.pruned.size()), k);
        EXPECT_LE(c.err_grace, c.err_think * (1 + 1e-12) + 1e-300);
        EXPECT_NEAR(c.err_think, et, 1e-12 * std::max(1.0, et));
        ++cases;
        mies_opt += em <= opt * (1 + 1e-9);
        think_opt += et <= opt * (1 + 1e-9);
        mies_beats_think += em < et * (1 - 1e-9);
        think_beats_mies += et < em * (1 - 1e-9);
        gap_mies += opt > 0 ? em / opt - 1 : 0;
        gap_think += opt > 0 ? et / opt - 1 : 0;
      }
    }
  std::printf(
      "[ record ] %d cases: MIES optimal %d, ThinK optimal %d; MIES < ThinK %d, ThinK < MIES "
      "%d; mean excess over the optimum: MIES %.4f, ThinK %.4f\n",
      cases, mies_opt, think_opt, mies_beats_think, think_beats_mies, gap_mies / cases,
      gap_think / cases);
  EXPECT_GT(mies_beats_think, 0);
  EXPECT_GT(mies_opt, think_opt);
  EXPECT_LT(gap_mies, gap_think);
}

// Uncorrelated channels (diagonal Grams): the objective has no edges, so ThinK, MIES and the
// optimum coincide.
TEST(KvPrune, DiagonalGramsMakeEveryMethodOptimal) {
  HeadGram g;
  g.d = 10;
  g.gq.assign(100, 0.0);
  g.gk.assign(100, 0.0);
  SynthRng r(5);
  for (int i = 0; i < 10; ++i) {
    g.gq[i * 10 + i] = 0.1 + r.uniform();
    g.gk[i * 10 + i] = 0.1 + r.uniform();
  }
  for (int k = 1; k < 10; ++k) {
    const double opt = brute_force_optimum(g, k, {});
    EXPECT_NEAR(pruning::pruned_error(g, pruning::mies(g, k).pruned), opt, 1e-12);
    EXPECT_NEAR(pruning::pruned_error(g, pruning::think_prune(g, k)), opt, 1e-12);
  }
}

// Salient protection: threshold mean + std of the key-channel norms, share clamped to [a, b],
// never more than the unpruned channels; GRACE never prunes a protected channel and is never
// worse than ThinK restricted to the same candidates.
TEST(KvPrune, SalientProtectionAndGuard) {
  HeadGram g;
  g.d = 20;
  g.gq.assign(400, 0.0);
  g.gk.assign(400, 0.0);
  for (int i = 0; i < 20; ++i) {
    g.gq[i * 20 + i] = 1.0;
    g.gk[i * 20 + i] = 1.0;  // norm 1
  }
  for (int i : {3, 11, 17}) g.gk[i * 20 + i] = 100.0;  // norm 10: the salient ones
  auto p = pruning::protect_salient(g, 0.0, 1.0, 5);
  EXPECT_EQ(p.salient, 3);
  EXPECT_EQ(p.count, 3);
  EXPECT_TRUE(p.is_protected[3] && p.is_protected[11] && p.is_protected[17]);
  p = pruning::protect_salient(g, 0.25, 1.0, 5);  // a·d = 5: two more, the lowest indices
  EXPECT_EQ(p.count, 5);
  EXPECT_TRUE(p.is_protected[0] && p.is_protected[1]);
  p = pruning::protect_salient(g, 0.0, 0.1, 5);  // b·d = 2: the two largest norms (ties: index)
  EXPECT_EQ(p.count, 2);
  EXPECT_TRUE(p.is_protected[3] && p.is_protected[11] && !p.is_protected[17]);
  p = pruning::protect_salient(g, 0.0, 1.0, 18);  // only d − n_prune = 2 channels stay
  EXPECT_EQ(p.count, 2);

  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const QK x = random_qk(16, seed, 16, 64);
    const HeadGram h = pruning::gram_of(x.q, x.m, x.k, x.n, 16);
    KvPruneOptions o;
    o.method = KvMethod::Grace;
    o.lambda = 0.5;
    const auto c = pruning::choose_channels(h, o);
    const auto prot = pruning::protect_salient(h, o.protect_lo, o.protect_hi, 8);
    std::vector<char> cand(16);
    for (int i = 0; i < 16; ++i) cand[i] = !prot.is_protected[i];
    for (int i : c.pruned) EXPECT_FALSE(prot.is_protected[i]) << "seed " << seed;
    EXPECT_EQ(c.protected_count, prot.count);
    const double tc = pruning::pruned_error(h, pruning::think_prune(h, 8, cand));
    EXPECT_LE(c.err_grace, tc * (1 + 1e-12));
    EXPECT_GE(c.err_grace, brute_force_optimum(h, 8, cand) * (1 - 1e-12));
    EXPECT_EQ(c.kept.size() + c.pruned.size(), 16u);
    // without the guard GRACE is MIES alone
    o.guard = false;
    const auto m = pruning::choose_channels(h, o);
    EXPECT_EQ(m.err_grace, m.err_mies);
    EXPECT_FALSE(m.guard_used);
  }
}

TEST(KvPrune, OptionsRejectBadValues) {
  auto bad = [](double lambda, double a, double b, int window, KvMethod m = KvMethod::Grace) {
    KvPruneOptions o;
    o.lambda = lambda;
    o.protect_lo = a;
    o.protect_hi = b;
    o.window = window;
    o.method = m;
    EXPECT_THROW(o.validate(64), Error) << lambda << " " << a << " " << b << " " << window;
  };
  bad(-0.1, 0.05, 0.25, 32);
  bad(1.0, 0.05, 0.25, 32);
  bad(std::nan(""), 0.05, 0.25, 32);
  bad(0.5, 0.3, 0.2, 32);  // a > b
  bad(0.5, -0.1, 0.2, 32);
  bad(0.5, 0.05, 1.0, 32);
  bad(0.9, 0.2, 0.25, 32);  // 13 protected at least, but only 6 channels stay
  bad(0.5, 0.05, 0.25, 0);
  KvPruneOptions neg;
  neg.recent = -1;
  EXPECT_THROW(neg.validate(64), Error);
  KvPruneOptions ok;
  ok.lambda = 0.99;  // ⌊63.36⌋ = 63: one channel left (λ < 1 always leaves one)
  ok.protect_lo = 0;
  EXPECT_NO_THROW(ok.validate(64));
  EXPECT_EQ(pruning::prune_count(0.3, 10), 3);     // 0.3·10 is not rounded up to 4
  EXPECT_EQ(pruning::prune_count(0.29, 100), 29);  // 28.999999999999996 is 29
  EXPECT_EQ(pruning::prune_count(0.3, 64), 19);    // ⌊19.2⌋, as ThinK's int(λ·d)
  EXPECT_EQ(pruning::prune_count(0.99, 64), 63);
  EXPECT_EQ(pruning::prune_count(0.5, 64), 32);
  EXPECT_EQ(pruning::prune_count(0.0, 64), 0);
}

template <class E>
class KvPruneEngine : public ::testing::Test {};
TYPED_TEST_SUITE(KvPruneEngine, Backends, BackendName);

// The selector's device Grams (dropped positions excluded) give the channels that the double
// precision reference gives, and the records hold the reference's errors.
TYPED_TEST(KvPruneEngine, DeviceGramsMatchReference) {
  using E = TypeParam;
  Config c = tiny_config();
  c.n_layer = 1;
  const int n_seq = 2, T = 30, w = 6, d = c.head_dim, nkv = c.n_kv_head, nh = c.n_head;
  const int kw = nkv * d, g = nh / nkv;
  KVCache<E> cache(c, n_seq, T);
  const auto K = random_vec(n_seq * T * kw, 21), V = random_vec(n_seq * T * kw, 22);
  auto Kd = to_device<E>(K, n_seq * T, kw);
  cache.store(E(), 0, CMat<E>(Kd), CMat<E>(to_device<E>(V, n_seq * T, kw)), n_seq, T, 0);
  auto dropped = [](int s, int p) { return (s == 0 && p % 7 == 3) || (s == 1 && p == 10); };
  IVec<E> skip("skip", n_seq * T);
  auto hs = Kokkos::create_mirror_view(skip);
  for (int s = 0; s < n_seq; ++s)
    for (int p = 0; p < T; ++p) hs(s * T + p) = dropped(s, p) ? 1 : 0;
  Kokkos::deep_copy(skip, hs);
  cache.set_dropped(E(), 0, skip, n_seq, T, 0);
  auto Q = random_vec(n_seq * w * nh * d, 23);
  for (std::size_t i = 0; i < Q.size(); ++i)
    if ((i / d) % nh == 1) Q[i] *= 4.0f;  // one loud query head
  for (KvMethod m : {KvMethod::Think, KvMethod::Grace}) {
    KvPruneOptions o;
    o.method = m;
    o.lambda = 0.4;
    o.window = w;
    o.recent = 0;
    pruning::KvChannelPruner<E> sel(o, 1, nkv, d, n_seq, n_seq);
    const KeptChannels kept = sel.select(E(), 0, cache.layer(0), cache.shape(0),
                                         CMat<E>(to_device<E>(Q, n_seq * w, nh * d)), n_seq, T);
    ASSERT_EQ(kept.idx.size(), static_cast<std::size_t>(n_seq));
    EXPECT_EQ(kept.positions, T);
    {  // ThinK's recent window: the same channels, the last 8 prompt keys left at full width;
       // a window covering the prompt leaves the layer dense
      KvPruneOptions r = o;
      r.recent = 8;
      pruning::KvChannelPruner<E> rs(r, 1, nkv, d, n_seq, n_seq);
      const KeptChannels kr = rs.select(E(), 0, cache.layer(0), cache.shape(0),
                                        CMat<E>(to_device<E>(Q, n_seq * w, nh * d)), n_seq, T);
      EXPECT_EQ(kr.positions, T - 8);
      EXPECT_EQ(kr.idx, kept.idx);
      r.recent = T;
      pruning::KvChannelPruner<E> all(r, 1, nkv, d, n_seq, n_seq);
      EXPECT_TRUE(all.select(E(), 0, cache.layer(0), cache.shape(0),
                             CMat<E>(to_device<E>(Q, n_seq * w, nh * d)), n_seq, T)
                      .empty());
    }
    EXPECT_GT(kept.flops, 0.0);
    double rel_think = 0, rel_grace = 0;
    for (int s = 0; s < n_seq; ++s)
      for (int h = 0; h < nkv; ++h) {
        std::vector<double> qh, kh;
        int nk = 0;
        for (int p = 0; p < T; ++p) {
          if (dropped(s, p)) continue;
          ++nk;
          for (int j = 0; j < d; ++j) kh.push_back(K[(s * T + p) * kw + h * d + j]);
        }
        for (int mm = 0; mm < g; ++mm)
          for (int r = 0; r < w; ++r)
            for (int j = 0; j < d; ++j)
              qh.push_back(Q[(s * w + r) * nh * d + (h * g + mm) * d + j]);
        const HeadGram ref = pruning::gram_of(qh, g * w, kh, nk, d);
        const auto c0 = pruning::choose_channels(ref, o);
        EXPECT_EQ(kept.idx[s][h], c0.kept)
            << pruning::to_string(m) << " seq " << s << " head " << h;
        rel_think += c0.rel(c0.err_think);
        rel_grace += c0.rel(c0.err_grace);
        const auto& mask = sel.kept_mask(s);
        for (int j = 0; j < d; ++j)
          EXPECT_EQ(mask[h * d + j] != 0,
                    std::find(c0.kept.begin(), c0.kept.end(), j) != c0.kept.end());
      }
    EXPECT_NEAR(sel.rel_error_mean(KvMethod::Think), rel_think / (n_seq * nkv), 1e-9);
    EXPECT_NEAR(sel.rel_error_mean(KvMethod::Grace), rel_grace / (n_seq * nkv), 1e-9);
    EXPECT_EQ(sel.selections(), static_cast<std::uint64_t>(n_seq * nkv));
    EXPECT_EQ(sel.kept_per_head(), d - 6);  // ⌊0.4·16⌋ = 6 pruned
  }
  // an observation window longer than the prompt is refused
  KvPruneOptions o;
  o.window = T + 1;
  pruning::KvChannelPruner<E> sel(o, 1, nkv, d, n_seq);
  EXPECT_THROW(sel.select(E(), 0, cache.layer(0), cache.shape(0),
                          CMat<E>(Mat<E>("q", n_seq * (T + 1), nh * d)), n_seq, T),
               Error);
}

std::vector<int> tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 89 + seed * 37 + (i * i) % 11) % (vocab - 3);
  return t;
}

// Prefill with ThinK / GRACE (the layers compacted by the hook), then decode; against a dense
// engine whose cached prompt keys have the pruned channels zeroed, and against the reference
// model that leaves them out of every score. With a recent window R, the last R prompt keys
// keep every channel (ThinK's reference code).
TYPED_TEST(KvPruneEngine, CompactedDecodeEqualsMaskedFullWidthDecode) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(41));
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const int n_seq = 2, P = 40, D = 6, V = c.vocab, d = c.head_dim, kw = c.kv_dim();
  const auto s0 = tokens(P + D, V, 1), s1 = tokens(P + D, V, 2);
  auto head = [&](const std::vector<int>& s) { return std::vector<int>(s.begin(), s.begin() + P); };
  for (const int R : {0, 12})
    for (KvMethod m : {KvMethod::Think, KvMethod::Grace}) {
      SCOPED_TRACE("recent " + std::to_string(R));
      const int PC = P - R;  // compacted prompt positions
      KvPruneOptions o;
      o.method = m;
      o.lambda = 0.5;
      o.window = 8;
      o.recent = R;
      pruning::KvChannelPruner<E> sel(o, c.n_layer, c.n_kv_head, d, n_seq, n_seq);
      Engine<E> comp(w, n_seq, 64), mask(w, n_seq, 64);
      comp.set_channel_selector(&sel);
      const std::size_t dense_bytes = comp.cache().k_bytes(0);
      comp.forward({head(s0), head(s1)}, 0, false);
      mask.forward({head(s0), head(s1)}, 0, false);
      for (int l = 0; l < c.n_layer; ++l) {
        EXPECT_TRUE(comp.cache().layer(l).compacted());
        // compacted prompt: n_seq·P·(kept of both heads) floats, the rest full width, the tables
        const std::size_t cap = static_cast<std::size_t>(c.n_kv_head) * (d - 8);
        EXPECT_EQ(comp.cache().k_bytes(l),
                  sizeof(float) * (n_seq * PC * cap + n_seq * (64 - PC) * kw) +
                      sizeof(int) * (n_seq * cap + n_seq * (c.n_kv_head + 1)));
        EXPECT_LT(comp.cache().k_bytes(l), dense_bytes);
        const auto& kl = mask.cache().layer(l);
        auto hk = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kl.k);
        for (int s = 0; s < n_seq; ++s)
          for (int p = 0; p < PC; ++p)
            for (int j = 0; j < kw; ++j)
              if (!sel.kept_mask(s)[(l * c.n_kv_head + j / d) * d + j % d]) hk(s, p, j) = 0.0f;
        Kokkos::deep_copy(kl.k, hk);
      }
      ReferenceLlama r0(path), r1(path);
      for (int t = 0; t < P; ++t) r0.step(s0[t]), r1.step(s1[t]);
      auto keep = [&](int s) {
        return [&, s](int l, int t, int h, int j) {
          return t >= PC || sel.kept_mask(s)[(l * c.n_kv_head + h) * d + j] != 0;
        };
      };
      r0.keep = keep(0);
      r1.keep = keep(1);
      for (int t = P; t < P + D; ++t) {
        const auto a = to_host(comp.forward({{s0[t]}, {s1[t]}}, t, false));
        const auto b = to_host(mask.forward({{s0[t]}, {s1[t]}}, t, false));
        EXPECT_LE(rel_err(a, b), 1e-5) << pruning::to_string(m) << " position " << t;
        EXPECT_LE(rel_err(std::vector<float>(a.begin(), a.begin() + V), r0.step(s0[t])), 2e-5);
        EXPECT_LE(rel_err(std::vector<float>(a.begin() + V, a.end()), r1.step(s1[t])), 2e-5);
      }
      EXPECT_GT(sel.recon_error_mean(), 0.0);
      EXPECT_LT(sel.recon_error_mean(), 1.0);
      EXPECT_EQ(sel.prefills(), 1u);
    }
}

// λ = 0: the selector scores every head but prunes nothing; prefill, decode and the perplexity
// protocol (prefix prefilled, scored rows against the cache) give the dense bits.
TYPED_TEST(KvPruneEngine, LambdaZeroIsBitwiseDense) {
  using E = TypeParam;
  TempDir dir;
  auto w = load_model<E>(make_model(dir, "m.gguf", tiny_spec(42)), LoadOptions{});
  const Config& c = w->cfg;
  KvPruneOptions o;
  o.method = KvMethod::Grace;
  o.lambda = 0;
  o.window = 8;
  pruning::KvChannelPruner<E> sel(o, c.n_layer, c.n_kv_head, c.head_dim, 2);
  Engine<E> a(w, 2, 96), b(w, 2, 96);
  a.set_channel_selector(&sel);
  const auto s0 = tokens(60, c.vocab, 3), s1 = tokens(60, c.vocab, 4);
  const std::vector<std::vector<int>> pr = {std::vector<int>(s0.begin(), s0.begin() + 50),
                                            std::vector<int>(s1.begin(), s1.begin() + 50)};
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(to_host(a.forward(pr, 0, true)), to_host(b.forward(pr, 0, true))));
  EXPECT_EQ(sel.selections(), static_cast<std::uint64_t>(2 * c.n_layer * c.n_kv_head));
  EXPECT_FALSE(a.cache().layer(0).compacted());
  for (int t = 50; t < 60; ++t)
    EXPECT_TRUE(same(to_host(a.forward({{s0[t]}, {s1[t]}}, t, false)),
                     to_host(b.forward({{s0[t]}, {s1[t]}}, t, false))));
  // perplexity: the split protocol with nothing pruned against the one-call dense protocol
  std::vector<int> stream = tokens(400, c.vocab, 5);
  PplOptions po;
  po.context = 96;
  po.stride = 64;
  po.score = 32;
  po.batch = 2;
  const PplResult ra = perplexity(a, stream, po), rb = perplexity(b, stream, po);
  EXPECT_TRUE(same_bits(ra.window_nll, rb.window_nll));
}

// After a pruned prefill, scoring D tokens in one call (the perplexity protocol) and decoding
// them one by one agree.
TYPED_TEST(KvPruneEngine, TeacherForcedEqualsTokenByToken) {
  using E = TypeParam;
  TempDir dir;
  auto w = load_model<E>(make_model(dir, "m.gguf", tiny_spec(43)), LoadOptions{});
  const Config& c = w->cfg;
  const int P = 36, D = 12, V = c.vocab;
  for (KvMethod m : {KvMethod::Think, KvMethod::Grace}) {
    KvPruneOptions o;
    o.method = m;
    o.lambda = 0.6;
    o.window = 8;
    pruning::KvChannelPruner<E> sa(o, c.n_layer, c.n_kv_head, c.head_dim, 2),
        sb(o, c.n_layer, c.n_kv_head, c.head_dim, 2);
    Engine<E> a(w, 2, 64), b(w, 2, 64);
    a.set_channel_selector(&sa);
    b.set_channel_selector(&sb);
    const auto s0 = tokens(P + D, V, 6), s1 = tokens(P + D, V, 7);
    auto part = [](const std::vector<int>& s, int from, int to) {
      return std::vector<int>(s.begin() + from, s.begin() + to);
    };
    a.forward({part(s0, 0, P), part(s1, 0, P)}, 0, false);
    b.forward({part(s0, 0, P), part(s1, 0, P)}, 0, false);
    const auto tf = to_host(a.forward({part(s0, P, P + D), part(s1, P, P + D)}, P, true));
    for (int t = 0; t < D; ++t) {
      const auto r = to_host(b.forward({{s0[P + t]}, {s1[P + t]}}, P + t, false));
      for (int s = 0; s < 2; ++s) {
        const std::vector<float> x(tf.begin() + (s * D + t) * V, tf.begin() + (s * D + t + 1) * V);
        const std::vector<float> y(r.begin() + s * V, r.begin() + (s + 1) * V);
        EXPECT_LE(rel_err(x, y), 1e-5) << pruning::to_string(m) << " s " << s << " t " << t;
      }
    }
  }
}

// The device path (fused single-token decode, split-K and tiled attention) runs only on dense
// cache layouts: with a compacted cache the engine falls back to the kernel that reads the
// compacted region, so device-path and op-by-op engines agree, over two prompts in a row (the
// second one resets the layout, re-allocating the dense key buffer) and with λ = 0 (dense
// layout, fused decode allowed).
TYPED_TEST(KvPruneEngine, DevicePathDecodesCompactedCacheOpByOp) {
  using E = TypeParam;
  TempDir dir;
  auto w = load_model<E>(make_model(dir, "m.gguf", tiny_spec(44)), LoadOptions{});
  const Config& c = w->cfg;
  const int P = 40, D = 5, V = c.vocab;
  for (double lambda : {0.5, 0.0}) {
    KvPruneOptions o;
    o.method = KvMethod::Grace;
    o.lambda = lambda;
    o.window = 8;
    pruning::KvChannelPruner<E> sa(o, c.n_layer, c.n_kv_head, c.head_dim, 2),
        sb(o, c.n_layer, c.n_kv_head, c.head_dim, 2);
    Engine<E> a(w, 2, 64), b(w, 2, 64);
    b.set_device_path(true);
    a.set_channel_selector(&sa);
    b.set_channel_selector(&sb);
    for (int prompt = 0; prompt < 2; ++prompt) {
      const auto s0 = tokens(P + D, V, 8 + 2 * prompt), s1 = tokens(P + D, V, 9 + 2 * prompt);
      const std::vector<std::vector<int>> pr = {std::vector<int>(s0.begin(), s0.begin() + P),
                                                std::vector<int>(s1.begin(), s1.begin() + P)};
      a.forward(pr, 0, false);
      b.forward(pr, 0, false);
      EXPECT_EQ(b.cache().layer(0).compacted(), lambda > 0);
      for (int t = P; t < P + D; ++t) {
        const auto x = to_host(a.forward({{s0[t]}, {s1[t]}}, t, false));
        const auto y = to_host(b.forward({{s0[t]}, {s1[t]}}, t, false));
        EXPECT_LE(rel_err(y, x), 1e-5) << "λ " << lambda << " prompt " << prompt << " t " << t;
      }
    }
  }
}

}  // namespace
}  // namespace sparsim::test
