// Interrupting a real `sparsim eval`: SIGINT and SIGTERM at each stage of the run (loading,
// tokenization, the forward passes, the write), the watchdog when no interruption point comes,
// kill -9, and resuming from the checkpoint an interruption leaves.
//
// SPARSIM_TEST_PAUSE=<stage> holds the child at that stage (it prints "paused at <stage>") so
// that the signal, sent from here, arrives at a known point.
#include "cli_process.hpp"
#include "helpers.hpp"
#include "io/hdf5.hpp"

#include <csignal>
#include <cstring>
#include <sstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliSignals : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = make_model(dir_, "tiny.gguf", tiny_spec(41));
    corpus_ = dir_.file("corpus.txt");
    write_word_corpus(corpus_, 9, 3000);
    fs::create_directories(dir_.path() / "out");
  }
  std::vector<std::string> eval_args(const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {sparsim_bin(),   "eval",      "--model", model_,     "--corpus",
                                  corpus_,         "--context", "32",      "--stride", "24",
                                  "--max-windows", "12",        "--batch", "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string out(const std::string& name) const { return dir_.file("out/" + name); }
  /// Starts eval held at `pause`, sends `sig` once it is there, returns the exit status.
  int interrupt_at(const std::string& pause, int sig, const std::vector<std::string>& extra,
                   const std::string& log) {
    const Child c = spawn(eval_args(extra), log, {"SPARSIM_TEST_PAUSE=" + pause});
    const std::string stage = pause.substr(0, pause.find(':'));
    EXPECT_TRUE(wait_for_text(log, "paused at " + stage)) << read_text(log);
    ::kill(c.pid, sig);
    return wait_child(c);
  }
  TempDir dir_;
  std::string model_, corpus_;
};

TEST_F(CliSignals, EachStageLeavesNoPartialFileAndNoTemporary) {
  const auto inputs = folder_state(dir_.path());
  std::ofstream(out("summary.json")) << "an earlier summary";
  const auto outputs_before = folder_state(dir_.path() / "out");
  struct Case {
    const char* stage;
    int sig;
  };
  for (const Case& k : {Case{"load", SIGINT}, Case{"tokenize", SIGTERM}, Case{"forward", SIGINT},
                        Case{"write", SIGTERM}}) {
    const std::string log = dir_.file(std::string("log_") + k.stage);
    const int rc = interrupt_at(k.stage, k.sig,
                                {"--out", out("run.h5"), "--json", out("summary.json"),
                                 "--checkpoint", "off", "--log-level", "error"},
                                log);
    const std::string text = read_text(log);
    EXPECT_EQ(rc, 128 + k.sig) << k.stage << "\n" << text;
    const std::string name = k.sig == SIGINT ? "SIGINT" : "SIGTERM";
    EXPECT_NE(text.find("sparsim eval: interrupted by " + name + "; not written: " + out("run.h5") +
                        ", " + out("summary.json")),
              std::string::npos)
        << k.stage << "\n"
        << text;
    EXPECT_NE(text.find("already there under these names are unchanged"), std::string::npos)
        << text;
    EXPECT_EQ(folder_state(dir_.path() / "out"), outputs_before)
        << k.stage << ": the output folder changed";
    EXPECT_TRUE(temp_files(dir_.path() / "out").empty()) << k.stage;
  }
  EXPECT_EQ(folder_state(dir_.path()).at("tiny.gguf"), inputs.at("tiny.gguf"));
  EXPECT_EQ(folder_state(dir_.path()).at("corpus.txt"), inputs.at("corpus.txt"));
}

TEST_F(CliSignals, WithoutAnInterruptionPointTheWatchdogCleansUp) {
  // ":hard" holds the run without polling, as a kernel that does not return would.
  const std::string log = dir_.file("log");
  const auto t0 = std::chrono::steady_clock::now();
  const int rc =
      interrupt_at("forward:hard", SIGTERM, {"--out", out("run.h5"), "--checkpoint", "off"}, log);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(rc, 143) << read_text(log);
  EXPECT_LT(s, 30.0);
  EXPECT_NE(read_text(log).find("interrupted by SIGTERM; not written: " + out("run.h5")),
            std::string::npos)
      << read_text(log);
  EXPECT_TRUE(fs::is_empty(dir_.path() / "out")) << temp_files(dir_.path() / "out").size();
}

TEST_F(CliSignals, KillNineLeavesOnlyATemporaryThatTheNextRunRemoves) {
  const std::string log = dir_.file("log");
  const std::vector<std::string> extra = {"--out",       out("run.h5"),  "--json",
                                          out("s.json"), "--checkpoint", "off"};
  const int rc = interrupt_at("write", SIGKILL, extra, log);
  EXPECT_EQ(rc, 128 + SIGKILL);
  EXPECT_FALSE(fs::exists(out("run.h5")));
  EXPECT_FALSE(fs::exists(out("s.json")));
  EXPECT_EQ(temp_files(dir_.path() / "out").size(), 2u) << "expected the two temporaries";
  const Child again = spawn(eval_args(extra), dir_.file("log2"));
  ASSERT_EQ(wait_child(again), 0) << read_text(dir_.file("log2"));
  EXPECT_TRUE(temp_files(dir_.path() / "out").empty());
  EXPECT_TRUE(fs::exists(out("run.h5")));
  EXPECT_TRUE(fs::exists(out("s.json")));
}

// forward, calibrate, profile, bench --json and synth (GGUF and Hugging Face folder), held just
// before they publish (for synth: while the model file is half written), then signalled.
TEST_F(CliSignals, EveryWritingCommandStopsAtTheWriteAndPublishesNothing) {
  // A calibration file for `profile --calibration` (an input here, so made before the state).
  const std::string cal = dir_.file("cal.h5");
  const std::string cal_opts =
      " --variants plain --context 32 --max-windows 1 --greedy-seqs 1 --greedy-tokens 8 "
      "--probes 0.4 --alpha 0.2 --threads 1 --log-level warn";
  const RunResult c = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " +
                              corpus_ + " --out " + cal + cal_opts);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  // Earlier results under the final names must survive every interrupted run byte for byte.
  for (const char* name : {"f.h5", "cal.h5", "b.json", "p.png", "s.gguf"})
    std::ofstream(out(name)) << "an earlier " << name;
  auto state = [&] {  // the test folder without the logs of the runs
    auto m = folder_state(dir_.path());
    for (auto it = m.begin(); it != m.end();)
      it = it->first.rfind("logs/", 0) == 0 ? m.erase(it) : std::next(it);
    return m;
  };
  fs::create_directories(dir_.path() / "logs");
  const auto inputs = state();
  auto split = [](const std::string& line) {
    std::vector<std::string> v;
    std::istringstream is(line);
    for (std::string w; is >> w;) v.push_back(w);
    return v;
  };
  struct Case {
    std::string command, args;
    std::vector<std::string> outputs;
    int sig;
  };
  const std::vector<Case> cases = {
      {"forward",
       "--model " + model_ + " --tokens 1,2,3 --greedy 2 --out " + out("f.h5"),
       {out("f.h5")},
       SIGINT},
      {"calibrate",
       "--model " + model_ + " --corpus " + corpus_ + " --out " + out("cal.h5") + cal_opts,
       {out("cal.h5")},
       SIGTERM},
      {"profile",
       "--calibration " + cal + " --variant plain --out " + out("p.h5") + " --plot " + out("p.png"),
       {out("p.h5"), out("p.png")},
       SIGINT},
      {"bench",
       "--model " + model_ + " --prompt 4 --decode 4 --reps 1 --json " + out("b.json"),
       {out("b.json")},
       SIGTERM},
      {"synth", "--out " + out("s.gguf"), {out("s.gguf")}, SIGINT},
      {"synth", "--format hf --out " + out("hf"), {out("hf")}, SIGTERM},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.command + " " + k.args);
    std::vector<std::string> argv = {sparsim_bin(), k.command};
    for (auto& a : split(k.args)) argv.push_back(a);
    const std::string log = dir_.file("logs/" + std::to_string(&k - cases.data()));
    const Child ch = spawn(argv, log, {"SPARSIM_TEST_PAUSE=write"});
    if (!wait_for_text(log, "paused at write", 30)) {
      ::kill(ch.pid, SIGKILL);
      wait_child(ch);
      ADD_FAILURE() << "never reached the write:\n" << read_text(log);
      continue;
    }
    ::kill(ch.pid, k.sig);
    const int rc = wait_child(ch);
    const std::string text = read_text(log);
    EXPECT_EQ(rc, 128 + k.sig) << text;
    std::string line = "sparsim " + k.command + ": interrupted by " +
                       (k.sig == SIGINT ? "SIGINT" : "SIGTERM") + "; not written: ";
    for (std::size_t i = 0; i < k.outputs.size(); ++i) line += (i ? ", " : "") + k.outputs[i];
    EXPECT_NE(text.find(line), std::string::npos) << "expected '" << line << "' in:\n" << text;
    EXPECT_EQ(state(), inputs) << "a file was added, removed or changed";
    EXPECT_TRUE(temp_files(dir_.path() / "out").empty());
    EXPECT_FALSE(fs::exists(out("hf"))) << "the folder this run created outlived it";
  }
}

