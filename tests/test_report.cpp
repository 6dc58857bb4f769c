// The report generator (scripts/report.py) on real run files: every figure the page names exists
// and is a non-empty PNG; the page opens in headless Chromium without load errors (when Debian's
// chromium is installed); the docs' generated blocks agree with the committed files; bad input.
#include "helpers.hpp"

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
  if (!on_path("chromium")) GTEST_SKIP() << "chromium not installed: the browser check is skipped";
  const std::string shot = dir_->file("shot.png");
  const RunResult c = run_cmd(
      "timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage "
      "--enable-logging=stderr --v=0 --window-size=1280,6000 --screenshot=" +
      shot + " file://" + out + "/index.html");
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_GT(slurp(shot).size(), 20000u) << c.output;
  // (a 404 only as a status: Chromium's log lines carry microsecond timestamps with any digits)
  for (const char* bad :
       {"Failed to load resource", "ERR_FILE_NOT_FOUND", "Uncaught", "status of 404"})
    EXPECT_EQ(c.output.find(bad), std::string::npos) << bad << "\n" << c.output;
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
  const RunResult r = run_cmd(report("docs-blocks --check " + docs + "cost-model.md " + docs +
                                     "performance.md " + docs + "eval.md " + docs + "sparsity.md " + docs +
                                     "recovery.md"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // the validation page is generated whole from its summary
  const RunResult v =
      run_cmd(report("validation-page " + docs + "results/cost_validation.json --page " + docs +
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
  };
  for (const Case& c : cases) {
    const RunResult r = run_cmd(report(c.args));
    EXPECT_NE(r.exit_code, 0) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(dir_->file("bad.png")));
  }
  for (const char* d : {"bad1", "bad2", "bad3", "bad4"})
    EXPECT_FALSE(fs::exists(dir_->file(std::string(d) + "/index.html"))) << d;
}

}  // namespace
}  // namespace sparsim::test
