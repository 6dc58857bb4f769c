// The sparsim command end to end: thread-count determinism, run files, and bad input
// (clear message, non-zero exit, no output file).
#include "core/blas_core.hpp"
#include "helpers.hpp"
#include "io/hdf5.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/model_registry.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

const char* kTokens = "1,5,9,300,42,17,260,7,7,511,100,3";

std::string forward_cmd(const std::string& model, const std::string& out,
                        const std::string& extra = "") {
  return sparsim_bin() + " forward --model " + model + " --tokens " + kTokens +
         " --log-level error --out " + out + " " + extra;
}

std::vector<float> read_logits(const std::string& path, const char* name = "prompt_logits") {
  auto f = io::H5File::open_read(path);
  return f.root().open_group("results").read<float>(name);
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override { model_ = make_model(dir_, "tiny.gguf", tiny_spec(21)); }
  /// Runs and checks failure: non-zero exit, message containing `needle`, no output file.
  void expect_failure(const std::string& model, const std::string& needle,
                      const std::string& extra = "") {
    const std::string out = dir_.file("out.h5");
    const RunResult r = run_cmd(forward_cmd(model, out, extra));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos)
        << "expected '" << needle << "' in: " << r.output;
    EXPECT_FALSE(fs::exists(out)) << "a failed run left its output behind";
    for (const auto& e : fs::directory_iterator(dir_.path()))
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
  TempDir dir_;
  std::string model_;
};

TEST_F(Cli, OneAndTwoThreadsAndSerialGiveBitwiseIdenticalLogits) {
  // host backends: bitwise the same for any thread count; the build's default backend (a GPU in
  // a CUDA build) agrees with them within fp32 reordering, bitwise when it is a host backend
  std::vector<std::vector<float>> runs;
  for (const char* extra : {"--backend openmp --threads 1", "--backend openmp --threads 2",
                            "--backend serial", "--threads 2 --mode decode", ""}) {
    const std::string out = dir_.file("run.h5");
    const RunResult r = run_cmd(forward_cmd(model_, out, extra));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    runs.push_back(read_logits(out));
    fs::remove(out);
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4)) << "1 vs 2 threads";
  EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[2].data(), runs[0].size() * 4))
      << "serial vs openmp";
#if defined(SPARSIM_EXEC_SPACE_Cuda)
  for (std::size_t i = 0; i < runs[0].size(); ++i)
    ASSERT_NEAR(runs[0][i], runs[4][i], 1e-5 * (1 + std::fabs(runs[0][i])))
        << "default backend vs serial";
#else
  EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[4].data(), runs[0].size() * 4))
      << "default backend vs serial";
#endif
  // decode mode goes through GEMV and the cache: equal within fp32 reordering
  for (std::size_t i = 0; i < runs[0].size(); ++i)
    ASSERT_NEAR(runs[0][i], runs[3][i], 1e-5 * (1 + std::fabs(runs[0][i])));
}

