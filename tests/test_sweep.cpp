// The sweep library: spec parsing and its errors, grid expansion and stable ids, the cost
// prediction against the FLOP / byte ledger of a real run, locks that die with their holder,
// point manifests, Slurm chunking and time limits, and the CSV writer.
#include "backends.hpp"
#include "engine/engine.hpp"
#include "eval/perplexity.hpp"
#include "flops/ledger.hpp"
#include "io/summary_columns.hpp"
#include "model/loader.hpp"
#include "sweep/collect.hpp"
#include "sweep/cost.hpp"
#include "sweep/lock.hpp"
#include "sweep/point_files.hpp"
#include "sweep/slurm.hpp"
#include "sweep_helpers.hpp"

#include <cmath>
#include <numeric>

namespace sparsim::test {
namespace {

using namespace sparsim::sweep;

const std::string kBase = spec_head("unit", {"a", "b"}) + R"(
[calibration.a]
corpus = "text"
context = 64
max-windows = 2

[options]
context = 64
stride = 32
max-windows = 2
)";

class SweepSpec : public ::testing::Test {
 protected:
  void SetUp() override {
    write_synth_gguf(tiny_spec(1), dir_.file("a.gguf"));
    write_synth_gguf(tiny_spec(2), dir_.file("b.gguf"));
    write_word_corpus(dir_.file("corpus.txt"), 5, 400);
  }
  Spec load(const std::string& body) {
    write_text(dir_.file("spec.toml"), body);
    return load_spec(dir_.file("spec.toml"));
  }
  /// Loading fails with a message containing every needle.
  void expect_error(const std::string& body, std::vector<std::string> needles) {
    write_text(dir_.file("spec.toml"), body);
    try {
      const Spec s = load_spec(dir_.file("spec.toml"));
      (void)make_plan(s, {});
      ADD_FAILURE() << "no error for:\n" << body;
    } catch (const Error& e) {
      for (const auto& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
            << "'" << n << "' not in: " << e.what();
    }
  }
  TempDir dir_;
};

TEST_F(SweepSpec, GridExpandsPerMethodAxesAndExplicitPoints) {
  const Spec s = load(std::string(kBase) + R"(
[grid]
model = ["a", "b"]
corpus = ["text"]
method = ["dense", "teal"]
stride = [16, 32]

[methods.teal]
sparsity = [0.25, 0.5, 0.75]
calibration = true

[[points]]
model = "a"
corpus = "text"
method = "teal"
sparsity = 0.6
)");
  EXPECT_EQ(s.name, "unit");
  EXPECT_EQ(s.output, dir_.file("out"));
  // model b has no calibration: its teal points are an error, listed by point
  EXPECT_THROW((void)make_plan(s, {}), Error);
  try {
    (void)make_plan(s, {});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[calibration.b] is not defined"), std::string::npos)
        << e.what();
  }
  const Spec s2 = load(std::string(kBase) + R"(
[grid]
model = ["a", "b"]
corpus = ["text"]
method = ["dense"]
stride = [16, 32]

[[points]]
model = "a"
corpus = "text"
method = "teal"
sparsity = 0.6
calibration = true

[[points]]
model = "b"
corpus = "text"
method = "dense"
stride = 16
)");
  const Plan p = make_plan(s2, {});
  // 2 models x 2 strides dense + 1 teal; the second explicit point repeats a grid point
  ASSERT_EQ(p.points.size(), 5u);
  EXPECT_EQ(p.duplicates, 1);
  ASSERT_EQ(p.calibrations.size(), 1u);
  EXPECT_TRUE(p.calibrations[0].computed);
  const PlannedPoint& teal = p.points.back();
  EXPECT_EQ(teal.method, "teal");
  EXPECT_EQ(teal.calibration, 0);
  EXPECT_EQ(teal.options["sparsity"].get<double>(), 0.6);
  EXPECT_EQ(teal.options["context"].get<int>(), 64);
  // the command line carries the options, the calibration file and nothing the sweep owns
  const auto& args = teal.args;
  EXPECT_EQ(args[0], "eval");
  auto has = [&](const std::string& k, const std::string& v) {
    for (std::size_t i = 0; i + 1 < args.size(); ++i)
      if (args[i] == k && args[i + 1] == v) return true;
    return false;
  };
  EXPECT_TRUE(has("--sparsity", "0.6"));
  EXPECT_TRUE(has("--method", "teal"));
  EXPECT_TRUE(has("--calibration", p.calibrations[0].file));
  EXPECT_TRUE(has("--model", dir_.file("a.gguf")));
  for (const auto& a : args) EXPECT_NE(a, "--out");
  // ids are distinct and 16 hex digits
  std::set<std::string> ids;
  for (const auto& pt : p.points) {
    EXPECT_EQ(pt.id.size(), 16u);
    ids.insert(pt.id);
  }
  EXPECT_EQ(ids.size(), p.points.size());
  // predicted costs are positive and grow with the work
  for (const auto& pt : p.points) EXPECT_GT(pt.predicted.seconds, 0);
}

TEST_F(SweepSpec, IdsAreStableUnderReorderingAndChangeWithTheConfiguration) {
  const std::string grid = R"(
[grid]
model = ["a"]
corpus = ["text"]
method = ["dense"]
)";
  const Plan p1 = make_plan(load(std::string(kBase) + grid), {});
  // same content, keys in another order, comments, another [run] and [cost]
  const Plan p2 = make_plan(load(R"(
# the same sweep written differently
[options]
max-windows = 2
stride = 32
context = 64
[run]
threads = 3
[cost]
gflops = 7
[grid]
corpus = ["text"]
method = ["dense"]
model = ["a"]
[corpora]
text = "corpus.txt"
[models]
b = "b.gguf"
a = "a.gguf"
[sweep]
output = "out"
name = "unit"
)"),
                            {});
  ASSERT_EQ(p1.points.size(), 1u);
  ASSERT_EQ(p2.points.size(), 1u);
  EXPECT_EQ(p1.points[0].id, p2.points[0].id);
  const Plan p3 =
      make_plan(load(std::string(kBase) + grid + "\n[methods.dense]\nscore = 16\n"), {});
  EXPECT_NE(p3.points[0].id, p1.points[0].id);
}

TEST_F(SweepSpec, BadSpecsNameTheKey) {
  const std::string grid = R"(
[grid]
model = ["a"]
corpus = ["text"]
method = ["dense"]
)";
  expect_error(std::string(kBase) + grid + "\n[sweep2]\nx = 1\n", {"unknown key 'sweep2'"});
  expect_error(std::string(kBase) + R"(
[grid]
model = ["a"]
corpus = ["text"]
method = []
)",
               {"[grid] method", "empty list"});
  expect_error(std::string(kBase) + R"(
[grid]
model = ["a"]
corpus = ["text"]
method = ["dense"]
stride = []
)",
               {"[grid] stride", "empty list"});
  expect_error(std::string(kBase) + grid + "\n[methods.teal]\nsparsity = [0.5]\n",
               {"[methods.teal]", "not used"});
  expect_error(std::string(kBase) + R"(
[grid]
model = ["a", "c"]
corpus = ["text"]
method = ["dense"]
)",
               {"'c' is not defined in [models]"});
  expect_error(R"(
[sweep]
name = "x"
output = "out"
sparsity = 0.5
)",
               {"spec.toml:5", "unknown key 'sparsity' in [sweep]"});
  expect_error(std::string(kBase) + grid + "\n[run]\nthreads = -1\n", {"[run] threads"});
  expect_error(std::string(kBase) + grid + "\n[methods.dense]\nout = \"x.h5\"\n",
               {"'out' is set by the sweep"});
  expect_error(std::string(kBase) + grid + "\n[methods.dense]\nthreads = 4\n",
               {"'threads' is set by the sweep", "[run] threads"});
  expect_error("[sweep]\nname = \"x\"\noutput = \"o\"\n[models]\na = \"a.gguf\"\n", {"no points"});
  expect_error("[sweep]\nname = \"x\"\n[grid\n", {"not valid TOML"});
  expect_error(R"(
[sweep]
name = "x"
output = "out"
[models]
a = "missing.gguf"
[corpora]
text = "corpus.txt"
[grid]
model = ["a"]
corpus = ["text"]
method = ["dense"]
)",
               {"[models] a = \"missing.gguf\"", "does not exist"});
  expect_error(missing_calibration_spec("x", "no-such-calibration.h5"),
               {"[calibration.a] file", "does not exist"});
}

