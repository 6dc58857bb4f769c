// RAP and KVPruner: layer budgets, channel selection, the fused reduced model against the masked
// full model (engine fp32 and the double-precision reference), ρ = 1 bitwise dense, orphans,
// the pruned GGUF round trip and pruned GGUFs with inconsistent layouts.
#include "backends.hpp"
#include "compare_helpers.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/loader.hpp"
#include "model/pruned_layout.hpp"
#include "model/synth_hf.hpp"
#include "reference_llama.hpp"
#include "transforms/kv_weight_pruning.hpp"
#include "transforms/pruned_gguf.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

namespace sparsim::test {
namespace {

using pruning::FisherScores;
using pruning::PruneMethod;

/// Fisher scores of random gate gradients (three sequences) for config c.
FisherScores random_fisher(const Config& c, std::uint64_t seed) {
  FisherScores f;
  f.sequences = 3;
  f.tokens = 8;
  f.n_layer = c.n_layer;
  f.n_kv_head = c.n_kv_head;
  f.head_dim = c.head_dim;
  f.rope_layout = pruning::rope_layout_name(c.rope_layout);
  SynthRng r(seed);
  const std::size_t n = static_cast<std::size_t>(f.sequences) * c.n_layer * c.kv_dim();
  for (std::size_t i = 0; i < n; ++i) {
    // per-layer scale so the budgets differ between layers
    const double s = 1.0 + static_cast<double>((i / c.kv_dim()) % c.n_layer);
    f.gate_k.push_back(s * r.normal());
    f.gate_v.push_back(s * r.normal());
  }
  f.loss.assign(3, 5.0);
  f.finish();
  f.validate();
  return f;
}

Config plan(const Config& c, PruneMethod m, double retain, std::uint64_t seed = 1) {
  pruning::PruneOptions o;
  o.method = m;
  o.retain = retain;
  o.flops_context = 64;
  o.source_fingerprint = "0000000000000000";
  return pruning::plan_pruning(c, random_fisher(c, seed), o);
}

/// The dense model with the W_k rows of cut K channels and the W_v rows of cut V channels zeroed
/// (fp32 storage), run at full width by the engine.
template <class E>
std::shared_ptr<Weights<E>> masked(const Weights<E>& w, const Config& p) {
  auto out = std::make_shared<Weights<E>>(w);
  const Config& c = w.cfg;
  for (int l = 0; l < c.n_layer; ++l) {
    auto zero_rows = [&](const Matrix<E>& m, bool k) {
      Matrix<E> o = m;
      o.f32 = decltype(o.f32)("masked", m.rows, m.cols);
      auto h = Kokkos::create_mirror(Kokkos::HostSpace(), m.f32);  // a copy on every backend
      Kokkos::deep_copy(h, m.f32);
      for (int kvh = 0; kvh < c.n_kv_head; ++kvh) {
        std::vector<char> keep(static_cast<std::size_t>(c.head_dim), 0);
        const int width = k ? p.qk_head_dim(l) : p.v_head_dim(l);
        for (int i = 0; i < width; ++i)
          keep[static_cast<std::size_t>(k ? p.k_channel(l, kvh, i) : p.v_channel(l, kvh, i))] = 1;
        for (int ch = 0; ch < c.head_dim; ++ch)
          if (!keep[static_cast<std::size_t>(ch)])
            for (int j = 0; j < m.cols; ++j) h(kvh * c.head_dim + ch, j) = 0;
      }
      Kokkos::deep_copy(o.f32, h);
      return o;
    };
    out->layers[l].wk = zero_rows(w.layers[l].wk, true);
    out->layers[l].wv = zero_rows(w.layers[l].wv, false);
  }
  return out;
}

ReferenceLlama::ChannelMask reference_mask(const Config& p) {
  ReferenceLlama::ChannelMask m;
  for (int l = 0; l < p.n_layer; ++l) {
    std::vector<char> k(static_cast<std::size_t>(p.kv_dim()), 0), v(k);
    for (int h = 0; h < p.n_kv_head; ++h) {
      for (int i = 0; i < p.qk_head_dim(l); ++i) k[h * p.head_dim + p.k_channel(l, h, i)] = 1;
      for (int i = 0; i < p.v_head_dim(l); ++i) v[h * p.head_dim + p.v_channel(l, h, i)] = 1;
    }
    m.k_keep.push_back(k);
    m.v_keep.push_back(v);
  }
  return m;
}

std::vector<int> prompt(int n, int vocab) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 53 + 7) % (vocab - 3);
  return t;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / scale;
}

template <class E>
std::vector<float> logits_of(std::shared_ptr<const Weights<E>> w, const std::vector<int>& toks) {
  Engine<E> eng(w, 1, static_cast<int>(toks.size()));
  return to_host(eng.forward({toks}, 0, true));
}

// ---------------------------------------------------------------------------------------------

TEST(PruneBudgets, ProportionalClampedAndExactlyOnBudget) {
  const auto m = pruning::layer_pair_budgets({1, 2, 3, 4}, 0.5, 8);
  EXPECT_EQ(m, (std::vector<int>{2, 3, 5, 6}));  // 1.6, 3.2, 4.8, 6.4 → largest remainders
  for (double rho : {0.05, 0.3, 0.5, 0.7, 0.9, 1.0}) {
    const std::vector<double> sig = {0.1, 5, 0.3, 2, 9, 0, 1};
    const auto b = pruning::layer_pair_budgets(sig, rho, 32);
    const long want = std::max<long>(7, std::lround(rho * 7 * 32));
    EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0L), want) << rho;
    for (int x : b) {
      EXPECT_GE(x, 1);
      EXPECT_LE(x, 32);
    }
    for (std::size_t i = 0; i < sig.size(); ++i)
      for (std::size_t j = 0; j < sig.size(); ++j)
        if (sig[i] > sig[j]) {
          EXPECT_GE(b[i], b[j]) << rho;
        }
  }
  EXPECT_EQ(pruning::layer_pair_budgets({1, 100}, 1.0, 8), (std::vector<int>{8, 8}));
  EXPECT_EQ(pruning::layer_pair_budgets({0, 0, 0}, 0.5, 8), (std::vector<int>{4, 4, 4}));
  EXPECT_EQ(pruning::layer_pair_budgets({1, 1000}, 0.5, 8), (std::vector<int>{1, 7}));
  for (double bad : {0.0, -0.1, 1.01, std::nan("")})
    EXPECT_THROW(pruning::layer_pair_budgets({1, 2}, bad, 8), Error) << bad;
  EXPECT_THROW(pruning::layer_pair_budgets({1, -2}, 0.5, 8), Error);
}