TEST_F(Cli, DefaultThreadCountFollowsOmpNumThreads) {
  // Without --threads the OpenMP backend uses OMP_NUM_THREADS (the suite sets 2); keeping
  // OpenBLAS to one thread per call must not pin the process's own thread count to 1 (the
  // OpenMP build of OpenBLAS sets it through omp_set_num_threads).
#if !defined(KOKKOS_ENABLE_OPENMP)
  GTEST_SKIP() << "no OpenMP backend in this build";
#else
  for (const char* n : {"2", "3"}) {
    const std::string out = dir_.file("threads.h5");
    const RunResult r = run_cmd("OMP_NUM_THREADS=" + std::string(n) + " " +
                                forward_cmd(model_, out, "--backend openmp"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto f = io::H5File::open_read(out);
    EXPECT_EQ(f.root().open_group("backend").get_attr<std::int64_t>("threads"), std::atoi(n))
        << "OMP_NUM_THREADS=" << n;
    fs::remove(out);
  }
#endif
}

TEST(Threads, KokkosPoolFollowsOmpNumThreadsAndBlasCallsStayOnOneThread) {
  // This test process: Kokkos's OpenMP pool has OMP_NUM_THREADS threads (so the suite's
  // thread-count tests run threaded), while code outside Kokkos regions sees one thread, which is
  // what keeps OpenBLAS's OpenMP build from splitting a call.
#if !defined(KOKKOS_ENABLE_OPENMP) || !defined(_OPENMP)
  GTEST_SKIP() << "no OpenMP backend in this build";
#else
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (!env) GTEST_SKIP() << "OMP_NUM_THREADS is not set";
  EXPECT_EQ(Kokkos::OpenMP().concurrency(), std::atoi(env));
  EXPECT_EQ(host_threads(), std::atoi(env));
  EXPECT_EQ(omp_get_max_threads(), 1);
#endif
}

TEST_F(Cli, RunFileHoldsModelBackendTimingsAndFlops) {
  const std::string out = dir_.file("run.h5");
  const RunResult r = run_cmd(forward_cmd(model_, out, "--greedy 4"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto f = io::H5File::open_read(out);
  auto root = f.root();
  for (const char* g : {"run", "backend", "model", "results", "timings", "flops"})
    EXPECT_TRUE(root.has(g)) << g;
  EXPECT_EQ(root.open_group("results").read<std::int32_t>("greedy_tokens").size(), 4u);
  EXPECT_EQ(root.open_group("model").get_attr<std::string>("fingerprint").size(), 16u);
}

TEST_F(Cli, MissingPath) {
  expect_failure(dir_.file("nope.gguf"), "does not exist");
}

TEST_F(Cli, TruncatedFile) {
  const std::string bad = dir_.file("trunc.gguf");
  fs::copy_file(model_, bad);
  fs::resize_file(bad, fs::file_size(model_) / 2);
  expect_failure(bad, "trunc.gguf");
}

TEST_F(Cli, BadMagic) {
  const std::string bad = dir_.file("magic.gguf");
  fs::copy_file(model_, bad);
  std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
  f.write("GGUX", 4);
  f.close();
  expect_failure(bad, "magic");
}

TEST_F(Cli, NonLlamaArchitecture) {
  const std::string bad = dir_.file("arch.gguf");
  rewrite_gguf(model_, bad, [](auto& kv, auto&) {
    for (auto& k : kv)
      if (k.key == "general.architecture") k.value = gguf::Value::string("mamba");
  });
  expect_failure(bad, "mamba");
}

TEST_F(Cli, MissingTensor) {
  const std::string bad = dir_.file("missing.gguf");
  rewrite_gguf(model_, bad, [](auto&, auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(),
                            [](const TensorCopy& t) { return t.name == "blk.1.ffn_up.weight"; }),
             ts.end());
  });
  expect_failure(bad, "blk.1.ffn_up.weight");
}

TEST_F(Cli, ShapeContradictsMetadata) {
  const std::string bad = dir_.file("shape.gguf");
  rewrite_gguf(model_, bad, [](auto& kv, auto&) {
    for (auto& k : kv)
      if (k.key == "llama.feed_forward_length") k.value = gguf::Value::u32(96);
  });
  expect_failure(bad, "blk.0.ffn_gate.weight");
}

TEST_F(Cli, MissingMetadataKey) {
  const std::string bad = dir_.file("key.gguf");
  rewrite_gguf(model_, bad, [](auto& kv, auto&) {
    kv.erase(std::remove_if(kv.begin(), kv.end(),
                            [](const gguf::KeyValue& k) { return k.key == "llama.block_count"; }),
             kv.end());
  });
  expect_failure(bad, "llama.block_count");
}

TEST_F(Cli, NanWeightsWarnOrFailWithStrict) {
  const std::string bad = dir_.file("nan.gguf");
  rewrite_gguf(model_, bad, [](auto&, auto& ts) {
    for (auto& t : ts)
      if (t.name == "blk.0.attn_q.weight") {
        const float nan = std::nanf("");
        std::memcpy(t.data.data() + 40, &nan, 4);
      }
  });
  const std::string out = dir_.file("ok.h5");
  const RunResult warn =
      run_cmd(sparsim_bin() + " forward --model " + bad + " --tokens 1,2 --out " + out);
  EXPECT_EQ(warn.exit_code, 0) << warn.output;
  EXPECT_NE(warn.output.find("NaN"), std::string::npos) << warn.output;
  EXPECT_NE(warn.output.find("blk.0.attn_q.weight"), std::string::npos) << warn.output;
  fs::remove(out);
  expect_failure(bad, "blk.0.attn_q.weight", "--strict");
}

TEST_F(Cli, NonsenseOptions) {
  expect_failure(model_, "--mode", "--mode sideways");
  expect_failure(model_, "storage", "--storage f8");
  expect_failure(model_, "backend", "--backend quantum");
  const RunResult r = run_cmd(sparsim_bin() + " forward --model " + model_ + " --tokens 1,x");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("'x'"), std::string::npos) << r.output;
  const RunResult v = run_cmd(sparsim_bin() + " forward --model " + model_ + " --tokens 1,600");
  EXPECT_NE(v.exit_code, 0);
  EXPECT_NE(v.output.find("600"), std::string::npos) << v.output;
  const RunResult u = run_cmd(sparsim_bin() + " frobnicate");
  EXPECT_EQ(u.exit_code, 2);
}

// `sparsim` alone shows every command once, under the group of what a user wants to do, each
// with an example that is a command line of that very command.
TEST(CliUsage, NoCommandListsEveryCommandGroupedWithAnExample) {
  const RunResult r = run_cmd(sparsim_bin());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* g : {"evaluate", "calibrate and profile", "prune", "sweep", "report",
                        "benchmark", "model files"})
    EXPECT_NE(r.output.find(std::string("\n") + g), std::string::npos) << g << "\n" << r.output;
  for (const char* c :
       {"eval", "compare", "generate", "calibrate", "profile", "prune", "recover", "sweep",
        "collect", "flops", "predict", "bench", "probe", "inspect", "synth", "forward"}) {
    const std::string line = std::string("\n  ") + c + " ";
    const auto at = r.output.find(line);
    ASSERT_NE(at, std::string::npos) << c;
    EXPECT_EQ(r.output.find(line, at + 1), std::string::npos) << c << " listed twice";
    const auto eg = r.output.find("e.g. ", at);
    ASSERT_NE(eg, std::string::npos) << c;
    EXPECT_EQ(r.output.compare(eg + 5, 8 + std::strlen(c) + 1, std::string("sparsim ") + c + " "),
              0)
        << c << ": its example runs another command";
    // and the command knows the options its example uses
    EXPECT_EQ(run_cmd(sparsim_bin() + " " + c + " --help").exit_code, 0) << c;
  }
  EXPECT_EQ(run_cmd(sparsim_bin() + " help").output, r.output);
}

