// sparsim eval / bench / generate with ThinK and GRACE on a tiny model: the JSON summary and run
// file records, λ = 0 against dense bit for bit, composition with an activation method, Token
// Filtering and the retrieval task in one run, and bad input.
#include "cli_fixture.hpp"
#include "io/hdf5.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliKvPrune : public TinyModelCli<CliKvPrune> {
 protected:
  static void SetUpTestSuite() { make_tiny({51, 7, 6000, 13, 1024}); }
  // windows of 128 tokens, the last 32 scored: 95 tokens are prefilled and pruned first
  static std::string eval(const std::string& extra) {
    return on_tiny("eval", "--context 128 --stride 128 --score 32 --max-windows 3 --progress never",
                   extra);
  }
};

TEST_F(CliKvPrune, EvalRecordsBytesErrorsAndPerHeadTables) {
  const std::string dj = dir_->file("dense.json"), dh = dir_->file("dense.h5");
  RunResult r = run_cmd(eval("--json " + dj + " --out " + dh));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto d = read_json(dj);
  double ppl_think = 0, ppl_grace = 0;
  for (const std::string m : {"think", "grace"}) {
    const std::string js = dir_->file(m + ".json"), out = dir_->file(m + ".h5");
    r = run_cmd(
        eval("--method " + m + " --kv-prune 0.5 --kv-trace 2 --json " + js + " --out " + out));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = read_json(js);
    const auto& k = j.at("kv_prune");
    EXPECT_EQ(k.at("method"), m);
    EXPECT_DOUBLE_EQ(k.at("lambda").get<double>(), 0.5);
    EXPECT_EQ(k.at("kept_per_head").get<int>(), 8);
    // 3 windows × 2 layers × 2 KV heads
    EXPECT_EQ(k.at("selections").get<int>(), 12);
    EXPECT_EQ(k.at("prefills").get<int>(), 3);
    // the cache of the last window: of the 95 prefilled positions the first 63 compacted to
    // half width, the last 32 (--kv-recent's default) and the 33 after them full
    const double dense = k.at("k_bytes_dense").get<double>(), real = k.at("k_bytes").get<double>();
    EXPECT_DOUBLE_EQ(dense, 2 * 4.0 * 128 * 32);
    EXPECT_DOUBLE_EQ(real, 2 * (4.0 * (63 * 16 + 65 * 32) + 4.0 * (16 + 3)));
    EXPECT_EQ(k.at("recent").get<int>(), 32);
    EXPECT_FALSE(k.at("guard").get<bool>());  // GRACE as published: MIES alone
    EXPECT_GT(k.at("recon_error_mean").get<double>(), 0.0);
    EXPECT_LT(k.at("recon_error_mean").get<double>(), 1.0);
    EXPECT_GT(k.at("protected_share_mean").get<double>(), 0.0);
    EXPECT_LE(k.at("protected_share_mean").get<double>(), 0.25);
    ASSERT_EQ(k.at("per_layer").size(), 2u);
    EXPECT_TRUE(k.at("per_layer")[0].at("compacted").get<bool>());
    (m == "think" ? ppl_think : ppl_grace) = j.at("perplexity").get<double>();
    EXPECT_NE(j.at("perplexity").get<double>(), d.at("perplexity").get<double>());
    EXPECT_LT(j.at("flops").at("realised").get<double>(), j.at("flops").at("dense").get<double>());
    io::H5File f = io::H5File::open_read(out);
    io::Group g = f.root().open_group("kv_prune");
    std::vector<hsize_t> dims;
    g.read<double>("recon_error_think", &dims);
    EXPECT_EQ(dims, (std::vector<hsize_t>{2, 2}));
    const auto et = g.read<double>("recon_error_think"), eg = g.read<double>("recon_error_grace");
    g.read<double>("protected_share", &dims);
    EXPECT_EQ(dims, (std::vector<hsize_t>{2, 2}));
    const auto kept = g.read<double>("kept_channels");
    for (double x : kept) EXPECT_DOUBLE_EQ(x, 8.0);
    g.read<std::uint8_t>("kept_mask", &dims);
    EXPECT_EQ(dims, (std::vector<hsize_t>{2, 2, 2, 16}));
    const auto kb = g.read<double>("k_bytes"), kd = g.read<double>("k_bytes_dense");
    ASSERT_EQ(kb.size(), 2u);
    EXPECT_LT(kb[0], kd[0]);
    const auto ops = f.root().open_group("flops").read_strings("ops");
    EXPECT_NE(std::find(ops.begin(), ops.end(), "channel_select"), ops.end());
  }
  EXPECT_NE(ppl_think, ppl_grace);
  // --kv-recent 0 compacts the whole prefill: 95 positions at half width, 33 full
  const std::string zj = dir_->file("recent0.json");
  r = run_cmd(eval("--method think --kv-prune 0.5 --kv-recent 0 --json " + zj));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_DOUBLE_EQ(read_json(zj).at("kv_prune").at("k_bytes").get<double>(),
                   2 * (4.0 * (95 * 16 + 33 * 32) + 4.0 * (16 + 3)));
}

