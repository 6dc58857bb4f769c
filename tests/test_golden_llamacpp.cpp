// The forward pass against llama.cpp, an independent implementation: golden logits made by
// scripts/reference/make_golden_llamacpp.sh for seeded synthetic F32 models that are re-created
// here. Opt-in live comparison: set SPARSIM_LLAMACPP_PYTHON to a Python with llama-cpp-python.
#include "backends.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "io/hdf5.hpp"
#include "model/loader.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace sparsim::test {
namespace {

struct Golden {
  std::string name;
  std::string synth_args;  // as in scripts/reference/make_golden_llamacpp.sh
};

const Golden kGolden[] = {
    {"tiny_gqa_tied", "--preset tiny --seed 1234"},
    {"tiny_mha_untied_llama3", "--preset tiny --seed 99 --kv-heads 4 --untied --llama3-rope"},
    {"small_gqa",
     "--preset tiny --seed 5 --layers 4 --d-model 128 --heads 8 --kv-heads 2 --ff 320 "
     "--vocab 1000 --context 512"},
};

struct Reference {
  std::vector<int> prompt, greedy;
  std::vector<float> prompt_logits, greedy_logits;
};

Reference read_reference(const std::string& path) {
  auto f = io::H5File::open_read(path);
  auto r = f.root();
  Reference ref;
  for (int v : r.read<std::int32_t>("prompt_tokens")) ref.prompt.push_back(v);
  for (int v : r.read<std::int32_t>("greedy_tokens")) ref.greedy.push_back(v);
  ref.prompt_logits = r.read<float>("prompt_logits");
  ref.greedy_logits = r.read<float>("greedy_logits");
  return ref;
}

template <class E>
void compare(const std::string& model, const Reference& ref, const std::string& tag) {
  auto w = load_model<E>(model, LoadOptions{});
  const int V = w->cfg.vocab;
  const int T = static_cast<int>(ref.prompt.size());
  const int G = static_cast<int>(ref.greedy.size());
  ASSERT_EQ(ref.prompt_logits.size(), static_cast<std::size_t>(T) * V) << tag;
  Engine<E> eng(w, 1, T + G + 1);
  const auto pl = to_host(eng.forward({ref.prompt}, 0, true));
  double worst = 0;
  for (std::size_t i = 0; i < pl.size(); ++i)
    worst = std::max(worst, double(std::fabs(pl[i] - ref.prompt_logits[i])));
  EXPECT_LE(worst, 1e-3) << tag << ": prompt logits max abs difference";
  // Greedy generation: our own argmax decides each next token; it must equal llama.cpp's.
  int next = static_cast<int>(std::max_element(pl.end() - V, pl.end()) - pl.end() + V);
  double gworst = 0;
  for (int g = 0; g < G; ++g) {
    ASSERT_EQ(next, ref.greedy[g]) << tag << ": greedy token " << g;
    const auto l = to_host(eng.forward({{next}}, T + g, true));
    for (int v = 0; v < V; ++v)
      gworst = std::max(gworst, double(std::fabs(l[v] - ref.greedy_logits[g * V + v])));
    next = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
  }
  EXPECT_LE(gworst, 1e-3) << tag << ": greedy-step logits max abs difference";
  std::printf(
      "[ llama.cpp ] %-24s %-8s prompt max|Δ| %.2e, %d greedy tokens identical, step max|Δ| %.2e\n",
      tag.c_str(), E::name(), worst, G, gworst);
}

template <class E>
class GoldenLlamaCpp : public ::testing::Test {};
TYPED_TEST_SUITE(GoldenLlamaCpp, Backends, BackendName);

TYPED_TEST(GoldenLlamaCpp, LogitsAndGreedyTokensMatch) {
  TempDir dir;
  for (const auto& g : kGolden) {
    const std::string model = dir.file(g.name + ".gguf");
    const RunResult s = run_cmd(sparsim_bin() + " synth --out " + model + " " + g.synth_args);
    ASSERT_EQ(s.exit_code, 0) << s.output;
    const Reference ref =
        read_reference(std::string(SPARSIM_SOURCE_DIR) + "/data/golden/llamacpp_" + g.name + ".h5");
    compare<TypeParam>(model, ref, g.name);
  }
}

TEST(GoldenLlamaCppLive, FreshReferenceFromLlamaCpp) {
  const char* py = std::getenv("SPARSIM_LLAMACPP_PYTHON");
  if (!py) GTEST_SKIP() << "set SPARSIM_LLAMACPP_PYTHON to a python with llama-cpp-python";
  TempDir dir;
  const std::string model = dir.file("live.gguf"), out = dir.file("live.h5");
  ASSERT_EQ(run_cmd(sparsim_bin() + " synth --out " + model + " --seed 4242 --untied").exit_code,
            0);
  const RunResult r = run_cmd(std::string(py) + " " + SPARSIM_SOURCE_DIR +
                              "/scripts/reference/llamacpp_reference.py --model " + model +
                              " --prompt-len 24 --seed 3 --n-greedy 32 --threads 2 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  compare<Kokkos::DefaultHostExecutionSpace>(model, read_reference(out), "live");
}

}  // namespace
}  // namespace sparsim::test