// inspect and forward take the model the way eval does: the alias, positional or --model.
TEST_F(Cli, InspectAndForwardTakeTheModelAlias) {
  const RunResult missing = run_cmd(sparsim_bin() + " inspect " + dir_.file("nope.gguf"));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("does not exist"), std::string::npos) << missing.output;
  const RunResult alias = run_cmd(sparsim_bin() + " inspect frobnitz");
  EXPECT_NE(alias.exit_code, 0);
  EXPECT_NE(alias.output.find("known: smollm2"), std::string::npos) << alias.output;
  const auto p = find_smollm2_gguf();
  if (!p) GTEST_SKIP() << "SmolLM2-135M-Instruct GGUF not found (scripts/setup.sh installs it)";
  const RunResult by_alias = run_cmd(sparsim_bin() + " inspect smollm2");
  ASSERT_EQ(by_alias.exit_code, 0) << by_alias.output;
  EXPECT_EQ(by_alias.output, run_cmd(sparsim_bin() + " inspect " + *p).output);
  EXPECT_EQ(run_cmd(sparsim_bin() + " inspect --model smollm2").output, by_alias.output);
  const std::string out = dir_.file("alias.h5");
  const RunResult fw = run_cmd(sparsim_bin() + " forward --model smollm2 --tokens 1,2,3 --out " +
                               out + " --log-level error");
  ASSERT_EQ(fw.exit_code, 0) << fw.output;
  auto f = io::H5File::open_read(out);
  EXPECT_EQ(f.root().open_group("model").get_attr<std::string>("path"), *p);
}

TEST_F(Cli, InspectAndSynthQuantizedTypes) {
  for (const char* t : {"f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"}) {
    const std::string m = dir_.file(std::string("m_") + t + ".gguf");
    RunResult s = run_cmd(sparsim_bin() + " synth --out " + m + " --type " + t + " --seed 3");
    ASSERT_EQ(s.exit_code, 0) << s.output;
    RunResult i = run_cmd(sparsim_bin() + " inspect " + m);
    ASSERT_EQ(i.exit_code, 0) << i.output;
    EXPECT_NE(i.output.find("blk.1.ffn_down.weight"), std::string::npos);
    const std::string out = dir_.file("q.h5");
    RunResult f = run_cmd(forward_cmd(m, out));
    ASSERT_EQ(f.exit_code, 0) << t << ": " << f.output;
    fs::remove(out);
  }
  // K-quants need rows that are multiples of 256
  const std::string k = dir_.file("k.gguf");
  for (const char* t : {"q4_k", "q6_k"}) {
    RunResult s = run_cmd(sparsim_bin() + " synth --out " + k + " --type " + t +
                          " --d-model 256 --heads 4 --ff 512 --layers 1");
    ASSERT_EQ(s.exit_code, 0) << s.output;
    const std::string out = dir_.file("k.h5");
    RunResult f = run_cmd(forward_cmd(k, out));
    ASSERT_EQ(f.exit_code, 0) << t << ": " << f.output;
    fs::remove(out);
  }
  RunResult bad = run_cmd(sparsim_bin() + " synth --out " + k + " --type q4_k");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("block size"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace sparsim::test
