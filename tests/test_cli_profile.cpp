// sparsim profile: from a calibration file and afresh on a tiny model, budgets against
// block_budgets, the plot, and bad input.
#include "cli_fixture.hpp"
#include "io/hdf5.hpp"
#include "sparsity/calibration.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliProfile : public TinyModelCli<CliProfile> {
 protected:
  // (the afresh runs below take the calibration's options, kTinyCalibOpts)
  static void SetUpTestSuite() {
    make_tiny_calibrated({31, 5, 6000, 11});
    make_other(32);
  }

  static std::string profile(const std::string& args) { return sparsim_bin() + " profile " + args; }
  static std::vector<double> read(const std::string& file, const std::string& name,
                                  std::vector<hsize_t>* dims = nullptr) {
    return io::H5File::open_read(file).root().open_group("profile").read<double>(name, dims);
  }
};

TEST_F(CliProfile, FromFileAndAfreshAgreeExactly) {
  const sparsity::Calibration cal = sparsity::read_calibration(calib_);
  for (const std::string variant : {"rotated", "plain"}) {
    const std::string a = dir_->file("a-" + variant + ".h5"),
                      b = dir_->file("b-" + variant + ".h5");
    const RunResult ra = run_cmd(profile("--calibration " + calib_ + " --model " + model_ +
                                         " --variant " + variant + " --out " + a));
    ASSERT_EQ(ra.exit_code, 0) << ra.output;
    const RunResult rb = run_cmd(profile("--model " + model_ + " --corpus " + corpus_ +
                                         kTinyCalibOpts + " --variant " + variant + " --out " + b));
    ASSERT_EQ(rb.exit_code, 0) << rb.output;
    std::vector<hsize_t> da, db;
    const std::vector<double> ea = read(a, "sensitivity", &da), eb = read(b, "sensitivity", &db);
    EXPECT_EQ(da, (std::vector<hsize_t>{4, 2}));
    EXPECT_EQ(da, db);
    EXPECT_EQ(ea, eb) << variant;
    const auto& var = variant == "plain" ? cal.plain : cal.rotated;
    const auto* set = var->find_sensitivity(
        variant == "plain" ? sparsity::ProbeRule::Threshold : sparsity::ProbeRule::Guided, 0.01,
        false, 0);
    ASSERT_NE(set, nullptr);
    std::vector<double> ef;
    for (const auto& row : set->e) ef.insert(ef.end(), row.begin(), row.end());
    EXPECT_EQ(ea, ef) << variant;
    EXPECT_EQ(read(a, "probe_levels"), (std::vector<double>{0.2, 0.4, 0.6, 0.8}));
    io::H5File h = io::H5File::open_read(b);
    const io::Group g = h.root().open_group("profile");
    EXPECT_EQ(g.get_attr<std::string>("variant"), variant);
    EXPECT_EQ(g.get_attr<std::string>("source"), "computed");
    EXPECT_EQ(g.get_attr<std::string>("model_fingerprint"), cal.model_fingerprint);
    EXPECT_EQ(g.get_attr<std::string>("corpus_fingerprint"), cal.corpus_fingerprint);
    EXPECT_EQ(g.get_attr<std::int64_t>("model_checked"), 1);
    EXPECT_TRUE(h.root().has_group("run"));
    EXPECT_TRUE(h.root().has_group("model"));
  }
}

TEST_F(CliProfile, BudgetsAreBlockBudgetsAndThePlotIsAPng) {
  const std::string out = dir_->file("budgets.h5"), png = dir_->file("profile.png");
  // file alone (no model loaded); λ = 3 pushes some budgets into the clamp
  const RunResult r = run_cmd(profile("--calibration " + calib_ +
                                      " --sparsity 0.1,0.5,0.9 --lambda 3 --probe 0.6 --out " +
                                      out + " --plot " + png));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("not checked"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("e@0.60"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("s=0.90"), std::string::npos) << r.output;

  const sparsity::Calibration cal = sparsity::read_calibration(calib_);
  const auto& rs = *cal.rotated->find_sensitivity(sparsity::ProbeRule::Guided, 0.01, false, 0);
  const std::vector<double>& e = rs.e[2];
  std::vector<hsize_t> dims;
  const std::vector<double> b = read(out, "budgets", &dims), bm = read(out, "budget_mean");
  ASSERT_EQ(dims, (std::vector<hsize_t>{3, 2}));
  EXPECT_EQ(read(out, "sparsity"), (std::vector<double>{0.1, 0.5, 0.9}));
  const std::vector<double> s{0.1, 0.5, 0.9};
  for (std::size_t j = 0; j < s.size(); ++j) {
    const std::vector<double> want = sparsity::block_budgets(e, s[j], 3.0);
    EXPECT_EQ(b[j * 2], want[0]);
    EXPECT_EQ(b[j * 2 + 1], want[1]);
    EXPECT_DOUBLE_EQ(bm[j], (want[0] + want[1]) / 2);
  }
  const std::vector<double> m = read(out, "mean");
  ASSERT_EQ(m.size(), 4u);
  for (std::size_t k = 0; k < 4; ++k) EXPECT_DOUBLE_EQ(m[k], (rs.e[k][0] + rs.e[k][1]) / 2);
  io::H5File h = io::H5File::open_read(out);
  const io::Group g = h.root().open_group("profile");
  EXPECT_EQ(g.get_attr<std::int64_t>("model_checked"), 0);
  EXPECT_EQ(g.get_attr<std::string>("calibration_file"), calib_);
  EXPECT_EQ(g.dataset("budgets").get_attr<double>("lambda"), 3.0);
  EXPECT_EQ(g.dataset("budgets").get_attr<double>("probe"), 0.6);

  std::ifstream f(png, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(f), {}};
  ASSERT_GT(bytes.size(), 33u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(bytes.substr(12, 4), "IHDR");
  // a figure of some size (width and height are big-endian after IHDR)
  auto be32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(bytes[at + i]);
    return v;
  };
  EXPECT_GT(be32(16), 400u);
  EXPECT_GT(be32(20), 200u);
  EXPECT_GT(bytes.size(), 10000u);
}

TEST_F(CliProfile, BadInputFailsAndWritesNothing) {
  const std::string out = dir_->file("bad.h5"), png = dir_->file("bad.png");
  const std::string files = " --out " + out + " --plot " + png;
  const std::string withcal = "--calibration " + calib_ + " ";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {withcal + "--sparsity 1.0", "--sparsity"},
      {withcal + "--sparsity -0.1", "--sparsity"},
      {withcal + "--sparsity 0.3,x", "--sparsity"},
      {withcal + "--lambda -1", "--lambda"},
      {withcal + "--probe 0.3", "--probe"},
      {withcal + "--variant odd", "--variant"},
      {withcal + "--corpus " + corpus_, "only used when computing"},
      {"--calibration " + corpus_, "calibration file"},
      {"--calibration " + dir_->file("missing.h5"), "missing.h5"},
      {withcal + "--model " + other_, "was made for model fingerprint"},
      {"--model " + model_ + " --corpus " + corpus_ + " --probe 0.5", "--probe"},
      {"--model " + model_ + " --corpus " + corpus_ + " --probes 0.2,1.5", "--probes"},
  };
  for (const auto& c : cases) {
    const RunResult r = run_cmd(profile(c.args + files));
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << c.args;
    EXPECT_FALSE(fs::exists(png)) << c.args;
  }
  const RunResult r = run_cmd(profile(withcal + "--plot " + png));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--out"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(png));
  for (const auto& e : fs::directory_iterator(dir_->path()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

}  // namespace
}  // namespace sparsim::test
