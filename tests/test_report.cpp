// The report generator (scripts/report.py) on real run files: every figure the page names exists
// and is a non-empty PNG; the page opens in headless Chromium without load errors (when Debian's
// chromium is installed); the docs' generated blocks agree with the committed files; bad input.
#include "helpers.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

std::string python() {
  if (const char* e = std::getenv("SPARSIM_PYTHON"); e && *e) return e;
  return SPARSIM_PYTHON;
}

std::string report(const std::string& args) {
  return python() + " " + std::string(SPARSIM_SOURCE_DIR) + "/scripts/report.py " + args;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool on_path(const std::string& prog) {
  return run_cmd("command -v " + prog).exit_code == 0;
}

class Report : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string model = make_model(*dir_, "m.gguf", tiny_spec(41));
    const std::string corpus = dir_->file("corpus.txt");
    write_word_corpus(corpus, 9, 4000, 11);
    const std::string bin = sparsim_bin() + " ";
    const std::string cal = dir_->file("cal.h5");
    const std::vector<std::string> cmds = {
        bin + "forward --model " + model + " --tokens 1,2,3,4,5,6,7,8 --greedy 4 --out " +
            dir_->file("fwd.h5"),
        bin + "calibrate --model " + model + " --corpus " + corpus + " --out " + cal +
            " --context 64 --max-windows 2 --greedy-seqs 1 --greedy-tokens 16 --alpha 0.1",
        bin + "eval --model " + model + " --corpus " + corpus +
            " --context 64 --stride 32 --max-windows 2 --method wina --sparsity 0.5 "
            "--calibration " +
            cal + " --out " + dir_->file("wina.h5"),
        bin + "bench --model " + model +
            " --prompt 16 --decode 4 --reps 1 --method teal "
            "--sparsity 0.5 --calibration " +
            cal + " --out " + dir_->file("bench.h5"),
        bin + "profile --calibration " + cal + " --out " + dir_->file("profile.h5") + " --plot " +
            dir_->file("profile.png"),
    };
    for (const std::string& c : cmds) {
      const RunResult r = run_cmd(c + " --log-level error");
      ASSERT_EQ(r.exit_code, 0) << c << "\n" << r.output;
    }
    // dense against Token Filtering, GRACE and a RAP-pruned model on the same windows, with
    // their JSON summaries (the comparison the main job makes), and a run of another model
    const std::string win = " --corpus " + corpus + " --context 64 --stride 32 --max-windows 4 ";
    const std::string other = make_model(*dir_, "other.gguf", tiny_spec(42));
    auto ev = [&](const std::string& name, const std::string& m, const std::string& opts) {
      return bin + "eval --model " + m + win + opts + " --out " + dir_->file(name + ".h5") +
             " --json " + dir_->file(name + ".json");
    };
    const std::vector<std::string> cmp = {
        ev("c_dense", model, ""),
        ev("c_tf", model, "--method token-filter --tf-ratio 0.5 --tf-warmup 4"),
        ev("c_grace", model, "--method grace --kv-prune 0.5 --kv-window 8 --kv-recent 8"),
        bin + "calibrate --fisher --model " + model + " --corpus " + corpus + " --out " +
            dir_->file("fisher.h5") + " --fisher-seqs 2 --fisher-tokens 48",
        bin + "prune --model " + model + " --method rap --retain 0.5 --calibration " +
            dir_->file("fisher.h5") + " --out " + dir_->file("rap.gguf"),
        ev("c_rap", dir_->file("rap.gguf"), ""),
        ev("c_other", other, ""),
    };
    for (const std::string& c : cmp) {
      const RunResult r = run_cmd(c + " --log-level error");
      ASSERT_EQ(r.exit_code, 0) << c << "\n" << r.output;
    }
    std::ofstream(dir_->file("sweep.csv")) << "method,sparsity,perplexity,decode_tokens_per_s\n"
                                              "teal,0.3,41.5,30\nteal,0.5,53.7,35\n"
                                              "wina,0.3,44.6,28\nwina,0.5,69.5,33\n";
  }
  static void TearDownTestSuite() { delete dir_; }
  // The generator runs under the Python the build was configured with (scripts/setup.sh makes
  // it, with matplotlib, pandas and jinja2); a machine without it (a GPU machine running a copied
  // build) skips these tests and says why.
  void SetUp() override {
    static const bool usable =
        run_cmd(python() + " -c 'import matplotlib, pandas, jinja2'").exit_code == 0;
    if (!usable)
      GTEST_SKIP() << "the report generator needs " << python()
                   << " with matplotlib, pandas and jinja2 (scripts/setup.sh installs them)";
  }
  static TempDir* dir_;
};
TempDir* Report::dir_ = nullptr;