TEST_F(SweepSpec, PlanChecksEveryPointWithTheCommandsOwnParser) {
  const Spec s = load(std::string(kBase) + R"(
[grid]
model = ["a"]
corpus = ["text"]
method = ["dense"]
)");
  PlanHooks h;
  std::vector<std::vector<std::string>> seen;
  h.check_options = [&](const std::vector<std::string>& args) {
    seen.push_back(args);
    if (args[0] == "eval") throw Error("--sparsity 7 is out of range");
    return json::object();
  };
  try {
    (void)make_plan(s, h);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("point "), std::string::npos) << m;
    EXPECT_NE(m.find("model=a corpus=text method=dense"), std::string::npos) << m;
    EXPECT_NE(m.find("--sparsity 7 is out of range"), std::string::npos) << m;
  }
  ASSERT_FALSE(seen.empty());
  // the check sees the command line the sweep will run, outputs included
  const auto& a = seen.back();
  EXPECT_NE(std::find(a.begin(), a.end(), "--out"), a.end());
  EXPECT_NE(std::find(a.begin(), a.end(), "--json"), a.end());
}

// ---- cost: the prediction sums the same per-launch formulas as the engine's ledger.
template <class E>
class SweepCost : public ::testing::Test {};
TYPED_TEST_SUITE(SweepCost, Backends, BackendName);

