// sparsim calibrate and eval --method: an end-to-end run on a tiny model, and bad input.
#include "cli_fixture.hpp"
#include "io/hdf5.hpp"
#include "sparsity/calibration.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliSparsity : public TinyModelCli<CliSparsity> {
 protected:
  static void SetUpTestSuite() {
    // generated text: words over a small alphabet, enough tokens for a few windows
    make_tiny_calibrated({21, 3, 6000, 13});
    make_other(22);
  }

  static std::string eval(const std::string& extra) {
    return on_tiny("eval", "--context 128 --stride 64 --max-windows 3", extra);
  }
};

/// Input width of each projection of the tiny model (tiny_config) and its parameter count.
struct ProjShape {
  int d;
  double f;
};
ProjShape proj_shape(int i) {
  const Config c = tiny_config();
  const int in[kNumProj] = {c.d_model, c.d_model, c.d_model, c.q_dim(),
                            c.d_model, c.d_model, c.d_ff};
  const int out[kNumProj] = {c.q_dim(), c.kv_dim(), c.kv_dim(), c.d_model,
                             c.d_ff,    c.d_ff,     c.d_model};
  return {in[i], static_cast<double>(in[i]) * out[i]};
}

// Each method against what it guarantees: WINA keeps exactly max(1, ⌊d(1 − p_i)⌋) entries of
// every token, so every token's FLOP-weighted sparsity is one number, computed here from the
// targets; TopK-Guided keeps every projection of every token within [p_i − δ, p_i + δ + 1/d];
// TEAL's thresholds guarantee nothing per token (only that they were fitted on calibration
// data), so its check is loose.
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
    for (const char* p : {"q", "k", "v", "o", "gate", "up", "down"})
      EXPECT_TRUE(s.at("per_projection").contains(p)) << p;
    // what the targets imply, FLOP-weighted over every projection (unmasked ones dense)
    const auto targets = s.at("block_targets").get<std::vector<std::vector<double>>>();
    ASSERT_EQ(targets.size(), 2u);
    const double delta = m == "topk-guided" ? s.at("delta").get<double>() : 0.0;
    double F = 0, exact = 0, band_lo = 0, band_hi = 0;
    for (const auto& row : targets)
      for (int i = 0; i < kNumProj; ++i) {
        const ProjShape ps = proj_shape(i);
        const double p = static_cast<float>(row[static_cast<std::size_t>(i)]);  // masks use float p
        F += ps.f;
        if (p <= 0) continue;
        const double k = std::max(1.0, std::floor(ps.d * (1.0 - p)));
        exact += ps.f * (1.0 - k / ps.d);
        band_lo += ps.f * std::max(0.0, p - delta);
        band_hi += ps.f * std::min(1.0, p + delta + 1.0 / ps.d);
      }
    if (m == "wina") {
      EXPECT_NEAR(lo, exact / F, 1e-12);
      EXPECT_NEAR(hi, exact / F, 1e-12);
    } else if (m == "topk-guided") {
      EXPECT_GE(lo, band_lo / F - 1e-12);
      EXPECT_LE(hi, band_hi / F + 1e-12);
      EXPECT_LT(lo, hi);  // it adapts per token
    } else {
      EXPECT_NEAR(mean, 0.5, 0.15) << m;
    }
    // per layer and projection, from the run file
    io::H5File h = io::H5File::open_read(out);
    const io::Group g = h.root().open_group("sparsity");
    const auto tgt = g.read<double>("target"), mn = g.read<double>("realised_min"),
               mx = g.read<double>("realised_max");
    for (std::size_t e = 0; e < tgt.size(); ++e) {
      const int i = static_cast<int>(e % kNumProj);
      const double p = static_cast<float>(tgt[e]);
      if (p <= 0) continue;
      const int d = proj_shape(i).d;
      if (m == "wina") {
        const double x = 1.0 - std::max(1.0, std::floor(d * (1.0 - p))) / d;
        EXPECT_DOUBLE_EQ(mn[e], x) << e;
        EXPECT_DOUBLE_EQ(mx[e], x) << e;
      } else if (m == "topk-guided") {
        EXPECT_GE(mn[e], p - delta - 1e-9) << e;
        EXPECT_LE(mx[e], p + delta + 1.0 / d + 1e-9) << e;
      }
    }
    // the FLOP totals: a rotated method adds its re-rotation, shown apart
    const auto& fl = j.at("flops");
    EXPECT_LT(fl.at("realised").get<double>(), fl.at("dense").get<double>() * 1.5);
    EXPECT_EQ(fl.at("rotation").get<double>() > 0, m != "teal") << m;
    EXPECT_NEAR(fl.at("realised_over_dense").get<double>(),
                fl.at("realised").get<double>() / fl.at("dense").get<double>(), 1e-12);
    EXPECT_GT(j.at("bytes").at("dense").get<double>(), 0);
    EXPECT_TRUE(j.at("perplexity_spread").contains("ci95"));
    EXPECT_TRUE(fs::exists(out));
  }
}

