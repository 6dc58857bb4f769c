// sparsim calibrate and eval --method: an end-to-end run on a tiny model, and bad input.
#include "helpers.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliSparsity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    SynthSpec s = tiny_spec(21);
    model_ = make_model(*dir_, "m.gguf", s);
    other_ = make_model(*dir_, "other.gguf", tiny_spec(22));
    // generated text: words over a small alphabet, enough tokens for a few windows
    corpus_ = dir_->file("corpus.txt");
    write_word_corpus(corpus_, 3, 6000, 13);
    calib_ = dir_->file("cal.h5");
    const RunResult c = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " +
                                corpus_ + " --out " + calib_ +
                                " --context 128 --max-windows 4 --greedy-seqs 2 --greedy-tokens 32"
                                " --alpha 0.05");
    ASSERT_EQ(c.exit_code, 0) << c.output;
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string eval(const std::string& extra) {
    return sparsim_bin() + " eval --model " + model_ + " --corpus " + corpus_ +
           " --context 128 --stride 64 --max-windows 3 " + extra;
  }

  static TempDir* dir_;
  static std::string model_, other_, corpus_, calib_;
};
TempDir* CliSparsity::dir_ = nullptr;
std::string CliSparsity::model_, CliSparsity::other_, CliSparsity::corpus_, CliSparsity::calib_;

TEST_F(CliSparsity, EachMethodReportsTargetAgainstRealised) {
  for (const std::string m : {"teal", "wina", "topk-guided"}) {
    const std::string js = dir_->file(m + ".json"), out = dir_->file(m + ".h5");
    const RunResult r = run_cmd(eval("--method " + m + " --sparsity 0.5 --calibration " + calib_ +
                                     " --json " + js + " --out " + out));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream f(js);
    const auto j = nlohmann::json::parse(f);
    const auto& s = j.at("sparsity");
    EXPECT_EQ(s.at("method"), m);
    EXPECT_DOUBLE_EQ(s.at("target").get<double>(), 0.5);
    const double mean = s.at("realised_mean"), lo = s.at("realised_min"), hi = s.at("realised_max");
    EXPECT_LE(lo, mean + 1e-12);
    EXPECT_LE(mean, hi + 1e-12);
    EXPECT_NEAR(mean, 0.5, 0.15) << m;
    for (const char* p : {"q", "k", "v", "o", "gate", "up", "down"})
      EXPECT_TRUE(s.at("per_projection").contains(p)) << p;
    EXPECT_LT(j.at("flops").at("realised").get<double>(), j.at("flops").at("dense").get<double>());
    EXPECT_TRUE(fs::exists(out));
  }
}

// The same run gives the same bits for any thread count: calibration and evaluation.
TEST_F(CliSparsity, ThreadCountDoesNotChangeResults) {
  std::string first;
  for (const std::string t : {"1", "2"}) {
    const std::string cal = dir_->file("cal_t" + t + ".h5"), js = dir_->file("t" + t + ".json");
    const RunResult c = run_cmd(sparsim_bin() + " calibrate --threads " + t + " --model " + model_ +
                                " --corpus " + corpus_ + " --out " + cal +
                                " --context 64 --max-windows 2 --greedy-seqs 2 --greedy-tokens 16"
                                " --alpha 0.1");
    ASSERT_EQ(c.exit_code, 0) << c.output;
    const RunResult r =
        run_cmd(eval("--threads " + t + " --method topk-guided --sparsity 0.4 --calibration " +
                     cal + " --json " + js));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream f(js);
    auto j = nlohmann::json::parse(f);
    nlohmann::json keep = {{"perplexity", j.at("perplexity")}, {"sparsity", j.at("sparsity")}};
    keep["sparsity"].erase("calibration");
    if (first.empty())
      first = keep.dump();
    else
      EXPECT_EQ(keep.dump(), first);
  }
}

