// sparsim calibrate --fisher and sparsim prune end to end on a tiny model: the JSON summary, the
// pruned model run by eval / generate / bench / inspect, thread-count independence, bad input.
#include "cli_fixture.hpp"
#include "io/hdf5.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliPrune : public TinyModelCli<CliPrune> {
 protected:
  static void SetUpTestSuite() {
    ASSERT_NO_FATAL_FAILURE(make_tiny_fisher({41, 5, 3000, 9}));
    make_other(42);
    // Q4_1 with 16 heads: W_o rows of any even head width are whole 32-blocks, cut through them
    SynthSpec s = tiny_spec(43);
    s.type = gguf::GGMLType::Q4_1;
    s.cfg.n_head = 16;
    s.cfg.n_kv_head = 4;
    s.cfg.d_model = 256;
    q41_ = make_model(*dir_, "q41.gguf", s);
    q41_calib_ = dir_->file("q41-fisher.h5");
    const RunResult cq = calibrate_fisher(q41_, q41_calib_, 2, 48);
    ASSERT_EQ(cq.exit_code, 0) << cq.output;
  }

  static std::string prune(const std::string& method, const std::string& retain,
                           const std::string& out, const std::string& extra = "") {
    return sparsim_bin() + " prune --model " + model_ + " --method " + method + " --retain " +
           retain + " --calibration " + calib_ + " --out " + out + " --flops-context 64 " + extra;
  }

  static std::string prune_q41(const std::string& out, const std::string& extra) {
    return sparsim_bin() + " prune --model " + q41_ + " --retain 0.5 --calibration " + q41_calib_ +
           " --out " + out + " --flops-context 64 " + extra;
  }

  inline static std::string q41_, q41_calib_;
};

TEST_F(CliPrune, CalibrationHoldsFisherScores) {
  io::H5File f = io::H5File::open_read(calib_);
  const io::Group g = f.root().open_group("fisher");
  std::vector<hsize_t> dims;
  const auto k = g.read<double>("k", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{2, 32}));
  g.read<double>("pair", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{2, 2, 8}));
  g.read<double>("gate_grad_v", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{3, 2, 32}));
  double s = 0;
  for (double x : k) {
    EXPECT_GE(x, 0);
    s += x;
  }
  EXPECT_GT(s, 0);
  EXPECT_EQ(f.root().get_attr<std::string>("model_fingerprint").size(), 16u);
  EXPECT_EQ(f.root().get_attr<std::string>("corpus_fingerprint").size(), 16u);
}

