// Nothing a user owns is lost, at the command line: outputs that would overwrite inputs or each
// other, missing folders, stale temporaries, model headers that contradict their tensors, and
// results that must not depend on --batch. Each case checks the exit status, the message and
// the state of the output folder and of every input (hashes before and after).
#include "cli_process.hpp"
#include "core/device_blas.hpp"
#include "core/error.hpp"
#include "eval/corpus.hpp"
#include "gemm_bf16/bf16_gemm.hpp"
#include "helpers.hpp"
#include "io/hdf5.hpp"
#include "io/temp_file.hpp"
#include "model/loader.hpp"

#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include <cstring>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

/// Sets (or with nullptr unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = std::string(old);
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

class CliPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = make_model(dir_, "tiny.gguf", tiny_spec(31));
    corpus_ = dir_.file("corpus.txt");
    write_word_corpus(corpus_, 5, 3000);
  }
  std::string eval(const std::string& extra) const {
    return sparsim_bin() + " eval --model " + model_ + " --corpus " + corpus_ +
           " --context 32 --stride 24 --max-windows 4 " + extra;
  }
  /// Runs `cmd` and checks: exit status 2, every needle in the message, nothing in the folder
  /// changed (inputs and existing outputs alike, no file added or removed).
  void expect_refused(const std::string& cmd, const std::vector<std::string>& needles) {
    const auto before = folder_state(dir_.path());
    const RunResult r = run_cmd(cmd);
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.output;
    for (const auto& n : needles)
      EXPECT_NE(r.output.find(n), std::string::npos) << "expected '" << n << "' in: " << r.output;
    EXPECT_EQ(r.output.find("info: model"), std::string::npos)
        << "the command started working before it refused: " << r.output;
    EXPECT_EQ(folder_state(dir_.path()), before) << cmd;
  }
  TempDir dir_;
  std::string model_, corpus_;
};

TEST_F(CliPaths, AnOutputNamingTheModelIsRefusedByEveryCommand) {
  fs::create_symlink(model_, dir_.file("link.gguf"));
  fs::create_hard_link(model_, dir_.file("hard.gguf"));
  for (const std::string& o : {model_, dir_.file("link.gguf"), dir_.file("hard.gguf")}) {
    expect_refused(eval("--out " + o), {"--out '" + o + "'", "--model", "destroy an input"});
    expect_refused(eval("--json " + o), {"--json", "--model"});
    expect_refused(sparsim_bin() + " forward --model " + model_ + " --tokens 1,2 --out " + o,
                   {"--out", "--model"});
    expect_refused(
        sparsim_bin() + " calibrate --model " + model_ + " --corpus " + corpus_ + " --out " + o,
        {"--out", "--model"});
    expect_refused(sparsim_bin() + " profile --model " + model_ + " --corpus " + corpus_ +
                       " --out " + dir_.file("p.h5") + " --plot " + o,
                   {"--plot", "--model"});
    expect_refused(sparsim_bin() + " bench --model " + model_ + " --json " + o,
                   {"--json", "--model"});
  }
  expect_refused(eval("--out " + corpus_), {"--out", "--corpus", "destroy an input"});
}

TEST_F(CliPaths, EveryOtherInputIsProtectedToo) {
  // The calibration file, a task file and a corpus folder are inputs as much as the model is;
  // a checkpoint is an output. Each is compared by file identity, not by name.
  const std::string cal = dir_.file("cal.h5");
  const RunResult c = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " +
                              corpus_ + " --out " + cal +
                              " --variants plain --context 32 --max-windows 1 --greedy-seqs 1 "
                              "--greedy-tokens 8 --probes 0.4 --alpha 0.2 --log-level warn");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const std::string cal2 = dir_.path().string() + "/./cal.h5";
  const std::string teal = " --method teal --sparsity 0.5 --calibration " + cal;
  expect_refused(eval(teal + " --out " + cal2), {"--out", "--calibration", "destroy an input"});
  expect_refused(sparsim_bin() + " bench --model " + model_ + teal + " --json " + cal2,
                 {"--json", "--calibration"});
  expect_refused(sparsim_bin() + " profile --calibration " + cal + " --out " + cal2,
                 {"--out", "--calibration"});
  const std::string tasks = dir_.file("tasks.jsonl");
  std::ofstream(tasks) << "{}\n";
  expect_refused(eval("--tasks " + tasks + " --json " + tasks), {"--json", "--tasks"});
  expect_refused(eval("--checkpoint " + model_ + " --out " + dir_.file("r.h5")),
                 {"--checkpoint", "--model", "destroy an input"});
  expect_refused(eval("--out " + dir_.file("r.h5") + " --checkpoint " + dir_.file("r.h5")),
                 {"--out", "--checkpoint"});
  const std::string texts = dir_.file("texts");
  fs::create_directories(texts);
  std::ofstream(texts + "/a.txt") << read_text(corpus_);
  expect_refused(sparsim_bin() + " eval --model " + model_ + " --corpus " + texts +
                     " --context 32 --stride 24 --out " + texts + "/run.h5",
                 {"--out", "inside the --corpus folder"});
}