TEST_F(CliSparsity, BenchMeasuresEachMethodAgainstDense) {
  for (const std::string m : {"teal", "wina"})
    for (const std::string cs : {"on", "off"}) {
      const std::string js = dir_->file("bench-" + m + cs + ".json");
      const RunResult r = run_cmd(sparsim_bin() + " bench --model " + model_ +
                                  " --prompt 16 --decode 8 --reps 1 --method " + m +
                                  " --sparsity 0.5 --calibration " + calib_ +
                                  " --column-skipping " + cs + " --json " + js);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("mask selection"), std::string::npos) << r.output;
      std::ifstream f(js);
      const auto j = nlohmann::json::parse(f);
      const auto& s = j.at("sparse");
      EXPECT_EQ(s.at("method"), m);
      EXPECT_EQ(s.at("column_skipping").get<bool>(), cs == "on");
      EXPECT_EQ(s.at("rotated").get<bool>(), m == "wina");
      EXPECT_GT(s.at("decode_tokens_per_s").get<double>(), 0);
      EXPECT_GT(j.at("decode_tokens_per_s").get<double>(), 0);
      const double sr = s.at("realised_projection_sparsity");
      EXPECT_NEAR(sr, 0.5, 0.15) << m;
      EXPECT_NEAR(s.at("ideal_speedup_projections").get<double>(), 1.0 / (1.0 - sr), 1e-9);
      const double step = s.at("ideal_speedup_decode_step");
      EXPECT_GT(step, 0.5);
      EXPECT_LT(step, 1.0 / (1.0 - sr));
      const double mask = s.at("mask_select_time_share"), rot = s.at("rotation_time_share");
      EXPECT_GT(mask, 0.0);
      EXPECT_LT(mask, 1.0);
      if (m == "wina")
        EXPECT_GT(rot, 0.0);
      else
        EXPECT_EQ(rot, 0.0);
    }
  // the method options are checked as eval checks them
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--method wina", "needs --calibration"},
           {"--calibration " + calib_, "only used by the sparse methods"},
           {"--method teal --calibration " + calib_ + " --column-skipping maybe",
            "--column-skipping must be on or off"}}) {
    const RunResult b = run_cmd(sparsim_bin() + " bench --model " + model_ +
                                " --prompt 16 --decode 8 --reps 1 " + args);
    EXPECT_NE(b.exit_code, 0) << args;
    EXPECT_NE(b.output.find(message), std::string::npos) << args << "\n" << b.output;
  }
}

TEST_F(CliSparsity, BadInputFailsAndWritesNothing) {
  const std::string out = dir_->file("bad.h5"), js = dir_->file("bad.json");
  const std::string files = " --out " + out + " --json " + js;
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--method teal --sparsity 1.0 --calibration " + calib_, "--sparsity"},
      {"--method teal --sparsity -0.1 --calibration " + calib_, "--sparsity"},
      {"--method topk-guided --delta 0.7 --calibration " + calib_, "--delta"},
      {"--method topk-guided --lambda -1 --calibration " + calib_, "--lambda"},
      {"--method topk-guided --probe 0.3 --calibration " + calib_, "--probe"},
      {"--method wina", "needs --calibration"},
      {"--method magic --calibration " + calib_, "--method"},
      {"--calibration " + calib_, "only used by the sparse methods"},
      {"--method teal --calibration " + corpus_, "calibration file"},
      {"--method teal --calibration " + dir_->file("missing.h5"), "missing.h5"},
  };
  for (const auto& c : cases) {
    const RunResult r = run_cmd(eval(c.args + files));
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << c.args;
    EXPECT_FALSE(fs::exists(js)) << c.args;
  }
  // a calibration file made for another model
  const RunResult r = run_cmd(
      sparsim_bin() + " eval --model " + other_ + " --corpus " + corpus_ +
      " --context 128 --stride 64 --max-windows 1 --method teal --calibration " + calib_ + files);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("was made for model fingerprint"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
  // calibrate refuses nonsense before writing
  const std::string cal2 = dir_->file("cal2.h5");
  for (const std::string a : {"--alpha 0", "--probes 0.2,x", "--probes 1.5", "--variants odd",
                              "--greedy-tokens 1", "--delta 0.9"}) {
    const RunResult b = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " +
                                corpus_ + " --out " + cal2 + " " + a);
    EXPECT_NE(b.exit_code, 0) << a;
    EXPECT_FALSE(fs::exists(cal2)) << a;
  }
}

}  // namespace
}  // namespace sparsim::test
