// The forward pass: against the double-precision reference, prefill against decode, across
// backends bitwise, and across storage types.
#include "backends.hpp"
#include "engine/engine.hpp"
#include "gemm_bf16/bf16_gemm.hpp"
#include "helpers.hpp"
#include "model/loader.hpp"
#include "reference_llama.hpp"

#include <cmath>
#include <cstring>

namespace sparsim::test {
namespace {

template <class E>
class EngineTest : public ::testing::Test {};
TYPED_TEST_SUITE(EngineTest, Backends, BackendName);

std::vector<int> prompt_tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 131 + seed * 17) % (vocab - 3);
  return t;
}

double max_rel(const std::vector<float>& a, const std::vector<double>& b) {
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(b[i]));
    err = std::max(err, std::fabs(a[i] - b[i]));
  }
  return err / scale;
}

template <class E>
void check_against_reference(const SynthSpec& spec, const std::string& tag) {
  TempDir dir;
  const std::string path = make_model(dir, tag + ".gguf", spec);
  auto w = load_model<E>(path, LoadOptions{});
  const int T = 12;
  const auto toks = prompt_tokens(T, spec.cfg.vocab, 1);
  Engine<E> eng(w, 1, 32);
  auto logits = to_host(eng.forward({toks}, 0, true));
  ReferenceLlama ref(path);
  const int V = spec.cfg.vocab;
  for (int t = 0; t < T; ++t) {
    const auto r = ref.step(toks[t]);
    std::vector<float> row(logits.begin() + t * V, logits.begin() + (t + 1) * V);
    EXPECT_LT(max_rel(row, r), 2e-5) << tag << " position " << t;
  }
}

TYPED_TEST(EngineTest, MatchesDoublePrecisionReference) {
  check_against_reference<TypeParam>(tiny_spec(), "gqa_tied");
}

TYPED_TEST(EngineTest, MatchesReferenceUntiedMhaLlama3Rope) {
  SynthSpec s = tiny_spec(9);
  s.cfg.n_kv_head = 4;  // plain multi-head attention
  s.cfg.tied_embeddings = false;
  s.cfg.rope_scaling.enabled = true;
  s.cfg.rope_scaling.factor = 8;
  s.cfg.rope_scaling.original_context = 16;
  s.rope_freqs = true;
  check_against_reference<TypeParam>(s, "mha_untied_llama3");
}

TYPED_TEST(EngineTest, PrefillEqualsTokenByTokenDecode) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(3);
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const int T = 20, V = spec.cfg.vocab;
  const auto toks = prompt_tokens(T, V, 2);
  Engine<E> pre(w, 1, 64), dec(w, 1, 64);
  const auto a = to_host(pre.forward({toks}, 0, true));
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    const auto b = to_host(dec.forward({{toks[t]}}, t, true));
    double scale = 0, err = 0;
    for (int v = 0; v < V; ++v) {
      scale = std::max(scale, double(std::fabs(a[t * V + v])));
      err = std::max(err, double(std::fabs(a[t * V + v] - b[v])));
    }
    worst = std::max(worst, err / scale);
  }
  EXPECT_LE(worst, 1e-5);
  // Chunked prefill (two halves through the cache) agrees as well.
  Engine<E> chunk(w, 1, 64);
  std::vector<int> h1(toks.begin(), toks.begin() + 7), h2(toks.begin() + 7, toks.end());
  chunk.forward({h1}, 0, true);
  const auto c = to_host(chunk.forward({h2}, 7, true));
  for (int t = 7; t < T; ++t) {
    double scale = 0, err = 0;
    for (int v = 0; v < V; ++v) {
      scale = std::max(scale, double(std::fabs(a[t * V + v])));
      err = std::max(err, double(std::fabs(c[(t - 7) * V + v] - a[t * V + v])));
    }
    EXPECT_LE(err / scale, 1e-5) << "position " << t;
  }
}

TYPED_TEST(EngineTest, BatchedSequencesMatchSingleSequences) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(5);
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const int T = 9, V = spec.cfg.vocab;
  const auto s0 = prompt_tokens(T, V, 4), s1 = prompt_tokens(T, V, 5);
  Engine<E> batch(w, 2, 32), single(w, 1, 32);
  const auto b = to_host(batch.forward({s0, s1}, 0, false));
  const auto r0 = to_host(single.forward({s0}, 0, false));
  const auto r1 = to_host(single.forward({s1}, 0, false));
  for (int v = 0; v < V; ++v) {
    EXPECT_NEAR(b[v], r0[v], 1e-5 * (1 + std::fabs(r0[v])));
    EXPECT_NEAR(b[V + v], r1[v], 1e-5 * (1 + std::fabs(r1[v])));
  }
}