// Open a page in headless Chromium: it loads, every image is there (no failed resource).
void expect_page_loads_in_a_browser(const std::string& dir, const std::string& shot) {
  if (!on_path("chromium")) GTEST_SKIP() << "chromium not installed: the browser check is skipped";
  const RunResult c = run_cmd(
      "timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage "
      "--enable-logging=stderr --v=0 --window-size=1280,6000 --screenshot=" +
      shot + " file://" + dir + "/index.html");
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_GT(slurp(shot).size(), 20000u) << c.output;
  // (a 404 only as a status: Chromium's log lines carry microsecond timestamps with any digits)
  for (const char* bad :
       {"Failed to load resource", "ERR_FILE_NOT_FOUND", "Uncaught", "status of 404"})
    EXPECT_EQ(c.output.find(bad), std::string::npos) << bad << "\n" << c.output;
}

double num(const nlohmann::json& j) {
  return j.get<double>();
}

TEST_F(Report, PageOnRealRunFilesHasEveryFigure) {
  const std::string out = dir_->file("page");
  const std::string runs = dir_->file("fwd.h5") + " " + dir_->file("wina.h5") + " " +
                           dir_->file("bench.h5") + " " + dir_->file("profile.h5");
  const RunResult r = run_cmd(report("page " + runs + " --table " + dir_->file("sweep.csv") +
                                     " --hardware h200 --measured-hardware a100-80gb --sparsim " +
                                     sparsim_bin() + " --title 'test report' --out " + out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string html = slurp(out + "/index.html");
  ASSERT_FALSE(html.empty());
  // every figure the page names is there and is a PNG of some size
  std::vector<std::string> imgs;
  const std::regex img(R"re(<img src="([^"]+)")re");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), img); it != std::sregex_iterator();
       ++it)
    imgs.push_back((*it)[1]);
  for (const std::string& i : imgs) {
    const std::string bytes = slurp(out + "/" + i);
    EXPECT_GT(bytes.size(), 5000u) << i;
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << i;
  }
  // one figure of each kind: FLOPs and bytes, sparsity distributions and the token trace of the
  // eval run, predicted against measured of the bench run, the sensitivity profile, the table
  for (const char* want : {"flops_flops.png", "flops_bytes.png", "sparsity_1.png", "tokens_1.png",
                           "measured_2.png", "sensitivity_3.png", "table_"}) {
    EXPECT_TRUE(std::any_of(imgs.begin(), imgs.end(),
                            [&](const std::string& i) { return i.find(want) == 0; }))
        << want << " missing from the page; it has " << imgs.size() << " figures";
  }
  for (const char* s : {"FLOP accounting", "Predicted time", "Sensitivity profile", "sweep.csv",
                        "scripts/report.py page", "wina"})
    EXPECT_NE(html.find(s), std::string::npos) << s;
  // no temporaries left
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();

  // the page in a real browser (opt-in: Debian's chromium, scripts/setup.sh --with-chromium)
  expect_page_loads_in_a_browser(out, dir_->file("shot.png"));
}

// The page leads with the methods against dense, and every number of that table is the one the
// runs' JSON summaries (written by sparsim eval, not by the generator) give; a run of another
// model is named on the page and left out of the comparison; each family's figure is there.
TEST_F(Report, ComparisonLeadsThePageAndAgreesWithTheSummaries) {
  const std::string out = dir_->file("cmp_page");
  const std::vector<std::string> names = {"c_dense", "c_tf", "c_grace", "c_rap", "c_other"};
  std::string runs;
  for (const auto& n : names) runs += dir_->file(n + ".h5") + " ";
  const RunResult r =
      run_cmd(report("page " + runs + "--hardware a100-80gb --sparsim " + sparsim_bin() +
                     " --comparison-json " + dir_->file("cmp.json") + " --out " + out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string html = slurp(out + "/index.html");
  const auto first_h2 = html.find("<h2>");
  ASSERT_NE(first_h2, std::string::npos);
  EXPECT_EQ(html.compare(first_h2, 25, "<h2>Methods against dense"), 0)
      << html.substr(first_h2, 80);
  EXPECT_NE(html.find("different models"), std::string::npos);
  EXPECT_NE(html.find("not compared with the baseline"), std::string::npos);

  const auto cmp = nlohmann::json::parse(slurp(dir_->file("cmp.json")));
  ASSERT_EQ(cmp["rows"].size(), 4u);  // the other model's run is not compared
  ASSERT_EQ(cmp["not_compared"].size(), 1u);
  EXPECT_NE(cmp["not_compared"][0]["path"].get<std::string>().find("c_other"), std::string::npos);
  auto summary = [&](const std::string& n) {
    return nlohmann::json::parse(slurp(dir_->file(n + ".json")));
  };
  const auto dense = summary("c_dense");
  for (std::size_t i = 0; i < 4; ++i) {
    const auto& row = cmp["rows"][i];
    const auto s = summary(names[i]);
    const double rel = 1e-12;
    EXPECT_NEAR(num(row["perplexity"]), num(s["perplexity"]), rel * num(s["perplexity"])) << i;
    for (int k = 0; k < 2; ++k)
      EXPECT_NEAR(num(row["perplexity_ci95"][k]), num(s["perplexity_spread"]["ci95"][k]),
                  1e-9 * num(s["perplexity"]))
          << i;
    EXPECT_NEAR(num(row["flops_saved"]),
                1.0 - num(s["flops"]["realised"]) / num(dense["flops"]["realised"]), 1e-12)
        << i;
    EXPECT_NEAR(num(row["bytes_saved"]),
                1.0 - num(s["bytes"]["realised"]) / num(dense["bytes"]["realised"]), 1e-12)
        << i;
    // the perplexity as the page prints it
    EXPECT_NE(html.find(fmt::format("{:.3f} [", num(s["perplexity"]))), std::string::npos) << i;
    EXPECT_EQ(row["windows"].get<int>(), s["windows"].get<int>());
  }
  EXPECT_EQ(num(cmp["rows"][0]["flops_saved"]), 0.0);
  const auto tf = summary("c_tf")["token_filter"];
  EXPECT_EQ(num(cmp["rows"][1]["target_realised"][0]["target"]), num(tf["target"]));
  EXPECT_EQ(num(cmp["rows"][1]["target_realised"][0]["realised"]), num(tf["realised"]));
  const auto kv = summary("c_grace")["kv_prune"];
  EXPECT_EQ(num(cmp["rows"][2]["target_realised"][0]["target"]), num(kv["lambda"]));
  EXPECT_NEAR(num(cmp["rows"][2]["target_realised"][0]["realised"]),
              1.0 - num(kv["k_bytes"]) / num(kv["k_bytes_dense"]), 1e-12);
  const auto pr = summary("c_rap")["pruned"];
  EXPECT_NEAR(num(cmp["rows"][3]["kv_cache_fraction"]), num(pr["kv_bytes_fraction"]), 1e-12);
  EXPECT_NEAR(num(cmp["rows"][3]["target_realised"][0]["target"]), 1.0 - num(pr["retain"]), 1e-12);
  // paired differences: per window, the method's per-token NLL minus dense's, both from the runs
  const auto d = cmp["rows"][1]["per_window_delta_nll"];
  double mean = 0;
  for (const auto& x : d) mean += num(x) / static_cast<double>(d.size());
  EXPECT_NEAR(num(cmp["rows"][1]["delta_nll_per_token"]), mean, 1e-12);
  EXPECT_NEAR(mean,
              num(summary("c_tf")["perplexity_spread"]["mean_nll_per_window"]) -
                  num(dense["perplexity_spread"]["mean_nll_per_window"]),
              1e-9);
  // one figure per family and the quality-cost plot, all present
  for (const char* f : {"compare_quality_cost.png", "compare_tf_1.png", "compare_kv_2.png",
                        "compare_pruned_3.png"}) {
    EXPECT_NE(html.find(std::string("src=\"") + f), std::string::npos) << f;
    EXPECT_GT(fs::file_size(out + "/" + f), 5000u) << f;
  }
  // and the text table of the same comparison
  const RunResult t = run_cmd(report("compare " + runs + "--sparsim " + sparsim_bin()));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("not compared: "), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("token-filter r=0.5"), std::string::npos) << t.output;
  expect_page_loads_in_a_browser(out, dir_->file("cmp_shot.png"));
}

TEST_F(Report, ProfilePlotComesFromTheGenerator) {
  const std::string png = slurp(dir_->file("profile.png"));
  ASSERT_GT(png.size(), 10000u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // the same figure from the generator directly
  const RunResult r = run_cmd(
      report("sensitivity-plot " + dir_->file("profile.h5") + " --png " + dir_->file("again.png")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(slurp(dir_->file("again.png")).size(), 10000u);
}

TEST_F(Report, DocsGeneratedBlocksAgreeWithTheCommittedFiles) {
  const std::string docs = std::string(SPARSIM_SOURCE_DIR) + "/docs/";
  const RunResult r =
      run_cmd(report("docs-blocks --check " + docs + "cost-model.md " + docs + "performance.md " +
                     docs + "eval.md " + docs + "sparsity.md " + docs + "recovery.md " +
                     std::string(SPARSIM_SOURCE_DIR) + "/README.md"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // the validation page is generated whole from its summary
  const RunResult v = run_cmd(report("validation-page " + docs +
                                     "results/cost_validation/cost_validation.json --page " + docs +
                                     "cost-validation.md --figures " + docs + "figures --check"));
  EXPECT_EQ(v.exit_code, 0) << v.output;
}

TEST_F(Report, BadInputFailsWithAReason) {
  std::ofstream(dir_->file("text.h5")) << "not hdf5\n";
  struct Case {
    std::string args, needle;
  };
  const std::vector<Case> cases = {
      {"page " + dir_->file("text.h5") + " --out " + dir_->file("bad1"), "cannot read run file"},
      {"page --out " + dir_->file("bad2"), "give run files"},
      {"page " + dir_->file("fwd.h5") + " --hardware tpu-v9 --sparsim " + sparsim_bin() +
           " --out " + dir_->file("bad3"),
       "unknown hardware profile"},
      {"sensitivity-plot " + dir_->file("fwd.h5") + " --png " + dir_->file("bad.png"),
       "holds no sensitivity profile"},
      {"page --table " + dir_->file("missing.csv") + " --out " + dir_->file("bad4"),
       "cannot read table"},
      {"page " + dir_->file("c_dense.h5") + " " + dir_->file("gone.h5") + " --out " +
           dir_->file("bad5"),
       "run file '" + dir_->file("gone.h5") + "' does not exist"},
      {"compare " + dir_->file("c_tf.h5") + " " + dir_->file("c_grace.h5"),
       "no dense run among the inputs"},
  };
  for (const Case& c : cases) {
    const RunResult r = run_cmd(report(c.args));
    EXPECT_NE(r.exit_code, 0) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(dir_->file("bad.png")));
  }
  for (const char* d : {"bad1", "bad2", "bad3", "bad4", "bad5"})
    EXPECT_FALSE(fs::exists(dir_->file(std::string(d) + "/index.html"))) << d;
}

}  // namespace
}  // namespace sparsim::test
