// sparsim sweep end to end with the real binary: plan, run, status, collect, results bitwise
// equal to the same points run one by one; faults (kill -9 halfway, a killed calibration, a
// truncated point file, a stale lock, a full disk, two sweeps at once) and bad input.
#include "sweep/lock.hpp"
#include "sweep/point_files.hpp"
#include "sweep_helpers.hpp"

#include <sys/mount.h>

#include <algorithm>
#include <cmath>

namespace sparsim::test {
namespace {

using sweep::State;

/// A dense-only study of `n_strides` x 2 models: quick points, no calibration.
std::string dense_spec(const std::string& name, const std::string& output, int n_points) {
  std::string strides;
  for (int i = 0; i < n_points / 2; ++i) strides += (i ? ", " : "") + std::to_string(8 + 4 * i);
  return spec_head(name, {"a", "b"}, output) + fmt::format(R"(
[options]
context = 128
stride = 64
max-windows = 4

[grid]
model = ["a", "b"]
corpus = ["text"]
method = ["dense"]
score = [{}]
)",
                                                           strides);
}

const std::string kCalibratedSpec =
    spec_head("calibrated", {"a", "b"}) + quick_calibration("a") + quick_calibration("b") + R"(
[options]
context = 64
stride = 32
max-windows = 3

[grid]
model = ["a", "b"]
corpus = ["text"]
method = ["dense", "teal"]

[methods.teal]
sparsity = [0.3, 0.6]
calibration = true

[[points]]
model = "a"
corpus = "text"
method = "wina"
sparsity = 0.5
calibration = true
)";

std::vector<std::string> ids_of(const json& plan) {
  std::vector<std::string> ids;
  for (const auto& p : plan["points"]) ids.push_back(p["id"]);
  return ids;
}

// --plan predicts each point from the families its method names: a token-filter or think
// point pays for no activation sparsity (its --sparsity resolves to the default 0.5 all the
// same), a combined point for both of its families.
/// scripts/tools/sweep_results.py loads <out>/results.h5 with h5py and pandas, finds `rows` rows
/// and the same table in results.csv (skipped with a note where the venv lacks h5py or pandas).
void expect_pandas_reads(const std::string& out, std::size_t rows) {
  const char* home = std::getenv("HOME");
  const std::string py = std::string(home ? home : "") + "/.cache/sparsim-deps/venv/bin/python";
  if (fs::exists(py) && run_cmd(py + " -c 'import h5py, pandas'").exit_code == 0) {
    const RunResult pd =
        run_cmd(py + " " + SPARSIM_SOURCE_DIR + "/scripts/tools/sweep_results.py " + out +
                "/results.h5 --check-csv " + out + "/results.csv");
    EXPECT_EQ(pd.exit_code, 0) << pd.output;
    EXPECT_NE(pd.output.find(std::to_string(rows) + " rows"), std::string::npos) << pd.output;
  } else {
    std::cout << "[ NOTE ] pandas check skipped: no " << py << " with h5py and pandas "
              << "(scripts/setup.sh makes it)\n";
  }
}

TEST(SweepCli, PlanPredictsAttentionSideMethodsByTheirOwnSavings) {
  Study s;
  s.add_model("a", 11, false);
  s.write_spec(spec_head("attention", {"a"}) + R"(
[options]
context = 64
stride = 32
score = 31
max-windows = 2

[grid]
model = ["a"]
corpus = ["text"]
method = ["dense", "token-filter", "think", "token-filter+think"]

[methods.token-filter]
tf-ratio = 0.5
tf-warmup = 4

[methods.think]
kv-prune = 0.5
kv-window = 8

[methods."token-filter+think"]
tf-ratio = 0.5
tf-warmup = 4
kv-prune = 0.5
kv-window = 8
)");
  const json plan = s.plan_json();
  ASSERT_EQ(plan["points"].size(), 4u);
  std::map<std::string, json> by;
  for (const auto& p : plan["points"]) by[p["method"].get<std::string>()] = p["predicted"];
  const double dense = by["dense"]["flops_realised"].get<double>();
  EXPECT_EQ(by["dense"]["flops_dense"].get<double>(), dense);
  for (const char* m : {"token-filter", "think", "token-filter+think"}) {
    EXPECT_EQ(by[m]["flops_dense"].get<double>(), dense) << m;
    EXPECT_LT(by[m]["flops_realised"].get<double>(), dense) << m;
  }
  const double tf = dense - by["token-filter"]["flops_realised"].get<double>();
  const double th = dense - by["think"]["flops_realised"].get<double>();
  const double both = dense - by["token-filter+think"]["flops_realised"].get<double>();
  EXPECT_GT(tf, th);  // the whole attention stage of half the blocks, against half the keys
  EXPECT_GT(both, tf);
  EXPECT_LT(both, tf + th);  // the skipped blocks' compacted keys are not saved twice
  // the projections stay dense: the saving is a fraction of the attention stage, not of all
  EXPECT_LT(tf, 0.5 * dense);
}