TYPED_TEST(EngineTest, SixteenBitStorageStaysCloseToF32) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(6);
  const std::string path = make_model(dir, "m.gguf", spec);
  auto w32 = load_model<E>(path, LoadOptions{DType::F32, false});
  const auto toks = prompt_tokens(10, spec.cfg.vocab, 6);
  Engine<E> e32(w32, 1, 32);
  const auto ref = to_host(e32.forward({toks}, 0, false));
  for (DType t : {DType::BF16, DType::F16}) {
    auto w = load_model<E>(path, LoadOptions{t, false});
    EXPECT_EQ(w->bytes() * 2 - 4 * spec.cfg.d_model * (2 * spec.cfg.n_layer + 1), w32->bytes())
        << "16-bit storage halves the matrices";
    Engine<E> e(w, 1, 32);
    for (int T : {1, 10, 20}) {  // below and above the widening threshold
      std::vector<int> tk(toks.begin(), toks.begin() + std::min<int>(T, toks.size()));
      while (static_cast<int>(tk.size()) < T) tk.push_back(5);
      e.forward({tk}, 0, false);
    }
    const auto got = to_host(e.forward({toks}, 0, false));
    double scale = 0, err = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      scale = std::max(scale, double(std::fabs(ref[i])));
      err = std::max(err, double(std::fabs(got[i] - ref[i])));
    }
    EXPECT_LT(err / scale, t == DType::BF16 ? 0.05 : 0.01) << to_string(t);
  }
}

#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
TEST(EngineDeterminism, SerialAndOpenMPBitwiseEqual) {
  TempDir dir;
  const SynthSpec spec = tiny_spec(8);
  const std::string path = make_model(dir, "m.gguf", spec);
  const auto toks = prompt_tokens(24, spec.cfg.vocab, 8);
  auto run = [&](auto exec) {
    using E = decltype(exec);
    auto w = load_model<E>(path, LoadOptions{});
    Engine<E> e(w, 1, 64);
    auto a = to_host(e.forward({toks}, 0, true));
    auto b = to_host(e.forward({{7}}, 24, true));
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const auto s = run(Kokkos::Serial());
  const auto o = run(Kokkos::OpenMP());
  ASSERT_EQ(s.size(), o.size());
  EXPECT_EQ(0, std::memcmp(s.data(), o.data(), s.size() * sizeof(float)));
}

// --bf16-compute: the same bits on one thread (Serial) and on the OpenMP pool, and close to the
// fp32-arithmetic bf16 model (prefill logits within bf16 rounding of the activations), while the
// decode step (one row) is the fp32-arithmetic one.
TEST(EngineDeterminism, Bf16ComputeSerialAndOpenMPBitwiseEqual) {
  if (!host::bf16_gemm_available()) GTEST_SKIP() << host::bf16_gemm_unavailable_reason();
  TempDir dir;
  const SynthSpec spec = tiny_spec(8);
  const std::string path = make_model(dir, "m.gguf", spec);
  const auto toks = prompt_tokens(40, spec.cfg.vocab, 8);
  auto run = [&](auto exec, bool bf16c) {
    using E = decltype(exec);
    LoadOptions lo;
    lo.storage = DType::BF16;
    lo.bf16_compute = bf16c;
    auto w = load_model<E>(path, lo);
    Engine<E> e(w, 1, 64);
    auto a = to_host(e.forward({toks}, 0, true));
    auto b = to_host(e.forward({{7}}, 40, true));
    return std::make_pair(a, b);
  };
  const auto s = run(Kokkos::Serial(), true);
  const auto o = run(Kokkos::OpenMP(), true);
  ASSERT_EQ(s.first.size(), o.first.size());
  EXPECT_EQ(0, std::memcmp(s.first.data(), o.first.data(), s.first.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(s.second.data(), o.second.data(), s.second.size() * sizeof(float)));
  const auto f = run(Kokkos::OpenMP(), false);
  double worst = 0, range = 0, differ = 0;
  for (std::size_t i = 0; i < f.first.size(); ++i) {
    worst = std::max(worst, double(std::fabs(f.first[i] - o.first[i])));
    range = std::max(range, double(std::fabs(f.first[i])));
    differ += f.first[i] != o.first[i];
  }
  EXPECT_GT(differ, 0) << "bf16 compute changed no prefill logit";
  EXPECT_LT(worst, 0.05 * range) << "bf16 compute moved a prefill logit by " << worst;
  // the decode step after a bf16-compute prefill reads a cache that the prefill wrote, so it
  // differs too, but it is the same kernel: close
  for (std::size_t i = 0; i < f.second.size(); ++i)
    EXPECT_NEAR(f.second[i], o.second[i], 0.05 * range);
}
#endif

}  // namespace
}  // namespace sparsim::test