TEST(PrunePlan, RapKeepsTheBestWholePairsKvPrunerTheBestChannels) {
  const Config c = tiny_config();
  const FisherScores f = random_fisher(c, 3);
  const auto m = pruning::layer_pair_budgets(pruning::layer_sigma(f), 0.5, c.head_dim / 2);
  for (PruneMethod method : {PruneMethod::Rap, PruneMethod::KvPruner}) {
    pruning::PruneOptions o;
    o.method = method;
    o.retain = 0.5;
    const Config p = pruning::plan_pruning(c, f, o);
    const pruning::PruneReport r = pruning::prune_report(p);
    for (int l = 0; l < c.n_layer; ++l) {
      EXPECT_EQ(p.qk_head_dim(l), 2 * m[l]);
      EXPECT_EQ(p.v_head_dim(l), 2 * m[l]);
      for (int h = 0; h < c.n_kv_head; ++h) {
        const std::size_t base = (static_cast<std::size_t>(l) * c.n_kv_head + h) * c.head_dim;
        // every kept V channel scores at least as high as every cut one
        std::vector<char> kv(c.head_dim, 0), kk(c.head_dim, 0);
        for (int i = 0; i < p.v_head_dim(l); ++i) kv[p.v_channel(l, h, i)] = 1;
        for (int i = 0; i < p.qk_head_dim(l); ++i) kk[p.k_channel(l, h, i)] = 1;
        for (int a = 0; a < c.head_dim; ++a)
          for (int b = 0; b < c.head_dim; ++b)
            if (kv[a] && !kv[b]) {
              EXPECT_GE(f.v[base + a], f.v[base + b]);
            }
        if (method == PruneMethod::Rap) {
          for (int j = 0; j < c.head_dim / 2; ++j) EXPECT_EQ(kk[2 * j], kk[2 * j + 1]) << j;
          for (int a = 0; a < c.head_dim / 2; ++a)
            for (int b = 0; b < c.head_dim / 2; ++b)
              if (kk[2 * a] && !kk[2 * b]) {
                EXPECT_GE(f.sigma(l, h, a), f.sigma(l, h, b));
              }
        } else {
          for (int a = 0; a < c.head_dim; ++a)
            for (int b = 0; b < c.head_dim; ++b)
              if (kk[a] && !kk[b]) {
                EXPECT_GE(f.k[base + a], f.k[base + b]);
              }
        }
      }
    }
    if (method == PruneMethod::Rap) {
      EXPECT_EQ(r.orphan_ratio, 0.0);  // by construction
      for (const auto& lc : r.layers) EXPECT_EQ(lc.orphans, 0);
    } else {
      EXPECT_GT(r.orphan_ratio, 0.0);  // random scores split pairs
    }
    EXPECT_NEAR(r.retain_realised, 0.5, 1.0 / (c.n_layer * c.head_dim / 2));
    EXPECT_DOUBLE_EQ(r.kv_bytes_fraction, r.retain_realised);
    // q, k, v, o all shrink with the widths: the parameter fraction is the channel fraction
    EXPECT_NEAR(r.attn_params_fraction, r.retain_realised, 1e-12);
    EXPECT_GT(r.attn_flops_fraction, r.retain_realised);  // the softmax does not shrink
    EXPECT_LT(r.attn_flops_fraction, r.retain_realised + 0.05);
  }
}

/// Kept K pairs and V channels of every (layer, KV head) of a plan, as 0/1 per channel.
std::vector<std::vector<char>> kept_k_sets(const Config& p) {
  std::vector<std::vector<char>> out;
  for (int l = 0; l < p.n_layer; ++l)
    for (int h = 0; h < p.n_kv_head; ++h) {
      std::vector<char> k(p.head_dim, 0);
      for (int i = 0; i < p.qk_head_dim(l); ++i) k[p.k_channel(l, h, i)] = 1;
      out.push_back(k);
    }
  return out;
}
std::vector<std::vector<char>> kept_v_sets(const Config& p) {
  std::vector<std::vector<char>> out;
  for (int l = 0; l < p.n_layer; ++l)
    for (int h = 0; h < p.n_kv_head; ++h) {
      std::vector<char> v(p.head_dim, 0);
      for (int i = 0; i < p.v_head_dim(l); ++i) v[p.v_channel(l, h, i)] = 1;
      out.push_back(v);
    }
  return out;
}

// The ablation switches (RAP's Figures 5-7): each changes what it says and nothing else.
TEST(PruneSwitches, UniformBudgetsGiveEqualWidthsAndTheSameRanking) {
  Config c = tiny_config();
  c.n_layer = 4;
  const FisherScores f = random_fisher(c, 5);
  pruning::PruneOptions o;
  o.retain = 0.5;  // ρ·D/2 = 4 pairs per head in every layer
  const Config adaptive = pruning::plan_pruning(c, f, o);
  o.budget = pruning::LayerBudget::Uniform;
  const Config uniform = pruning::plan_pruning(c, f, o);
  bool differ = false;
  for (int l = 0; l < c.n_layer; ++l) {
    EXPECT_EQ(uniform.qk_head_dim(l), c.head_dim / 2) << l;
    EXPECT_EQ(uniform.v_head_dim(l), c.head_dim / 2) << l;
    differ |= adaptive.qk_head_dim(l) != uniform.qk_head_dim(l);
  }
  EXPECT_TRUE(differ) << "random per-layer Fisher scales must give adaptive budgets";
  EXPECT_EQ(uniform.prune.recipe, "score=fisher budget=uniform pair=joint k_share=0.5 kv=balanced");
  // within a head: the same ranking, so where a layer's widths agree the kept sets agree
  const auto ka = kept_k_sets(adaptive), ku = kept_k_sets(uniform);
  const auto va = kept_v_sets(adaptive), vu = kept_v_sets(uniform);
  for (int l = 0; l < c.n_layer; ++l)
    if (adaptive.qk_head_dim(l) == uniform.qk_head_dim(l))
      for (int h = 0; h < c.n_kv_head; ++h) {
        EXPECT_EQ(ka[l * c.n_kv_head + h], ku[l * c.n_kv_head + h]);
        EXPECT_EQ(va[l * c.n_kv_head + h], vu[l * c.n_kv_head + h]);
      }
}