TEST(SweepCli, CollectCarriesEachMethodFamilysColumnsFromItsRecord) {
  Study s;
  s.add_model("a", 11, false);
  // a RAP-pruned copy of model a, swept as a model of its own
  const std::string a = s.file("a.gguf"), fisher = s.file("fisher.h5");
  const RunResult cal =
      run_cmd(sparsim_bin() + " calibrate --fisher --model " + a + " --corpus " +
              s.file("corpus.txt") + " --out " + fisher + " --fisher-seqs 3 --fisher-tokens 48");
  ASSERT_EQ(cal.exit_code, 0) << cal.output;
  const RunResult pr =
      run_cmd(sparsim_bin() + " prune --model " + a + " --method rap --retain 0.5 --calibration " +
              fisher + " --out " + s.file("p.gguf") + " --flops-context 64");
  ASSERT_EQ(pr.exit_code, 0) << pr.output;
  // kv-recent is also a method column of GRACE's: the method column becomes m_kv_recent
  s.write_spec(spec_head("columns", {"a", "p"}) + R"(
[options]
context = 64
stride = 32
score = 31
max-windows = 2

[grid]
model = ["a"]
corpus = ["text"]
method = ["dense", "token-filter", "grace"]

[methods.token-filter]
tf-ratio = 0.5
tf-warmup = 4

[methods.grace]
kv-prune = 0.5
kv-window = 8
kv-recent = 16

[[points]]
model = "p"
corpus = "text"
method = "dense"
)");
  const RunResult run = s.sweep("--threads 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const RunResult col = run_cmd(sparsim_bin() + " collect " + s.spec());
  ASSERT_EQ(col.exit_code, 0) << col.output;
  const auto rows = read_csv(s.out() + "/results.csv");
  ASSERT_EQ(rows.size(), 4u);
  auto h5 = io::H5File::open_read(s.out() + "/results.h5");
  const io::Group g = h5.root().open_group("results");
  const auto ids = g.read_strings("id");
  const auto models = g.read_strings("model");
  const auto methods = g.read_strings("method");
  ASSERT_EQ(ids.size(), 4u);

  // the method columns follow the fixed ones, each with its units
  const auto order = h5.root().read_strings("columns");
  const auto at = [&](const std::string& c) {
    return std::find(order.begin(), order.end(), c) - order.begin();
  };
  const std::map<std::string, std::string> units = {{"tf_target", "1"},
                                                    {"tf_realised", "1"},
                                                    {"tf_layer_target", "1"},
                                                    {"tf_gated_layers", "1"},
                                                    {"kv_lambda", "1"},
                                                    {"kv_kept_per_head", "channel"},
                                                    {"kv_head_dim", "channel"},
                                                    {"m_kv_recent", "token"},
                                                    {"k_bytes", "byte"},
                                                    {"k_bytes_dense", "byte"},
                                                    {"k_bytes_fraction", "1"},
                                                    {"kv_recon_error", "1"},
                                                    {"prune_retain", "1"},
                                                    {"prune_retain_realised", "1"},
                                                    {"orphan_ratio", "1"},
                                                    {"kv_bytes_fraction", "1"},
                                                    {"attn_params_fraction", "1"},
                                                    {"attn_flops_fraction", "1"}};
  for (const auto& [c, u] : units) {
    ASSERT_TRUE(g.has_dataset(c)) << c;
    EXPECT_EQ(g.dataset(c).type_name(), "float64") << c;
    EXPECT_EQ(g.dataset(c).get_attr<std::string>("units"), u) << c;
    EXPECT_FALSE(g.dataset(c).get_attr<std::string>("meaning").empty()) << c;
    EXPECT_GT(at(c), at("finished_utc")) << c;
  }
  for (const char* c : {"tf_criterion", "tf_layers", "kv_method", "prune_method"}) {
    ASSERT_TRUE(g.has_dataset(c)) << c;
    EXPECT_EQ(g.dataset(c).type_name(), "string") << c;
  }
  for (const auto& c : order)  // collect renames only what a fixed or option column has
    if (c.rfind("m_", 0) == 0) {
      EXPECT_EQ(c, "m_kv_recent");
    }

  const auto num = [&](const std::string& c) { return g.read<double>(c); };
  const auto str = [&](const std::string& c) { return g.read_strings(c); };
  // each row's values are those of the block its point's summary built them from
  const std::vector<std::string> tf_num = {"tf_target", "tf_realised", "tf_layer_target",
                                           "tf_gated_layers"};
  const std::vector<std::string> kv_num = {"kv_lambda",        "kv_kept_per_head", "kv_head_dim",
                                           "m_kv_recent",      "k_bytes",          "k_bytes_dense",
                                           "k_bytes_fraction", "kv_recon_error"};
  const std::vector<std::string> pr_num = {"prune_retain",         "prune_retain_realised",
                                           "orphan_ratio",         "kv_bytes_fraction",
                                           "attn_params_fraction", "attn_flops_fraction"};
  int seen = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const json sum = json::parse(read_file(s.out() + "/points/" + ids[i] + "/summary.json"));
    std::map<std::string, double> want;  // the numbers this row must hold (NaN elsewhere)
    std::map<std::string, std::string> want_s;
    if (methods[i] == "token-filter") {
      const json& tf = sum.at("token_filter");
      want = {{"tf_target", tf.at("target").get<double>()},
              {"tf_realised", tf.at("realised").get<double>()},
              {"tf_layer_target", tf.at("layer_target").get<double>()},
              {"tf_gated_layers", static_cast<double>(tf.at("layers").size())}};
      want_s = {{"tf_criterion", tf.at("criterion").get<std::string>()},
                {"tf_layers", tf.at("layer_set").get<std::string>()}};
      EXPECT_EQ(want["tf_target"], 0.5);
      EXPECT_GT(want["tf_realised"], 0);
      ++seen;
    } else if (methods[i] == "grace") {
      const json& kv = sum.at("kv_prune");
      const double b = kv.at("k_bytes").get<double>(), d = kv.at("k_bytes_dense").get<double>();
      want = {{"kv_lambda", kv.at("lambda").get<double>()},
              {"kv_kept_per_head", kv.at("kept_per_head").get<double>()},
              {"kv_head_dim", kv.at("head_dim").get<double>()},
              {"m_kv_recent", kv.at("recent").get<double>()},
              {"k_bytes", b},
              {"k_bytes_dense", d},
              {"k_bytes_fraction", b / d},
              {"kv_recon_error", kv.at("recon_error_mean").get<double>()}};
      want_s = {{"kv_method", kv.at("method").get<std::string>()}};
      EXPECT_EQ(want_s["kv_method"], "grace");
      EXPECT_EQ(want["m_kv_recent"], 16);
      EXPECT_LT(b / d, 1);
      ++seen;
    } else if (models[i] == "p") {
      const json& pj = sum.at("pruned");
      for (const auto& c : pr_num)
        want[c] = pj.at(c == "prune_retain"            ? std::string("retain")
                        : c == "prune_retain_realised" ? std::string("retain_realised")
                                                       : c)
                      .get<double>();
      want_s = {{"prune_method", pj.at("method").get<std::string>()}};
      EXPECT_EQ(want["prune_retain"], 0.5);
      EXPECT_EQ(want_s["prune_method"], "rap");
      ++seen;
    } else {
      EXPECT_EQ(methods[i], "dense");
      EXPECT_TRUE(sum.at("columns").empty()) << sum.at("columns").dump();
    }
    for (const auto* list : {&tf_num, &kv_num, &pr_num})
      for (const auto& c : *list) {
        const double v = num(c)[i];
        const std::string& csv = rows[i].at(c);
        if (want.count(c)) {
          EXPECT_EQ(v, want[c]) << ids[i] << " " << c;
          ASSERT_FALSE(csv.empty()) << ids[i] << " " << c;
          EXPECT_EQ(std::stod(csv), v) << ids[i] << " " << c;
        } else {
          EXPECT_TRUE(std::isnan(v)) << ids[i] << " " << c << " = " << v;
          EXPECT_EQ(csv, "") << ids[i] << " " << c;
        }
      }
    for (const char* c : {"tf_criterion", "tf_layers", "kv_method", "prune_method"}) {
      const std::string w = want_s.count(c) ? want_s[c] : "";
      EXPECT_EQ(str(c)[i], w) << ids[i] << " " << c;
      EXPECT_EQ(rows[i].at(c), w) << ids[i] << " " << c;
    }
    // the option column kv_recent keeps the spec's value
    EXPECT_EQ(rows[i].at("kv_recent"), methods[i] == "grace" ? "16" : "") << ids[i];
  }
  EXPECT_EQ(seen, 3);
  expect_pandas_reads(s.out(), 4);

  // two points that give a column different units: collect names both and writes nothing new
  std::string dense_id;
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (methods[i] == "dense" && models[i] == "a") dense_id = ids[i];
  const std::string dir = s.out() + "/points/" + dense_id;
  json sum = json::parse(read_file(dir + "/summary.json"));
  sum["columns"]["k_bytes"] = {{"value", 1.0}, {"units", "KiB"}, {"meaning", "K bytes"}};
  write_text(dir + "/summary.json", sum.dump());
  json man = json::parse(read_file(dir + "/point.json"));
  const sweep::FileDigest fd = sweep::digest(dir + "/summary.json");
  man["files"]["summary.json"] = {{"bytes", fd.bytes}, {"hash", fd.hash}};
  write_text(dir + "/point.json", man.dump());
  ASSERT_EQ(s.status()["done"], 4);  // the point is still done: only its units disagree
  const auto before = read_file(s.out() + "/results.csv");
  const RunResult bad = run_cmd(sparsim_bin() + " collect " + s.spec());
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  for (const std::string& w : std::vector<std::string>{"'k_bytes'", "'byte'", "'KiB'", dense_id})
    EXPECT_NE(bad.output.find(w), std::string::npos) << w << " not in: " << bad.output;
  EXPECT_EQ(read_file(s.out() + "/results.csv"), before);
}