TEST_F(CliPaths, TwoOutputsOfOneName) {
  const std::string p = dir_.file("both");
  expect_refused(eval("--out " + p + " --json " + p), {"--out", "--json", "name the same file"});
  std::ofstream(p) << "kept";  // an existing file of that name stays as it was
  expect_refused(eval("--out " + p + " --json " + dir_.path().string() + "/./both"),
                 {"name the same file"});
  expect_refused(sparsim_bin() + " profile --model " + model_ + " --corpus " + corpus_ + " --out " +
                     p + " --plot " + p,
                 {"--out", "--plot"});
}

TEST_F(CliPaths, BenchBatchOutsideItsRange) {
  for (const char* b : {"0", "1025", "-3"}) {
    const RunResult r = run_cmd(sparsim_bin() + " bench --model " + model_ + " --batch " + b +
                                " --json " + dir_.file("b.json"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(std::string("--batch must be in 1 … 1024, got ") + b),
              std::string::npos)
        << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir_.file("b.json")));
  }
}

TEST_F(CliPaths, MissingFoldersAndFolderOutputsBeforeAnyWork) {
  expect_refused(eval("--json " + dir_.file("nope/s.json")),
                 {"--json", "'" + dir_.file("nope") + "' does not exist"});
  expect_refused(eval("--out " + dir_.path().string()), {"--out", "is a folder"});
  expect_refused(
      sparsim_bin() + " forward --model " + model_ + " --tokens 1 --out " + dir_.file("nope/r.h5"),
      {"does not exist"});
  expect_refused(sparsim_bin() + " calibrate --model " + model_ + " --corpus " + corpus_ +
                     " --out " + dir_.file("nope/c.h5"),
                 {"does not exist"});
  expect_refused(sparsim_bin() + " bench --model " + model_ + " --json " + dir_.path().string(),
                 {"--json", "is a folder"});
  expect_refused(sparsim_bin() + " synth --out " + dir_.path().string(), {"is a folder"});
  expect_refused(sparsim_bin() + " synth --format hf --out " + model_, {"not a folder"});
  expect_refused(sparsim_bin() + " synth --out " + dir_.file("nope/m.gguf"), {"does not exist"});
}