/// Every dataset of a run file group, as raw bytes.
std::map<std::string, std::vector<double>> doubles(const std::string& file, const char* group) {
  auto f = io::H5File::open_read(file);
  io::Group g = f.root().open_group(group);
  std::map<std::string, std::vector<double>> m;
  for (const auto& name : g.list()) {
    io::Dataset d = g.dataset(name);
    if (d.type_name() == "float64") m[name] = g.read<double>(name);
  }
  return m;
}

TEST_F(CliSignals, AnInterruptedRunContinuesToTheBitwiseSameResult) {
  const Child ref =
      spawn(eval_args({"--out", out("ref.h5"), "--checkpoint", "off"}), dir_.file("log_ref"));
  ASSERT_EQ(wait_child(ref), 0) << read_text(dir_.file("log_ref"));

  // Interrupted after the first batch: the windows done are kept in run.h5.ckpt.
  const std::vector<std::string> cmd = {"--out", out("run.h5")};
  const int rc = interrupt_at("forward", SIGINT, cmd, dir_.file("log1"));
  const std::string t1 = read_text(dir_.file("log1"));
  EXPECT_EQ(rc, 130) << t1;
  EXPECT_NE(t1.find("2 of 12 windows are kept in '" + out("run.h5.ckpt") +
                    "': run the same command again to continue"),
            std::string::npos)
      << t1;
  ASSERT_TRUE(fs::exists(out("run.h5.ckpt")));
  EXPECT_FALSE(fs::exists(out("run.h5")));

  // Another batch size is another command line but the same settings: it continues.
  std::vector<std::string> again = eval_args(cmd);
  again[13] = "3";  // --batch 3
  const Child c = spawn(again, dir_.file("log2"));
  ASSERT_EQ(wait_child(c), 0) << read_text(dir_.file("log2"));
  EXPECT_NE(read_text(dir_.file("log2")).find("2 of 12 windows were done"), std::string::npos)
      << read_text(dir_.file("log2"));
  EXPECT_FALSE(fs::exists(out("run.h5.ckpt"))) << "the checkpoint outlived its run";
  const auto a = doubles(out("ref.h5"), "results/perplexity");
  const auto b = doubles(out("run.h5"), "results/perplexity");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, v] : a) {
    ASSERT_EQ(v.size(), b.at(name).size()) << name;
    EXPECT_EQ(std::memcmp(v.data(), b.at(name).data(), v.size() * sizeof(double)), 0) << name;
  }
  auto fa = io::H5File::open_read(out("ref.h5"));
  auto fb = io::H5File::open_read(out("run.h5"));
  for (const char* attr : {"perplexity", "nll_sum"}) {
    const double x = fa.root().open_group("results/perplexity").get_attr<double>(attr);
    const double y = fb.root().open_group("results/perplexity").get_attr<double>(attr);
    EXPECT_EQ(std::memcmp(&x, &y, sizeof x), 0) << attr << ": " << x << " vs " << y;
  }
  // The FLOP ledger covers every window, the resumed ones included (dense FLOPs are exact).
  const auto la = doubles(out("ref.h5"), "flops"), lb = doubles(out("run.h5"), "flops");
  EXPECT_EQ(la.at("flops_dense"), lb.at("flops_dense"));
  EXPECT_EQ(fb.root().open_group("timings").get_attr<std::int64_t>("resumed_windows"), 2);
}