TEST(SweepCli, PlanRunStatusCollectAndBitwiseEqualToDirectRuns) {
  Study s;
  s.add_model("a", 11, false);
  s.add_model("b", 12, false);
  s.write_spec(kCalibratedSpec);

  // --plan: every point with its id and predicted cost; nothing is written
  const RunResult plan_txt = s.sweep("--plan");
  ASSERT_EQ(plan_txt.exit_code, 0) << plan_txt.output;
  const json plan = s.plan_json();
  ASSERT_EQ(plan["points"].size(), 7u);  // 2 models x (dense + 2 teal) + 1 wina
  ASSERT_EQ(plan["calibrations"].size(), 2u);
  for (const auto& p : plan["points"]) {
    EXPECT_NE(plan_txt.output.find(p["id"].get<std::string>()), std::string::npos);
    EXPECT_GT(p["predicted"]["seconds"].get<double>(), 0);
    EXPECT_GT(p["predicted"]["flops_dense"].get<double>(), 0);
  }
  EXPECT_FALSE(fs::exists(s.out())) << "--plan wrote the output folder";

  // run: everything done, each calibration made once and shared
  const RunResult run = s.sweep("--threads 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  json st = s.status();
  EXPECT_EQ(st["points"], 7);
  EXPECT_EQ(st["done"], 7);
  EXPECT_EQ(st["pending"], 0);
  EXPECT_EQ(st["failed"], 0);
  EXPECT_EQ(st["running"], 0);
  auto n = starts(s.out());
  for (const auto& c : plan["calibrations"]) EXPECT_EQ(n[c["id"].get<std::string>()], 1);
  for (const auto& id : ids_of(plan)) EXPECT_EQ(n[id], 1) << id;

  // the same points run one by one give bitwise the same results
  expect_same_as_direct(s, plan, s.out());

  // collect: one row per point, the values of the run files
  const RunResult col = run_cmd(sparsim_bin() + " collect " + s.spec());
  ASSERT_EQ(col.exit_code, 0) << col.output;
  const auto rows = read_csv(s.out() + "/results.csv");
  ASSERT_EQ(rows.size(), 7u);
  auto h5 = io::H5File::open_read(s.out() + "/results.h5");
  const io::Group g = h5.root().open_group("results");
  EXPECT_EQ(g.get_attr<std::int64_t>("rows"), 7);
  const auto ppl = g.read<double>("perplexity");
  const auto ids = g.read_strings("id");
  const auto target = g.read<double>("sparsity_target");
  const auto realised = g.read<double>("sparsity_realised");
  const auto fl_d = g.read<double>("flops_dense");
  const auto fl_r = g.read<double>("flops_realised");
  const auto by_r = g.read<double>("bytes_realised");
  const auto methods = g.read_strings("method");
  ASSERT_EQ(ppl.size(), 7u);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const json sum = json::parse(read_file(s.out() + "/points/" + ids[i] + "/summary.json"));
    EXPECT_EQ(ppl[i], sum["perplexity"].get<double>()) << ids[i];
    EXPECT_EQ(rows[i].at("id"), ids[i]);
    EXPECT_EQ(std::stod(rows[i].at("perplexity")), ppl[i]);  // CSV round-trips exactly
    EXPECT_GT(by_r[i], 0);
    if (methods[i] == "dense") {
      EXPECT_EQ(target[i], 0.0);
      EXPECT_EQ(fl_d[i], fl_r[i]);
    } else {
      EXPECT_GT(target[i], 0.0);
      EXPECT_GT(realised[i], 0.0);
      EXPECT_LT(fl_r[i], fl_d[i]);
    }
  }
  for (const char* c : {"model_fingerprint", "corpus_fingerprint", "sparsim_version", "sparsity",
                        "context", "wall_seconds", "bytes_dense", "tasks_acc", "calibration"})
    EXPECT_TRUE(g.has_dataset(c)) << c;

  // h5py and pandas read the table, and it is the CSV's (scripts/tools/sweep_results.py)
  expect_pandas_reads(s.out(), 7);

  // a rerun has nothing to do
  const RunResult again = s.sweep();
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(starts(s.out()), n);

  // a truncated point file: that point (only) is pending again, and rerun
  const std::vector<std::string> all = ids_of(plan);
  const std::string victim = all[3];
  auto before = done_files(s.out(), all);
  fs::resize_file(s.out() + "/points/" + victim + "/run.h5",
                  fs::file_size(s.out() + "/points/" + victim + "/run.h5") / 2);
  st = s.status();
  EXPECT_EQ(st["done"], 6);
  EXPECT_EQ(st["pending"], 1);
  EXPECT_EQ(st["pending_points"][0]["id"], victim);
  EXPECT_NE(st["pending_points"][0]["why"].get<std::string>().find("bytes"), std::string::npos);
  const RunResult fix = s.sweep();
  ASSERT_EQ(fix.exit_code, 0) << fix.output;
  EXPECT_EQ(s.status()["done"], 7);
  auto n2 = starts(s.out());
  for (const auto& id : all) EXPECT_EQ(n2[id], id == victim ? 2 : 1) << id;
  auto after = done_files(s.out(), all);
  for (const auto& id : all) {
    if (id != victim) {
      EXPECT_TRUE(before[id] == after[id]) << "point " << id << " was rewritten";
    }
  }
}