TEST(PruneSwitches, AdditivePairScoreRanksPairsByTheSumOfTheirChannels) {
  const Config c = tiny_config();
  const FisherScores f = random_fisher(c, 9);
  pruning::PruneOptions o;
  o.retain = 0.5;
  o.budget = pruning::LayerBudget::Uniform;  // same widths: only the ranking may change
  const Config joint = pruning::plan_pruning(c, f, o);
  o.pair_score = pruning::PairScore::Additive;
  const Config add = pruning::plan_pruning(c, f, o);
  EXPECT_EQ(kept_v_sets(joint), kept_v_sets(add));  // V does not use pair scores
  const auto kk = kept_k_sets(add);
  bool differ = kk != kept_k_sets(joint);
  for (int l = 0; l < c.n_layer; ++l)
    for (int h = 0; h < c.n_kv_head; ++h) {
      const std::size_t base = (static_cast<std::size_t>(l) * c.n_kv_head + h) * c.head_dim;
      const auto& k = kk[l * c.n_kv_head + h];
      auto score = [&](int j) { return f.k[base + 2 * j] + f.k[base + 2 * j + 1]; };
      for (int a = 0; a < c.head_dim / 2; ++a) {
        EXPECT_EQ(k[2 * a], k[2 * a + 1]);
        for (int b = 0; b < c.head_dim / 2; ++b)
          if (k[2 * a] && !k[2 * b]) {
            EXPECT_GE(score(a), score(b)) << l << " " << h;
          }
      }
    }
  EXPECT_TRUE(differ) << "G_c·G_c' cross terms must change some ranking";
}

TEST(PruneSwitches, KShareMovesChannelsBetweenKAndV) {
  const Config c = tiny_config();
  const FisherScores f = random_fisher(c, 4);
  pruning::PruneOptions o;
  o.retain = 0.5;
  o.budget = pruning::LayerBudget::Uniform;
  const Config even = pruning::plan_pruning(c, f, o);
  o.k_share = 0.75;  // K keeps 0.75 of its channels, V 0.25
  const Config k_heavy = pruning::plan_pruning(c, f, o);
  const int D = c.head_dim;
  for (int l = 0; l < c.n_layer; ++l) {
    EXPECT_EQ(k_heavy.qk_head_dim(l), 3 * D / 4);
    EXPECT_EQ(k_heavy.v_head_dim(l), D / 4);
    // the same KV bytes as the even split
    EXPECT_EQ(k_heavy.qk_head_dim(l) + k_heavy.v_head_dim(l),
              even.qk_head_dim(l) + even.v_head_dim(l));
  }
  EXPECT_NEAR(pruning::prune_report(k_heavy).kv_bytes_fraction,
              pruning::prune_report(even).kv_bytes_fraction, 1e-12);
  o.k_share = 0.9;  // at ρ = 0.7, K would keep 2·0.9·0.7 > 1 of its channels
  o.retain = 0.7;
  EXPECT_THROW(pruning::plan_pruning(c, f, o), Error);
}

TEST(PruneSwitches, PooledBudgetsSplitEachLayerByScoreMassAtTheSameKvBytes) {
  const Config c = tiny_config();
  FisherScores f = random_fisher(c, 6);
  for (auto& x : f.v) x *= 9;  // V carries more Fisher mass than K (as the paper finds)
  pruning::PruneOptions o;
  o.retain = 0.5;
  const Config balanced = pruning::plan_pruning(c, f, o);
  o.kv_budget = pruning::KvBudget::Pooled;
  const Config pooled = pruning::plan_pruning(c, f, o);
  const int H = c.n_kv_head, D = c.head_dim;
  for (int l = 0; l < c.n_layer; ++l) {
    const int t = balanced.qk_head_dim(l) + balanced.v_head_dim(l);
    EXPECT_EQ(pooled.qk_head_dim(l) + pooled.v_head_dim(l), t) << l;  // same KV bytes
    double sk = 0, sv = 0;
    for (int i = 0; i < H * D; ++i) {
      sk += std::sqrt(f.k[static_cast<std::size_t>(l) * H * D + i]);
      sv += std::sqrt(f.v[static_cast<std::size_t>(l) * H * D + i]);
    }
    // K's pairs: the root-mass share of the layer's pairs, rounded (within [1, D/2])
    EXPECT_NEAR(pooled.qk_head_dim(l) / 2.0, sk / (sk + sv) * t / 2.0, 0.5 + 1e-9) << l;
    EXPECT_LT(pooled.qk_head_dim(l), pooled.v_head_dim(l)) << l;
  }
  EXPECT_NEAR(pruning::prune_report(pooled).kv_bytes_fraction,
              pruning::prune_report(balanced).kv_bytes_fraction, 1e-12);
  EXPECT_EQ(pooled.prune.recipe, "score=fisher budget=adaptive pair=joint k_share=0.5 kv=pooled");
  o.k_share = 0.6;  // pooled sets the split itself
  EXPECT_THROW(pruning::plan_pruning(c, f, o), Error);
}

TEST(PruneSwitches, MagnitudeScoresAreTheSquaredRowNorms) {
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(33));
  auto w = load_model<Kokkos::DefaultHostExecutionSpace>(path, LoadOptions{});
  const Config& c = w->cfg;
  const pruning::ChannelScores s = pruning::magnitude_channel_scores(*w);
  // brute force from the file's own tensors, dequantized by the GGUF reader
  gguf::File g = gguf::File::open(path);
  for (int l = 0; l < c.n_layer; ++l)
    for (const char* which : {"k", "v"}) {
      const gguf::TensorInfo* t = g.find_tensor(fmt::format("blk.{}.attn_{}.weight", l, which));
      ASSERT_NE(t, nullptr);
      std::vector<float> row(t->ne[0]);
      for (int r = 0; r < c.kv_dim(); ++r) {
        gguf::dequantize(t->type, t->data + r * gguf::row_bytes(t->type, t->ne[0]), row.data(),
                         row.size());
        double n2 = 0;
        for (float x : row) n2 += static_cast<double>(x) * x;
        const double got =
            (which[0] == 'k' ? s.k : s.v)[static_cast<std::size_t>(l) * c.kv_dim() + r];
        EXPECT_NEAR(got, n2, 1e-9 * n2) << l << which << r;
      }
    }
  pruning::PruneOptions o;
  o.retain = 0.5;
  o.score = pruning::ScoreSource::Magnitude;
  const Config p = pruning::plan_pruning(c, s, o);
  EXPECT_EQ(p.prune.recipe, "score=magnitude budget=adaptive pair=joint k_share=0.5 kv=balanced");
  // the kept pairs are the largest by the sum of their rows' squared norms
  const auto kk = kept_k_sets(p);
  for (int l = 0; l < c.n_layer; ++l)
    for (int h = 0; h < c.n_kv_head; ++h)
      for (int a = 0; a < c.head_dim / 2; ++a)
        for (int b = 0; b < c.head_dim / 2; ++b)
          if (kk[l * c.n_kv_head + h][2 * a] && !kk[l * c.n_kv_head + h][2 * b]) {
            EXPECT_GE(s.sigma(l, h, a), s.sigma(l, h, b));
          }
}

