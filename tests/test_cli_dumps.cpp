// sparsim eval --dump-layers: projection inputs and their masks in the run file, checked against
// each method's rule and the realised sparsity the run reports; bad option values.
#include "cli_fixture.hpp"
#include "io/hdf5.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

class CliDumps : public TinyModelCli<CliDumps> {
 protected:
  static void SetUpTestSuite() { make_tiny_calibrated({31, 5, 6000, 11}); }

  static std::string eval(const std::string& extra) {
    return on_tiny("eval", "--context 128 --stride 64 --max-windows 2", extra);
  }
};

int keep_count(int d, double s) {
  const double f = d * (1.0 - s);
  return std::min(d, f >= 1.0 ? static_cast<int>(f) : 1);
}

int proj_index(const std::string& p) {
  const char* names[] = {"q", "k", "v", "o", "gate", "up", "down"};
  for (int i = 0; i < 7; ++i)
    if (p == names[i]) return i;
  return -1;
}

struct Dump {
  std::vector<float> input;
  std::vector<std::uint8_t> kept;
  std::vector<hsize_t> dims;
  std::int64_t seen = 0;
  std::string rule;
  double target = 0, tau = 0, delta = 0;
  int rows() const { return static_cast<int>(dims.at(0)); }
  int d() const { return static_cast<int>(dims.at(1)); }
  int kept_in_row(int r) const {
    return static_cast<int>(std::count(kept.begin() + static_cast<long>(r) * d(),
                                       kept.begin() + static_cast<long>(r + 1) * d(), 1));
  }
};

Dump read_dump(const io::Group& root, int layer, const std::string& proj) {
  const io::Group g = root.open_group("activations/layer_" + std::to_string(layer) + "/" + proj);
  Dump u;
  u.input = g.read<float>("input", &u.dims);
  std::vector<hsize_t> kd;
  u.kept = g.read<std::uint8_t>("kept", &kd);
  EXPECT_EQ(kd, u.dims);
  u.seen = g.get_attr<std::int64_t>("sparse_rows_seen");
  u.rule = g.get_attr<std::string>("rule");
  u.target = g.get_attr<double>("target");
  u.tau = g.get_attr<double>("threshold");
  u.delta = g.get_attr<double>("delta");
  EXPECT_EQ(g.read<std::int64_t>("sparse_row").size(), u.dims.at(0));
  return u;
}

TEST_F(CliDumps, ShapesAndMasksFollowEachMethod) {
  const int N = 16;
  for (const std::string m : {"teal", "wina", "topk-guided"}) {
    const std::string out = dir_->file("dump-" + m + ".h5");
    const RunResult r = run_cmd(eval("--method " + m + " --sparsity 0.5 --calibration " + calib_ +
                                     " --dump-layers 1,0 --dump-proj q,o,down --dump-tokens " +
                                     std::to_string(N) + " --out " + out));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const io::H5File f = io::H5File::open_read(out);
    const io::Group root = f.root();
    const io::Group a = root.open_group("activations");
    EXPECT_EQ(a.get_attr<std::int64_t>("tokens"), N);
    EXPECT_EQ(a.get_attr<std::string>("method"), m);
    EXPECT_EQ(a.get_attr<std::string>("basis"), m == "teal" ? "plain" : "rotated");
    EXPECT_EQ(a.list(), (std::vector<std::string>{"layer_0", "layer_1"}));
    EXPECT_EQ(a.open_group("layer_0").list(), (std::vector<std::string>{"down", "o", "q"}));
    std::vector<hsize_t> dims;
    const auto rmin = root.open_group("sparsity").read<double>("realised_min", &dims);
    const auto rmax = root.open_group("sparsity").read<double>("realised_max");
    for (int layer : {0, 1})
      for (const std::string p : {"q", "o", "down"}) {
        const Dump u = read_dump(root, layer, p);
        const std::string what = m + " layer " + std::to_string(layer) + " " + p;
        ASSERT_EQ(u.dims.size(), 2u) << what;
        EXPECT_EQ(u.d(), p == "down" ? 128 : 64) << what;
        if (u.rule == "none") {
          EXPECT_EQ(u.rows(), 0) << what;
          continue;
        }
        ASSERT_GT(u.seen, N) << what;
        ASSERT_EQ(u.rows(), N) << what;
        const std::size_t cell = static_cast<std::size_t>(layer) * 7 + proj_index(p);
        for (int row = 0; row < u.rows(); ++row) {
          const int k = u.kept_in_row(row);
          // every dumped row lies within the range of realised sparsity the run reports
          const double s = 1.0 - static_cast<double>(k) / u.d();
          EXPECT_GE(s, rmin[cell] - 1e-12) << what;
          EXPECT_LE(s, rmax[cell] + 1e-12) << what;
          if (m == "wina") {
            EXPECT_EQ(u.rule, "topk") << what;
            EXPECT_EQ(k, keep_count(u.d(), u.target)) << what << " row " << row;
          } else if (m == "teal") {
            EXPECT_EQ(u.rule, "threshold") << what;
            for (int j = 0; j < u.d(); ++j) {
              const std::size_t e = static_cast<std::size_t>(row) * u.d() + j;
              EXPECT_EQ(u.kept[e], std::fabs(u.input[e]) >= static_cast<float>(u.tau) ? 1 : 0)
                  << what << " row " << row << " entry " << j;
            }
          } else {
            EXPECT_EQ(u.rule, "guided") << what;
            EXPECT_GE(k, keep_count(u.d(), u.target + u.delta)) << what;
            EXPECT_LE(k, keep_count(u.d(), u.target - u.delta)) << what;
          }
        }
      }
  }
}