TEST(SweepCli, KilledHalfwayResumesWithoutLosingOrRedoingAPoint) {
  Study s;
  s.add_model("a", 21);
  s.add_model("b", 22);
  s.write_spec(dense_spec("kill", "out", 10));
  const json plan = s.plan_json();
  const auto all = ids_of(plan);
  ASSERT_EQ(all.size(), 10u);
  auto v = s.view();
  {
    Background bg("exec " + sparsim_bin() + " sweep " + s.spec() + " --threads 1",
                  s.file("run1.log"));
    ASSERT_TRUE(
        wait_for([&] { return bg.exited() || (v->manifests() >= 2 && v->locked() >= 1); }, 120))
        << read_file(s.file("run1.log"));
    ASSERT_FALSE(bg.exited()) << "the sweep finished before it could be killed halfway";
    ::kill(bg.pid(), SIGKILL);
    EXPECT_EQ(bg.wait(30), 128 + SIGKILL);
  }
  // the killed point's command dies with its sweep and leaves no lock behind
  ASSERT_TRUE(wait_for([&] { return v->locked() == 0; }, 20));
  const int done = v->count(State::Done);
  EXPECT_GE(done, 2);
  EXPECT_LT(done, 10);
  EXPECT_EQ(v->count(State::Done) + v->count(State::Pending), 10);
  const auto before = done_files(s.out(), all);
  EXPECT_EQ(static_cast<int>(before.size()), done) << "a point has a manifest but is not done";

  // a stale lock on a pending point: a file nobody holds
  std::string stale;
  for (const auto& id : all)
    if (!before.count(id)) stale = id;
  fs::create_directories(s.out() + "/points/" + stale);
  write_text(s.out() + "/points/" + stale + "/lock", "host=gone pid=999999 since=yesterday\n");

  const RunResult r = s.sweep("--threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(s.status()["done"], 10);
  const auto after = done_files(s.out(), all);
  const auto n = starts(s.out());
  for (const auto& [id, files] : before) {
    EXPECT_TRUE(files == after.at(id)) << "finished point " << id << " was rewritten";
    EXPECT_EQ(n.at(id), 1) << "finished point " << id << " ran again";
  }
  for (const auto& id : all) EXPECT_LE(n.at(id), 2) << id;
  // no work folder of the killed attempt survives
  for (const auto& id : all)
    for (const auto& e : fs::directory_iterator(s.out() + "/points/" + id))
      EXPECT_EQ(e.path().filename().string().rfind(".work-", 0), std::string::npos) << e.path();
  expect_same_as_direct(s, plan, s.out());
}

TEST(SweepCli, KilledDuringCalibrationMakesItAgainOnce) {
  Study s;
  s.add_model("a", 31, false);
  s.add_model("b", 32, false);
  s.write_spec(kCalibratedSpec);
  auto v = s.view();
  ASSERT_EQ(v->plan.calibrations.size(), 2u);
  const std::string lock = v->store->calibration_base(v->plan.calibrations[0]) + ".lock";
  const std::string lock1 = v->store->calibration_base(v->plan.calibrations[1]) + ".lock";
  {
    Background bg("exec " + sparsim_bin() + " sweep " + s.spec() + " --threads 1",
                  s.file("run1.log"));
    ASSERT_TRUE(wait_for(
        [&] { return bg.exited() || sweep::FileLock::held(lock) || sweep::FileLock::held(lock1); },
        60));
    ASSERT_FALSE(bg.exited()) << read_file(s.file("run1.log"));
    ::kill(bg.pid(), SIGKILL);
    bg.wait(30);
  }
  ASSERT_TRUE(
      wait_for([&] { return !sweep::FileLock::held(lock) && !sweep::FileLock::held(lock1); }, 20));
  const RunResult r = s.sweep("--threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(s.status()["done"], 7);
  int completed = 0;
  for (const auto& e : journal_events(s.out()))
    if (e["task"] == "calibration" && e["event"] == "done") ++completed;
  EXPECT_EQ(completed, 2) << "each calibration is made exactly once to completion";
}

TEST(SweepCli, TwoSweepsOnTheSameFolderRunEveryPointOnce) {
  Study s;
  s.add_model("a", 41);
  s.add_model("b", 42);
  s.write_spec(dense_spec("twice", "out", 10));
  const auto all = ids_of(s.plan_json());
  {
    // both wait for one start signal, so that a loaded machine cannot start one sweep so late
    // that the other has run every point by then
    const std::string go = s.file("go");
    const std::string cmd = "while [ ! -e " + go + " ]; do sleep 0.01; done; exec " +
                            sparsim_bin() + " sweep " + s.spec() + " --threads 1";
    Background one(cmd, s.file("one.log"));
    Background two(cmd, s.file("two.log"));
    write_text(go, "");
    EXPECT_EQ(one.wait(180), 0) << read_file(s.file("one.log"));
    EXPECT_EQ(two.wait(180), 0) << read_file(s.file("two.log"));
  }
  EXPECT_EQ(s.status()["done"], 10);
  const auto n = starts(s.out());
  std::set<int> pids;
  for (const auto& e : journal_events(s.out()))
    if (e["event"] == "start") pids.insert(e["pid"].get<int>());
  for (const auto& id : all) EXPECT_EQ(n.at(id), 1) << "point " << id << " ran " << n.at(id);
  EXPECT_EQ(pids.size(), 2u) << "both sweeps should have run points";
}

TEST(SweepCli, StatusNamesRunningAndFailedPointsAndARerunCompletesOnlyThose) {
  Study s;
  s.add_model("a", 45);
  // short.txt: too little text for one window, which only the point's own run finds out
  write_text(s.file("short.txt"), "A few words only.\n");
  s.write_spec(spec_head("status", {"a"}, "out", "text = \"corpus.txt\"\nshort = \"short.txt\"\n") +
               R"(
[options]
context = 128
stride = 64
max-windows = 2

[grid]
model = ["a"]
corpus = ["text", "short"]
method = ["dense"]
score = [8, 12]
)");
  const json plan = s.plan_json();
  ASSERT_EQ(plan["points"].size(), 4u);
  std::vector<std::string> ok, bad;
  for (const auto& p : plan["points"])
    (p["config"]["corpus"].get<std::string>().find("short.txt") != std::string::npos ? bad : ok)
        .push_back(p["id"]);
  ASSERT_EQ(ok.size(), 2u);
  ASSERT_EQ(bad.size(), 2u);

  // 1. the broken model's points fail; the sweep says which and why, and exits non-zero
  const RunResult r = s.sweep("--threads 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (const auto& id : bad)
    EXPECT_NE(r.output.find("failed " + id), std::string::npos) << r.output;
  json st = s.status();
  EXPECT_EQ(st["points"], 4);
  EXPECT_EQ(st["done"], 2);
  EXPECT_EQ(st["failed"], 2);
  EXPECT_EQ(st["running"], 0);
  EXPECT_EQ(st["pending"], 0);
  ASSERT_EQ(st["failures"].size(), 2u);
  for (const auto& f : st["failures"]) {
    EXPECT_NE(std::find(bad.begin(), bad.end(), f["id"].get<std::string>()), bad.end());
    const std::string msg = f["message"];
    EXPECT_NE(msg.find("exit code"), std::string::npos) << msg;
    EXPECT_GT(msg.size(), std::string("exit code 1").size()) << "no reason given: " << msg;
  }
  const RunResult text = s.sweep("--status");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const auto& id : bad) EXPECT_NE(text.output.find("failed  " + id), std::string::npos);
  const auto before = done_files(s.out(), ok);
  ASSERT_EQ(before.size(), 2u);
  // collect takes the finished points only
  ASSERT_EQ(run_cmd(sparsim_bin() + " collect " + s.spec()).exit_code, 0);
  EXPECT_EQ(read_csv(s.out() + "/results.csv").size(), 2u);

  // 2. the corpus is repaired; another process holds one failed point: status says running,
  //    with the holder's note, and a sweep leaves that point alone
  fs::copy_file(s.file("corpus.txt"), s.file("short.txt"), fs::copy_options::overwrite_existing);
  auto v = s.view();
  auto held = sweep::FileLock::try_acquire(v->store->point_lock(bad[0]),
                                           "host=elsewhere pid=4242 since=now");
  ASSERT_TRUE(held.has_value());
  st = s.status();
  EXPECT_EQ(st["running"], 1);
  ASSERT_EQ(st["running_points"].size(), 1u);
  EXPECT_EQ(st["running_points"][0]["id"], bad[0]);
  EXPECT_NE(st["running_points"][0]["holder"].get<std::string>().find("pid=4242"),
            std::string::npos);
  const RunResult r2 = s.sweep("--threads 1");
  EXPECT_NE(r2.output.find("1 running elsewhere"), std::string::npos) << r2.output;
  st = s.status();
  EXPECT_EQ(st["done"], 3);
  EXPECT_EQ(st["running"], 1);
  auto n = starts(s.out());
  EXPECT_EQ(n[bad[0]], 1) << "a point held elsewhere was started";

  // 3. the holder is gone: the last point runs; finished points are neither rerun nor rewritten
  held.reset();
  const RunResult r3 = s.sweep("--threads 1");
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  st = s.status();
  EXPECT_EQ(st["done"], 4);
  EXPECT_EQ(st["failed"], 0);
  EXPECT_EQ(st["failures"].size(), 0u);
  n = starts(s.out());
  for (const auto& id : ok) EXPECT_EQ(n[id], 1) << id;
  for (const auto& id : bad) EXPECT_EQ(n[id], 2) << id;
  const auto after = done_files(s.out(), ok);
  for (const auto& [id, files] : before)
    EXPECT_TRUE(files == after.at(id)) << "finished point " << id << " was rewritten";
  expect_same_as_direct(s, plan, s.out());
}

/// A small tmpfs mounted for the test (skips when this machine does not allow mounting).
class SmallFs {
 public:
  SmallFs(const std::string& dir, const std::string& size) : dir_(dir) {
    fs::create_directories(dir);
    ok_ = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
    err_ = ok_ ? "" : std::strerror(errno);
  }
  ~SmallFs() {
    if (ok_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return err_; }
  bool grow(const std::string& size) {
    return ::mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT, ("size=" + size).c_str()) == 0;
  }

 private:
  std::string dir_, err_;
  bool ok_ = false;
};

TEST(SweepCli, FullDiskFailsCleanlyAndTheRerunCompletesOnlyTheMissingPoints) {
  Study s;
  s.add_model("a", 51);
  s.add_model("b", 52);
  s.write_spec(dense_spec("fulldisk", "disk/out", 10));
  SmallFs disk(s.file("disk"), "160k");
  if (!disk.ok())
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << disk.error()
                 << "): the full-disk case needs root or CAP_SYS_ADMIN";
  const auto all = ids_of(s.plan_json());
  const std::string out = s.file("disk/out");
  const RunResult r = s.sweep("--threads 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("failed"), std::string::npos) << r.output;
  const json st = s.status();
  const int done = st["done"].get<int>();
  EXPECT_LT(done, 10) << "the file system was meant to fill up";
  EXPECT_EQ(st["running"], 0);
  // every point that says done is complete (the status checks sizes and hashes)
  auto v = s.view();
  int manifests = 0;
  for (const auto& id : all) manifests += fs::exists(out + "/points/" + id + "/point.json");
  EXPECT_EQ(manifests, done) << "a manifest vouches for an incomplete point";
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  const auto before = done_files(out, all);

  ASSERT_TRUE(disk.grow("64m"));
  const RunResult r2 = s.sweep("--threads 1");
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_EQ(s.status()["done"], 10);
  const auto after = done_files(out, all);
  for (const auto& [id, files] : before)
    EXPECT_TRUE(files == after.at(id)) << "finished point " << id << " was rewritten";
  const auto n = starts(out);
  for (const auto& [id, files] : before) EXPECT_EQ(n.at(id), 1) << id;
}

TEST(SweepCli, ChunksRunOnlyTheirPointsAndTheSlurmScriptSaysWhatItRuns) {
  Study s;
  s.add_model("a", 61, false);
  s.add_model("b", 62, false);
  s.write_spec(dense_spec("chunks", "out", 6));
  const RunResult w = s.sweep(
      "--slurm --no-submit --time 00:20:00 --partition gpu --gpus-per-task 1 --chunks 2 "
      "--sbatch-option=--constraint=a100");
  ASSERT_EQ(w.exit_code, 0) << w.output;
  const std::string script = read_file(s.out() + "/slurm/0/job.sbatch");
  for (const char* line :
       {"#SBATCH --array=0-1", "#SBATCH --time=00:20:00", "#SBATCH --partition=gpu",
        "#SBATCH --gpus-per-task=1", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@",
        "#SBATCH --constraint=a100", "--chunk-file", "scontrol requeue"})
    EXPECT_NE(script.find(line), std::string::npos) << line << "\n" << script;
  const json chunks = json::parse(read_file(s.out() + "/slurm/0/chunks.json"));
  ASSERT_EQ(chunks["chunks"].size(), 2u);
  std::set<std::string> in_chunks;
  for (const auto& c : chunks["chunks"])
    for (const auto& id : c) in_chunks.insert(id.get<std::string>());
  EXPECT_EQ(in_chunks.size(), 6u);
  // one chunk by hand: exactly its points
  const RunResult c0 = s.sweep("--chunk-file " + s.out() + "/slurm/0/chunks.json --chunk 0");
  ASSERT_EQ(c0.exit_code, 0) << c0.output;
  const json st = s.status();
  EXPECT_EQ(st["done"], static_cast<int>(chunks["chunks"][0].size()));
  for (const auto& id : chunks["chunks"][0])
    EXPECT_TRUE(fs::exists(s.out() + "/points/" + id.get<std::string>() + "/point.json"));
  // a second --slurm only packs what is left
  const RunResult w2 = s.sweep("--slurm --no-submit --time 00:20:00");
  ASSERT_EQ(w2.exit_code, 0) << w2.output;
  const json chunks2 = json::parse(read_file(s.out() + "/slurm/1/chunks.json"));
  std::size_t left = 0;
  for (const auto& c : chunks2["chunks"]) left += c.size();
  EXPECT_EQ(left, chunks["chunks"][1].size());
}

class SweepBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    s_.add_model("a", 71, false);
    s_.add_model("b", 72, false);
  }
  /// The sweep (and its --plan) fail naming `needle`, and write nothing.
  void expect_refused(const std::string& spec, const std::vector<std::string>& needles,
                      bool out_exists = false) {
    s_.write_spec(spec);
    std::set<std::string> listing_before;
    if (out_exists)
      for (const auto& e : fs::recursive_directory_iterator(s_.out()))
        listing_before.insert(e.path().string() + ":" +
                              std::to_string(e.is_regular_file() ? fs::file_size(e.path()) : 0));
    for (const std::string mode : {"--plan", "", "--slurm --no-submit --time 00:10:00"}) {
      const RunResult r = s_.sweep(mode);
      EXPECT_NE(r.exit_code, 0) << mode << ": " << r.output;
      for (const auto& n : needles)
        EXPECT_NE(r.output.find(n), std::string::npos)
            << mode << ": '" << n << "' not in: " << r.output;
    }
    if (!out_exists) {
      EXPECT_FALSE(fs::exists(s_.out())) << "a refused sweep created its output folder";
    } else {
      std::set<std::string> after;
      for (const auto& e : fs::recursive_directory_iterator(s_.out()))
        after.insert(e.path().string() + ":" +
                     std::to_string(e.is_regular_file() ? fs::file_size(e.path()) : 0));
      EXPECT_EQ(listing_before, after) << "a refused sweep changed the output folder";
    }
  }
  Study s_;
};

const std::string kHead = spec_head("bad", {"a"}) + R"(
[calibration.a]
corpus = "text"
context = 64
max-windows = 2
)";

