// sparsim prune --method palu|svd-llm end to end on a tiny model: the JSON summary, the low-rank
// model run by eval / generate / bench / inspect, thread-count independence, bad input.
#include "cli_fixture.hpp"
#include "io/hdf5.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliLowRank : public TinyModelCli<CliLowRank> {
 protected:
  static void SetUpTestSuite() {
    make_tiny_fisher({51, 6, 3000, 9});
    make_other(52);
  }

  static std::string prune(const std::string& method, const std::string& retain,
                           const std::string& out, const std::string& extra = "",
                           const std::string& whiten = "--whiten-seqs 3 --whiten-tokens 48") {
    return sparsim_bin() + " prune --model " + model_ + " --method " + method + " --retain " +
           retain + " --out " + out + " --corpus " + corpus_ + " " + whiten + " " +
           (method == "palu" ? "--calibration " + calib_ : "") + " " + extra;
  }
};

TEST_F(CliLowRank, LowRankModelRunsEverywhere) {
  for (const std::string m : {"palu", "svd-llm"}) {
    const std::string out = dir_->file(m + ".gguf"), js = dir_->file(m + ".json");
    const RunResult r = run_cmd(prune(m, "0.5", out, "--json " + js + " --flops-context 64"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = read_json(js);
    EXPECT_EQ(j.at("method"), m);
    EXPECT_EQ(j.at("flops_context").get<int>(), 64);  // the context the FLOP fractions are at
    EXPECT_DOUBLE_EQ(j.at("retain").get<double>(), 0.5);
    EXPECT_NEAR(j.at("kv_bytes_fraction").get<double>(), 0.5, 0.07);
    EXPECT_TRUE(j.at("whiten").get<bool>());
    EXPECT_EQ(j.at("group").get<int>(), 2);  // PaLU: min(4, n_kv); SVD-LLM: all KV heads
    EXPECT_EQ(j.at("whitening").at("sequences").get<int>(), 3);
    EXPECT_EQ(j.at("layers").size(), 2u);
    // the factors stay online: attention parameters above ρ, decode FLOPs pay the rebuild
    EXPECT_GT(j.at("attn_params_fraction").get<double>(), 0.5);
    EXPECT_GT(j.at("attn_decode_flops_fraction").get<double>(), 1.0);
    for (const auto& l : j.at("layers")) {
      EXPECT_GT(l.at("k_loss").get<double>(), 0.0);
      EXPECT_LT(l.at("k_loss").get<double>(), 1.0);
    }

    const std::string ejs = dir_->file(m + "-eval.json"), run = dir_->file(m + "-eval.h5");
    const RunResult e = run_cmd(eval_of(out, "--json " + ejs + " --out " + run));
    ASSERT_EQ(e.exit_code, 0) << e.output;
    const auto ej = read_json(ejs);
    ASSERT_TRUE(ej.contains("low_rank")) << ej.dump();
    EXPECT_EQ(ej.at("low_rank").at("method"), m);
    EXPECT_DOUBLE_EQ(ej.at("low_rank").at("kv_bytes_fraction").get<double>(),
                     j.at("kv_bytes_fraction").get<double>());
    EXPECT_TRUE(std::isfinite(ej.at("perplexity").get<double>()));
    io::H5File rf = io::H5File::open_read(run);
    EXPECT_EQ(rf.root().open_group("low_rank").get_attr<std::string>("method"), m);

    const RunResult g = run_cmd(generate_of(out));
    EXPECT_EQ(g.exit_code, 0) << g.output;
    const std::string bj = dir_->file(m + "-bl.json");
    const RunResult bl = run_cmd(sparsim_bin() + " bench --model " + out + " --baseline " + model_ +
                                 " --decode-only --prompt 16 --decode 4 --reps 1 --json " + bj);
    ASSERT_EQ(bl.exit_code, 0) << bl.output;
    const auto bb = read_json(bj);
    EXPECT_EQ(bb.at("low_rank").at("method"), m);
    EXPECT_EQ(bb.at("attention_decode_op_seconds").at("model").at("kv_reconstruct").size(), 1u);
    EXPECT_GT(
        bb.at("attention_decode_op_seconds").at("model").at("kv_reconstruct")[0].get<double>(),
        0.0);
    const RunResult i = run_cmd(sparsim_bin() + " inspect " + out);
    ASSERT_EQ(i.exit_code, 0) << i.output;
    EXPECT_NE(i.output.find("low-rank   " + m), std::string::npos) << i.output;
  }
}

// The written model does not depend on the thread count (whitening statistics, factorisation).
TEST_F(CliLowRank, ThreadCountDoesNotChangeTheModel) {
  std::string first;
  for (const std::string t : {"1", "2"}) {
    const std::string out = dir_->file("t" + t + ".gguf");
    const RunResult r = run_cmd(prune("palu", "0.6", out, "--threads " + t));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    if (first.empty())
      first = file_bytes(out);
    else
      EXPECT_TRUE(file_bytes(out) == first);
  }
}

TEST_F(CliLowRank, BadInputFailsClearlyWithoutOutput) {
  const std::string out = dir_->file("bad.gguf");
  auto expect_fail = [&](const std::string& cmd, const std::string& needle) {
    expect_fails(cmd, needle, {out});
  };
  expect_fail(prune("svd-llm", "0", out), "(0, 1]");
  expect_fail(prune("palu", "1.5", out), "(0, 1]");
  expect_fail(prune("svd-llm", "nan", out), "(0, 1]");
  expect_fail(prune("magic", "0.5", out),
              "not rap, kvpruner, kvpruner-naive, palu, svd-llm, flap or slimgpt");
  // PaLU needs the Fisher scores, of this model
  expect_fail(
      sparsim_bin() + " prune --model " + model_ + " --method palu --retain 0.5 --out " + out,
      "--calibration FILE");
  expect_fail(sparsim_bin() + " prune --model " + other_ + " --method palu --retain 0.5 --out " +
                  out + " --calibration " + calib_,
              "was made for model fingerprint");
  // a group that does not divide the KV heads; options of the other family
  expect_fail(prune("svd-llm", "0.5", out, "--group 3"), "does not divide the model's 2 KV heads");
  expect_fail(prune("palu", "0.5", out, "--score magnitude"), "--score does not apply");
  expect_fail(sparsim_bin() + " prune --model " + model_ + " --method rap --retain 0.5 --out " +
                  out + " --calibration " + calib_ + " --group 1",
              "--group applies to --method palu and svd-llm only");
  // whitening needs more text than the corpus has, or tokens beyond the model's context
  expect_fail(prune("svd-llm", "0.5", out, "", "--whiten-seqs 1000 --whiten-tokens 48"),
              "whitening sequences");
  expect_fail(prune("svd-llm", "0.5", out, "", "--whiten-seqs 1 --whiten-tokens 100000"),
              "exceeds the model's context");
  // a low-rank model cannot be factorised again
  const std::string once = dir_->file("once.gguf");
  ASSERT_EQ(run_cmd(prune("svd-llm", "0.7", once)).exit_code, 0);
  expect_fail(sparsim_bin() + " prune --model " + once + " --method svd-llm --retain 0.5 --out " +
                  out + " --corpus " + corpus_,
              "already pruned");
}

}  // namespace
}  // namespace sparsim::test
