// Dropped tokens leaving the KV cache (--tf-drop-skipped): a token-compacted layer against the
// masked layout and the double-precision reference (dropped tokens evicted from every head),
// prefill, teacher-forced and token by token, op-by-op and device decode kernels; the held
// positions and bytes against a direct count of the gate's decisions; a gate that drops nothing
// leaves the cache and the logits as they were; misuse is refused.
#include "backends.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "model/loader.hpp"
#include "policies/token_filter.hpp"
#include "reference_llama.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

namespace sparsim::test {
namespace {

template <class E>
class TokenDrop : public ::testing::Test {};
TYPED_TEST_SUITE(TokenDrop, Backends, BackendName);

std::vector<int> tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 97 + seed * 31) % (vocab - 3);
  return t;
}

template <class V>
double rel_err(const std::vector<float>& a, const V& b, std::size_t off = 0) {
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    scale = std::max(scale, std::fabs(double(b[i])));
    err = std::max(err, std::fabs(double(a[off + i]) - double(b[i])));
  }
  return err / scale;
}

/// A gate that skips a fixed set of (layer, sequence, position) and drops them when `drop`.
template <class E>
class PatternGate final : public TokenGate<E> {
 public:
  std::function<bool(int, int, int)> skip_at;
  std::vector<int> gated{1};
  bool drop = true;
  int n_seq = 0, T = 0, p0 = 0;
  std::vector<std::vector<KVOccupancy>> occupancy;  // per call
  void begin_call(const E&, int ns, int t, int p) override { n_seq = ns, T = t, p0 = p; }
  bool active(int layer) const override {
    return std::find(gated.begin(), gated.end(), layer) != gated.end();
  }
  bool drop_skipped() const override { return drop; }
  int decide(const E&, int layer, const CMat<E>&, const CMat<E>&, const IVec<E>& skip,
             PolicyCost&) override {
    auto h = Kokkos::create_mirror_view(skip);
    int n = 0;
    for (int s = 0; s < n_seq; ++s)
      for (int t = 0; t < T; ++t) n += (h(s * T + t) = skip_at(layer, s, p0 + t) ? 1 : 0);
    Kokkos::deep_copy(skip, h);
    return n;
  }
  void account_cache(const std::vector<KVOccupancy>& l) override { occupancy.push_back(l); }
};

bool pattern(int l, int s, int p) {
  return l == 1 && p >= 2 && (s == 0 ? p % 3 == 1 : (p % 4 != 0 && p < 30));
}

// The compacted cache gives the masked computation's logits (≤ 1e-5) and the reference's, for
// a prefill, the decode after it and a token-by-token run, with the op-by-op kernels and with
// the device decode kernel; the layer holds exactly the kept positions.
TYPED_TEST(TokenDrop, CompactedEqualsMaskedAndReference) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(41));
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const int P = 20, D = 12, V = c.vocab, ctx = 40;
  const auto s0 = tokens(P + D, V, 1), s1 = tokens(P + D, V, 2);
  auto head = [&](const std::vector<int>& s) { return std::vector<int>(s.begin(), s.begin() + P); };
  for (bool device : {false, true}) {
    PatternGate<E> gc, gm, gd;
    for (auto* g : {&gc, &gm, &gd}) g->skip_at = pattern;
    Engine<E> comp(w, 2, ctx), mask(w, 2, ctx), dec(w, 2, ctx);
    comp.set_token_gate(&gc);
    mask.set_token_gate(&gm);
    dec.set_token_gate(&gd);
    mask.set_drop_compaction(false);
    for (auto* e : {&comp, &mask, &dec}) e->set_device_path(device);
    const auto a = to_host(comp.forward({head(s0), head(s1)}, 0, true));
    const auto b = to_host(mask.forward({head(s0), head(s1)}, 0, true));
    ASSERT_EQ(a.size(), b.size());
    EXPECT_TRUE(comp.cache().token_compacted(1));
    EXPECT_FALSE(comp.cache().token_compacted(0));
    EXPECT_FALSE(mask.cache().token_compacted(1));
    EXPECT_LE(rel_err(a, b), 1e-5) << "prefill, device " << device;
    // the reference: skipped tokens attend nowhere and are evicted from every head
    ReferenceLlama r0(path), r1(path);
    r0.skip = [](int l, int p) { return pattern(l, 0, p); };
    r1.skip = [](int l, int p) { return pattern(l, 1, p); };
    r0.evicted = [](int l, int p, int) { return pattern(l, 0, p); };
    r1.evicted = [](int l, int p, int) { return pattern(l, 1, p); };
    for (int t = 0; t < P; ++t) {
      EXPECT_LE(rel_err(a, r0.step(s0[t]), static_cast<std::size_t>(t) * V), 2e-5) << t;
      EXPECT_LE(rel_err(a, r1.step(s1[t]), static_cast<std::size_t>(P + t) * V), 2e-5) << t;
    }
    for (int t = 0; t < P; ++t) dec.forward({{s0[t]}, {s1[t]}}, t, false);
    for (int t = P; t < P + D; ++t) {
      const auto x = to_host(comp.forward({{s0[t]}, {s1[t]}}, t, false));
      const auto y = to_host(mask.forward({{s0[t]}, {s1[t]}}, t, false));
      const auto z = to_host(dec.forward({{s0[t]}, {s1[t]}}, t, false));
      EXPECT_LE(rel_err(x, y), 1e-5) << "position " << t << ", device " << device;
      EXPECT_LE(rel_err(z, y), 1e-5) << "position " << t << ", device " << device;
      EXPECT_LE(rel_err(x, r0.step(s0[t])), 2e-5) << t;
      EXPECT_LE(rel_err(x, r1.step(s1[t]), static_cast<std::size_t>(V)), 2e-5) << t;
    }
    // what layer 1 holds: the positions the pattern keeps, counted here
    const int n = P + D;
    for (int s = 0; s < 2; ++s) {
      std::vector<int> want;
      for (int p = 0; p < n; ++p)
        if (!pattern(1, s, p)) want.push_back(p);
      EXPECT_EQ(comp.cache().held_positions(1, s), want) << s;
      EXPECT_EQ(dec.cache().held_positions(1, s), want) << s;
      EXPECT_EQ(comp.cache().held(1, s), static_cast<int>(want.size()));
      EXPECT_EQ(mask.cache().held(1, s), static_cast<int>(want.size()));
      EXPECT_EQ(comp.cache().held(0, s), n);
      EXPECT_EQ(comp.cache().positions(1, s), n);
    }
  }
}