TEST_F(CliKvPrune, LambdaZeroEqualsDenseBitForBit) {
  const std::string dj = dir_->file("d0.json"), dh = dir_->file("d0.h5"),
                    zj = dir_->file("z0.json"), zh = dir_->file("z0.h5");
  RunResult r = run_cmd(eval("--batch 2 --json " + dj + " --out " + dh));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(eval("--batch 2 --method grace --kv-prune 0 --json " + zj + " --out " + zh));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto d = read_json(dj), z = read_json(zj);
  EXPECT_EQ(d.at("perplexity").get<double>(), z.at("perplexity").get<double>());
  EXPECT_EQ(z.at("kv_prune").at("k_bytes").get<double>(),
            z.at("kv_prune").at("k_bytes_dense").get<double>());
  io::H5File fd = io::H5File::open_read(dh), fz = io::H5File::open_read(zh);
  EXPECT_EQ(fd.root().open_group("results/perplexity").read<double>("window_nll"),
            fz.root().open_group("results/perplexity").read<double>("window_nll"));
}

TEST_F(CliKvPrune, ComposesWithActivationSparsityTokenFilterAndRetrieval) {
  const std::string cal = dir_->file("cal.h5"), js = dir_->file("all.json");
  RunResult r = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " + corpus_ +
                        " --out " + cal +
                        " --context 64 --max-windows 2 --greedy-seqs 2 --greedy-tokens 16"
                        " --alpha 0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(eval("--method teal+token-filter+grace --sparsity 0.4 --calibration " + cal +
                   " --tf-ratio 0.25 --tf-warmup 8 --kv-prune 0.4 --kv-window 16"
                   " --task passkey --retrieval-lengths 320 --retrieval-depths 0,1 --json " +
                   js));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(js);
  EXPECT_EQ(j.at("sparsity").at("method"), "teal");
  EXPECT_GT(j.at("token_filter").at("realised").get<double>(), 0.05);
  const auto& k = j.at("kv_prune");
  EXPECT_EQ(k.at("method"), "grace");
  EXPECT_EQ(k.at("kept_per_head").get<int>(), 16 - 6);  // ⌊0.4·16⌋ pruned
  EXPECT_EQ(k.at("prefills").get<int>(), 3 + 2);        // three windows, two retrieval prompts
  EXPECT_EQ(j.at("retrieval").at("items").get<int>(), 2);
}

TEST_F(CliKvPrune, BenchAndGenerate) {
  const std::string js = dir_->file("bench.json"), ss = dir_->file("bench_syn.json");
  RunResult r = run_cmd(sparsim_bin() + " bench --model " + model_ +
                        " --method grace --kv-prune 0.5 --kv-window 16 --prompt 64 --decode 4"
                        " --reps 2 --batch 2 --json " +
                        js);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = read_json(js);
  EXPECT_EQ(j.at("batch").get<int>(), 2);
  EXPECT_GT(j.at("attention").at("dense_seconds").get<double>(), 0.0);
  EXPECT_GT(j.at("selection").at("select_seconds_per_head").get<double>(), 0.0);
  EXPECT_GT(j.at("prefill").at("method_seconds").get<double>(), 0.0);
  EXPECT_LT(j.at("k_bytes").get<double>(), j.at("k_bytes_dense").get<double>());
  EXPECT_EQ(j.at("kv_prune").at("prefills").get<int>(), 1);
  r = run_cmd(sparsim_bin() + " bench --model " + model_ +
              " --method think --kv-prune 0.3 --kv-synthetic-cache --prompt 256 --reps 3 --batch 2"
              " --json " +
              ss);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = read_json(ss);
  EXPECT_TRUE(j.at("synthetic_cache").get<bool>());
  EXPECT_EQ(j.at("attention").at("dense_seconds_reps").size(), 3u);
  EXPECT_LT(j.at("k_bytes").get<double>(), j.at("k_bytes_dense").get<double>());
  r = run_cmd(sparsim_bin() + " generate --model " + model_ +
              " --prompt 'abc def ghi jkl' -n 8 --method think --kv-prune 0.25 --kv-window 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("K-channel pruning (think, λ = 0.25): 12 of 16"), std::string::npos)
      << r.output;
}

TEST_F(CliKvPrune, BadInputFailsWithoutOutput) {
  const std::string js = dir_->file("bad.json"), out = dir_->file("bad.h5");
  const std::string sink = " --json " + js + " --out " + out;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--method think --kv-prune 1", "--kv-prune"},
      {"--method think --kv-prune -0.1", "--kv-prune"},
      {"--method think --kv-prune nan", "--kv-prune"},
      {"--method think --kv-recent -1", "--kv-recent"},
      {"--method grace --kv-protect 0.3,0.2", "--kv-protect"},
      {"--method grace --kv-protect 0.2,1", "--kv-protect"},
      {"--method grace --kv-protect 0.2", "two numbers"},
      {"--method grace --kv-prune 0.9 --kv-protect 0.2,0.25", "lower a or λ"},
      {"--method think --kv-window 100", "observation window"},
      {"--method think --kv-window 0", "--kv-window"},
      {"--method grace --kv-guard maybe", "--kv-guard"},
      {"--kv-prune 0.3", "add think or grace to --method"},
      {"--method think+grace", "more than one"},
      {"--method think --no-perplexity --task passkey --retrieval-lengths 320 --kv-window 400",
       "observation window"},
  };
  expect_each_fails(cases, [&](const std::string& a) { return eval(a + sink); }, {js, out});
}

}  // namespace
}  // namespace sparsim::test
