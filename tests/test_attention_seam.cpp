// The attention-side seam of the engine: the KV cache with a compacted K region, the attention
// kernel that reads it, the token gate before attention and the channel-selector hook, each
// against the double-precision reference, brute force or the dense engine.
#include "backends.hpp"
#include "compare_helpers.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "kernels/cached_attention.hpp"
#include "kernels/pointwise.hpp"
#include "model/loader.hpp"
#include "reference_llama.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

namespace sparsim::test {
namespace {

template <class E>
class AttentionSeam : public ::testing::Test {};
TYPED_TEST_SUITE(AttentionSeam, Backends, BackendName);

std::vector<int> tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 97 + seed * 31) % (vocab - 3);
  return t;
}

/// Kept channels of (layer, sequence, head): a different pseudo-random subset for each, of
/// 5 … 12 of the 16 channels.
KeptChannels kept_for(int layer, int n_seq, int n_kv, int hd, int P) {
  KeptChannels k;
  k.positions = P;
  k.idx.resize(static_cast<std::size_t>(n_seq));
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < n_kv; ++h) {
      std::vector<int> ch;
      const int want = 5 + (layer * 7 + s * 3 + h * 5) % 8;
      for (int j = 0; j < hd && static_cast<int>(ch.size()) < want; ++j)
        if ((j * 5 + layer + s * 3 + h) % 3 != 0 || hd - j <= want - static_cast<int>(ch.size()))
          ch.push_back(j);
      k.idx[static_cast<std::size_t>(s)].push_back(ch);
    }
  return k;
}

bool is_kept(const KeptChannels& k, int s, int h, int j) {
  const auto& v = k.idx[static_cast<std::size_t>(s)][static_cast<std::size_t>(h)];
  return std::find(v.begin(), v.end(), j) != v.end();
}

