// sparsim eval / bench / generate with Token Filtering and the generated retrieval task: an
// end-to-end run on a tiny model, composition with an activation method, and bad input.
#include "cli_fixture.hpp"
#include "io/hdf5.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliTokenFilter : public TinyModelCli<CliTokenFilter> {
 protected:
  // context 1024: room for retrieval prompts of the byte-level test tokenizer
  static void SetUpTestSuite() { make_tiny({31, 5, 6000, 13, 1024}); }
  static std::string eval(const std::string& extra) {
    return on_tiny("eval", "--context 96 --stride 64 --max-windows 3 --progress never", extra);
  }
};

TEST_F(CliTokenFilter, EvalReportsTargetRealisedAndPerLayer) {
  const std::string js = dir_->file("tf.json"), out = dir_->file("tf.h5"),
                    dj = dir_->file("dense.json");
  RunResult r =
      run_cmd(eval("--method token-filter --tf-ratio 0.3 --tf-warmup 8 --tf-num-layers 2"
                   " --tf-attention-mass --json " +
                   js + " --out " + out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(eval("--json " + dj));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(js), d = read_json(dj);
  const auto& tf = j.at("token_filter");
  EXPECT_DOUBLE_EQ(tf.at("target").get<double>(), 0.3);
  EXPECT_EQ(tf.at("criterion"), "kv");
  EXPECT_EQ(tf.at("layers"), (std::vector<int>{0, 1}));
  EXPECT_NEAR(tf.at("realised").get<double>(), 0.3, 0.1);
  ASSERT_EQ(tf.at("per_layer").size(), 2u);
  EXPECT_EQ(tf.at("decided_tokens").get<int>(), 3 * (96 - 8));
  EXPECT_LT(j.at("flops").at("realised").get<double>(), j.at("flops").at("dense").get<double>());
  EXPECT_EQ(d.at("flops").at("realised").get<double>(), d.at("flops").at("dense").get<double>());
  EXPECT_NE(j.at("perplexity").get<double>(), d.at("perplexity").get<double>());
  io::H5File f = io::H5File::open_read(out);
  io::Group g = f.root().open_group("token_filter");
  std::vector<hsize_t> dims;
  g.open_group("trace").open_group("seq0").read<float>("similarity", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{2, 96}));
  const auto mass = g.open_group("attention_mass").read<float>("attention_received", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{2, 96}));
  EXPECT_GT(mass[0], 0.0f);           // position 0 receives attention from every query
  EXPECT_TRUE(std::isnan(mass[95]));  // the last position has no later query
  const auto ops = f.root().open_group("flops").read_strings("ops");
  EXPECT_NE(std::find(ops.begin(), ops.end(), "gate_similarity"), ops.end());
}

TEST_F(CliTokenFilter, ComposesWithAnActivationMethod) {
  const std::string cal = dir_->file("cal.h5"), js = dir_->file("both.json");
  RunResult r = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " + corpus_ +
                        " --out " + cal +
                        " --context 64 --max-windows 2 --greedy-seqs 2 --greedy-tokens 16"
                        " --alpha 0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(eval("--method topk-guided+token-filter --sparsity 0.4 --calibration " + cal +
                   " --tf-ratio 0.25 --tf-warmup 8 --json " + js));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(js);
  EXPECT_EQ(j.at("sparsity").at("method"), "topk-guided");
  EXPECT_DOUBLE_EQ(j.at("token_filter").at("target").get<double>(), 0.25);
  EXPECT_GT(j.at("token_filter").at("realised").get<double>(), 0.1);
}