TEST_F(SweepBadInput, UnknownKey) {
  expect_refused(std::string(kHead) + R"(
[grid]
model = ["a"]
corpus = ["text"]
method = ["dense"]
methd = ["teal"]
)",
                 {"methd", "unrecognised option"});
  expect_refused(std::string(kHead) +
                     "[grid]\nmodel = [\"a\"]\ncorpus = [\"text\"]\n"
                     "method = [\"dense\"]\n[gird]\nx = 1\n",
                 {"unknown key 'gird'"});
}

TEST_F(SweepBadInput, EmptyAxis) {
  expect_refused(std::string(kHead) + R"(
[grid]
model = ["a"]
corpus = ["text"]
method = ["dense", "teal"]
[methods.teal]
calibration = true
sparsity = []
)",
                 {"[methods.teal] sparsity", "empty list"});
}

TEST_F(SweepBadInput, ValueOutOfRangeForItsMethod) {
  expect_refused(std::string(kHead) + R"(
[grid]
model = ["a"]
corpus = ["text"]
method = ["dense", "teal"]
[methods.teal]
calibration = true
sparsity = [0.5, 1.5]
)",
                 {"method=teal", "sparsity=1.5", "--sparsity"});
}

TEST_F(SweepBadInput, MissingModelOrCalibrationFile) {
  expect_refused(R"(
[sweep]
name = "bad"
output = "out"
[models]
a = "a.gguf"
gone = "models/gone.gguf"
[corpora]
text = "corpus.txt"
[grid]
model = ["a", "gone"]
corpus = ["text"]
method = ["dense"]
)",
                 {"[models] gone", "does not exist"});
  expect_refused(missing_calibration_spec("bad", "cal/a.h5"),
                 {"[calibration.a] file", "does not exist"});
}