TEST_F(CliSignals, ASparseRunContinuesWithItsRealisedSparsityStatistics) {
  const std::string cal = dir_.file("cal.h5");
  const RunResult c = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " +
                              corpus_ + " --out " + cal +
                              " --variants plain --context 32 --max-windows 1 --greedy-seqs 1 "
                              "--greedy-tokens 8 --probes 0.4 --alpha 0.2 --threads 1 "
                              "--log-level warn");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const std::vector<std::string> teal = {"--method", "teal",          "--sparsity",
                                         "0.5",      "--calibration", cal};
  auto with = [&](std::vector<std::string> v, const std::string& o) {
    v.insert(v.end(), {"--out", out(o)});
    return v;
  };
  const Child ref = spawn(eval_args(with(teal, "ref.h5")), dir_.file("log_ref"));
  ASSERT_EQ(wait_child(ref), 0) << read_text(dir_.file("log_ref"));
  ASSERT_EQ(interrupt_at("forward", SIGTERM, with(teal, "run.h5"), dir_.file("log1")), 143)
      << read_text(dir_.file("log1"));
  ASSERT_TRUE(fs::exists(out("run.h5.ckpt")));
  const Child again = spawn(eval_args(with(teal, "run.h5")), dir_.file("log2"));
  ASSERT_EQ(wait_child(again), 0) << read_text(dir_.file("log2"));
  for (const char* group : {"results/perplexity", "sparsity"}) {
    const auto a = doubles(out("ref.h5"), group), b = doubles(out("run.h5"), group);
    ASSERT_EQ(a.size(), b.size()) << group;
    for (const auto& [name, v] : a) {
      ASSERT_EQ(v.size(), b.at(name).size()) << name;
      EXPECT_EQ(std::memcmp(v.data(), b.at(name).data(), v.size() * sizeof(double)), 0)
          << group << "/" << name;
    }
  }
  auto fa = io::H5File::open_read(out("ref.h5"));
  auto fb = io::H5File::open_read(out("run.h5"));
  EXPECT_EQ(fa.root().open_group("sparsity").read<std::uint64_t>("histogram"),
            fb.root().open_group("sparsity").read<std::uint64_t>("histogram"));
  EXPECT_EQ(fa.root().open_group("sparsity").read<std::uint64_t>("tokens"),
            fb.root().open_group("sparsity").read<std::uint64_t>("tokens"));
}