TEST_F(CliPaths, StaleTemporariesOfDeadRunsAreRemovedByTheNextRun) {
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  int st = 0;
  ::waitpid(gone, &st, 0);
  const std::string own = io::temp_path_for(dir_.file("live.h5"));  // this (live) process
  std::string dead = own;
  dead.replace(dead.find(".sparsim-") + 9, std::to_string(::getpid()).size(), std::to_string(gone));
  dead.replace(dead.find("live.h5"), 7, "run.h5");
  for (const auto& p : {own, dead}) std::ofstream(p) << "partial";
  const RunResult r = run_cmd(sparsim_bin() + " forward --model " + model_ +
                              " --tokens 1,2,3 --out " + dir_.file("r.h5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dead)) << "a stale temporary survived the next run";
  EXPECT_NE(r.output.find(dead), std::string::npos) << "the removal is not reported: " << r.output;
  EXPECT_TRUE(fs::exists(own)) << "the temporary of a live process was removed";
}

// ---------------------------------------------------------------------------------------------
// Model headers that contradict their tensors

TEST_F(CliPaths, InspectAndEvalNameTheWrongKey) {
  const std::string blocks = dir_.file("blocks.gguf");
  rewrite_gguf(model_, blocks, [](auto& kv, auto&) { set_u32(kv, "llama.block_count", 1000); });
  RunResult r = run_cmd(sparsim_bin() + " inspect " + blocks);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("'llama.block_count' = 1000"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tensors for 2 blocks only"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("1000 layers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("blk.1.ffn_down.weight"), std::string::npos)
      << "the tensor table is not shown: " << r.output;

  const std::string width = dir_.file("width.gguf");
  rewrite_gguf(model_, width, [](auto& kv, auto&) {
    kv.erase(std::remove_if(kv.begin(), kv.end(),
                            [](const gguf::KeyValue& k) {
                              return k.key == "llama.attention.key_length" ||
                                     k.key == "llama.attention.value_length";
                            }),
             kv.end());
    set_u32(kv, "llama.embedding_length", 12345);
  });
  for (const std::string& cmd : {sparsim_bin() + " inspect " + width,
                                 sparsim_bin() + " eval --model " + width + " --corpus " + corpus_ +
                                     " --context 32 --stride 24"}) {
    r = run_cmd(cmd);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const std::string error = r.output.substr(r.output.find(": error: "));
    EXPECT_NE(error.find("'llama.embedding_length' = 12345"), std::string::npos) << error;
    EXPECT_NE(error.find("'token_embd.weight'"), std::string::npos) << error;
    EXPECT_EQ(error.find("rope.dimension_count"), std::string::npos) << error;
  }
}

TEST_F(CliPaths, HuggingFaceConfigAgainstItsTensors) {
  const std::string hf = dir_.file("hf");
  RunResult r = run_cmd(sparsim_bin() + " synth --format hf --out " + hf);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string cfg = hf + "/config.json";
  std::string text = read_text(cfg);
  const std::string key = "\"num_hidden_layers\": 2";
  ASSERT_NE(text.find(key), std::string::npos) << text;
  text.replace(text.find(key), key.size(), "\"num_hidden_layers\": 5");
  std::ofstream(cfg) << text;
  r = run_cmd(sparsim_bin() + " inspect " + hf);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("'num_hidden_layers' = 5, but the file holds tensors for 2 blocks only"),
            std::string::npos)
      << r.output;
}

// ---------------------------------------------------------------------------------------------
// Options

TEST_F(CliPaths, WindowOptionsNameWhatTheUserSet) {
  RunResult r = run_cmd(sparsim_bin() + " eval --model " + model_ + " --corpus " + corpus_ +
                        " --context 24 --stride 30");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--stride 30 is not smaller than --context 24"), std::string::npos)
      << r.output;
  r = run_cmd(sparsim_bin() + " eval --model " + model_ + " --corpus " + corpus_ + " --context 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--context must be at least 2"), std::string::npos) << r.output;
  r = run_cmd(eval("--batch 0"));
  EXPECT_NE(r.output.find("--batch must be at least 1"), std::string::npos) << r.output;
}

// ---------------------------------------------------------------------------------------------
// --batch

std::vector<double> window_nll(const std::string& run) {
  auto f = io::H5File::open_read(run);
  return f.root().open_group("results/perplexity").read<double>("window_nll");
}