TEST_F(CliTokenFilter, RetrievalTaskAccuracyPerCell) {
  const std::string js = dir_->file("ret.json"), out = dir_->file("ret.h5");
  const RunResult r = run_cmd(sparsim_bin() + " eval --model " + model_ + " --corpus " + corpus_ +
                              " --no-perplexity --task passkey --retrieval-lengths 320,384"
                              " --retrieval-depths 0,0.5,1 --retrieval-samples 2 --batch 2"
                              " --progress never --json " +
                              js + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(js);
  const auto& rt = j.at("retrieval");
  EXPECT_EQ(rt.at("items").get<int>(), 12);
  ASSERT_EQ(rt.at("cells").size(), 6u);
  EXPECT_GE(rt.at("accuracy").get<double>(), 0.0);
  // the sweep table's columns of the task are the block's figures
  const auto& cols = j.at("columns");
  EXPECT_EQ(cols.at("retrieval_accuracy").at("value"), rt.at("accuracy"));
  EXPECT_EQ(cols.at("retrieval_items").at("value").get<double>(), 12.0);
  EXPECT_EQ(cols.at("retrieval_task").at("value"), "passkey");
  EXPECT_EQ(cols.at("retrieval_accuracy").at("units"), "1");
  io::H5File f = io::H5File::open_read(out);
  std::vector<hsize_t> dims;
  f.root().open_group("results").open_group("retrieval").read<double>("accuracy", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{2, 3}));
  const auto answers =
      f.root().open_group("results").open_group("retrieval").read_strings("item_answer");
  ASSERT_EQ(answers.size(), 12u);
  for (const auto& a : answers) EXPECT_EQ(a.size(), 5u);
}