TYPED_TEST(SweepCost, PredictedDenseCostEqualsTheLedgerOfARealRun) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  SynthSpec spec = tiny_spec(3);
  write_synth_gguf(spec, path);
  ModelInfo mi;
  auto w = load_model<E>(path, LoadOptions{}, &mi);
  const Config& c = w->cfg;
  PplOptions o;
  o.context = 48;
  o.stride = 16;
  o.score = 16;
  o.max_windows = 3;
  std::vector<int> stream(200);
  for (std::size_t i = 0; i < stream.size(); ++i) stream[i] = static_cast<int>(7 + i * 13 % 400);
  flops::Ledger ledger(c.n_layer);
  Engine<E> eng(w, 1, o.context, &ledger, E());
  (void)perplexity(eng, stream, o);
  const auto tot = ledger.total();
  const ModelShape shape = read_model_shape(path);
  EXPECT_EQ(shape.cfg.n_layer, c.n_layer);
  const Cost k = forward_cost(shape.cfg, 4, 1, o.context, o.score + 1);
  EXPECT_NEAR(k.flops_dense * 3, tot.flops_dense, 1e-9 * tot.flops_dense);
  EXPECT_NEAR(k.bytes_dense * 3, tot.bytes_dense, 1e-9 * tot.bytes_dense);
  // predict_eval: the windows from the corpus size, capped by max-windows
  EvalWork ew;
  ew.context = o.context;
  ew.stride = o.stride;
  ew.score = o.score;
  ew.max_windows = 3;
  ew.bos = false;
  ew.corpus_bytes = 100000;
  const Cost p = predict_eval(shape, ew, CostRates{});
  EXPECT_NEAR(p.flops_dense, tot.flops_dense, 1e-9 * tot.flops_dense);
  ew.sparsity = 0.5;
  EXPECT_LT(predict_eval(shape, ew, CostRates{}).flops_realised, p.flops_realised);

  // Token Filtering: a fraction r of the q and o projections, scores, softmax and value mixing
  // is skipped (counted here from the shapes: per layer and window)
  ew.sparsity = 0;
  ew.tf_ratio = 0.25;
  const double n = o.context, T = o.context, pairs = T * (T + 1) / 2;
  const double stage = 2 * n * c.q_dim() * c.d_model * 2 + 4.0 * pairs * c.n_head * c.head_dim +
                       5.0 * pairs * c.n_head;
  const Cost tf = predict_eval(shape, ew, CostRates{});
  EXPECT_EQ(tf.flops_dense, p.flops_dense);
  EXPECT_NEAR(p.flops_realised - tf.flops_realised, 0.25 * stage * c.n_layer * 3,
              1e-9 * p.flops_dense);
  // ThinK / GRACE: the scored rows' query-key products with the prefix at (1 − λ) of the width
  ew.tf_ratio = 0;
  ew.kv_prune = 0.5;
  const double tail = o.score + 1, prefix_pairs = tail * (T - tail);
  const Cost kv = predict_eval(shape, ew, CostRates{});
  EXPECT_NEAR(p.flops_realised - kv.flops_realised,
              0.5 * 2.0 * prefix_pairs * c.n_head * c.head_dim * c.n_layer * 3,
              1e-9 * p.flops_dense);
  EXPECT_LT(kv.bytes_realised, p.bytes_realised);
}

