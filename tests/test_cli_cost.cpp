// The FLOP ledger of real runs against FLOPs counted independently from the model's shapes and
// the masks the run recorded (dense forward, and eval with each activation-sparsity method);
// sparsim flops and sparsim predict on those run files; bad input.
#include "cli_fixture.hpp"
#include "flops/ledger_file.hpp"
#include "io/hdf5.hpp"
#include "io/run_file.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

const char* kTokens = "1,5,9,300,42,17,260,7,7,511,100,3";  // 12 tokens
constexpr int kT = 12, kGreedy = 3;

/// The tiny model's projections: output rows and input width.
struct Shape {
  const char* op;
  const char* proj;
  int out, in;
};
const Shape kShapes[] = {{"q_proj", "q", 64, 64},        {"k_proj", "k", 32, 64},
                         {"v_proj", "v", 32, 64},        {"o_proj", "o", 64, 64},
                         {"gate_proj", "gate", 128, 64}, {"up_proj", "up", 128, 64},
                         {"down_proj", "down", 64, 128}};

nlohmann::json run_json(const std::string& cmd) {
  const RunResult r = run_cmd(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  try {
    return nlohmann::json::parse(r.output);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON (" << e.what() << "): " << r.output;
    return {};
  }
}

class CliCost : public TinyModelCli<CliCost> {
 protected:
  static void SetUpTestSuite() {
    make_tiny({31, 5, 6000, 11});
    for (const char* st : {"f32", "bf16"}) {
      const RunResult r =
          run_cmd(sparsim_bin() + " forward --model " + model_ + " --tokens " + kTokens +
                  " --greedy " + std::to_string(kGreedy) + " --storage " + st +
                  " --log-level error --out " + dir_->file(std::string("fwd-") + st + ".h5"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
  }
  static std::string fwd(const char* storage) {
    return dir_->file(std::string("fwd-") + storage + ".h5");
  }
};

// Dense forward: every projection, the LM head and attention counted from the shapes.
TEST_F(CliCost, ForwardLedgerEqualsFlopsCountedFromTheShapes) {
  const flops::LedgerFile lf = flops::read_ledger_file(fwd("f32"));
  const flops::LedgerFile lb = flops::read_ledger_file(fwd("bf16"));
  const auto pre = static_cast<std::size_t>(lf.phase_index("prefill"));
  const auto dec = static_cast<std::size_t>(lf.phase_index("decode"));
  EXPECT_EQ(lf.calls[pre], 1);
  EXPECT_EQ(lf.tokens[pre], kT);
  EXPECT_EQ(lf.calls[dec], kGreedy);
  EXPECT_EQ(lf.tokens[dec], kGreedy);
  const int L = 2;
  for (const Shape& s : kShapes) {
    const auto o = static_cast<std::size_t>(lf.op_index(s.op));
    const double per_token = 2.0 * s.out * s.in * L;
    const flops::Cell p = lf.op_total(pre, o), d = lf.op_total(dec, o);
    EXPECT_DOUBLE_EQ(p.flops_dense, per_token * kT) << s.op;
    EXPECT_DOUBLE_EQ(p.flops_realised, per_token * kT) << s.op;
    EXPECT_DOUBLE_EQ(d.flops_dense, per_token * kGreedy) << s.op;
    EXPECT_DOUBLE_EQ(p.launches, L) << s.op;
    EXPECT_DOUBLE_EQ(d.launches, L * kGreedy) << s.op;
    // weights once per launch in the storage type, activations in and out as fp32
    EXPECT_DOUBLE_EQ(p.bytes_dense, L * (4.0 * s.out * s.in + 4.0 * kT * (s.out + s.in))) << s.op;
    const flops::Cell pb = lb.op_total(pre, o), db = lb.op_total(dec, o);
    EXPECT_DOUBLE_EQ(p.bytes_dense - pb.bytes_dense, L * 2.0 * s.out * s.in) << s.op;
    EXPECT_DOUBLE_EQ(d.bytes_dense - db.bytes_dense, L * kGreedy * 2.0 * s.out * s.in) << s.op;
    EXPECT_DOUBLE_EQ(pb.flops_dense, p.flops_dense) << s.op;
  }
  const auto head = static_cast<std::size_t>(lf.op_index("lm_head"));
  EXPECT_DOUBLE_EQ(lf.op_total(pre, head).flops_dense, 2.0 * kT * 512 * 64);
  EXPECT_DOUBLE_EQ(lf.op_total(dec, head).flops_dense, 2.0 * kGreedy * 512 * 64);
  // attention: every query position against every cached one, 4 heads of 16
  const auto score = static_cast<std::size_t>(lf.op_index("attn_score"));
  double pairs_pre = 0, pairs_dec = 0;
  for (int t = 0; t < kT; ++t) pairs_pre += t + 1;
  for (int g = 0; g < kGreedy; ++g) pairs_dec += kT + g + 1;
  EXPECT_DOUBLE_EQ(lf.op_total(pre, score).flops_dense, L * 2.0 * pairs_pre * 4 * 16);
  EXPECT_DOUBLE_EQ(lf.op_total(dec, score).flops_dense, L * 2.0 * pairs_dec * 4 * 16);
  // a dense run realises exactly its dense cost and adds nothing
  for (std::size_t p = 0; p < lf.num_phases(); ++p) {
    const flops::Cell t = lf.phase_total(p);
    EXPECT_DOUBLE_EQ(t.flops_realised, t.flops_dense);
    EXPECT_DOUBLE_EQ(t.bytes_realised, t.bytes_dense);
  }
}

// bench --profile at batch B profiles the calls it times: B sequences in the prefill and in
// every decode step (the profiled run once decoded one sequence while the timings were of B).
TEST_F(CliCost, BenchProfilesTheBatchItTimes) {
  constexpr int kPrompt = 16, kDecode = 5;
  nlohmann::json w[2];
  double step_bytes[2] = {};
  for (const int b : {1, 2}) {
    const std::string js = dir_->file("bench-b" + std::to_string(b) + ".json");
    const RunResult r =
        run_cmd(sparsim_bin() + " bench --model " + model_ + " --prompt " +
                std::to_string(kPrompt) + " --decode " + std::to_string(kDecode) +
                " --reps 1 --profile --batch " + std::to_string(b) + " --json " + js);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    if (b == 2) {
      EXPECT_NE(r.output.find("2 x 16 tokens"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("decode time by op (profiled run, batch 2)"), std::string::npos);
    }
    const nlohmann::json all = read_json(js);
    w[b - 1] = all.at("profile_work");
    // the weights a decode step reads: the same whatever the batch (the old key is kept)
    step_bytes[b - 1] = all.at("decode_weight_bytes_per_step").get<double>();
    EXPECT_EQ(step_bytes[b - 1], all.at("decode_weight_bytes_per_token").get<double>());
    EXPECT_EQ(w[b - 1].at("batch").get<int>(), b);
    EXPECT_EQ(w[b - 1].at("decode_steps").get<int>(), kDecode - 1);
  }
  // one sequence: at least the projections of every profiled token, and the head of every
  // decode step (a prefill computes the last position's logits only)
  const int L = 2;
  double proj = 0;
  for (const Shape& s : kShapes) proj += 2.0 * s.out * s.in * L;
  const double head = 2.0 * 512 * 64;
  EXPECT_GE(w[0].at("prefill_flops").get<double>(), proj * kPrompt + head);
  EXPECT_GE(w[0].at("decode_flops").get<double>(), (proj + head) * (kDecode - 1));
  // two sequences at the same positions: twice the work, the weights still read once a step
  EXPECT_DOUBLE_EQ(w[1].at("prefill_flops").get<double>(),
                   2 * w[0].at("prefill_flops").get<double>());
  EXPECT_DOUBLE_EQ(w[1].at("decode_flops").get<double>(),
                   2 * w[0].at("decode_flops").get<double>());
  EXPECT_LT(w[1].at("decode_bytes").get<double>(), 2 * w[0].at("decode_bytes").get<double>());
  EXPECT_GT(step_bytes[0], 0.0);
  EXPECT_EQ(step_bytes[1], step_bytes[0]);
}

// eval with each method, every sparsified row dumped: the ledger's realised FLOPs of every
// projection equal 2 · out · (dense rows · d + Σ kept entries of the recorded masks); mask
// selection counts one compare per sparsified entry; WINA's re-rotation 2 · n · d² twice a
// layer; all of it absent from the dense column.
TEST_F(CliCost, MethodLedgerEqualsFlopsCountedFromTheRecordedMasks) {
  const std::string cal = dir_->file("cal.h5");
  RunResult r = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " + corpus_ +
                        " --out " + cal +
                        " --context 128 --max-windows 2 --greedy-seqs 2 --greedy-tokens 32"
                        " --alpha 0.05 --log-level error");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string m : {"teal", "wina", "topk-guided"}) {
    const std::string out = dir_->file("eval-" + m + ".h5");
    r = run_cmd(sparsim_bin() + " eval --model " + model_ + " --corpus " + corpus_ +
                " --context 96 --stride 48 --max-windows 2 --method " + m +
                " --sparsity 0.5 --calibration " + cal +
                " --dump-layers 0,1 --dump-tokens 1000000 --log-level error --out " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const flops::LedgerFile lf = flops::read_ledger_file(out);
    EXPECT_EQ(lf.run.method, m);
    const auto pre = static_cast<std::size_t>(lf.phase_index("prefill"));
    const double n = static_cast<double>(lf.tokens[pre]);
    ASSERT_GT(n, 0);
    const io::H5File f = io::H5File::open_read(out);
    const auto sel = static_cast<std::size_t>(lf.op_index("mask_select"));
    const auto rot = static_cast<std::size_t>(lf.op_index("rotation"));
    double masked_rows = 0;
    for (int layer = 0; layer < 2; ++layer) {
      double select = 0;
      for (const Shape& s : kShapes) {
        const io::Group g =
            f.root().open_group("activations/layer_" + std::to_string(layer) + "/" + s.proj);
        std::vector<hsize_t> dims;
        const std::vector<std::uint8_t> kept = g.read<std::uint8_t>("kept", &dims);
        const auto seen = static_cast<double>(g.get_attr<std::int64_t>("sparse_rows_seen"));
        ASSERT_EQ(static_cast<double>(dims[0]), seen) << m << " every row must be dumped";
        double kept_sum = 0;
        for (std::uint8_t k : kept) kept_sum += k;
        const std::string what = m + " layer " + std::to_string(layer) + " " + s.op;
        const flops::Cell c = lf.at(pre, static_cast<std::size_t>(lf.op_index(s.op)),
                                    static_cast<std::size_t>(layer + 1));
        EXPECT_DOUBLE_EQ(c.flops_dense, 2.0 * s.out * n * s.in) << what;
        EXPECT_DOUBLE_EQ(c.flops_realised, 2.0 * s.out * ((n - seen) * s.in + kept_sum)) << what;
        select += seen * s.in;
        masked_rows += seen;
      }
      const flops::Cell cs = lf.at(pre, sel, static_cast<std::size_t>(layer + 1));
      EXPECT_DOUBLE_EQ(cs.flops_realised, select) << m << " layer " << layer;
      EXPECT_DOUBLE_EQ(cs.flops_dense, 0.0);
      const flops::Cell cr = lf.at(pre, rot, static_cast<std::size_t>(layer + 1));
      EXPECT_DOUBLE_EQ(cr.flops_realised, m == "teal" ? 0.0 : 2 * 2.0 * n * 64 * 64) << m;
      EXPECT_DOUBLE_EQ(cr.flops_dense, 0.0);
    }
    EXPECT_GT(masked_rows, 0) << m;

    // flops --json: per phase and per op the same numbers; the method's additions marked
    const nlohmann::json j = run_json(sparsim_bin() + " flops " + out + " --json");
    const auto& ph = j["phases"]["prefill"];
    const flops::Cell all = lf.phase_total(pre);
    EXPECT_DOUBLE_EQ(ph["dense_flops"].get<double>(), all.flops_dense);
    EXPECT_DOUBLE_EQ(ph["realised_flops"].get<double>(), all.flops_realised);
    EXPECT_DOUBLE_EQ(ph["dense_bytes"].get<double>(), all.bytes_dense);
    EXPECT_DOUBLE_EQ(ph["realised_bytes"].get<double>(), all.bytes_realised);
    EXPECT_LT(all.flops_realised, all.flops_dense) << m;
    EXPECT_TRUE(ph["ops"]["mask_select"]["method_overhead"].get<bool>());
    EXPECT_EQ(ph["ops"].contains("rotation"), m != "teal");
    // predict: the method's speedup over dense on an H200 comes from the same ledger
    const nlohmann::json p =
        run_json(sparsim_bin() + " predict " + out + " --hardware h200 --json");
    EXPECT_GT(p["speedup_vs_dense"]["prefill"].get<double>(), 0.0);
    EXPECT_EQ(p["run"]["method"], m);
  }
}

TEST_F(CliCost, FlopsReportOnRunFiles) {
  const flops::LedgerFile lf = flops::read_ledger_file(fwd("f32"));
  const io::H5File f = io::H5File::open_read(fwd("f32"));
  const io::Group g = f.root().open_group("flops");
  const nlohmann::json j = run_json(sparsim_bin() + " flops " + fwd("f32") + " --json");
  for (const char* phase : {"prefill", "decode"}) {
    const auto& ph = j["phases"][phase];
    const std::string p = phase;
    EXPECT_DOUBLE_EQ(ph["dense_flops"].get<double>(), g.get_attr<double>(p + "_flops_dense"));
    EXPECT_DOUBLE_EQ(ph["realised_flops"].get<double>(), g.get_attr<double>(p + "_flops_realised"));
    EXPECT_DOUBLE_EQ(ph["dense_bytes"].get<double>(), g.get_attr<double>(p + "_bytes_dense"));
    EXPECT_DOUBLE_EQ(ph["realised_bytes"].get<double>(), g.get_attr<double>(p + "_bytes_realised"));
    EXPECT_EQ(ph["calls"].get<int>(), p == "prefill" ? 1 : kGreedy);
    double sum = 0;
    for (const auto& [op, e] : ph["ops"].items()) {
      for (const char* k : {"dense_flops", "realised_flops", "dense_bytes", "realised_bytes"})
        EXPECT_TRUE(e.contains(k)) << op << " " << k;
      sum += e["realised_flops"].get<double>();
    }
    EXPECT_NEAR(sum, ph["realised_flops"].get<double>(), 1e-6 * sum);
    EXPECT_EQ(ph["layers"].size(), 3u);  // non-layer, 0, 1
  }
  EXPECT_EQ(j["model"]["storage"], "f32");
  // two runs side by side, every format
  const std::string both = fwd("f32") + " " + fwd("bf16");
  RunResult r = run_cmd(sparsim_bin() + " flops " + both);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"side by side", "q_proj", "prefill: 1 call, 12 tokens", "decode: 3 calls",
                        "bf16 weights", "FLOP/byte"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  r = run_cmd(sparsim_bin() + " flops " + both + " --by layer --markdown");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| layer |"), std::string::npos) << r.output;
  const std::string csv = dir_->file("ledger.csv");
  r = run_cmd(sparsim_bin() + " flops " + both + " --csv --out " + csv);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(csv);
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("run,file,method,phase,op,layer,launches,", 0), 0u) << header;
  int rows = 0;
  double q_pre_a = 0;
  while (std::getline(in, line)) {
    ++rows;
    if (line.rfind("A,", 0) == 0 && line.find(",prefill,q_proj,") != std::string::npos) {
      const std::size_t c = line.find(",prefill,q_proj,");
      std::stringstream ss(line.substr(c + 16));
      std::string layer, launches, fd;
      std::getline(ss, layer, ',');
      std::getline(ss, launches, ',');
      std::getline(ss, fd, ',');
      q_pre_a += std::stod(fd);
    }
  }
  EXPECT_GT(rows, 40);
  EXPECT_DOUBLE_EQ(q_pre_a, 2.0 * 64 * 64 * 2 * kT);
  const nlohmann::json two = run_json(sparsim_bin() + " flops " + both + " --json");
  ASSERT_EQ(two["runs"].size(), 2u);
  EXPECT_EQ(two["runs"][1]["model"]["storage"], "bf16");
}

TEST_F(CliCost, PredictOnRunFilesFollowsTheProfile) {
  const nlohmann::json hw = read_json(std::string(SPARSIM_SOURCE_DIR) + "/data/hardware/h200.json");
  const double P = hw["peak_flops"]["fp32"].get<double>(), W = hw["memory_bandwidth"].get<double>();
  const double tl = hw["launch_overhead_s"].get<double>();
  const nlohmann::json j =
      run_json(sparsim_bin() + " predict " + fwd("f32") + " --hardware h200 --json");
  for (const char* k : {"prefill_tokens_per_s", "decode_tokens_per_s", "speedup_vs_dense", "per_op",
                        "per_layer", "phases", "notes"})
    EXPECT_TRUE(j.contains(k)) << k;
  double pre = 0, dec = 0;
  for (const auto& e : j["per_op"]) {
    // every op's time: the roofline of its own FLOPs and bytes, and the fixed cost of the
    // kernels it owns (an op fused into another op's kernel pays none)
    const double want = std::max(e["flops"].get<double>() / P, e["bytes"].get<double>() / W) +
                        e["kernels"].get<double>() * tl;
    EXPECT_NEAR(e["seconds"].get<double>(), want, 1e-12 * want + 1e-18) << e["op"];
    (e["phase"] == "prefill" ? pre : dec) += e["seconds"].get<double>();
  }
  EXPECT_NEAR(j["prefill_tokens_per_s"].get<double>(), kT / pre, 1e-9 * kT / pre);
  EXPECT_NEAR(j["decode_tokens_per_s"].get<double>(), kGreedy / dec, 1e-9 * kGreedy / dec);
  // a dense run is its own dense baseline
  EXPECT_DOUBLE_EQ(j["speedup_vs_dense"]["prefill"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["speedup_vs_dense"]["decode"].get<double>(), 1.0);
  // bf16 weights read half the weight bytes: decode (memory-bound) gets faster
  const nlohmann::json jb =
      run_json(sparsim_bin() + " predict " + fwd("bf16") + " --hardware h200 --json");
  EXPECT_LT(jb["phases"]["decode"]["memory_seconds"].get<double>(),
            j["phases"]["decode"]["memory_seconds"].get<double>());
  // Tensor Core precision and the A100: a slower memory roof, so a slower decode
  const nlohmann::json ja = run_json(sparsim_bin() + " predict " + fwd("f32") +
                                     " --hardware a100-80gb --precision bf16 --json");
  EXPECT_EQ(ja["precision"], "bf16");
  EXPECT_LT(ja["decode_tokens_per_s"].get<double>(), j["decode_tokens_per_s"].get<double>());
  // the text report
  const RunResult r =
      run_cmd(sparsim_bin() + " predict " + fwd("f32") + " --hardware h200 --by-layer");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"NVIDIA H200", "prefill by op", "decode by layer", "tok/s", "q_proj"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  const RunResult l = run_cmd(sparsim_bin() + " predict --list");
  ASSERT_EQ(l.exit_code, 0) << l.output;
  EXPECT_NE(l.output.find("a100-40gb"), std::string::npos) << l.output;
}

TEST_F(CliCost, BadInputFailsWithAReasonAndWritesNothing) {
  const std::string out = dir_->file("report.out");
  const std::string text = dir_->file("text.h5");
  std::ofstream(text) << "not hdf5\n";
  const std::string profile = dir_->file("incomplete.json");
  {
    nlohmann::json p = read_json(std::string(SPARSIM_SOURCE_DIR) + "/data/hardware/h200.json");
    p.erase("memory_bandwidth");
    std::ofstream(profile) << p.dump(2);
  }
  const std::string cal = dir_->file("not-a-run.h5");
  {
    io::H5File f = io::H5File::create(cal);
    f.root().set_attr("format", "sparsim-calibration");
    f.close();
  }
  // a run file of this program without a ledger
  const std::string noledger = dir_->file("noledger.h5");
  {
    io::H5File f = io::H5File::create(noledger);
    io::Group run = f.root().create_group("run");
    run.set_attr("format", io::kRunFormat);
    run.set_attr("schema_version", io::kRunSchemaVersion);
    run.set_attr("command", "sparsim calibrate ...");
    run.set_attr("version", "test");
    f.close();
  }
  // a real run file cut short (as when a copy is interrupted)
  const std::string cut = dir_->file("truncated.h5");
  {
    std::ifstream in(fwd("f32"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 4096u);
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  struct Case {
    std::string args, needle;
  };
  const std::string run = fwd("f32");
  const std::vector<Case> cases = {
      {"flops", "no run file given"},
      {"flops " + dir_->file("none.h5"), "none.h5"},
      {"flops " + text, "cannot read run file"},
      {"flops " + cal, "not a run file"},
      {"flops " + run + " --json --csv", "exclude each other"},
      {"flops " + run + " --by token", "--by must be op or layer"},
      {"predict " + run, "--hardware is required"},
      {"predict " + run + " --hardware tpu-v9", "unknown hardware profile 'tpu-v9'"},
      {"predict " + run + " --hardware " + profile, "missing field 'memory_bandwidth'"},
      {"predict " + run + " --hardware h200 --precision fp8", "no peak FLOP/s for precision 'fp8'"},
      {"predict " + cal + " --hardware h200", "not a run file"},
      {"predict --hardware h200", "no run file given"},
      {"flops " + noledger, "no FLOP ledger"},
      {"predict " + noledger + " --hardware h200", "no FLOP ledger"},
      {"flops " + cut, "truncated.h5"},
      {"predict " + cut + " --hardware a100-80gb --json", "truncated.h5"},
      {"flops " + run + " " + cut, "truncated.h5"},
  };
  for (const Case& c : cases) {
    const RunResult r = run_cmd(sparsim_bin() + " " + c.args + " --out " + out);
    EXPECT_NE(r.exit_code, 0) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos)
        << c.args << ": expected '" << c.needle << "' in: " << r.output;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  for (const auto& e : fs::directory_iterator(dir_->path()))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

}  // namespace
}  // namespace sparsim::test