// Kernel level: gathered rows over a compacted cache with dropped positions, against brute force.
TYPED_TEST(AttentionSeam, CachedAttentionAgainstBruteForce) {
  using E = TypeParam;
  const int n_seq = 2, ctx = 12, P = 5, nh = 4, nkv = 2, hd = 8;
  Config c = tiny_config();
  c.n_layer = 1;
  c.n_head = nh;
  c.n_kv_head = nkv;
  c.head_dim = hd;
  KVCache<E> cache(c, n_seq, ctx);
  const AttnShape sh = cache.shape(0);
  const int kw = sh.k_width();
  // fill positions 0 … ctx−1 through store(), compact the first P, mark drops
  const auto K = random_vec(n_seq * ctx * kw, 1), V = random_vec(n_seq * ctx * kw, 2);
  std::vector<float> kr(n_seq * ctx * kw), vr(n_seq * ctx * kw);
  for (int s = 0; s < n_seq; ++s)
    for (int p = 0; p < ctx; ++p)
      for (int j = 0; j < kw; ++j) {
        kr[(s * ctx + p) * kw + j] = K[(s * ctx + p) * kw + j];
        vr[(s * ctx + p) * kw + j] = V[(s * ctx + p) * kw + j];
      }
  cache.store(E(), 0, CMat<E>(to_device<E>(kr, n_seq * ctx, kw)),
              CMat<E>(to_device<E>(vr, n_seq * ctx, kw)), n_seq, ctx, 0);
  const std::size_t dense_bytes = cache.k_bytes(0);
  const KeptChannels kept = kept_for(0, n_seq, nkv, hd, P);
  cache.compact_keys(E(), 0, kept);
  int cap = 0;
  for (int s = 0; s < n_seq; ++s) {
    int tot = 0;
    for (int h = 0; h < nkv; ++h) tot += static_cast<int>(kept.idx[s][h].size());
    cap = std::max(cap, tot);
  }
  EXPECT_EQ(cache.k_bytes(0), sizeof(float) * (n_seq * P * cap + n_seq * (ctx - P) * kw) +
                                  sizeof(int) * (n_seq * cap + n_seq * (nkv + 1)));
  (void)dense_bytes;  // (so small a cache can grow by the index tables; see the engine test)
  IVec<E> drop_rows("skip", n_seq * ctx);
  auto hd_ = Kokkos::create_mirror_view(drop_rows);
  auto dropped = [](int s, int p) { return (p == 2 && s == 0) || (p == 7 && s == 1) || p == 9; };
  for (int s = 0; s < n_seq; ++s)
    for (int p = 0; p < ctx; ++p) hd_(s * ctx + p) = dropped(s, p) ? 1 : 0;
  Kokkos::deep_copy(drop_rows, hd_);
  cache.set_dropped(E(), 0, drop_rows, n_seq, ctx, 0);
  // rows: a few (sequence, position) pairs in no particular order
  const std::vector<std::pair<int, int>> rows = {{1, 11}, {0, 3}, {0, 11}, {1, 4}, {0, 6}, {1, 8}};
  const int n = static_cast<int>(rows.size());
  const auto Q = random_vec(n * nh * hd, 3);
  IVec<E> rs("rs", n), rp("rp", n);
  auto hs = Kokkos::create_mirror_view(rs), hp = Kokkos::create_mirror_view(rp);
  for (int i = 0; i < n; ++i) hs(i) = rows[i].first, hp(i) = rows[i].second;
  Kokkos::deep_copy(rs, hs);
  Kokkos::deep_copy(rp, hp);
  Mat<E> out("out", n, nh * hd);
  cached_attention(E(), CMat<E>(to_device<E>(Q, n, nh * hd)), rs, rp, cache.layer(0), sh, out, ctx);
  std::vector<double> ref(n * nh * hd, 0.0);
  for (int i = 0; i < n; ++i) {
    const int s = rows[i].first, pos = rows[i].second;
    for (int h = 0; h < nh; ++h) {
      const int kvh = h / (nh / nkv);
      std::vector<double> sc(pos + 1, -1e300);
      double mx = -1e300;
      for (int p = 0; p <= pos; ++p) {
        if (dropped(s, p)) continue;
        double a = 0;
        for (int j = 0; j < hd; ++j)
          if (p >= P || is_kept(kept, s, kvh, j))
            a += double(Q[(i * nh + h) * hd + j]) * K[(s * ctx + p) * kw + kvh * hd + j];
        sc[p] = a / std::sqrt(double(hd));
        mx = std::max(mx, sc[p]);
      }
      double z = 0;
      for (int p = 0; p <= pos; ++p) z += dropped(s, p) ? 0.0 : std::exp(sc[p] - mx);
      for (int p = 0; p <= pos; ++p) {
        if (dropped(s, p)) continue;
        const double w = std::exp(sc[p] - mx) / z;
        for (int j = 0; j < hd; ++j)
          ref[(i * nh + h) * hd + j] += w * V[(s * ctx + p) * kw + kvh * hd + j];
      }
    }
  }
  const auto got = to_host(out);
  for (std::size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(got[i], ref[i], 1e-5 * (1 + std::fabs(ref[i]))) << "element " << i;
  // the split decode kernel reads the same layout in place: one query per sequence, rows
  // (0, 11) and (1, 8) of the list above
  {
    attn::DecodeWorkspace<E> ws;
    ws.ensure(n_seq, nh, nkv, hd, ctx);
    const int pick[2] = {2, 5};
    std::vector<float> q1(n_seq * nh * hd);
    IVec<E> pos1("pos1", n_seq);
    auto hp1 = Kokkos::create_mirror_view(pos1);
    for (int s = 0; s < n_seq; ++s) {
      for (int j = 0; j < nh * hd; ++j) q1[s * nh * hd + j] = Q[pick[s] * nh * hd + j];
      hp1(s) = rows[pick[s]].second;
    }
    Kokkos::deep_copy(pos1, hp1);
    Mat<E> out1("out1", n_seq, nh * hd);
    attention_decode_split(E(), CMat<E>(to_device<E>(q1, n_seq, nh * hd)), cache.layer(0), pos1,
                           out1, n_seq, sh, ws);
    const auto got1 = to_host(out1);
    for (int s = 0; s < n_seq; ++s)
      for (int j = 0; j < nh * hd; ++j) {
        const double want = ref[pick[s] * nh * hd + j];
        EXPECT_NEAR(got1[s * nh * hd + j], want, 1e-5 * (1 + std::fabs(want)))
            << "split kernel, sequence " << s << " element " << j;
      }
  }
  // writing into the compacted region is refused
  EXPECT_THROW(cache.store(E(), 0, CMat<E>(to_device<E>(kr, 1, kw)),
                           CMat<E>(to_device<E>(vr, 1, kw)), 1, 1, P - 1),
               Error);
  EXPECT_THROW(cache.compact_keys(E(), 0, kept), Error);  // already compacted
}

TYPED_TEST(AttentionSeam, CompactionRejectsBadChannelLists) {
  using E = TypeParam;
  Config c = tiny_config();
  KVCache<E> cache(c, 1, 8);
  KeptChannels k = kept_for(0, 1, c.n_kv_head, c.head_dim, 4);
  KeptChannels bad = k;
  bad.idx[0][1] = {3, 3};
  EXPECT_THROW(cache.compact_keys(E(), 0, bad), Error);
  bad = k;
  bad.idx[0][0] = {c.head_dim};
  EXPECT_THROW(cache.compact_keys(E(), 0, bad), Error);
  bad = k;
  bad.idx[0].pop_back();
  EXPECT_THROW(cache.compact_keys(E(), 0, bad), Error);
  bad = k;
  bad.positions = 9;
  EXPECT_THROW(cache.compact_keys(E(), 0, bad), Error);
  EXPECT_NO_THROW(cache.compact_keys(E(), 0, k));
}

// The brief's equivalence: prefill, compact every layer's prompt keys, decode; against the same
// decode with the pruned channels zeroed in the full-width cache, and against the reference.
TYPED_TEST(AttentionSeam, CompactedDecodeEqualsMaskedFullWidthDecode) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(11);
  const std::string path = make_model(dir, "m.gguf", spec);
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const int n_seq = 2, P = 14, D = 6, V = c.vocab, kw = c.kv_dim();
  const auto s0 = tokens(P + D, V, 1), s1 = tokens(P + D, V, 2);
  auto head = [&](const std::vector<int>& s) { return std::vector<int>(s.begin(), s.begin() + P); };
  flops::Ledger ledger(c.n_layer);
  Engine<E> comp(w, n_seq, 32, &ledger), mask(w, n_seq, 32);
  comp.forward({head(s0), head(s1)}, 0, false);
  mask.forward({head(s0), head(s1)}, 0, false);
  std::vector<KeptChannels> kept;
  const std::size_t bytes_before = comp.cache().bytes();
  for (int l = 0; l < c.n_layer; ++l) {
    kept.push_back(kept_for(l, n_seq, c.n_kv_head, c.head_dim, P));
    comp.compact_keys(l, kept.back());
    // zero the pruned channels of the prompt's keys in the full-width cache
    const auto& kl = mask.cache().layer(l);
    auto hk = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kl.k);
    for (int s = 0; s < n_seq; ++s)
      for (int p = 0; p < P; ++p)
        for (int j = 0; j < kw; ++j)
          if (!is_kept(kept.back(), s, j / c.head_dim, j % c.head_dim)) hk(s, p, j) = 0.0f;
    Kokkos::deep_copy(kl.k, hk);
  }
  EXPECT_LT(comp.cache().bytes(), bytes_before);
  EXPECT_GT(ledger.by_op(flops::Op::ChannelSelect).bytes_realised, 0.0);
  ReferenceLlama r0(path), r1(path);
  for (int t = 0; t < P; ++t) r0.step(s0[t]), r1.step(s1[t]);  // the prefill sees full keys
  r0.keep = [&](int l, int t, int h, int j) { return t >= P || is_kept(kept[l], 0, h, j); };
  r1.keep = [&](int l, int t, int h, int j) { return t >= P || is_kept(kept[l], 1, h, j); };
  ledger.reset();
  for (int t = P; t < P + D; ++t) {
    const auto a = to_host(comp.forward({{s0[t]}, {s1[t]}}, t, false));
    const auto b = to_host(mask.forward({{s0[t]}, {s1[t]}}, t, false));
    EXPECT_LE(rel_err(a, b), 1e-5) << "position " << t;
    const auto e0 = r0.step(s0[t]), e1 = r1.step(s1[t]);
    EXPECT_LE(rel_err(std::vector<float>(a.begin(), a.begin() + V), e0), 2e-5) << t;
    EXPECT_LE(rel_err(std::vector<float>(a.begin() + V, a.end()), e1), 2e-5) << t;
  }
  // The scores against the compacted positions read only the kept channels.
  const auto sc = ledger.by_op(flops::Op::AttnScore, flops::Phase::Decode);
  EXPECT_LT(sc.flops_realised, sc.flops_dense);
  EXPECT_LT(sc.bytes_realised, sc.bytes_dense);
  // A new prompt at position 0 restores the dense layout.
  comp.forward({head(s0), head(s1)}, 0, false);
  EXPECT_EQ(comp.cache().bytes(), bytes_before);
  EXPECT_FALSE(comp.cache().layer(0).compacted());
}