template <class E>
class PruneModel : public ::testing::Test {};
TYPED_TEST_SUITE(PruneModel, Backends, BackendName);

// Fused RAP = the full model with the cut W_k / W_v rows zeroed (fp32 engine against fp32
// engine, ≤ 1e-5 relative; and both methods against the double-precision masked reference).
TYPED_TEST(PruneModel, FusedModelEqualsMaskedFullModel) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(31));
  auto w = load_model<E>(path, LoadOptions{});
  const auto toks = prompt(20, w->cfg.vocab);
  for (double rho : {0.5, 0.75}) {
    const Config p = plan(w->cfg, PruneMethod::Rap, rho);
    const auto fused = logits_of<E>(pruning::fuse_pruned(*w, p), toks);
    const auto mask = logits_of<E>(masked(*w, p), toks);
    EXPECT_LE(max_rel(fused, mask), 1e-5) << "rap " << rho;
    const auto dense = logits_of<E>(w, toks);
    EXPECT_GT(max_rel(fused, dense), 1e-3) << "pruning must change the model";
  }
  {  // K and V of different widths (--k-share): still the masked full model
    pruning::PruneOptions o;
    o.retain = 0.5;
    o.k_share = 0.75;
    const Config p = pruning::plan_pruning(w->cfg, random_fisher(w->cfg, 2), o);
    ASSERT_NE(p.qk_head_dim(0), p.v_head_dim(0));
    EXPECT_LE(
        max_rel(logits_of<E>(pruning::fuse_pruned(*w, p), toks), logits_of<E>(masked(*w, p), toks)),
        1e-5);
  }
  const int V = w->cfg.vocab;
  for (PruneMethod m : {PruneMethod::Rap, PruneMethod::KvPruner}) {
    const Config p = plan(w->cfg, m, 0.6, 7);
    if (m == PruneMethod::KvPruner) {
      ASSERT_GT(pruning::prune_report(p).orphan_ratio, 0.0);
    }
    const auto fused = logits_of<E>(pruning::fuse_pruned(*w, p), toks);
    ReferenceLlama ref(path);
    ref.set_mask(reference_mask(p));
    double err = 0, scale = 0;
    for (std::size_t t = 0; t < toks.size(); ++t) {
      const auto r = ref.step(toks[t]);
      for (int v = 0; v < V; ++v) {
        err = std::max(err, std::fabs(fused[t * V + v] - r[v]));
        scale = std::max(scale, std::fabs(r[v]));
      }
    }
    EXPECT_LE(err / scale, 1e-5) << pruning::method_name(m);
  }
}

TYPED_TEST(PruneModel, RetainOneIsBitwiseDense) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(32));
  auto w = load_model<E>(path, LoadOptions{});
  const auto toks = prompt(17, w->cfg.vocab);
  const auto dense = logits_of<E>(w, toks);
  for (PruneMethod m : {PruneMethod::Rap, PruneMethod::KvPruner}) {
    const Config p = plan(w->cfg, m, 1.0);
    EXPECT_EQ(logits_of<E>(pruning::fuse_pruned(*w, p), toks), dense);
    const std::string out = dir.file("p1.gguf");
    pruning::write_pruned_gguf(path, p, out);
    EXPECT_EQ(logits_of<E>(load_model<E>(out, LoadOptions{}), toks), dense);
    // decode too
    auto wp = load_model<E>(out, LoadOptions{});
    Engine<E> a(w, 1, 32), b(wp, 1, 32);
    for (int t = 0; t < 5; ++t)
      EXPECT_EQ(to_host(a.forward({{toks[t]}}, t)), to_host(b.forward({{toks[t]}}, t)));
  }
}

// rotate_half layout (Hugging Face): pairs (j, j + D/2) stay pairs in the reduced head.
TYPED_TEST(PruneModel, RotateHalfLayoutFusedEqualsMasked) {
  using E = TypeParam;
  TempDir dir;
  write_synth_safetensors(tiny_spec(33), dir.file("hf"));
  auto w = load_model<E>(dir.file("hf"), LoadOptions{});
  ASSERT_EQ(w->cfg.rope_layout, RopeLayout::Half);
  const Config p = plan(w->cfg, PruneMethod::Rap, 0.5);
  EXPECT_EQ(pruning::prune_report(p).orphan_ratio, 0.0);
  for (int l = 0; l < p.n_layer; ++l)  // channel j kept ⇔ channel j + D/2 kept
    for (int h = 0; h < p.n_kv_head; ++h) {
      const int w2 = p.qk_head_dim(l), m = w2 / 2;
      for (int i = 0; i < m; ++i) EXPECT_EQ(p.k_channel(l, h, i + m), p.k_channel(l, h, i) + 8);
    }
  const auto toks = prompt(16, w->cfg.vocab);
  EXPECT_LE(
      max_rel(logits_of<E>(pruning::fuse_pruned(*w, p), toks), logits_of<E>(masked(*w, p), toks)),
      1e-5);
}