TEST_F(SweepBadInput, NonsenseOptionsNameTheOptionAndWriteNothing) {
  s_.write_spec(dense_spec("opts", "out", 2));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--plan --status", "exclude each other"},
      {"--collect --slurm", "exclude each other"},
      {"--json", "--json goes with --plan or --status"},
      {"--jobs 0", "--jobs 0"},
      {"--threads -3", "--threads -3"},
      {"--chunk 1", "--chunk-file and --chunk go together"},
      {"--slurm --no-submit --time soon", "--time 'soon' is not one of"},
      {"--slurm --no-submit --chunks -1", "--chunks"},
      {"--no-such-option", "no-such-option"},
  };
  for (const auto& [args, needle] : cases) {
    const RunResult r = s_.sweep(args);
    EXPECT_NE(r.exit_code, 0) << args << ": " << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << ": " << r.output;
    EXPECT_FALSE(fs::exists(s_.out())) << args << " created the output folder";
  }
  const RunResult none = run_cmd(sparsim_bin() + " sweep");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("give the spec file"), std::string::npos) << none.output;
  const RunResult missing = run_cmd(sparsim_bin() + " sweep " + s_.file("nope.toml"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("nope.toml"), std::string::npos) << missing.output;
}

TEST_F(SweepBadInput, OutputFolderOfAnotherSpec) {
  s_.write_spec(dense_spec("first", "out", 2));
  const RunResult r = s_.sweep("--threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_refused(dense_spec("second", "out", 2), {"belongs to the sweep 'first'"},
                 /*out_exists=*/true);
}

}  // namespace
}  // namespace sparsim::test
