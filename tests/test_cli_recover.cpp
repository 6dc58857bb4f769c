// sparsim recover end to end on a tiny model pruned by sparsim prune: the written model runs
// everywhere and records its recovery, the run file holds the settings and the loss curve, the
// result is bitwise the same for any thread count, a run killed (SIGKILL, SIGTERM) and run again
// ends with bitwise the model of an uninterrupted run, and bad input is refused with a clear
// message and no model written.
#include "cli_process.hpp"
#include "helpers.hpp"
#include "io/hdf5.hpp"
#include "model/gguf.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliRecover : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    teacher_ = make_model(*dir_, "full.gguf", tiny_spec(51));
    other_ = make_model(*dir_, "other.gguf", tiny_spec(52));
    SynthSpec big = tiny_spec(53);
    big.cfg.vocab = 600;
    other_vocab_ = make_model(*dir_, "vocab600.gguf", big);
    corpus_ = dir_->file("corpus.txt");
    write_word_corpus(corpus_, 6, 4000, 9);
    const std::string cal = dir_->file("fisher.h5");
    RunResult r = run_cmd(sparsim_bin() + " calibrate --fisher --model " + teacher_ + " --corpus " +
                          corpus_ + " --out " + cal + " --fisher-seqs 2 --fisher-tokens 32");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    student_ = dir_->file("rap.gguf");
    r = run_cmd(sparsim_bin() + " prune --model " + teacher_ + " --method rap --retain 0.5 " +
                "--calibration " + cal + " --out " + student_ + " --flops-context 64");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override { fs::create_directories(work_.path() / "out"); }

  std::vector<std::string> args(const std::vector<std::string>& extra,
                                const std::string& teacher = "",
                                const std::string& student = "") const {
    std::vector<std::string> a = {sparsim_bin(), "recover",
                                  "--model",     student.empty() ? student_ : student,
                                  "--teacher",   teacher.empty() ? teacher_ : teacher,
                                  "--corpus",    corpus_,
                                  "--progress",  "never",
                                  "--log-level", "warn"};
    a.insert(a.end(), extra.begin(), extra.end());
    // defaults of these tests, where `extra` does not set them
    for (const auto& [k, v] :
         std::vector<std::pair<std::string, std::string>>{{"--steps", "6"},
                                                          {"--seq-len", "32"},
                                                          {"--batch", "2"},
                                                          {"--lora-rank", "4"},
                                                          {"--lr", "5e-3"},
                                                          {"--out", out("m.gguf")}})
      if (std::find(extra.begin(), extra.end(), k) == extra.end()) {
        a.push_back(k);
        a.push_back(v);
      }
    return a;
  }
  static std::string join(const std::vector<std::string>& a) {
    std::string s;
    for (const auto& x : a) s += (s.empty() ? "" : " ") + x;
    return s;
  }
  RunResult recover(const std::vector<std::string>& extra, const std::string& teacher = "") const {
    return run_cmd(join(args(extra, teacher)));
  }
  std::string out(const std::string& name) const { return work_.file("out/" + name); }

  static TempDir* dir_;
  static std::string teacher_, other_, other_vocab_, corpus_, student_;
  TempDir work_;
};
TempDir* CliRecover::dir_ = nullptr;
std::string CliRecover::teacher_, CliRecover::other_, CliRecover::other_vocab_, CliRecover::corpus_,
    CliRecover::student_;