// A pruned model on the engine's device path (the fused decode kernel with the layer's RoPE
// units, split-K decode attention at the reduced widths and the model's scale) gives the logits of
// the op-by-op path: two sequences, prefill then decode, both RoPE layouts, RAP (every layer
// fused) and KVPruner (split pairs: decode attention only), f32 and bf16 storage.
TYPED_TEST(PruneModel, DevicePathMatchesOpByOp) {
  using E = TypeParam;
  TempDir dir;
  const std::string gguf = make_model(dir, "m.gguf", tiny_spec(35));
  write_synth_safetensors(tiny_spec(36), dir.file("hf"));
  for (const std::string& path : {gguf, dir.file("hf")})
    for (DType st : {DType::F32, DType::BF16})
      for (PruneMethod m : {PruneMethod::Rap, PruneMethod::KvPruner}) {
        LoadOptions lo;
        lo.storage = st;
        auto w = load_model<E>(path, lo);
        const Config p = plan(w->cfg, m, 0.6, 11);
        auto wp = pruning::fuse_pruned(*w, p);
        Engine<E> a(wp, 2, 48), b(wp, 2, 48);
        b.set_device_path(true);
        const int V = w->cfg.vocab;
        std::vector<std::vector<int>> pr(2);
        for (int sq = 0; sq < 2; ++sq)
          for (int t = 0; t < 20; ++t) pr[sq].push_back(3 + (t * 41 + sq * 97) % (V - 3));
        const std::string what = path + " " + to_string(st) + " " + pruning::method_name(m);
        EXPECT_LE(max_rel(to_host(a.forward(pr, 0, false)), to_host(b.forward(pr, 0, false))), 1e-5)
            << what << " prefill";
        for (int step = 0; step < 4; ++step) {
          const std::vector<std::vector<int>> next = {{5 + step * 13}, {9 + step * 17}};
          EXPECT_LE(max_rel(to_host(a.forward(next, 20 + step, false)),
                            to_host(b.forward(next, 20 + step, false))),
                    1e-5)
              << what << " decode step " << step;
        }
      }
}

// The pruned GGUF reads back as the same model: config, and logits bitwise equal to the fused
// model in memory (quantized rows copied as stored, a cut W_o in an exact wider type).
TYPED_TEST(PruneModel, PrunedGgufRoundTrips) {
  using E = TypeParam;
  TempDir dir;
  for (gguf::GGMLType type : {gguf::GGMLType::F32, gguf::GGMLType::Q4_1, gguf::GGMLType::F16}) {
    SynthSpec s = tiny_spec(34);
    s.type = type;
    s.cfg.d_model = 64;
    const std::string path = make_model(dir, "m.gguf", s);
    auto w = load_model<E>(path, LoadOptions{});
    for (PruneMethod m : {PruneMethod::Rap, PruneMethod::KvPruner}) {
      const Config p = plan(w->cfg, m, 0.6, 9);
      const std::string out = dir.file("p.gguf");
      pruning::write_pruned_gguf(path, p, out);
      ModelInfo mi;
      auto wp = load_model<E>(out, LoadOptions{}, &mi);
      const Config& q = wp->cfg;
      ASSERT_TRUE(q.pruned());
      EXPECT_EQ(q.prune.method, pruning::method_name(m));
      EXPECT_DOUBLE_EQ(q.prune.retain, 0.6);
      for (int l = 0; l < p.n_layer; ++l) {
        EXPECT_EQ(q.attn[l].qk_dim, p.attn[l].qk_dim);
        EXPECT_EQ(q.attn[l].v_dim, p.attn[l].v_dim);
        EXPECT_EQ(q.attn[l].k_channels, p.attn[l].k_channels);
        EXPECT_EQ(q.attn[l].v_channels, p.attn[l].v_channels);
      }
      EXPECT_EQ(q.n_params(), p.n_params());
      const auto toks = prompt(12, w->cfg.vocab);
      EXPECT_EQ(logits_of<E>(wp, toks), logits_of<E>(pruning::fuse_pruned(*w, p), toks))
          << gguf::to_string(type);
      // the tokenizer travels with the model
      gguf::File f = gguf::File::open(out);
      EXPECT_TRUE(f.has("tokenizer.ggml.tokens"));
    }
  }
}

/// The naive KVPruner's fused model run as a dense model of head width w: the same weights
/// with the configuration of a dense model whose heads are w wide (RoPE over w: pairs of the
/// reduced head at frequencies base^(−2i/w), softmax scale 1/√w), W_q scaled by √(w/D) so
/// that the scores keep the pruned model's 1/√D.
template <class E>
std::shared_ptr<Weights<E>> as_dense_of_width(const Weights<E>& fused, int w) {
  auto d = std::make_shared<Weights<E>>(fused);
  const int D = fused.cfg.head_dim;
  d->cfg.head_dim = w;
  d->cfg.attn.clear();
  d->cfg.prune = PruneRecord{};
  const float s = static_cast<float>(std::sqrt(static_cast<double>(w) / D));
  for (auto& lw : d->layers) {
    Matrix<E> q = lw.wq;
    q.f32 = decltype(q.f32)("scaled_wq", q.rows, q.cols);
    auto h = Kokkos::create_mirror(Kokkos::HostSpace(), lw.wq.f32);
    Kokkos::deep_copy(h, lw.wq.f32);
    for (int r = 0; r < q.rows; ++r)
      for (int k = 0; k < q.cols; ++k) h(r, k) *= s;
    Kokkos::deep_copy(q.f32, h);
    lw.wq = q;
  }
  return d;
}