TEST_F(CliTokenFilter, BenchAndGenerateTakeTheSameOptions) {
  const std::string js = dir_->file("bench.json");
  RunResult r = run_cmd(sparsim_bin() + " bench --model " + model_ +
                        " --prompt 24 --decode 24 --reps 2 --batch 3 --method token-filter"
                        " --tf-ratio 0.5 --tf-warmup 8 --json " +
                        js);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(js);
  EXPECT_GT(j.at("attention_stage_ratio").get<double>(), 0.0);
  EXPECT_EQ(j.at("batch").get<int>(), 3);
  EXPECT_NEAR(j.at("token_filter").at("realised").get<double>(), 0.5, 0.15);
  EXPECT_GT(j.at("decode_ledger_last_rep").at("q_proj").at("flops_dense").get<double>(),
            j.at("decode_ledger_last_rep").at("q_proj").at("flops_realised").get<double>());
  r = run_cmd(sparsim_bin() + " generate --model " + model_ +
              " --prompt 'abc def ghi' -n 20 --method token-filter --tf-ratio 0.3 --tf-warmup 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("token filter: target 0.300"), std::string::npos) << r.output;
}

// --tf-drop-skipped: the gated layers free the dropped tokens' bytes; the record counts them; the
// masked layout gives the same perplexity with the dense allocation; without it no record.
TEST_F(CliTokenFilter, DroppedTokensLeaveTheCache) {
  const std::string jc = dir_->file("drop_c.json"), jm = dir_->file("drop_m.json"),
                    out = dir_->file("drop_c.h5"), jn = dir_->file("drop_n.json");
  // (r = 0.5: each window keeps fewer than one page of 64 slots, of the 96 positions)
  const std::string base = "--method token-filter --tf-ratio 0.5 --tf-warmup 8 --tf-num-layers 2 ";
  RunResult r = run_cmd(eval(base + "--tf-drop-skipped --json " + jc + " --out " + out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(eval(base + "--tf-drop-skipped --tf-drop-mode mask --json " + jm));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(eval(base + "--json " + jn));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto c = read_json(jc), m = read_json(jm), n = read_json(jn);
  EXPECT_FALSE(n.at("token_filter").contains("kv_cache"));
  const auto& kc = c.at("token_filter").at("kv_cache");
  const auto& km = m.at("token_filter").at("kv_cache");
  EXPECT_EQ(kc.at("mode"), "compacted");
  EXPECT_EQ(km.at("mode"), "masked");
  EXPECT_NEAR(c.at("perplexity").get<double>(), m.at("perplexity").get<double>(),
              1e-5 * m.at("perplexity").get<double>());
  // one call per window of 96 tokens, one sequence each: 96 positions written in each layer
  EXPECT_EQ(kc.at("calls").get<int>(), 3);
  const double written = kc.at("bytes_dense_final").get<double>();
  const double held = kc.at("bytes_held_final").get<double>();
  EXPECT_LT(held, written);
  EXPECT_EQ(km.at("bytes_held_final").get<double>(), held);  // the same tokens dropped
  EXPECT_LT(kc.at("bytes_allocated_peak").get<double>(),
            kc.at("bytes_allocated_dense").get<double>());
  EXPECT_EQ(km.at("bytes_allocated_peak").get<double>(),
            km.at("bytes_allocated_dense").get<double>());
  // the held bytes are the layers' held positions at the bytes of a position; the skipped
  // tokens of the last window are what the gated layers lack
  const auto& pl = kc.at("per_layer");
  ASSERT_EQ(pl.size(), 2u);
  double sum = 0;
  for (const auto& l : pl) {
    EXPECT_EQ(l.at("positions_final").get<double>(), 96.0);
    EXPECT_TRUE(l.at("gated").get<bool>());
    EXPECT_TRUE(l.at("compacted").get<bool>());
    sum += l.at("held_final").get<double>();
  }
  EXPECT_NEAR(sum / (2 * 96.0), held / written, 1e-12);
  io::H5File f = io::H5File::open_read(out);
  io::Group g = f.root().open_group("token_filter").open_group("kv_cache");
  std::vector<hsize_t> dims;
  const auto hf = g.read<double>("held_final", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{2}));
  EXPECT_EQ(hf[0], pl[0].at("held_final").get<double>());
  EXPECT_EQ(hf[1], pl[1].at("held_final").get<double>());
}

TEST_F(CliTokenFilter, BenchReportsKvBytesAgainstDense) {
  const std::string js = dir_->file("bench_drop.json");
  RunResult r = run_cmd(sparsim_bin() + " bench --model " + model_ +
                        " --prompt 24 --decode 8 --reps 1 --batch 4 --method token-filter"
                        " --tf-ratio 0.5 --tf-warmup 8 --tf-drop-skipped --json " +
                        js);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("KV cache, all layers, 4 sequences"), std::string::npos) << r.output;
  const auto j = read_json(js);
  const auto& kv = j.at("kv_bytes");
  EXPECT_LT(kv.at("held_final").get<double>(), kv.at("dense_final").get<double>());
  EXPECT_GT(kv.at("held_final").get<double>(), 0.0);
  EXPECT_EQ(kv.at("dense_allocated").get<double>(), j.at("dense_kv_bytes_allocated").get<double>());
  // the tiny model's context is one page: the buffers grow to it
  EXPECT_LE(kv.at("allocated_peak").get<double>(), kv.at("dense_allocated").get<double>());
}

TEST_F(CliTokenFilter, BadInputFailsWithoutOutput) {
  const std::string js = dir_->file("bad.json"), out = dir_->file("bad.h5");
  const std::string sink = " --json " + js + " --out " + out;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--method token-filter --tf-ratio 1", "--tf-ratio"},
      {"--method token-filter --tf-ratio -0.2", "--tf-ratio"},
      {"--method token-filter --tf-ratio 0.6 --tf-num-layers 1", "above 1"},
      {"--method token-filter --tf-warmup 200", "--tf-warmup"},
      {"--method token-filter --tf-criterion cosine", "--tf-criterion"},
      {"--method token-filter --tf-layers middle", "--tf-layers"},
      {"--method token-filter --tf-keys both", "--tf-keys"},
      {"--tf-ratio 0.3", "add token-filter to --method"},
      {"--method token-filter+token-filter", "twice"},
      {"--method teal+wina", "at most one"},
      {"--method token-filter --tf-drop-mode compact", "add --tf-drop-skipped"},
      {"--method token-filter --tf-drop-skipped --tf-drop-mode shrink", "--tf-drop-mode"},
      {"--method token-filter+think --tf-drop-skipped --tf-drop-mode compact", "masked"},
      {"--tf-drop-skipped", "add token-filter to --method"},
      {"--no-perplexity --task passkey --retrieval-lengths 4096", "context"},
      {"--no-perplexity --task haystack", "--task"},
      {"--no-perplexity --task passkey --retrieval-depths 0,1.5", "outside"},
  };
  expect_each_fails(cases, [&](const std::string& a) { return eval(a + sink); }, {js, out});
}

}  // namespace
}  // namespace sparsim::test