TEST_F(CliPrune, PrunedModelRunsEverywhereWithTheSameSummary) {
  for (const std::string m : {"rap", "kvpruner"}) {
    const std::string out = dir_->file(m + ".gguf"), js = dir_->file(m + ".json");
    const RunResult r = run_cmd(prune(m, "0.5", out, "--json " + js));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = read_json(js);
    EXPECT_EQ(j.at("method"), m);
    EXPECT_DOUBLE_EQ(j.at("retain").get<double>(), 0.5);
    for (const char* k :
         {"orphan_ratio", "kv_bytes_fraction", "attn_params_fraction", "attn_flops_fraction"})
      ASSERT_TRUE(j.contains(k)) << k;
    if (m == "rap") {
      EXPECT_EQ(j.at("orphan_ratio").get<double>(), 0.0);
    }
    EXPECT_NEAR(j.at("kv_bytes_fraction").get<double>(), 0.5, 0.07);
    EXPECT_EQ(j.at("layers").size(), 2u);

    const std::string ejs = dir_->file(m + "-eval.json"), run = dir_->file(m + "-eval.h5");
    const RunResult e = run_cmd(eval_of(out, "--json " + ejs + " --out " + run));
    ASSERT_EQ(e.exit_code, 0) << e.output;
    const auto ej = read_json(ejs);
    ASSERT_TRUE(ej.contains("pruned"));
    nlohmann::json block = j;  // prune's summary without what only prune knows
    for (const char* k : {"source", "output", "calibration", "layer_sigma", "n_params",
                          "n_params_full", "command", "tensor_types", "file_bytes", "switches"})
      block.erase(k);
    EXPECT_EQ(ej.at("pruned"), block);
    EXPECT_TRUE(std::isfinite(ej.at("perplexity").get<double>()));
    io::H5File rf = io::H5File::open_read(run);
    EXPECT_EQ(rf.root().open_group("pruned").get_attr<std::string>("method"), m);

    const RunResult g = run_cmd(generate_of(out));
    EXPECT_EQ(g.exit_code, 0) << g.output;
    const RunResult b =
        run_cmd(sparsim_bin() + " bench --model " + out + " --prompt 16 --decode 4 --reps 1");
    EXPECT_EQ(b.exit_code, 0) << b.output;
    // its attention module against the full model's, decode steps only over a noise-filled cache
    const std::string bj = dir_->file(m + "-bl.json");
    const RunResult bl = run_cmd(sparsim_bin() + " bench --model " + out + " --baseline " + model_ +
                                 " --decode-only --prompt 16 --decode 4 --reps 3 --json " + bj);
    ASSERT_EQ(bl.exit_code, 0) << bl.output;
    EXPECT_NE(bl.output.find("not run (--decode-only)"), std::string::npos) << bl.output;
    const auto bb = read_json(bj);
    EXPECT_TRUE(bb.at("decode_only").get<bool>());
    EXPECT_GT(bb.at("attention_decode_ratio").get<double>(), 0.0);
    EXPECT_EQ(bb.at("pruned").at("method"), m);
    EXPECT_EQ(bb.at("attention_decode_op_seconds").at("model").at("attn_score").size(), 3u);
    // the load order is swapped for the second half of the repetitions
    EXPECT_EQ(bb.at("loaded_first"), nlohmann::json::array({0, 0, 1}));
    EXPECT_GT(bb.at("attention_decode_ratio_by_load_order").at("model_first").get<double>(), 0.0);
    EXPECT_GT(bb.at("attention_decode_ratio_by_load_order").at("baseline_first").get<double>(),
              0.0);
    EXPECT_NE(bl.output.find("load order swapped halfway"), std::string::npos) << bl.output;
    const RunResult i = run_cmd(sparsim_bin() + " inspect " + out);
    ASSERT_EQ(i.exit_code, 0) << i.output;
    EXPECT_NE(i.output.find("pruned     " + m), std::string::npos) << i.output;
    EXPECT_NE(i.output.find("orphans"), std::string::npos) << i.output;
  }
}

// A Q4_1 model: by default W_o (cut through its blocks) is written exactly in F32 and the
// summary, the text and the metadata say so; --type source requantizes it in Q4_1 (smaller,
// lossy) and the model evaluates.
TEST_F(CliPrune, QuantizedSourceReportsTensorTypesAndSizes) {
  const std::string a = dir_->file("q-auto.gguf"), aj = dir_->file("q-auto.json");
  const RunResult r = run_cmd(prune_q41(a, "--json " + aj));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("changed: attn_output Q4_1 -> F32 (exact) in 2 layers"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("file size:"), std::string::npos) << r.output;
  // F32 columns against Q4_1 blocks: larger than the source, which is said with the way out
  ASSERT_GT(fs::file_size(a), fs::file_size(q41_));
  EXPECT_NE(r.output.find("LARGER than its source: the tensors above were widened to keep their "
                          "values exact; --type source or --type q8_0 requantizes them (lossy)"),
            std::string::npos)
      << r.output;
  const auto j = read_json(aj);
  const auto& tt = j.at("tensor_types");
  EXPECT_EQ(tt.at("option"), "auto");
  ASSERT_EQ(tt.at("changed").size(), 2u);
  for (int l = 0; l < 2; ++l) {
    const auto& c = tt.at("changed")[l];
    EXPECT_EQ(c.at("name"), "blk." + std::to_string(l) + ".attn_output.weight");
    EXPECT_EQ(c.at("from"), "Q4_1");
    EXPECT_EQ(c.at("to"), "F32");
    EXPECT_TRUE(c.at("exact").get<bool>());
  }
  const std::size_t n_tensors = gguf::File::open(q41_).tensors().size();
  EXPECT_EQ(tt.at("kept").get<std::size_t>() + 2, n_tensors);
  EXPECT_EQ(j.at("file_bytes").at("output").get<std::uintmax_t>(), fs::file_size(a));
  EXPECT_EQ(j.at("file_bytes").at("source").get<std::uintmax_t>(), fs::file_size(q41_));
  {
    gguf::File f = gguf::File::open(a);
    EXPECT_EQ(f.get_string("sparsim.prune.tensor_type").value_or(""), "auto");
    const auto retyped = f.get_string_array("sparsim.prune.retyped_tensors");
    ASSERT_TRUE(retyped.has_value());
    EXPECT_EQ(retyped->at(1), "blk.1.attn_output.weight Q4_1->F32 exact");
  }
  const RunResult i = run_cmd(sparsim_bin() + " inspect " + a);
  ASSERT_EQ(i.exit_code, 0) << i.output;
  EXPECT_NE(i.output.find("sparsim.prune.tensor_type"), std::string::npos) << i.output;

  const std::string q = dir_->file("q-source.gguf"), qj = dir_->file("q-source.json");
  const RunResult rs = run_cmd(prune_q41(q, "--type source --json " + qj));
  ASSERT_EQ(rs.exit_code, 0) << rs.output;
  EXPECT_NE(rs.output.find("attn_output requantized in Q4_1 (lossy) in 2 layers"),
            std::string::npos)
      << rs.output;
  const auto sj = read_json(qj);
  for (const auto& c : sj.at("tensor_types").at("changed")) {
    EXPECT_EQ(c.at("to"), "Q4_1");
    EXPECT_FALSE(c.at("exact").get<bool>());
  }
  EXPECT_LT(fs::file_size(q), fs::file_size(a));
  gguf::File fq = gguf::File::open(q);
  EXPECT_EQ(fq.require_tensor("blk.0.attn_output.weight").type, gguf::GGMLType::Q4_1);
  const std::string ejs = dir_->file("q-source-eval.json");
  const RunResult e = run_cmd(sparsim_bin() + " eval --model " + q + " --corpus " + corpus_ +
                              " --context 64 --stride 32 --max-windows 2 --json " + ejs);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_TRUE(std::isfinite(read_json(ejs).at("perplexity").get<double>()));
}