TEST(SweepCostMethods, FamiliesOfAMethodString) {
  const auto all = method_families("topk-guided+token-filter+grace");
  EXPECT_TRUE(all.activation && all.token_filter && all.kv_prune);
  const auto dense = method_families("dense");
  EXPECT_FALSE(dense.activation || dense.token_filter || dense.kv_prune);
  const auto tf = method_families("token-filter");
  EXPECT_TRUE(tf.token_filter);
  EXPECT_FALSE(tf.activation || tf.kv_prune);
  const auto th = method_families("think");
  EXPECT_TRUE(th.kv_prune && !th.activation && !th.token_filter);
  EXPECT_TRUE(method_families("wina").activation);
  EXPECT_TRUE(method_families("teal+think").activation);
}

// ---- locks
TEST(SweepLock, ExclusiveWhileHeldAndFreeWhenTheHolderDies) {
  TempDir dir;
  const std::string p = dir.file("x.lock");
  EXPECT_FALSE(FileLock::held(p));
  {
    auto a = FileLock::try_acquire(p, "host=h pid=1");
    ASSERT_TRUE(a.has_value());
    EXPECT_TRUE(FileLock::held(p));
    EXPECT_EQ(FileLock::note(p), "host=h pid=1");
    EXPECT_FALSE(FileLock::try_acquire(p, "second").has_value());
  }
  EXPECT_FALSE(FileLock::held(p));
  // a holder killed with SIGKILL: the lock file stays, the lock does not
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    auto l = FileLock::try_acquire(p, "host=child");
    char c = l ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_EQ(c, 'y');
  EXPECT_TRUE(FileLock::held(p));
  EXPECT_FALSE(FileLock::try_acquire(p, "parent").has_value());
  ::kill(child, SIGKILL);
  int st;
  ::waitpid(child, &st, 0);
  EXPECT_TRUE(fs::exists(p));
  EXPECT_EQ(FileLock::note(p), "host=child");
  EXPECT_FALSE(FileLock::held(p));
  EXPECT_TRUE(FileLock::try_acquire(p, "parent").has_value());
  ::close(ready[0]);
  ::close(ready[1]);
}

// ---- manifests: complete, matching files only
TEST(SweepStore, ManifestVerifiesSizesHashesAndConfiguration) {
  TempDir dir;
  write_text(dir.file("run.h5"), std::string(1000, 'x'));
  const FileDigest d = digest(dir.file("run.h5"));
  EXPECT_EQ(d.bytes, 1000u);
  const json config = {{"model", "a"}, {"options", {{"sparsity", 0.5}}}};
  json m = {{"status", "done"},
            {"config", config},
            {"files", {{"run.h5", {{"bytes", d.bytes}, {"hash", d.hash}}}}}};
  std::string why;
  EXPECT_TRUE(Store::verify_manifest(m, config, dir.path().string(), &why)) << why;
  json other = config;
  other["options"]["sparsity"] = 0.6;
  EXPECT_FALSE(Store::verify_manifest(m, other, dir.path().string(), &why));
  EXPECT_NE(why.find("another configuration"), std::string::npos);
  fs::resize_file(dir.file("run.h5"), 500);  // truncated
  EXPECT_FALSE(Store::verify_manifest(m, config, dir.path().string(), &why));
  EXPECT_NE(why.find("500 bytes"), std::string::npos) << why;
  write_text(dir.file("run.h5"), std::string(999, 'x') + "y");  // same size, other bytes
  EXPECT_FALSE(Store::verify_manifest(m, config, dir.path().string(), &why));
  EXPECT_NE(why.find("hash"), std::string::npos) << why;
  m["status"] = "started";
  EXPECT_FALSE(Store::verify_manifest(m, config, dir.path().string(), &why));
}

TEST(SweepAtomic, WriteAtomicallyLeavesNoTemporaryAndRefusesToOverwriteWhenAsked) {
  TempDir dir;
  write_atomically(dir.file("a.json"), "{}\n");
  EXPECT_EQ(read_file(dir.file("a.json")), "{}\n");
  EXPECT_THROW(write_atomically(dir.file("a.json"), "x", /*overwrite=*/false), Error);
  EXPECT_EQ(read_file(dir.file("a.json")), "{}\n");
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos);
  EXPECT_THROW(write_atomically(dir.file("no/such/dir/a.json"), "x"), Error);
}