TEST_F(CliRecover, WritesARecoveredModelThatEveryCommandRuns) {
  const RunResult r = recover({"--out", out("rec.gguf"), "--run", out("run.h5"), "--json",
                               out("s.json"), "--dump-gradients", out("g.h5")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  {  // the first step's gradients (scripts/reference/backprop_torch_check.py compares them with
     // PyTorch)
    io::H5File g = io::H5File::open_read(out("g.h5"));
    std::vector<hsize_t> dims;
    g.root().read<std::int32_t>("tokens", &dims);
    EXPECT_EQ(dims, (std::vector<hsize_t>{2, 32}));
    g.root().read<double>("adapters/blk.1.attn_v/grad_B", &dims);
    EXPECT_EQ(dims.at(1), 4u);
  }
  EXPECT_NE(r.output.find("recovered"), std::string::npos) << r.output;
  // the JSON summary
  std::ifstream jf(out("s.json"));
  const auto j = nlohmann::json::parse(jf);
  EXPECT_EQ(j.at("settings").at("lora_rank"), 4);
  EXPECT_EQ(j.at("settings").at("targets"), "q,k,v,o");
  EXPECT_EQ(j.at("tokens"), 6 * 2 * 32);
  EXPECT_EQ(j.at("loss").size(), 6u);
  EXPECT_LE(j.at("merge_check_rel_error").get<double>(), 1e-4);
  EXPECT_GT(j.at("peak_rss_bytes").get<double>(), 0);
  // the model records its recovery; the merged projections are F32
  gguf::File f = gguf::File::open(out("rec.gguf"));
  EXPECT_EQ(f.get_uint("sparsim.recovery.steps").value_or(0), 6u);
  EXPECT_EQ(f.get_uint("sparsim.recovery.lora_rank").value_or(0), 4u);
  EXPECT_EQ(f.get_string("sparsim.recovery.teacher_fingerprint").value_or(""),
            j.at("teacher").at("fingerprint").get<std::string>());
  EXPECT_EQ(f.get_float_array("sparsim.recovery.loss_curve").value_or(std::vector<float>{}).size(),
            6u);
  EXPECT_EQ(f.get_string("sparsim.prune.method").value_or(""), "rap");
  EXPECT_EQ(f.require_tensor("blk.1.attn_k.weight").type, gguf::GGMLType::F32);
  // the run file: settings, the curve, the adapters
  io::H5File h = io::H5File::open_read(out("run.h5"));
  const io::Group g = h.root().open_group("recovery");
  EXPECT_EQ(g.get_attr<std::int64_t>("lora_rank"), 4);
  EXPECT_DOUBLE_EQ(g.get_attr<double>("kd_temperature"), 2.0);
  EXPECT_EQ(g.get_attr<std::string>("kd_direction"), "reverse");
  EXPECT_EQ(g.read<double>("curve/loss").size(), 6u);
  EXPECT_EQ(g.read<double>("adapters/blk.0.attn_q/A").size(), 4u * 64);
  EXPECT_TRUE(h.root().has_group("teacher"));
  EXPECT_TRUE(h.root().has_group("pruned"));
  EXPECT_FALSE(fs::exists(out("rec.gguf.ckpt"))) << "the checkpoint of a finished run is removed";
  // every command runs it
  for (const std::string& cmd :
       {" eval --model " + out("rec.gguf") + " --corpus " + corpus_ +
            " --context 32 --stride 16 --max-windows 2 --progress never",
        " inspect --model " + out("rec.gguf"),
        " generate --model " + out("rec.gguf") + " --prompt abc --max-tokens 4"}) {
    const RunResult e = run_cmd(sparsim_bin() + cmd);
    EXPECT_EQ(e.exit_code, 0) << cmd << "\n" << e.output;
  }
}

// A low-rank student (SVD-LLM; PaLU's groups are the same code path): the K and V adapters
// train the down factors, so the recovered model keeps the latent cache of the student (the same
// tensor shapes, the up factors untouched) and every command runs it.
TEST_F(CliRecover, LowRankStudentKeepsItsLatentCache) {
  const std::string lr = out("svd.gguf");
  RunResult r = run_cmd(sparsim_bin() + " prune --model " + teacher_ +
                        " --method svd-llm --retain 0.5 --corpus " + corpus_ +
                        " --whiten-seqs 3 --whiten-tokens 48 --out " + lr);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(join(
      args({"--out", out("rec.gguf"), "--run", out("run.h5"), "--json", out("s.json")}, "", lr)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream jf(out("s.json"));
  const auto j = nlohmann::json::parse(jf);
  EXPECT_EQ(j.at("student").at("method"), "svd-llm");
  EXPECT_LE(j.at("merge_check_rel_error").get<double>(), 1e-4);
  gguf::File before = gguf::File::open(lr), after = gguf::File::open(out("rec.gguf"));
  EXPECT_EQ(after.get_string("sparsim.prune.method").value_or(""), "svd-llm");
  for (const std::string t : {"blk.0.attn_k.weight", "blk.1.attn_v.weight",
                              "blk.0.attn_k_up.weight", "blk.1.attn_v_up.weight"})
    EXPECT_EQ(after.require_tensor(t).ne, before.require_tensor(t).ne) << t;
  const auto& ku0 = before.require_tensor("blk.1.attn_k_up.weight");
  const auto& ku1 = after.require_tensor("blk.1.attn_k_up.weight");
  ASSERT_EQ(ku0.nbytes, ku1.nbytes);
  EXPECT_EQ(std::memcmp(ku0.data, ku1.data, ku0.nbytes), 0) << "the up factors are not trained";
  EXPECT_EQ(after.require_tensor("blk.1.attn_k.weight").type, gguf::GGMLType::F32);
  io::H5File h = io::H5File::open_read(out("run.h5"));
  EXPECT_TRUE(h.root().has_group("low_rank"));
  const RunResult e =
      run_cmd(sparsim_bin() + " eval --model " + out("rec.gguf") + " --corpus " + corpus_ +
              " --context 32 --stride 16 --max-windows 2 --progress never");
  EXPECT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("low-rank K/V (svd-llm"), std::string::npos) << e.output;
}

TEST_F(CliRecover, ThreadCountsGiveTheSameModel) {
  const RunResult a = recover({"--out", out("t1.gguf"), "--threads", "1", "--targets",
                               "q,k,v,o,gate,up,down", "--checkpoint", "off"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const RunResult b = recover({"--out", out("t2.gguf"), "--threads", "2", "--targets",
                               "q,k,v,o,gate,up,down", "--checkpoint", "off"});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(read_text(out("t1.gguf")), read_text(out("t2.gguf")));
}

// A real kill: SIGKILL after the checkpoint of step 2, or SIGTERM during step 4 (the run saves
// step 3 on its way out); the same command run again continues and writes bitwise the model
// and adapters of the uninterrupted run.
TEST_F(CliRecover, KilledAndRunAgainGivesTheUninterruptedModel) {
  const RunResult ref = recover({"--out", out("ref.gguf"), "--run", out("ref.h5")});
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const auto adapters = [](const std::string& run) {
    io::H5File h = io::H5File::open_read(run);
    const io::Group g = h.root().open_group("recovery/adapters");
    std::vector<double> all;
    for (const std::string& n : g.list())
      for (const char* m : {"A", "B"}) {
        const auto v = g.read<double>(n + "/" + m);
        all.insert(all.end(), v.begin(), v.end());
      }
    return all;
  };
  struct Case {
    const char* pause;
    int sig;
    int resumed;
  };
  for (const Case& k : {Case{"checkpoint-written", SIGKILL, 2}, Case{"step-4", SIGTERM, 3}}) {
    SCOPED_TRACE(k.pause);
    const std::string model = out(std::string("k") + std::to_string(k.sig) + ".gguf");
    const std::string run = model + ".h5", log = work_.file(std::string("log") + k.pause);
    const std::vector<std::string> a =
        args({"--out", model, "--run", run, "--checkpoint-steps", k.sig == SIGKILL ? "2" : "0"});
    const Child c = spawn(a, log, {std::string("SPARSIM_TEST_PAUSE=") + k.pause});
    ASSERT_TRUE(wait_for_text(log, std::string("paused at ") + k.pause)) << read_text(log);
    ::kill(c.pid, k.sig);
    EXPECT_EQ(wait_child(c), 128 + k.sig) << read_text(log);
    EXPECT_FALSE(fs::exists(model)) << "no model before the run finished";
    EXPECT_TRUE(fs::exists(model + ".ckpt")) << read_text(log);
    if (k.sig == SIGTERM) {
      EXPECT_NE(read_text(log).find("the adapters of step 3 of 6 are kept in"), std::string::npos)
          << read_text(log);
    }
    const RunResult again = run_cmd(join(a) + " --json " + model + ".json");
    ASSERT_EQ(again.exit_code, 0) << again.output;
    EXPECT_NE(again.output.find("continued from step " + std::to_string(k.resumed)),
              std::string::npos)
        << again.output;
    EXPECT_EQ(read_text(model), read_text(out("ref.gguf"))) << "the model differs";
    EXPECT_EQ(adapters(run), adapters(out("ref.h5")));
    EXPECT_FALSE(fs::exists(model + ".ckpt"));
    EXPECT_TRUE(temp_files(work_.path() / "out").empty());
  }
}

TEST_F(CliRecover, BadInputIsRefusedWithoutWritingAModel) {
  struct Case {
    std::vector<std::string> extra;
    std::string teacher, message;
  };
  const std::vector<Case> cases = {
      {{}, other_, "the student was pruned from the model with fingerprint"},
      {{}, other_vocab_, "vocabulary has 600 tokens, the student's 512"},
      {{}, student_, "the teacher is itself a pruned model"},
      {{"--lora-rank", "0"}, "", "LoRA rank must be at least 1"},
      {{"--lora-rank", "1000"}, "", "LoRA rank 1000 exceeds the"},
      {{"--targets", "q,x"}, "", "unknown projection 'x'"},
      {{"--kd-temperature", "nan"}, "", "distillation temperature must be a positive number"},
      {{"--lr", "nan"}, "", "learning rate must be a positive number"},
      {{"--kd-weight", "-1"}, "", "distillation weight must be a number >= 0"},
      {{"--kd-direction", "sideways"}, "", "must be reverse"},
      {{"--seq-len", "1000"}, "", "exceed the student's context"},
      {{"--steps", "0"}, "", "steps must be at least 1"},
  };
  for (const Case& c : cases) {
    const RunResult r = recover(c.extra, c.teacher);
    EXPECT_NE(r.exit_code, 0) << join(c.extra);
    EXPECT_NE(r.output.find(c.message), std::string::npos) << join(c.extra) << "\n" << r.output;
    EXPECT_TRUE(fs::is_empty(work_.path() / "out")) << join(c.extra);
  }
  // the full model as the student
  {
    const RunResult r = run_cmd(sparsim_bin() + " recover --model " + teacher_ + " --teacher " +
                                teacher_ + " --corpus " + corpus_ + " --out " + out("x.gguf"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("records no model it was pruned from"), std::string::npos) << r.output;
  }
  // an output that cannot be written
  {
    const RunResult r = recover({"--out", work_.file("missing/dir/x.gguf")});
    EXPECT_FALSE(fs::exists(work_.file("missing")));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--out"), std::string::npos) << r.output;
  }
  // a damaged checkpoint, a checkpoint of other settings
  {
    std::ofstream(out("m.gguf.ckpt")) << "not an HDF5 file";
    const RunResult r = recover({"--out", out("m.gguf")});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("recovery checkpoint '" + out("m.gguf.ckpt") + "' cannot be used"),
              std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(out("m.gguf")));
    fs::remove(out("m.gguf.ckpt"));
    const RunResult k =
        recover({"--out", out("m.gguf"), "--checkpoint-steps", "1", "--lr", "1e30"});
    EXPECT_EQ(k.exit_code, 1) << k.output;
    EXPECT_NE(k.output.find("the loss of step 2 is"), std::string::npos) << k.output;
    EXPECT_NE(k.output.find("holds step 1"), std::string::npos) << k.output;
    EXPECT_FALSE(fs::exists(out("m.gguf"))) << "no model from a run that did not finish";
    EXPECT_TRUE(fs::exists(out("m.gguf.ckpt")));
    const RunResult o = recover({"--out", out("m.gguf"), "--lora-rank", "2"});
    EXPECT_EQ(o.exit_code, 2) << o.output;
    EXPECT_NE(o.output.find("other settings"), std::string::npos) << o.output;
    EXPECT_NE(o.output.find("lora-rank"), std::string::npos) << o.output;
  }
}

}  // namespace
}  // namespace sparsim::test