// With every sparsified row dumped, the masks reproduce the run's realised sparsity exactly; with
// --dump-every k the rows are every k-th one of the same sequence.
TEST_F(CliDumps, AllRowsReproduceRealisedSparsityAndEverySamples) {
  const std::string all = dir_->file("all.h5"), every = dir_->file("every.h5");
  const std::string base =
      "--method topk-guided --sparsity 0.5 --calibration " + calib_ + " --dump-layers 1 ";
  RunResult r = run_cmd(eval(base + "--dump-proj up --dump-tokens 100000 --out " + all));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(eval(base + "--dump-proj up --dump-tokens 5 --dump-every 7 --out " + every));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const io::H5File fa = io::H5File::open_read(all), fe = io::H5File::open_read(every);
  const Dump ua = read_dump(fa.root(), 1, "up"), ue = read_dump(fe.root(), 1, "up");
  ASSERT_GT(ua.rows(), 0);
  EXPECT_EQ(ua.rows(), ua.seen);
  double sum = 0;
  for (int row = 0; row < ua.rows(); ++row)
    sum += 1.0 - static_cast<double>(ua.kept_in_row(row)) / ua.d();
  const auto mean = fa.root().open_group("sparsity").read<double>("realised_mean");
  EXPECT_NEAR(sum / ua.rows(), mean[1 * 7 + proj_index("up")], 1e-12);
  ASSERT_EQ(ue.rows(), 5);
  const auto ord = fe.root().open_group("activations/layer_1/up").read<std::int64_t>("sparse_row");
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(ord[static_cast<std::size_t>(i)], 7 * i);
    const int d = ue.d();
    EXPECT_TRUE(std::equal(ue.input.begin() + static_cast<long>(i) * d,
                           ue.input.begin() + static_cast<long>(i + 1) * d,
                           ua.input.begin() + static_cast<long>(7 * i) * d));
    EXPECT_TRUE(std::equal(ue.kept.begin() + static_cast<long>(i) * d,
                           ue.kept.begin() + static_cast<long>(i + 1) * d,
                           ua.kept.begin() + static_cast<long>(7 * i) * d));
  }
}

TEST_F(CliDumps, BadOptionsFailAndWriteNothing) {
  const std::string out = dir_->file("bad.h5");
  const std::string teal = "--method teal --calibration " + calib_ + " ";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--dump-layers 0 --out " + out, "needs a sparse --method"},
      {teal + "--dump-layers 0", "needs --out"},
      {teal + "--dump-layers 2 --out " + out, "layer 2 outside 0 … 1"},
      {teal + "--dump-layers -1 --out " + out, "outside"},
      {teal + "--dump-layers 0,x --out " + out, "--dump-layers: 'x' is not an integer"},
      {teal + "--dump-layers 1,1 --out " + out, "listed twice"},
      {teal + "--dump-layers 0 --dump-proj q,zz --out " + out, "unknown projection 'zz'"},
      {teal + "--dump-layers 0 --dump-proj q,q --out " + out, "listed twice"},
      {teal + "--dump-layers 0 --dump-tokens 0 --out " + out, "--dump-tokens"},
      {teal + "--dump-layers 0 --dump-every 0 --out " + out, "--dump-every"},
      {teal + "--dump-proj q --out " + out, "need --dump-layers"},
      {teal + "--dump-tokens 4 --out " + out, "need --dump-layers"},
  };
  for (const auto& c : cases) {
    const RunResult r = run_cmd(eval(c.args));
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
}

}  // namespace
}  // namespace sparsim::test