// Bytes: the compacted layer's buffers are whole pages of the longest held sequence, the rest
// dense; the occupancy the engine reports is the count of kept positions times their bytes.
TYPED_TEST(TokenDrop, BytesFollowTheKeptPositions) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(42));
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const int ctx = 200, P = 120, V = c.vocab, max_seqs = 3;
  auto drop_pat = [](int l, int s, int p) { return l == 1 && p >= 4 && (p + s) % 2 == 0; };
  PatternGate<E> g;
  g.skip_at = drop_pat;
  Engine<E> comp(w, max_seqs, ctx), dense(w, max_seqs, ctx);
  comp.set_token_gate(&g);
  comp.forward({tokens(P, V, 1), tokens(P, V, 2)}, 0, false);
  const std::size_t pb = 4u * static_cast<std::size_t>(c.kv_dim()) * 2;  // K and V of a position
  EXPECT_EQ(comp.cache().position_bytes(1), pb);
  // kept per sequence: positions 0 … 3, then every other one
  int most = 0;
  std::vector<int> kept(2, 0);
  for (int s = 0; s < 2; ++s) {
    for (int p = 0; p < P; ++p) kept[s] += drop_pat(1, s, p) ? 0 : 1;
    most = std::max(most, kept[s]);
  }
  const int page = KVCache<E>::kTokenPage;
  const int cap = (most + page - 1) / page * page;
  EXPECT_EQ(comp.cache().capacity(1), cap);
  EXPECT_EQ(comp.cache().k_bytes(1) + comp.cache().v_bytes(1),
            static_cast<std::size_t>(max_seqs) * cap * pb);
  EXPECT_EQ(comp.cache().k_bytes(0), dense.cache().k_bytes(0));
  EXPECT_LT(comp.cache().bytes(), dense.cache().bytes());
  ASSERT_EQ(g.occupancy.size(), 1u);
  const auto& o = g.occupancy[0];
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(o[0].positions, 2.0 * P);
  EXPECT_EQ(o[0].held, 2.0 * P);
  EXPECT_FALSE(o[0].compacted);
  EXPECT_EQ(o[1].positions, 2.0 * P);
  EXPECT_EQ(o[1].held, double(kept[0] + kept[1]));
  EXPECT_TRUE(o[1].compacted);
  EXPECT_EQ(o[1].position_bytes, double(pb));
  EXPECT_EQ(o[1].allocated, double(max_seqs) * cap * pb);
  EXPECT_EQ(o[1].allocated_dense, double(max_seqs) * ctx * pb);
  // decoding past a page boundary grows the buffers by a page, the held slots moved intact
  int t = P;
  auto most_held = [&] { return std::max(comp.cache().held(1, 0), comp.cache().held(1, 1)); };
  while (most_held() <= cap && t < ctx) comp.forward({{5}, {6}}, t++, false);
  ASSERT_GT(most_held(), cap);
  for (int s = 0; s < 2; ++s) {
    int k = 0;
    for (int p = 0; p < t; ++p) k += drop_pat(1, s, p) ? 0 : 1;
    EXPECT_EQ(comp.cache().held(1, s), k);
  }
  EXPECT_EQ(comp.cache().capacity(1), cap + page);
  // a new prompt releases the buffers and starts again from its own tokens
  comp.forward({tokens(8, V, 3)}, 0, false);
  EXPECT_EQ(comp.cache().capacity(1), page);
  EXPECT_EQ(comp.cache().held(1, 0), 6);  // positions 4 and 6 dropped
}