// The naive KVPruner (the paper's main-table KVPruner) keeps the index-aware variant's channels
// but re-packs them as a head of width w and rotates them as that head's pairs: with uniform
// budgets its model is a dense model of head width w (an independent path: the engine's plain
// RoPE over w, no rotation units), prefill and decode, op-by-op and device path, both RoPE
// layouts; and it differs from the index-aware model, which rotates each channel at its own
// frequency.
TYPED_TEST(PruneModel, NaiveKvPrunerIsADenseModelOfTheReducedWidth) {
  using E = TypeParam;
  TempDir dir;
  const std::string gguf = make_model(dir, "m.gguf", tiny_spec(37));
  write_synth_safetensors(tiny_spec(38), dir.file("hf"));
  for (const std::string& path : {gguf, dir.file("hf")}) {
    auto w = load_model<E>(path, LoadOptions{});
    pruning::PruneOptions o;
    o.method = PruneMethod::KvPrunerNaive;
    o.retain = 0.5;
    o.budget = pruning::LayerBudget::Uniform;
    o.flops_context = 64;
    const Config p = pruning::plan_pruning(w->cfg, random_fisher(w->cfg, 5), o);
    ASSERT_TRUE(p.naive_rope());
    const int width = p.qk_head_dim(0);
    ASSERT_LT(width, w->cfg.head_dim);
    for (int l = 0; l < p.n_layer; ++l) {
      ASSERT_EQ(p.qk_head_dim(l), width);
      ASSERT_EQ(p.v_head_dim(l), width);
    }
    auto fused = pruning::fuse_pruned(*w, p);
    auto dense_w = as_dense_of_width(*fused, width);
    const auto toks = prompt(18, w->cfg.vocab);
    const auto naive = logits_of<E>(fused, toks);
    EXPECT_LE(max_rel(naive, logits_of<E>(dense_w, toks)), 1e-5) << path;
    // the index-aware variant keeps the same channels at their own frequencies: another model
    pruning::PruneOptions ia = o;
    ia.method = PruneMethod::KvPruner;
    const Config pi = pruning::plan_pruning(w->cfg, random_fisher(w->cfg, 5), ia);
    for (int l = 0; l < p.n_layer; ++l) EXPECT_EQ(pi.attn[l].k_channels, p.attn[l].k_channels);
    EXPECT_GT(max_rel(naive, logits_of<E>(pruning::fuse_pruned(*w, pi), toks)), 1e-3) << path;
    // decode, op-by-op and on the device path, against the dense model of width w
    for (bool device : {false, true}) {
      Engine<E> a(fused, 1, 32), b(dense_w, 1, 32);
      a.set_device_path(device);
      b.set_device_path(device);
      for (int t = 0; t < 6; ++t)
        EXPECT_LE(max_rel(to_host(a.forward({{toks[t]}}, t)), to_host(b.forward({{toks[t]}}, t))),
                  1e-5)
            << path << " device " << device << " step " << t;
    }
    // written, read back and run: the same model, its method in the file
    if (path == gguf) {
      const std::string out = dir.file("naive.gguf");
      pruning::write_pruned_gguf(gguf, p, out);
      auto wp = load_model<E>(out, LoadOptions{});
      EXPECT_EQ(wp->cfg.prune.method, "kvpruner-naive");
      EXPECT_TRUE(wp->cfg.naive_rope());
      EXPECT_EQ(logits_of<E>(wp, toks), naive);
    }
  }
}

// Adaptive budgets give layers of different widths: each width has its own block of frequencies
// (base^(−2i/w)), and each layer equals the dense model of its width in isolation — checked here
// through the table: every layer's rotation units index frequencies of its own width.
TEST(PruneNaive, EachReducedWidthRotatesAtItsOwnFrequencies) {
  Config c = tiny_spec(39).cfg;
  pruning::PruneOptions o;
  o.method = PruneMethod::KvPrunerNaive;
  o.retain = 0.6;
  const Config p = pruning::plan_pruning(c, random_fisher(c, 3), o);
  const std::vector<double> inv = p.rope_inv_freq();
  bool differ = false;
  for (int l = 0; l < p.n_layer; ++l) {
    const int w = p.qk_head_dim(l);
    differ = differ || w != p.qk_head_dim(0);
    const RopeUnits u = p.rope_units(l);
    ASSERT_EQ(u.units, w / 2);
    for (int h = 0; h < p.n_kv_head; ++h)
      for (int i = 0; i < w / 2; ++i) {
        const std::size_t k = static_cast<std::size_t>(h) * u.units + i;
        EXPECT_DOUBLE_EQ(inv[static_cast<std::size_t>(u.freq[k])],
                         std::pow(static_cast<double>(c.rope_theta), -2.0 * i / w))
            << l << " " << h << " " << i;
        EXPECT_EQ(u.i0[k], c.rope_layout == RopeLayout::Adjacent ? 2 * i : i);
        EXPECT_EQ(u.i1[k], c.rope_layout == RopeLayout::Adjacent ? 2 * i + 1 : i + w / 2);
      }
  }
  EXPECT_TRUE(differ) << "adaptive budgets should give layers of different widths";
  // the full head's frequencies come first, unchanged
  const std::vector<double> dense = c.rope_inv_freq();
  for (std::size_t j = 0; j < dense.size(); ++j) EXPECT_EQ(inv[j], dense[j]);
}

/// The fp32 values of tensor `name` of a GGUF file as the loader sees them, [ne1][ne0].
std::vector<float> values_of(const gguf::File& f, const std::string& name) {
  const gguf::TensorInfo& t = f.require_tensor(name);
  std::vector<float> x(t.ne[0] * t.ne[1]);
  gguf::dequantize(t.type, t.data, x.data(), x.size());
  return x;
}

/// The kept columns of the source's W_o of layer l, dequantized, [rows][kept].
std::vector<float> kept_wo(const gguf::File& src, const Config& p, int l) {
  const gguf::TensorInfo& t = src.require_tensor(fmt::format("blk.{}.attn_output.weight", l));
  const std::vector<float> x = values_of(src, t.name);
  const int group = p.n_head / p.n_kv_head;
  std::vector<float> y;
  for (std::uint64_t r = 0; r < t.ne[1]; ++r)
    for (int h = 0; h < p.n_head; ++h)
      for (int i = 0; i < p.v_head_dim(l); ++i)
        y.push_back(x[r * t.ne[0] + h * p.head_dim + p.v_channel(l, h / group, i)]);
  return y;
}