/// A gate that skips a fixed set of (layer, sequence, position).
template <class E>
class FixedGate final : public TokenGate<E> {
 public:
  std::function<bool(int, int, int)> skip_at;
  int gated_layer = 1;
  bool drop = false;
  int n_seq = 0, T = 0, p0 = 0;
  void begin_call(const E&, int ns, int t, int p) override { n_seq = ns, T = t, p0 = p; }
  bool active(int layer) const override { return layer == gated_layer; }
  bool drop_skipped() const override { return drop; }
  int decide(const E&, int layer, const CMat<E>&, const CMat<E>&, const IVec<E>& skip,
             PolicyCost& cost) override {
    auto h = Kokkos::create_mirror_view(skip);
    int n = 0;
    for (int s = 0; s < n_seq; ++s)
      for (int t = 0; t < T; ++t) n += (h(s * T + t) = skip_at(layer, s, p0 + t) ? 1 : 0);
    Kokkos::deep_copy(skip, h);
    cost.flops = 1.0;
    return n;
  }
};

// Skipped rows against the reference (which zeroes their attention output), teacher-forced and
// token by token, for two sequences with different patterns.
TYPED_TEST(AttentionSeam, GatedRowsMatchReferenceAndDecode) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(12);
  const std::string path = make_model(dir, "m.gguf", spec);
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const int T = 15, V = c.vocab;
  const auto s0 = tokens(T, V, 3), s1 = tokens(T, V, 4);
  auto pattern = [](int l, int s, int p) {
    return l == 1 && p >= 2 && (s == 0 ? p % 3 == 1 : p % 4 != 0);
  };
  for (bool drop : {false, true}) {
    FixedGate<E> gate;
    gate.skip_at = pattern;
    gate.drop = drop;
    flops::Ledger ledger(c.n_layer);
    Engine<E> tf(w, 2, 32, &ledger), dec(w, 2, 32);
    tf.set_token_gate(&gate);
    dec.set_token_gate(&gate);
    const auto a = to_host(tf.forward({s0, s1}, 0, true));
    std::vector<float> b;
    for (int t = 0; t < T; ++t) {
      const auto r = to_host(dec.forward({{s0[t]}, {s1[t]}}, t, true));
      b.insert(b.end(), r.begin(), r.end());
    }
    // teacher-forced rows are s·T + t, decode rows (t, s)
    ReferenceLlama r0(path), r1(path);
    r0.skip = [&](int l, int p) { return pattern(l, 0, p); };
    r1.skip = [&](int l, int p) { return pattern(l, 1, p); };
    for (int t = 0; t < T; ++t) {
      const std::vector<float> ta0(a.begin() + t * V, a.begin() + (t + 1) * V);
      const std::vector<float> ta1(a.begin() + (T + t) * V, a.begin() + (T + t + 1) * V);
      const std::vector<float> tb0(b.begin() + (2 * t) * V, b.begin() + (2 * t + 1) * V);
      const std::vector<float> tb1(b.begin() + (2 * t + 1) * V, b.begin() + (2 * t + 2) * V);
      EXPECT_LE(rel_err(ta0, tb0), 1e-5) << "drop " << drop << " t " << t;
      EXPECT_LE(rel_err(ta1, tb1), 1e-5) << "drop " << drop << " t " << t;
      if (!drop) {
        EXPECT_LE(rel_err(ta0, r0.step(s0[t])), 2e-5) << t;
        EXPECT_LE(rel_err(ta1, r1.step(s1[t])), 2e-5) << t;
      }
    }
    if (drop) continue;  // (dropping is checked against brute force in the kernel test)
    int skipped = 0;
    for (int s = 0; s < 2; ++s)
      for (int p = 0; p < T; ++p) skipped += pattern(1, s, p);
    const auto qp = ledger.at(flops::Phase::Prefill, flops::Op::QProj, 1);
    EXPECT_DOUBLE_EQ(qp.flops_realised / qp.flops_dense, double(2 * T - skipped) / (2 * T));
    const auto op = ledger.at(flops::Phase::Prefill, flops::Op::OProj, 1);
    EXPECT_DOUBLE_EQ(op.flops_realised / op.flops_dense, double(2 * T - skipped) / (2 * T));
    EXPECT_EQ(ledger.at(flops::Phase::Prefill, flops::Op::QProj, 0).flops_realised,
              ledger.at(flops::Phase::Prefill, flops::Op::QProj, 0).flops_dense);
    EXPECT_GT(ledger.by_op(flops::Op::GatherScatter).bytes_realised, 0.0);
    EXPECT_EQ(ledger.by_op(flops::Op::GateSimilarity).flops_realised, 1.0);
    const auto sc = ledger.at(flops::Phase::Prefill, flops::Op::AttnScore, 1);
    EXPECT_LT(sc.flops_realised, sc.flops_dense);
  }
}