// The Token Filtering record against a direct count of the gate's own decisions (its traces).
TYPED_TEST(TokenDrop, TokenFilterRecordCountsKeptPositions) {
  using E = TypeParam;
  TempDir dir;
  SynthSpec spec = tiny_spec(43);
  spec.cfg.n_layer = 4;
  const std::string path = make_model(dir, "m.gguf", spec);
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const int P = 40, D = 10, ctx = 128, V = c.vocab;
  for (bool compact : {true, false}) {
    gating::TokenFilterOptions o;
    o.ratio = 0.4;
    o.num_layers = 3;
    o.warmup = 6;
    o.drop_skipped = true;
    o.trace_sequences = 2;
    gating::TokenFilter<E> g(o, c.n_layer, c.n_kv_head, c.head_dim, c.head_dim, 2);
    Engine<E> e(w, 2, ctx);
    e.set_token_gate(&g);
    e.set_drop_compaction(compact);
    e.forward({tokens(P, V, 4), tokens(P, V, 5)}, 0, false);
    for (int t = 0; t < D; ++t) e.forward({{7 + t}, {9 + t}}, P + t, false);
    const gating::KVCacheRecord& kv = g.kv_cache();
    ASSERT_EQ(kv.layers.size(), static_cast<std::size_t>(c.n_layer));
    EXPECT_EQ(kv.calls, static_cast<std::uint64_t>(1 + D));
    const double pb = 4.0 * 2 * c.kv_dim();
    double held_total = 0, skipped_total = 0;
    for (int l = 0; l < c.n_layer; ++l) {
      const auto it = std::find(g.layers().begin(), g.layers().end(), l);
      double skipped = 0;
      if (it != g.layers().end())
        for (int s = 0; s < 2; ++s)
          for (std::uint8_t x :
               g.traces()[s][static_cast<std::size_t>(it - g.layers().begin())].skipped)
            skipped += x;
      const auto& r = kv.layers[static_cast<std::size_t>(l)];
      EXPECT_EQ(r.positions_final, 2.0 * (P + D)) << l;
      EXPECT_EQ(r.held_final, 2.0 * (P + D) - skipped) << l;
      EXPECT_EQ(r.compacted, compact && it != g.layers().end()) << l;
      EXPECT_EQ(r.allocated_final, double(e.cache().k_bytes(l) + e.cache().v_bytes(l))) << l;
      held_total += r.held_final;
      skipped_total += skipped;
    }
    EXPECT_GT(skipped_total, 0.0);
    EXPECT_EQ(kv.held_final, held_total * pb);
    EXPECT_EQ(kv.dense_final, 2.0 * (P + D) * c.n_layer * pb);
    EXPECT_GE(kv.held_peak, kv.held_final);
    EXPECT_EQ(kv.dense_peak, kv.dense_final);
    EXPECT_EQ(kv.allocated_dense, 2.0 * ctx * c.n_layer * pb);
    if (compact)
      EXPECT_LT(kv.allocated_final, kv.allocated_dense);
    else
      EXPECT_EQ(kv.allocated_final, kv.allocated_dense);
    EXPECT_LT(kv.held_fraction(), 1.0);
  }
}