TEST_F(CliPrune, UnknownTypeIsRefusedWithoutOutput) {
  const std::string out = dir_->file("badtype.gguf");
  const RunResult r = run_cmd(prune_q41(out, "--type q9_9"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("'q9_9'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("source"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
}

// Fisher scores and the pruned model are the same bits for any thread count.
// The switches are recorded in the model and the JSON; magnitude scores need no calibration.
TEST_F(CliPrune, SwitchesAreRecordedAndMagnitudeNeedsNoCalibration) {
  const std::string out = dir_->file("mu.gguf"), js = dir_->file("mu.json");
  const RunResult r =
      run_cmd(sparsim_bin() + " prune --model " + model_ +
              " --retain 0.5 --score magnitude --budget uniform --out " + out + " --json " + js);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string recipe = "score=magnitude budget=uniform pair=joint k_share=0.5 kv=balanced";
  EXPECT_NE(r.output.find("recipe " + recipe), std::string::npos) << r.output;
  const auto j = read_json(js);
  EXPECT_EQ(j.at("recipe"), recipe);
  EXPECT_EQ(j.at("switches").at("score"), "magnitude");
  EXPECT_FALSE(j.contains("calibration"));
  gguf::File f = gguf::File::open(out);
  EXPECT_EQ(f.get_string("sparsim.prune.recipe").value_or(""), recipe);
  for (const auto& l : j.at("layers"))
    EXPECT_EQ(l.at("qk_head_dim"), j.at("layers")[0].at("qk_head_dim"));
  // and the eval summary of the pruned model carries it too
  const std::string ejs = dir_->file("mu-eval.json");
  ASSERT_EQ(run_cmd(sparsim_bin() + " eval --model " + out + " --corpus " + corpus_ +
                    " --context 64 --stride 32 --max-windows 1 --json " + ejs)
                .exit_code,
            0);
  EXPECT_EQ(read_json(ejs).at("pruned").at("recipe"), recipe);
}

TEST_F(CliPrune, ThreadCountDoesNotChangeFisherScores) {
  std::vector<double> first;
  for (const std::string t : {"1", "2"}) {
    const std::string cal = dir_->file("f" + t + ".h5");
    const RunResult c =
        run_cmd(sparsim_bin() + " calibrate --fisher --threads " + t + " --model " + model_ +
                " --corpus " + corpus_ + " --out " + cal + " --fisher-seqs 2 --fisher-tokens 40");
    ASSERT_EQ(c.exit_code, 0) << c.output;
    io::H5File f = io::H5File::open_read(cal);
    auto g = f.root().open_group("fisher").read<double>("gate_grad_k");
    const auto v = f.root().open_group("fisher").read<double>("gate_grad_v");
    g.insert(g.end(), v.begin(), v.end());
    if (first.empty())
      first = g;
    else
      EXPECT_EQ(g, first);
  }
}

TEST_F(CliPrune, BadInputFailsClearlyWithoutOutput) {
  const std::string out = dir_->file("bad.gguf");
  auto expect_fail = [&](const std::string& cmd, const std::string& needle) {
    expect_fails(cmd, needle, {out});
  };
  expect_fail(prune("rap", "0", out), "(0, 1]");
  expect_fail(prune("rap", "1.5", out), "(0, 1]");
  expect_fail(prune("rap", "-0.2", out), "(0, 1]");
  expect_fail(prune("rap", "nan", out), "(0, 1]");
  expect_fail(prune("magic", "0.5", out),
              "not rap, kvpruner, kvpruner-naive, palu, svd-llm, flap or slimgpt");
  // the ablation switches: unknown values, a K share K or V cannot hold
  expect_fail(prune("rap", "0.5", out, "--score entropy"), "'entropy' is not fisher or magnitude");
  expect_fail(prune("rap", "0.5", out, "--budget greedy"), "'greedy' is not adaptive or uniform");
  expect_fail(prune("rap", "0.5", out, "--pair-score max"), "'max' is not joint or additive");
  expect_fail(prune("rap", "0.5", out, "--k-share 1"), "--k-share must be in (0, 1)");
  expect_fail(prune("rap", "0.8", out, "--k-share 0.7"), "asks K to keep more than all");
  expect_fail(prune("rap", "0.8", out, "--k-share 0.3"), "asks V to keep more than all");
  expect_fail(prune("rap", "0.5", out, "--score magnitude --pair-score additive"),
              "--pair-score applies to Fisher scores only");
  expect_fail(sparsim_bin() + " prune --model " + model_ + " --retain 0.5 --out " + out,
              "--calibration FILE");
  expect_fail(prune("rap", "0.5", out, "--kv-budget shared"), "'shared' is not balanced or pooled");
  expect_fail(prune("rap", "0.5", out, "--kv-budget pooled --k-share 0.4"),
              "--k-share applies to balanced budgets");
  // Fisher scores of another model
  expect_fail(sparsim_bin() + " prune --model " + other_ + " --retain 0.5 --calibration " + calib_ +
                  " --out " + out,
              "was made for model fingerprint");
  // a calibration file without Fisher scores
  const std::string teal = dir_->file("teal.h5");
  ASSERT_EQ(run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " + corpus_ +
                    " --out " + teal +
                    " --variants plain --context 64 --max-windows 2 --greedy-seqs 2"
                    " --greedy-tokens 16 --alpha 0.2")
                .exit_code,
            0);
  expect_fail(
      prune("rap", "0.5", out).replace(prune("rap", "0.5", out).find(calib_), calib_.size(), teal),
      "no Fisher scores");
  // a model without RoPE metadata
  {
    gguf::File f = gguf::File::open(model_);
    gguf::Writer w;
    for (const auto& kv : f.metadata())
      if (kv.key != "general.alignment" && kv.key != "llama.rope.dimension_count" &&
          kv.key != "llama.rope.freq_base")
        w.set(kv.key, kv.value);
    for (const auto& t : f.tensors()) w.add_tensor(t.name, t.ne, t.type, t.data, t.nbytes);
    w.write(dir_->file("norope.gguf"));
  }
  expect_fail(sparsim_bin() + " prune --model " + dir_->file("norope.gguf") +
                  " --retain 0.5 --calibration " + calib_ + " --out " + out,
              "no RoPE metadata");
  // a pruned model cannot be pruned or Fisher-calibrated again
  const std::string p = dir_->file("once.gguf");
  ASSERT_EQ(run_cmd(prune("rap", "0.7", p)).exit_code, 0);
  expect_fail(sparsim_bin() + " calibrate --fisher --model " + p + " --corpus " + corpus_ +
                  " --out " + out + " --fisher-seqs 1 --fisher-tokens 16",
              "already pruned");
  // a corpus too short for the requested Fisher sequences
  expect_fail(sparsim_bin() + " calibrate --fisher --model " + model_ + " --corpus " + corpus_ +
                  " --out " + out + " --fisher-seqs 1000 --fisher-tokens 200",
              "corpus has");
}

}  // namespace
}  // namespace sparsim::test