// An evaluation whose masking settings the calibration's sensitivities were not probed with is
// refused, naming what the file holds; the settings it holds are accepted.
TEST_F(CliSparsity, EvalRefusesSettingsTheCalibrationContradicts) {
  const std::string base = "--method topk-guided --sparsity 0.5 --calibration " + calib_ + " ";
  for (const std::string bad : {"--delta 0.02", "--wina-norms all", "--sensitivity-from 2"}) {
    const RunResult r = run_cmd(eval(base + bad));
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.output.find("holds no sensitivities probed with this evaluation's settings"),
              std::string::npos)
        << bad << "\n"
        << r.output;
    EXPECT_NE(r.output.find("guided δ = 0.01, norms on k,gate, positions ≥ 0"), std::string::npos)
        << r.output;
  }
  for (const std::string ok :
       {"--masking topk", "--sensitivity-from 4", "--budget uniform --delta 0.02",
        "--greedy-lookup interpolate", "--rotation-storage bf16"}) {
    const RunResult r = run_cmd(eval(base + ok));
    EXPECT_EQ(r.exit_code, 0) << ok << "\n" << r.output;
  }
  const RunResult r = run_cmd(eval(base + "--greedy-lookup nearby"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--greedy-lookup"), std::string::npos) << r.output;
}

// compare: each configuration's perplexity and sparsity are eval's on the same windows.
TEST_F(CliSparsity, CompareEqualsEvalPerConfiguration) {
  const std::string cfgfile = dir_->file("configs.txt");
  {
    std::ofstream f(cfgfile);
    f << "# name: options\n"
         "dense: --method dense\n"
         "teal: --method teal --sparsity 0.5\n"
         "wina: --method wina --sparsity 0.5 --wina-norms all\n"
         "tkg: --method topk-guided --sparsity 0.5 --lambda 0.2 --greedy-lookup interpolate\n"
         "tkg16: --method topk-guided --sparsity 0.5 --rotation-storage bf16\n";
  }
  const std::string js = dir_->file("compare.json"), h5 = dir_->file("compare.h5");
  const RunResult c =
      run_cmd(sparsim_bin() + " compare --model " + model_ + " --corpus " + corpus_ +
              " --context 128 --stride 64 --max-windows 3 --calibration " + calib_ + " --configs " +
              cfgfile + " --json " + js + " --out " + h5);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  std::ifstream f(js);
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("protocol").at("windows").get<int>(), 3);
  const std::map<std::string, std::string> args = {
      {"dense", ""},
      {"teal", "--method teal --sparsity 0.5"},
      {"wina", "--method wina --sparsity 0.5 --wina-norms all"},
      {"tkg", "--method topk-guided --sparsity 0.5 --lambda 0.2 --greedy-lookup interpolate"},
      {"tkg16", "--method topk-guided --sparsity 0.5 --rotation-storage bf16"}};
  ASSERT_EQ(j.at("configs").size(), args.size());
  for (const auto& e : j.at("configs")) {
    const std::string name = e.at("name");
    const std::string ej = dir_->file("ev-" + name + ".json");
    const std::string cal = name == "dense" ? "" : " --calibration " + calib_;
    const RunResult r = run_cmd(eval(args.at(name) + cal + " --json " + ej));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream g(ej);
    const auto ev = nlohmann::json::parse(g);
    const double pc = e.at("perplexity"), pe = ev.at("perplexity");
    EXPECT_NEAR(pc, pe, 1e-6 * pe) << name;
    EXPECT_EQ(e.at("tokens_scored").get<int>(), ev.at("tokens_scored").get<int>()) << name;
    EXPECT_NEAR(e.at("flops").at("realised").get<double>(),
                ev.at("flops").at("realised").get<double>(),
                1e-9 * ev.at("flops").at("realised").get<double>())
        << name;
    if (name == "dense") continue;
    for (const char* k : {"realised_mean", "realised_min", "realised_max", "block_budget_mean"})
      EXPECT_NEAR(e.at("sparsity").at(k).get<double>(), ev.at("sparsity").at(k).get<double>(), 1e-9)
          << name << " " << k;
  }
  EXPECT_TRUE(fs::exists(h5));
  const RunResult bad =
      run_cmd(sparsim_bin() + " compare --model " + model_ + " --corpus " + corpus_ +
              " --context 128 --stride 64 --max-windows 1 --config 'x: --method "
              "topk-guided --sparsity 2' --calibration " +
              calib_ + " --json " + dir_->file("bad.json"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--config x"), std::string::npos) << bad.output;
  EXPECT_FALSE(fs::exists(dir_->file("bad.json")));
}

// calibrate reports every stage with an ETA, on a terminal or not, and records the stage times.
TEST_F(CliSparsity, CalibrateShowsProgressPerStage) {
  const std::string cal = dir_->file("cal_progress.h5");
  const RunResult c = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " +
                              corpus_ + " --out " + cal +
                              " --context 64 --max-windows 2 --greedy-seqs 2 --greedy-tokens 16"
                              " --alpha 0.1 --progress lines");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  for (const char* stage : {"plain: histograms", "plain: greedy", "plain: sensitivity",
                            "rotated: histograms", "rotated: greedy", "rotated: sensitivity"})
    EXPECT_NE(c.output.find(stage), std::string::npos) << stage << "\n" << c.output;
  EXPECT_NE(c.output.find("ETA"), std::string::npos);
  const sparsity::Calibration r = sparsity::read_calibration(cal);
  std::vector<std::string> stages;
  for (const auto& t : r.timings) stages.push_back(t.stage);
  EXPECT_EQ(stages, (std::vector<std::string>{
                        "histograms (plain)", "greedy (plain)", "sensitivity (plain)", "rotation",
                        "histograms (rotated)", "greedy (rotated)", "sensitivity (rotated)"}));
  EXPECT_EQ(r.greedy_seqs, 2);
  EXPECT_EQ(r.greedy_seq_tokens, 16);
  // plain: threshold probes; rotated: guided and topk; each over positions ≥ 0 and ≥ 4
  EXPECT_EQ(r.plain->sensitivity.size(), 2u);
  EXPECT_EQ(r.rotated->sensitivity.size(), 4u);
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
      // the bandwidth reference: arrays past the last-level cache, 11 runs, medians in range;
      // the ideal's bandwidth is the faster of the copy kernel and the runtime's copy
      const auto& bw = j.at("bandwidth");
      EXPECT_GE(bw.at("array_bytes").get<double>(), 256.0 * 1024 * 1024);
      EXPECT_EQ(bw.at("reps"), 11);
      EXPECT_EQ(
          std::max(bw.at("copy_median").get<double>(), bw.at("runtime_copy_median").get<double>()),
          j.at("copy_bandwidth_bytes_per_s").get<double>());
      EXPECT_EQ(bw.at("reference").get<double>(), j.at("copy_bandwidth_bytes_per_s").get<double>());
      EXPECT_LE(bw.at("runtime_copy_min").get<double>(), bw.at("runtime_copy_max").get<double>());
      EXPECT_LE(bw.at("copy_min").get<double>(), bw.at("copy_median").get<double>());
      EXPECT_LE(bw.at("copy_median").get<double>(), bw.at("copy_max").get<double>());
      EXPECT_LE(bw.at("read_min").get<double>(), bw.at("read_max").get<double>());
      const double sr = s.at("realised_projection_sparsity");
      EXPECT_NEAR(sr, 0.5, 0.15) << m;
      EXPECT_NEAR(s.at("ideal_speedup_projections").get<double>(), 1.0 / (1.0 - sr), 1e-9);
      // per projection: kept fractions that add up, FLOP-weighted, to the realised sparsity,
      // and the profiled times of both engines
      const auto& pj = s.at("projections");
      EXPECT_EQ(pj.size(), 7u);
      // per-step figures are over the profiled steps: all decoded tokens but the first
      EXPECT_EQ(s.at("profiled_decode_steps").get<int>(), j.at("decode_tokens").get<int>() - 1);
      double kept = 0, total = 0, kept_min = 1.0;
      for (const auto& [op, e] : pj.items()) {
        const double kf = e.at("kept_fraction"), fl = e.at("flops_dense_per_step");
        kept_min = std::min(kept_min, kf);
        EXPECT_GT(kf, 0.0) << op;
        EXPECT_LE(kf, 1.0) << op;
        EXPECT_GT(e.at("dense_seconds").get<double>(), 0.0) << op;
        EXPECT_GT(e.at("method_seconds").get<double>(), 0.0) << op;
        EXPECT_LE(e.at("bytes_realised_per_step").get<double>(),
                  e.at("bytes_dense_per_step").get<double>() * (1 + 1e-12))
            << op;
        kept += kf * fl;
        total += fl;
      }
      EXPECT_NEAR(1.0 - kept / total, sr, 1e-9);
      const double step = s.at("ideal_speedup_decode_step");
      EXPECT_GT(step, 0.5);
      // the step's ideal weighs each projection by its measured time (a tiny model's times are
      // noisy under load), the FLOP-weighted ideal by its FLOPs; whatever the times, no step can
      // shrink by more than its least-kept projection does
      EXPECT_LE(step, 1.0 / kept_min * (1 + 1e-9));
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
      {"--method topk-guided --probe 0.3 --calibration " + calib_,
       "probe level 0.3 was not calibrated"},
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
  for (const std::string a :
       {"--alpha 0", "--probes 0.2,x", "--probes 1.5", "--variants odd", "--greedy-tokens 1",
        "--delta 0.9", "--greedy-step-cap 2", "--probe-masking odd", "--wina-norms kg,kg",
        "--greedy-tokens 16 --sensitivity-from 40", "--progress maybe"}) {
    const RunResult b = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " +
                                corpus_ + " --out " + cal2 + " " + a);
    EXPECT_NE(b.exit_code, 0) << a;
    EXPECT_FALSE(fs::exists(cal2)) << a;
  }
}

}  // namespace
}  // namespace sparsim::test