// A gate that does not drop: the cache stays dense in every layer, compaction on or off gives
// the same logits bit for bit, nothing is accounted.
TYPED_TEST(TokenDrop, WithoutDropNothingChanges) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(44));
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  const int P = 20, V = c.vocab;
  PatternGate<E> ga, gb;
  ga.skip_at = gb.skip_at = pattern;
  ga.drop = gb.drop = false;
  Engine<E> a(w, 2, 32), b(w, 2, 32), plain(w, 2, 32);
  a.set_token_gate(&ga);
  b.set_token_gate(&gb);
  b.set_drop_compaction(false);
  const auto x = to_host(a.forward({tokens(P, V, 1), tokens(P, V, 2)}, 0, true));
  const auto y = to_host(b.forward({tokens(P, V, 1), tokens(P, V, 2)}, 0, true));
  ASSERT_EQ(x.size(), y.size());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
  const auto x1 = to_host(a.forward({{5}, {6}}, P, false));
  const auto y1 = to_host(b.forward({{5}, {6}}, P, false));
  EXPECT_EQ(0, std::memcmp(x1.data(), y1.data(), x1.size() * sizeof(float)));
  for (int l = 0; l < c.n_layer; ++l) {
    EXPECT_FALSE(a.cache().token_compacted(l));
    EXPECT_FALSE(a.cache().layer(l).has_drops());
    EXPECT_EQ(a.cache().held(l, 0), P + 1);
  }
  EXPECT_EQ(a.cache().bytes(), plain.cache().bytes());
  EXPECT_TRUE(ga.occupancy.empty());
  // skipped rows without drops: the reference, whose skipped tokens stay in the cache
  ReferenceLlama r0(path), r1(path);
  r0.skip = [](int l, int p) { return pattern(l, 0, p); };
  r1.skip = [](int l, int p) { return pattern(l, 1, p); };
  for (int t = 0; t < P; ++t) {
    EXPECT_LE(rel_err(x, r0.step(tokens(P, V, 1)[t]), static_cast<std::size_t>(t) * V), 2e-5);
    EXPECT_LE(rel_err(x, r1.step(tokens(P, V, 2)[t]), static_cast<std::size_t>(P + t) * V), 2e-5);
  }
  // a gate that skips nothing: the dense engine's logits, bit for bit, prefill and decode
  PatternGate<E> none;
  none.skip_at = [](int, int, int) { return false; };
  none.drop = false;
  Engine<E> g(w, 2, 32), d(w, 2, 32);
  g.set_token_gate(&none);
  d.set_fused_decode(false);  // (a gated layer runs op by op)
  const auto gx = to_host(g.forward({tokens(P, V, 1), tokens(P, V, 2)}, 0, true));
  const auto dx = to_host(d.forward({tokens(P, V, 1), tokens(P, V, 2)}, 0, true));
  EXPECT_EQ(0, std::memcmp(gx.data(), dx.data(), gx.size() * sizeof(float)));
  const auto g1 = to_host(g.forward({{5}, {6}}, P, false));
  const auto d1 = to_host(d.forward({{5}, {6}}, P, false));
  EXPECT_EQ(0, std::memcmp(g1.data(), d1.data(), g1.size() * sizeof(float)));
}

// Misuse: continuing compacted sequences without the dropping gate, writing a compacted layer
// at positions, compacting its key channels or evicting from it.
TYPED_TEST(TokenDrop, MisuseIsRefused) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(45));
  auto w = load_model<E>(path, LoadOptions{});
  const Config& c = w->cfg;
  PatternGate<E> g;
  g.skip_at = pattern;
  Engine<E> e(w, 2, 32);
  e.set_token_gate(&g);
  e.forward({tokens(10, c.vocab, 1), tokens(10, c.vocab, 2)}, 0, false);
  ASSERT_TRUE(e.cache().token_compacted(1));
  e.set_token_gate(nullptr);
  EXPECT_THROW(e.forward({{5}, {6}}, 10, false), Error);
  e.forward({tokens(10, c.vocab, 1)}, 0, false);  // new sequences without the gate: dense again
  EXPECT_FALSE(e.cache().token_compacted(1));

  KVCache<E> cache(c, 2, 16);
  cache.set_token_compaction(1, true);
  const int kw = c.kv_dim();
  Mat<E> k("k", 2, kw), v("v", 2, kw);
  EXPECT_THROW(cache.store(E(), 1, CMat<E>(k), CMat<E>(v), 2, 1, 0), Error);
  KeptChannels ch;
  ch.positions = 1;
  EXPECT_THROW(cache.compact_keys(E(), 1, ch), Error);
  KeptTokens kt;
  kt.positions = 1;
  EXPECT_THROW(cache.evict(E(), 1, kt), Error);
  const auto slots = cache.store_kept(E(), 1, CMat<E>(k), CMat<E>(v), nullptr, 2, 1, 0);
  EXPECT_EQ(slots, (std::vector<int>{0, 0}));
  EXPECT_THROW(cache.store_kept(E(), 1, CMat<E>(k), CMat<E>(v), nullptr, 2, 1, 16), Error);
}

}  // namespace
}  // namespace sparsim::test