// A Q4_1 W_o cut through its blocks: auto writes the exact values (F32 here, as Q4_1 values
// need more than the 11/8 significant bits of F16/BF16); the other tensors are copied as stored;
// requantized types load and run, within the type's rounding error.
TEST(PrunedGgufTypes, CutQuantizedOutputProjection) {
  using E = Kokkos::DefaultHostExecutionSpace;
  using T = gguf::GGMLType;
  TempDir dir;
  SynthSpec s = tiny_spec(37);
  s.type = T::Q4_1;
  s.cfg.n_head = 16;  // 16 heads of any even width: rows of whole 32-blocks, cut through blocks
  s.cfg.n_kv_head = 4;
  s.cfg.d_model = 256;
  const std::string path = make_model(dir, "m.gguf", s);
  auto w = load_model<E>(path, LoadOptions{});
  const Config p = plan(w->cfg, PruneMethod::Rap, 0.5, 5);
  gguf::File src = gguf::File::open(path);
  const std::string a = dir.file("auto.gguf");
  const pruning::WrittenModel wa = pruning::write_pruned_gguf(path, p, a);
  gguf::File fa = gguf::File::open(a);
  ASSERT_EQ(wa.changed.size(), 2u);
  EXPECT_EQ(wa.kept + 2, static_cast<int>(src.tensors().size()));
  EXPECT_EQ(wa.output_bytes, std::filesystem::file_size(a));
  EXPECT_EQ(wa.source_bytes, std::filesystem::file_size(path));
  for (int l = 0; l < p.n_layer; ++l) {
    const std::string name = fmt::format("blk.{}.attn_output.weight", l);
    EXPECT_EQ(wa.changed[l].name, name);
    EXPECT_EQ(wa.changed[l].from, T::Q4_1);
    EXPECT_EQ(wa.changed[l].to, T::F32);
    EXPECT_TRUE(wa.changed[l].exact);
    EXPECT_EQ(fa.require_tensor(name).type, T::F32);
    EXPECT_TRUE(same_bits(values_of(fa, name), kept_wo(src, p, l))) << name;
  }
  for (const gguf::TensorInfo& t : src.tensors()) {
    if (t.name.find("attn_") != std::string::npos) continue;
    const gguf::TensorInfo& o = fa.require_tensor(t.name);
    EXPECT_EQ(o.type, t.type) << t.name;
    ASSERT_EQ(o.nbytes, t.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(o.data, t.data, t.nbytes), 0) << t.name;
  }
  EXPECT_EQ(fa.get_string(prune_keys::kTensorType).value_or(""), "auto");
  // requantized: Q4_1 (the source's type), Q8_0, F16; each loads and runs
  const auto toks = prompt(12, w->cfg.vocab);
  const auto exact = logits_of<E>(load_model<E>(a, LoadOptions{}), toks);
  for (const std::string opt : {"source", "q8_0", "f16"}) {
    const std::string out = dir.file(opt + ".gguf");
    const pruning::WrittenModel wr =
        pruning::write_pruned_gguf(path, p, out, pruning::CutType::parse(opt));
    gguf::File fo = gguf::File::open(out);
    const T want = opt == "source" ? T::Q4_1 : *gguf::supported_type_named(opt);
    ASSERT_EQ(wr.changed.size(), 2u) << opt;
    EXPECT_LT(wr.output_bytes, wa.output_bytes) << opt;
    for (int l = 0; l < p.n_layer; ++l) {
      const std::string name = fmt::format("blk.{}.attn_output.weight", l);
      EXPECT_EQ(fo.require_tensor(name).type, want) << opt;
      EXPECT_EQ(wr.changed[l].to, want) << opt;
      EXPECT_FALSE(wr.changed[l].exact) << opt;
      // within half a quantization step of each block: (max − min) / 15 / 2 for Q4_1,
      // absmax / 127 / 2 for Q8_0 (plus the f16 rounding of the scale), 2^-11 relative for F16
      const std::vector<float> x = kept_wo(src, p, l), y = values_of(fo, name);
      for (std::size_t b = 0; b < x.size(); b += 32) {
        const auto [lo, hi] = std::minmax_element(x.begin() + b, x.begin() + b + 32);
        const float amax = std::max(std::fabs(*lo), std::fabs(*hi));
        for (std::size_t i = b; i < b + 32; ++i) {
          const float bound = want == T::Q4_1   ? (*hi - *lo) / 15 * 0.502f + 1e-3f * amax
                              : want == T::Q8_0 ? amax / 127 * 0.502f + 1e-3f * amax
                                                : std::fabs(x[i]) * 0x1p-11f + 0x1p-24f;
          EXPECT_LE(std::fabs(x[i] - y[i]), bound) << opt << " " << name << " " << i;
        }
      }
    }
    EXPECT_EQ(fo.get_string(prune_keys::kTensorType).value_or(""), opt);
    EXPECT_EQ(fo.get_string_array(prune_keys::kRetyped).value_or(std::vector<std::string>{}).size(),
              2u);
    const auto lg = logits_of<E>(load_model<E>(out, LoadOptions{}), toks);
    for (float v : lg) ASSERT_TRUE(std::isfinite(v)) << opt;
    EXPECT_LE(max_rel(lg, exact), 0.2) << opt;
  }
}

// Kept columns that are whole aligned Q4_1 blocks (head_dim 64: each head keeps channels 0-31)
// are copied block for block: the type is kept and nothing is listed as changed.
TEST(PrunedGgufTypes, WholeBlocksKeepTheirType) {
  using T = gguf::GGMLType;
  TempDir dir;
  SynthSpec s = tiny_spec(38);
  s.type = T::Q4_1;
  s.cfg.head_dim = 64;
  s.cfg.n_head = 2;
  s.cfg.n_kv_head = 1;
  s.cfg.d_model = 128;
  const std::string path = make_model(dir, "m.gguf", s);
  Config p = plan(s.cfg, PruneMethod::Rap, 0.5, 3);
  for (LayerAttention& a : p.attn) {
    a.v_dim = 32;
    a.v_channels.resize(32);
    std::iota(a.v_channels.begin(), a.v_channels.end(), 0);
  }
  const std::string out = dir.file("p.gguf");
  gguf::File src = gguf::File::open(path);
  const pruning::WrittenModel wr =
      pruning::write_pruned_gguf(path, p, out, pruning::CutType::parse("q8_0"));
  EXPECT_TRUE(wr.changed.empty());
  EXPECT_EQ(wr.kept, static_cast<int>(src.tensors().size()));
  gguf::File fo = gguf::File::open(out);
  for (int l = 0; l < p.n_layer; ++l) {
    const std::string name = fmt::format("blk.{}.attn_output.weight", l);
    EXPECT_EQ(fo.require_tensor(name).type, T::Q4_1);
    EXPECT_TRUE(same_bits(values_of(fo, name), kept_wo(src, p, l))) << name;
  }
  EXPECT_NO_THROW(load_model<Kokkos::DefaultHostExecutionSpace>(out, LoadOptions{}));
}