// A skipped token's attention sub-block is exactly the identity: the MLP's input of that row
// equals rmsnorm(block input) bit for bit.
TYPED_TEST(AttentionSeam, SkippedRowIsExactResidualPassThrough) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(13);
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const Config& c = w->cfg;
  const int T = 10;
  FixedGate<E> gate;
  gate.skip_at = [](int, int, int p) { return p == 4 || p == 7 || p == 9; };
  Engine<E> eng(w, 1, 32);
  eng.set_token_gate(&gate);
  std::vector<float> block_in, mlp_in;
  eng.set_observer([&](int layer, Site s, const CMat<E>& x) {
    if (layer != 1) return;
    if (s == Site::BlockIn) block_in = to_host(x);
    if (s == Site::Mlp) mlp_in = to_host(x);
  });
  eng.forward({tokens(T, c.vocab, 5)}, 0, false);
  ASSERT_EQ(block_in.size(), static_cast<std::size_t>(T * c.d_model));
  auto x = to_device<E>(block_in, T, c.d_model);
  Mat<E> xn("xn", T, c.d_model);
  rmsnorm(E(), CMat<E>(x), CVec<E>(w->layers[1].ffn_norm), c.rms_eps, xn);
  const auto ref = to_host(xn);
  for (int t = 0; t < T; ++t) {
    const bool skipped = t == 4 || t == 7 || t == 9;
    const int same =
        std::memcmp(&ref[t * c.d_model], &mlp_in[t * c.d_model], sizeof(float) * c.d_model);
    EXPECT_EQ(same == 0, skipped) << "row " << t;
  }
}