TEST_F(CliPaths, WindowResultsDoNotDependOnTheBatchBitwise) {
  // 200-token windows: batches of 2 and 3 windows put 400 and 600 rows in one GEMM, more than
  // one 256-token tile, and the scored tails (101 rows) of several windows in one LM head call.
  std::vector<std::vector<double>> nll;
  for (int b : {1, 2, 3, 4}) {
    const std::string out = dir_.file("b" + std::to_string(b) + ".h5");
    const RunResult r = run_cmd(sparsim_bin() + " eval --model " + model_ + " --corpus " + corpus_ +
                                " --context 200 --stride 100 --max-windows 7 --batch " +
                                std::to_string(b) + " --log-level error --out " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    nll.push_back(window_nll(out));
  }
  ASSERT_EQ(nll[0].size(), 7u);
  for (std::size_t i = 1; i < nll.size(); ++i) {
    ASSERT_EQ(nll[i].size(), nll[0].size());
    for (std::size_t w = 0; w < nll[0].size(); ++w)
      EXPECT_EQ(std::memcmp(&nll[0][w], &nll[i][w], sizeof(double)), 0)
          << "--batch " << i + 1 << ", window " << w << ": " << nll[0][w] << " vs " << nll[i][w];
  }
}

// Without the default corpus installed, a command that reads it names --corpus and what to do,
// and writes nothing; the library's messages name quantities, the command line maps them.
TEST_F(CliPaths, LibraryWordsBecomeOptionsOnTheCommandLine) {
  const std::string home = dir_.file("empty-home");
  fs::create_directories(home);
  const std::string js = dir_.file("e.json");
  const RunResult r =
      run_cmd("env -u SPARSIM_CORPUS SPARSIM_DEPS= HOME=" + home + " " + sparsim_bin() +
              " eval --model " + model_ + " --context 32 --stride 24 --max-windows 2 --json " + js);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--corpus 'default' is not installed: run scripts/setup.sh"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(js));
  // the library's own words name the quantity, not an option
  {
    const ScopedEnv no_corpus("SPARSIM_CORPUS", nullptr), deps("SPARSIM_DEPS", home.c_str()),
        empty_home("HOME", home.c_str());
    try {
      load_corpus("default");
      ADD_FAILURE() << "the default corpus was found in an empty home";
    } catch (const sparsim::OptionError& e) {
      EXPECT_EQ(e.key(), "corpus.path");
      EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
    }
  }
  // and the loader's bf16 check its setting and the storage it needs
  LoadOptions lo;
  lo.bf16_compute = true;
  try {
    check_load_options(lo);
    ADD_FAILURE() << "bf16 compute over f32 storage was accepted";
  } catch (const sparsim::OptionError& e) {
    EXPECT_EQ(e.key(), "load.bf16_compute");
    EXPECT_EQ(e.fix().key, "load.storage");
    EXPECT_TRUE(e.usage());
    EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
  }
}

// --bf16-compute: refused before any work without bf16 storage (or where it cannot run); with it,
// eval records the setting and its perplexity moves by the rounding of the prefill activations.
TEST_F(CliPaths, Bf16ComputeNeedsBf16Storage) {
  const std::string js = dir_.file("e.json");
  expect_refused(eval("--bf16-compute --json " + js), {"--bf16-compute", "--storage bf16"});
  // the command runs on the build's default backend: cuBLAS there in a CUDA build
#if defined(SPARSIM_EXEC_SPACE_Cuda)
  const bool available = device_blas::available();
#else
  const bool available = host::bf16_gemm_available();
#endif
  if (!available) {
    expect_refused(eval("--storage bf16 --bf16-compute --json " + js),
                   {"--bf16-compute is unavailable"});
    GTEST_SKIP() << host::bf16_gemm_unavailable_reason();
  }
  auto ppl = [&](const std::string& extra) {
    const RunResult r = run_cmd(eval("--storage bf16 --json " + js + " " + extra));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::ifstream f(js);
    const auto j = nlohmann::json::parse(f);
    EXPECT_EQ(j.at("bf16_compute").get<bool>(), !extra.empty());
    return j.at("perplexity").get<double>();
  };
  const double plain = ppl(""), b16 = ppl("--bf16-compute");
  EXPECT_NE(plain, b16);
  EXPECT_NEAR(b16, plain, 0.02 * plain);
  // compare takes it too: refused the same way, and its dense configuration scores the same
  // windows as eval (compare runs each window's dense prefix as a call of its own, so the bf16
  // rounding of the rows falls into other tiles: equal to rounding, not to the bit)
  const std::string cj = dir_.file("c.json");
  const std::string compare = sparsim_bin() + " compare --model " + model_ + " --corpus " +
                              corpus_ + " --context 32 --stride 24 --max-windows 4 --config " +
                              "'d: --method dense' --json " + cj + " ";
  expect_refused(compare + "--bf16-compute", {"--bf16-compute", "--storage bf16"});
  const RunResult r = run_cmd(compare + "--storage bf16 --bf16-compute");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(cj);
  const auto j = nlohmann::json::parse(f);
  EXPECT_TRUE(j.at("bf16_compute").get<bool>());
  const double pc = j.at("configs").at(0).at("perplexity");
  EXPECT_NE(pc, plain);
  EXPECT_NEAR(std::log(pc), std::log(b16), 1e-4 * std::log(b16));
}

}  // namespace
}  // namespace sparsim::test