TEST_F(CliSignals, ATokenGateRunKeepsNoCheckpoint) {
  // The gate's state and statistics over all windows are not in the side file: a resumed run
  // could not give the uninterrupted result, so there is none.
  const std::vector<std::string> gate = {
      "--method", "token-filter", "--tf-ratio", "0.3", "--tf-warmup", "8", "--tf-num-layers", "2"};
  std::vector<std::string> explicit_ckpt = gate;
  explicit_ckpt.insert(explicit_ckpt.end(),
                       {"--out", out("run.h5"), "--checkpoint", out("c.ckpt")});
  const Child c = spawn(eval_args(explicit_ckpt), dir_.file("log1"));
  EXPECT_EQ(wait_child(c), 1);
  EXPECT_NE(
      read_text(dir_.file("log1")).find("--checkpoint cannot be combined with a token-filter"),
      std::string::npos)
      << read_text(dir_.file("log1"));
  std::vector<std::string> with_out = gate;
  with_out.insert(with_out.end(), {"--out", out("run.h5")});
  EXPECT_EQ(interrupt_at("forward", SIGINT, with_out, dir_.file("log2")), 130)
      << read_text(dir_.file("log2"));
  EXPECT_EQ(read_text(dir_.file("log2")).find("windows are kept"), std::string::npos)
      << read_text(dir_.file("log2"));
  EXPECT_TRUE(fs::is_empty(dir_.path() / "out"));
}

TEST_F(CliSignals, ACheckpointOfOtherSettingsIsNotUsedOrOverwritten) {
  const std::vector<std::string> cmd = {"--out", out("run.h5"), "--checkpoint", out("c.ckpt")};
  ASSERT_EQ(interrupt_at("forward", SIGINT, cmd, dir_.file("log1")), 130)
      << read_text(dir_.file("log1"));
  ASSERT_TRUE(fs::exists(out("c.ckpt")));
  const auto before = folder_state(dir_.path() / "out");
  std::vector<std::string> other = eval_args(cmd);
  other[7] = "28";  // --context 28
  const Child c = spawn(other, dir_.file("log2"));
  EXPECT_EQ(wait_child(c), 2);
  const std::string t = read_text(dir_.file("log2"));
  EXPECT_NE(t.find("other settings"), std::string::npos) << t;
  EXPECT_NE(t.find("context 32 there, 28 here"), std::string::npos) << t;
  EXPECT_EQ(folder_state(dir_.path() / "out"), before);
}

}  // namespace
}  // namespace sparsim::test