// A requantization whose rows are not whole blocks is refused, naming the tensor and the
// block, and nothing is written; an unknown tensor type names the value and the accepted ones.
TEST(PrunedGgufTypes, RowsThatAreNotWholeBlocksAreRefused) {
  TempDir dir;
  SynthSpec s = tiny_spec(39);
  s.type = gguf::GGMLType::Q8_0;
  const std::string path = make_model(dir, "m.gguf", s);
  Config p = plan(s.cfg, PruneMethod::Rap, 0.5, 5);
  p.attn[0].v_dim = 8;  // 4 heads · 8 = 32 columns: one Q8_0 block
  p.attn[0].v_channels = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7};
  p.attn[1].v_dim = 10;  // 4 heads · 10 = 40 columns
  p.attn[1].v_channels = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::string out = dir.file("p.gguf");
  try {
    pruning::write_pruned_gguf(path, p, out, pruning::CutType::parse("source"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("blk.1.attn_output.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("32"), std::string::npos) << m;
    // the library names the quantity; the command line maps it to --type
    EXPECT_NE(m.find("the pruned model's tensor type source:"), std::string::npos) << m;
    ASSERT_NE(dynamic_cast<const OptionError*>(&e), nullptr);
    EXPECT_EQ(dynamic_cast<const OptionError&>(e).key(), "prune.type");
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_NO_THROW(pruning::write_pruned_gguf(path, p, out));  // auto writes any row
  try {
    pruning::CutType::parse("q3_x");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'q3_x'"), std::string::npos) << m;
    EXPECT_NE(m.find("q8_0"), std::string::npos) << m;
  }
}

// The ledger of a run on a pruned model counts the attention at the reduced widths, exactly
// as the prune report's FLOP model says.
TYPED_TEST(PruneModel, LedgerMatchesReportedAttentionFlops) {
  using E = TypeParam;
  TempDir dir;
  auto w = load_model<E>(make_model(dir, "m.gguf", tiny_spec(35)), LoadOptions{});
  const Config p = plan(w->cfg, PruneMethod::KvPruner, 0.6);
  flops::Ledger ledger(p.n_layer);
  Engine<E> eng(pruning::fuse_pruned(*w, p), 1, 40, &ledger);
  eng.forward({prompt(40, p.vocab)}, 0, false);
  for (int l = 0; l < p.n_layer; ++l) {
    double fl = 0;
    for (flops::Op op :
         {flops::Op::QProj, flops::Op::KProj, flops::Op::VProj, flops::Op::OProj, flops::Op::RoPE,
          flops::Op::AttnScore, flops::Op::AttnSoftmax, flops::Op::AttnValue})
      fl += ledger.at(flops::Phase::Prefill, op, l).flops_dense;
    EXPECT_DOUBLE_EQ(fl, pruning::attention_flops(p, l, 40)) << l;
  }
}

// ---------------------------------------------------------------------------------------------
// Pruned GGUFs with inconsistent layouts: a clear message naming the problem.

class BadPrunedGguf : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = make_model(dir_, "m.gguf", tiny_spec(36));
    good_ = dir_.file("good.gguf");
    pruning::write_pruned_gguf(src_, plan(tiny_config(), PruneMethod::Rap, 0.5), good_);
  }
  /// The good file with `key` replaced by `v` (or removed when v is empty-typed nullopt).
  std::string rewrite(const std::string& key, const gguf::Value* v) {
    gguf::File f = gguf::File::open(good_);
    gguf::Writer w;
    for (const auto& kv : f.metadata()) {
      if (kv.key == "general.alignment") continue;
      if (kv.key == key) {
        if (v) w.set(key, *v);
        continue;
      }
      w.set(kv.key, kv.value);
    }
    for (const auto& t : f.tensors()) w.add_tensor(t.name, t.ne, t.type, t.data, t.nbytes);
    const std::string out = dir_.file("bad.gguf");
    w.write(out);
    return out;
  }
  std::string error_of(const std::string& path) {
    try {
      load_model<Kokkos::DefaultHostExecutionSpace>(path, LoadOptions{});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  TempDir dir_;
  std::string src_, good_;
};

TEST_F(BadPrunedGguf, EachInconsistencyIsNamed) {
  gguf::File f = gguf::File::open(good_);
  auto widths = f.require_int_array(prune_keys::kKeyWidths);
  {  // a width that disagrees with the tensors
    std::vector<std::uint32_t> w2(widths.begin(), widths.end());
    w2[0] += 2;
    const gguf::Value v = gguf::Value::array_u32(w2);
    const std::string e = error_of(rewrite(prune_keys::kKeyWidths, &v));
    EXPECT_NE(e.find("has "), std::string::npos) << e;  // lists of the wrong length / shape
  }
  {  // a width outside 1 … head_dim
    std::vector<std::uint32_t> w2(widths.begin(), widths.end());
    w2[1] = 40;
    const gguf::Value v = gguf::Value::array_u32(w2);
    const std::string e = error_of(rewrite(prune_keys::kKeyWidths, &v));
    EXPECT_NE(e.find("layer 1"), std::string::npos) << e;
  }
  {  // channels out of order
    auto ch = f.require_int_array(prune_keys::kKeyChannels);
    std::swap(ch[0], ch[1]);
    std::vector<std::int32_t> c2(ch.begin(), ch.end());
    const gguf::Value v = gguf::Value::array_i32(c2);
    const std::string e = error_of(rewrite(prune_keys::kKeyChannels, &v));
    EXPECT_NE(e.find("ascending"), std::string::npos) << e;
  }
  {  // a frequency index that does not belong to its channel
    auto fi = f.require_int_array(prune_keys::kFreqIndex);
    fi[3] += 1;
    std::vector<std::int32_t> f2(fi.begin(), fi.end());
    const gguf::Value v = gguf::Value::array_i32(f2);
    const std::string e = error_of(rewrite(prune_keys::kFreqIndex, &v));
    EXPECT_NE(e.find("frequency index"), std::string::npos) << e;
  }
  {  // a missing list
    const std::string e = error_of(rewrite(prune_keys::kValueChannels, nullptr));
    EXPECT_NE(e.find(prune_keys::kValueChannels), std::string::npos) << e;
  }
  {  // the method without a layout
    gguf::File g = gguf::File::open(src_);
    gguf::Writer w;
    for (const auto& kv : g.metadata())
      if (kv.key != "general.alignment") w.set(kv.key, kv.value);
    w.set(prune_keys::kMethod, "rap");
    for (const auto& t : g.tensors()) w.add_tensor(t.name, t.ne, t.type, t.data, t.nbytes);
    w.write(dir_.file("half.gguf"));
    const std::string e = error_of(dir_.file("half.gguf"));
    EXPECT_NE(e.find(prune_keys::kKeyWidths), std::string::npos) << e;
  }
  EXPECT_EQ(error_of(good_), "");
}

}  // namespace
}  // namespace sparsim::test
