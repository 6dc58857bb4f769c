// sparsim eval / bench / generate with Probe Pruning on a tiny model: the realised ratio per
// batch and layer in the JSON summary and the run file, ratio 0 equal to dense, and bad input.
#include "cli_fixture.hpp"
#include "io/hdf5.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliProbePruning : public TinyModelCli<CliProbePruning> {
 protected:
  static void SetUpTestSuite() { make_tiny({41, 6, 6000, 13}); }
  static std::string eval(const std::string& extra) {
    return on_tiny("eval", "--context 96 --stride 64 --max-windows 3 --progress never", extra);
  }
};

TEST_F(CliProbePruning, EvalRecordsRealisedRatioPerBatchAndLayer) {
  const std::string js = dir_->file("pp.json"), out = dir_->file("pp.h5"),
                    dj = dir_->file("dense.json"), zj = dir_->file("zero.json");
  RunResult r = run_cmd(
      eval("--method probe-pruning --pp-ratio 0.5 --pp-probe 0.1 --json " + js + " --out " + out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(eval("--json " + dj));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(eval("--method probe-pruning --pp-ratio 0 --json " + zj));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(js), d = read_json(dj), z = read_json(zj);
  const auto& pp = j.at("probe_pruning");
  EXPECT_DOUBLE_EQ(pp.at("ratio").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(pp.at("probe").get<double>(), 0.1);
  // the tiny model: 2 KV groups (1 kept) and 128 FFN channels (64 kept) in each of 2 layers
  EXPECT_DOUBLE_EQ(pp.at("head_ratio").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(pp.at("channel_ratio").get<double>(), 0.5);
  ASSERT_EQ(pp.at("per_layer").size(), 2u);
  const auto& batches = pp.at("batches");
  ASSERT_EQ(batches.size(), 3u);  // one forward call per window
  for (const auto& b : batches) {
    EXPECT_EQ(b.at("probe_rows").get<int>(), 10);  // ⌈0.1 · 96⌉
    EXPECT_EQ(b.at("heads_kept"), (std::vector<int>{1, 1}));
    EXPECT_EQ(b.at("channels_kept"), (std::vector<int>{64, 64}));
  }
  EXPECT_NE(j.at("perplexity").get<double>(), d.at("perplexity").get<double>());
  EXPECT_EQ(z.at("perplexity").get<double>(), d.at("perplexity").get<double>());
  EXPECT_EQ(z.at("probe_pruning").at("batches").size(), 0u);
  io::H5File f = io::H5File::open_read(out);
  io::Group g = f.root().open_group("probe_pruning");
  std::vector<hsize_t> dims;
  const auto heads = g.read<std::int32_t>("heads_kept", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{3, 2}));
  EXPECT_EQ(heads, (std::vector<std::int32_t>(6, 1)));
  const auto ch = g.read<std::int32_t>("channels_kept", &dims);
  EXPECT_EQ(ch, (std::vector<std::int32_t>(6, 64)));
  const auto hr = g.read<double>("head_ratio", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{2}));
  EXPECT_DOUBLE_EQ(hr[0], 0.5);
}

TEST_F(CliProbePruning, BenchAndGenerateTakeTheSameOptions) {
  const std::string js = dir_->file("bench.json");
  RunResult r = run_cmd(sparsim_bin() + " bench --model " + model_ +
                        " --prompt 24 --decode 8 --reps 2 --batch 3 --method probe-pruning"
                        " --pp-ratio 0.5 --json " +
                        js);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(js);
  EXPECT_EQ(j.at("batch").get<int>(), 3);
  const auto& pp = j.at("probe_pruning");
  EXPECT_GT(pp.at("probe_seconds_per_prefill").get<double>(), 0.0);
  EXPECT_GT(pp.at("probe_share_of_prefill").get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(pp.at("channel_ratio").get<double>(), 0.5);
  EXPECT_EQ(pp.at("reused_calls").get<int>(), 2 * 8);
  r = run_cmd(sparsim_bin() + " generate --model " + model_ +
              " --prompt 'abc def ghi' -n 10 --method probe-pruning --pp-ratio 0.5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("probe-pruning: ratio 0.5"), std::string::npos) << r.output;
}

// calibrate --pp-history writes the historical states; eval fuses them (the JSON and run file
// say so) and refuses a calibration file without them or of another model.
TEST_F(CliProbePruning, HistoryFromCalibrateIsFusedAndChecked) {
  const std::string cal = dir_->file("pp_cal.h5"), js = dir_->file("pph.json"),
                    out = dir_->file("pph.h5");
  RunResult r = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " + corpus_ +
                        " --pp-history --pp-history-seqs 4 --pp-history-tokens 48 --progress "
                        "never --out " +
                        cal);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Probe Pruning history: 4 sequences of 48 tokens"), std::string::npos)
      << r.output;
  {
    io::H5File f = io::H5File::open_read(cal);
    io::Group g = f.root().open_group("probe_history");
    std::vector<hsize_t> dims;
    const auto o = g.read<float>("o", &dims);
    ASSERT_EQ(dims.size(), 3u);
    EXPECT_EQ(dims[0], 2u);   // layers
    EXPECT_EQ(dims[1], 48u);  // positions
    EXPECT_GT(*std::max_element(o.begin(), o.end()), 0.0f);
  }
  r = run_cmd(eval("--method probe-pruning --pp-ratio 0.5 --calibration " + cal + " --json " + js +
                   " --out " + out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(js);
  const std::string hist = j.at("probe_pruning").at("history").get<std::string>();
  EXPECT_NE(hist.find("4 sequences of 48 tokens"), std::string::npos) << hist;
  EXPECT_DOUBLE_EQ(j.at("probe_pruning").at("channel_ratio").get<double>(), 0.5);
  io::H5File f = io::H5File::open_read(out);
  EXPECT_NE(
      f.root().open_group("probe_pruning").get_attr<std::string>("history").find("calibration"),
      std::string::npos);
  // a calibration file without the history, and a history of another model
  const std::string fisher_only = dir_->file("no_pp.h5"), other_cal = dir_->file("other_cal.h5");
  r = calibrate_fisher(model_, fisher_only, 2, 16);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  make_other(42);
  r = run_cmd(sparsim_bin() + " calibrate --model " + other_ + " --corpus " + corpus_ +
              " --pp-history --pp-history-seqs 2 --pp-history-tokens 16 --progress never --out " +
              other_cal);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string bad_js = dir_->file("bad_pp.json"), bad_out = dir_->file("bad_pp.h5");
  const std::string sink = " --json " + bad_js + " --out " + bad_out;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--method probe-pruning --calibration " + fisher_only, "holds no Probe Pruning history"},
      {"--method probe-pruning --calibration " + other_cal, "fingerprint"},
  };
  expect_each_fails(cases, [&](const std::string& a) { return eval(a + sink); }, {bad_js, bad_out});
  // calibrate's own checks
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--pp-history-seqs 4", "--pp-history"},
           {"--pp-history --pp-history-tokens 100000", "exceeds the model's context"},
           {"--pp-history --pp-history-seqs 0", "--pp-history-seqs"}}) {
    const std::string o = dir_->file("bad_cal.h5");
    r = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " + corpus_ + " " +
                args + " --progress never --out " + o);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << ": " << r.output;
    EXPECT_FALSE(fs::exists(o)) << args;
  }
}

TEST_F(CliProbePruning, BadInputFailsWithoutOutput) {
  const std::string js = dir_->file("bad.json"), out = dir_->file("bad.h5");
  const std::string sink = " --json " + js + " --out " + out;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--method probe-pruning --pp-ratio 1.5", "--pp-ratio"},
      {"--method probe-pruning --pp-ratio -0.1", "--pp-ratio"},
      {"--method probe-pruning --pp-ratio 1", "--pp-ratio"},
      {"--method probe-pruning --pp-probe 0", "--pp-probe"},
      {"--pp-ratio 0.3", "add probe-pruning to --method"},
      {"--method probe-pruning+token-filter", "runs alone"},
      {"--method probe-pruning+probe-pruning", "twice"},
      {"--method probe-pruning --checkpoint c.ckpt", "--checkpoint"},
  };
  expect_each_fails(cases, [&](const std::string& a) { return eval(a + sink); }, {js, out});
}

}  // namespace
}  // namespace sparsim::test