// ---- Slurm helpers
TEST(SweepSlurmChunks, TimeLimitsInEverySlurmForm) {
  EXPECT_EQ(parse_time_limit("30"), 1800);
  EXPECT_EQ(parse_time_limit("30:15"), 1815);
  EXPECT_EQ(parse_time_limit("01:00:00"), 3600);
  EXPECT_EQ(parse_time_limit("2-0"), 2 * 86400);
  EXPECT_EQ(parse_time_limit("1-02:30"), 86400 + 2 * 3600 + 30 * 60);
  EXPECT_EQ(parse_time_limit("1-00:00:10"), 86410);
  for (const char* bad : {"", "1:2:3:4", "ab", "-5", "1:", "0", "1-"}) {
    // the library names the quantity; the command line maps slurm.time to --time
    try {
      parse_time_limit(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const OptionError& e) {
      EXPECT_EQ(e.key(), "slurm.time") << bad;
      EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
    }
  }
}

TEST(SweepSlurmChunks, ChunksFitTheBudgetAndHoldEveryPointOnce) {
  std::vector<double> secs = {50, 10, 10, 10, 200, 30, 30, 5, 5, 5, 60};
  std::vector<int> pts(secs.size());
  std::iota(pts.begin(), pts.end(), 0);
  const auto c = make_chunks(secs, pts, 100, 0, 1000);
  std::multiset<int> all;
  for (const auto& ch : c) {
    double s = 0;
    for (int p : ch) {
      all.insert(p);
      s += secs[static_cast<std::size_t>(p)];
    }
    EXPECT_TRUE(s <= 100 || ch.size() == 1) << "chunk over budget: " << s;
  }
  EXPECT_EQ(all.size(), secs.size());
  EXPECT_EQ(std::set<int>(all.begin(), all.end()).size(), secs.size());
  // total 415 s in chunks of <= 100 s: at least 5, the 200 s point alone
  EXPECT_GE(c.size(), 5u);
  EXPECT_EQ(make_chunks(secs, pts, 100, 2, 1000).size(), 2u);
  EXPECT_EQ(make_chunks(secs, pts, 1, 0, 3).size(), 3u);  // capped by the array size
  EXPECT_TRUE(make_chunks(secs, {}, 100, 0, 10).empty());
}

TEST(SweepCsv, QuotesFieldsAndWritesShortestRoundTripNumbers) {
  Table t;
  Column a;
  a.name = "name";
  a.type = Column::Type::String;
  a.s = {"plain", "with,comma", "with \"quote\""};
  Column b;
  b.name = "x";
  b.type = Column::Type::Float;
  b.f = {0.1, 1.0 / 3.0, std::nan("")};
  Column c;
  c.name = "n";
  c.type = Column::Type::Int;
  c.i = {1, -2, 3};
  t.columns = {a, b, c};
  t.rows = 3;
  const auto rows = [&] {
    TempDir d;
    write_text(d.file("t.csv"), table_csv(t));
    return read_csv(d.file("t.csv"));
  }();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1].at("name"), "with,comma");
  EXPECT_EQ(rows[2].at("name"), "with \"quote\"");
  EXPECT_EQ(std::stod(rows[1].at("x")), 1.0 / 3.0);  // round trip
  EXPECT_EQ(rows[0].at("x"), "0.1");
  EXPECT_EQ(rows[2].at("x"), "");  // missing
  EXPECT_EQ(rows[1].at("n"), "-2");
}

TEST(SummaryColumns, NamesAreUniqueIdentifiersAndTheObjectReadsBack) {
  io::SummaryColumns c;
  c.add("tf_realised", 0.25, "1", "a ratio");
  c.add("kv_method", std::string("grace"), "", "a name");
  c.add("not_finite", std::nan(""), "1", "unknown for this run");
  for (const char* bad : {"", "Upper", "9lives", "has-dash", "m_reserved", "tf_realised"})
    EXPECT_THROW(c.add(bad, 1.0, "1", "x"), Error) << bad;
  const nlohmann::json j = c.json();
  EXPECT_EQ(j["tf_realised"]["value"], 0.25);
  EXPECT_EQ(j["tf_realised"]["units"], "1");
  EXPECT_EQ(j["kv_method"]["value"], "grace");
  EXPECT_TRUE(j["not_finite"]["value"].is_null());
  const io::SummaryColumns back = io::SummaryColumns::from_json(j);
  ASSERT_EQ(back.list().size(), 3u);
  EXPECT_EQ(back.json(), j);
  // a malformed entry is named
  for (const char* bad : {R"({"x": {"value": [1], "units": "", "meaning": ""}})",
                          R"({"x": {"value": 1, "meaning": ""}})", R"({"x": 1})", R"([])"}) {
    try {
      (void)io::SummaryColumns::from_json(nlohmann::json::parse(bad));
      ADD_FAILURE() << bad << " was read";
    } catch (const Error& e) {
      if (std::string(bad) != "[]") {
        EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace sparsim::test