/// A selector that keeps fixed channels and records what it was shown.
template <class E>
class FixedSelector final : public ChannelSelector<E> {
 public:
  int calls = 0, seen_T = 0, seen_rows = 0;
  int observation_window() const override { return 4; }
  KeptChannels select(const E&, int layer, const KVLayer<E>& cache, const AttnShape& sh,
                      const CMat<E>& q_obs, int n_seq, int T) override {
    ++calls;
    seen_T = T;
    seen_rows = static_cast<int>(q_obs.extent(0));
    EXPECT_FALSE(cache.compacted());
    KeptChannels k = kept_for(layer, n_seq, sh.n_kv_head, sh.qk_dim, T);
    k.flops = 100;
    return k;
  }
};

// The selector hook compacts every layer after the prefill, exactly as compact_keys() does.
TYPED_TEST(AttentionSeam, ChannelSelectorHookCompactsAfterPrefill) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(14);
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const Config& c = w->cfg;
  const int P = 9;
  const auto s0 = tokens(P + 3, c.vocab, 6);
  FixedSelector<E> sel;
  flops::Ledger ledger(c.n_layer);
  Engine<E> hooked(w, 1, 32, &ledger), manual(w, 1, 32);
  hooked.set_channel_selector(&sel);
  const std::vector<int> prompt(s0.begin(), s0.begin() + P);
  hooked.forward({prompt}, 0, false);
  manual.forward({prompt}, 0, false);
  EXPECT_EQ(sel.calls, c.n_layer);
  EXPECT_EQ(sel.seen_T, P);
  EXPECT_EQ(sel.seen_rows, 4);
  for (int l = 0; l < c.n_layer; ++l) {
    EXPECT_TRUE(hooked.cache().layer(l).compacted());
    manual.compact_keys(l, kept_for(l, 1, c.n_kv_head, c.head_dim, P));
  }
  EXPECT_EQ(ledger.by_op(flops::Op::ChannelSelect).flops_realised, 100.0 * c.n_layer);
  for (int t = P; t < P + 3; ++t) {
    const auto a = to_host(hooked.forward({{s0[t]}}, t, false));
    const auto b = to_host(manual.forward({{s0[t]}}, t, false));
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << t;
  }
  EXPECT_EQ(sel.calls, c.n_layer);  // decode calls do not select again
}

}  // namespace
}  // namespace sparsim::test
