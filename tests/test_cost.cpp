// The cost model: hardware profiles (the shipped vendor files, validation of bad ones), the
// ledger reader (schema checks, generic op lists) and the roofline of hand-made ledgers against
// hand-computed times.
#include "core/error.hpp"
#include "cost/hardware.hpp"
#include "cost/report.hpp"
#include "cost/roofline.hpp"
#include "flops/ledger.hpp"
#include "flops/ledger_file.hpp"
#include "flops/report.hpp"
#include "helpers.hpp"
#include "io/hdf5.hpp"
#include "io/run_file.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;
using flops::Op;
using flops::Phase;

/// Expects `f` to throw sparsim::Error whose message contains every needle.
template <class F>
void expect_error(F&& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << *needles.begin();
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* n : needles) EXPECT_NE(m.find(n), std::string::npos) << n << " in: " << m;
  }
}

/// The /run group of a run file of the current schema.
void write_run(io::Group root, std::int64_t schema = io::kRunSchemaVersion) {
  io::Group run = root.create_group("run");
  run.set_attr("format", io::kRunFormat);
  run.set_attr("schema_version", schema);
  run.set_attr("command", "hand-made");
  run.set_attr("version", "test");
}

/// A hand-made ledger: 2 layers; prefill of 16 tokens in one call, 3 decode calls.
flops::Ledger hand_ledger() {
  flops::Ledger l(2);
  l.count_call(Phase::Prefill, 16);
  for (int i = 0; i < 3; ++i) l.count_call(Phase::Decode, 1);
  // prefill q_proj: compute-bound on the test profile below
  l.add(Op::QProj, 0, Phase::Prefill, 2e9, 2e9, 1e8, 1e8);
  l.add(Op::QProj, 1, Phase::Prefill, 2e9, 1e9, 1e8, 5e7);  // half sparse
  // decode q_proj: memory-bound, three launches
  for (int i = 0; i < 3; ++i) l.add(Op::QProj, 0, Phase::Decode, 1e6, 5e5, 1e9, 6e8);
  // an op a dense run does not have
  l.add(Op::MaskSelect, 0, Phase::Decode, 0, 1e3, 0, 4e3);
  l.add(Op::Embedding, -1, Phase::Decode, 0, 0, 1e4, 1e4);
  return l;
}

const char* kTestProfile = R"({
  "format": "sparsim-hardware", "version": 1, "name": "test-hw", "description": "a test machine",
  "kind": "vendor", "peak_flops": {"fp32": 1e12, "bf16": 4e12},
  "memory_bandwidth": 1e11, "l2_bytes": 1e6, "launch_overhead_s": 1e-5,
  "sources": {"peak_flops.fp32": "doc A", "peak_flops.bf16": "doc B", "memory_bandwidth": "doc C",
              "l2_bytes": "doc D", "launch_overhead_s": "doc E"}
})";

class CostFiles : public ::testing::Test {
 protected:
  std::string write_hand_run(const std::string& name) {
    const std::string p = dir_.file(name);
    io::H5File f = io::H5File::create(p);
    write_run(f.root());
    io::Group g = f.root().create_group("flops");
    hand_ledger().write(g);
    f.close();
    return p;
  }
  TempDir dir_;
};

TEST(CostHardware, ShippedVendorProfilesParseAndCiteEveryNumber) {
  const std::vector<std::string> names = cost::available_hardware_profiles();
  for (const char* want : {"a100-40gb", "a100-80gb", "h100-sxm", "h200"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  for (const std::string& n : names) {
    const cost::HardwareProfile p = cost::load_hardware_profile(n);
    if (p.kind != "vendor") continue;
    EXPECT_GT(p.peak("fp32"), 1e12) << n;
    for (const char* prec : {"tf32", "bf16", "fp16"}) EXPECT_GT(p.peak(prec), p.peak("fp32")) << n;
    EXPECT_GT(p.memory_bandwidth, 1e12) << n;
    EXPECT_GE(p.l2_bytes, 40.0 * (1 << 20)) << n;
    EXPECT_GT(p.launch_overhead_s, 0) << n;
    for (const char* f : {"memory_bandwidth", "l2_bytes", "launch_overhead_s", "peak_flops.fp32",
                          "peak_flops.bf16"})
      EXPECT_FALSE(p.sources.at(f).empty()) << n << " " << f;
  }
  // the datasheet figures the predictions rest on
  const cost::HardwareProfile h200 = cost::load_hardware_profile("H200");  // names: any case
  EXPECT_DOUBLE_EQ(h200.memory_bandwidth, 4.8e12);
  EXPECT_DOUBLE_EQ(h200.peak("fp32"), 67e12);
  EXPECT_DOUBLE_EQ(h200.peak("bf16"), 989.5e12);
  EXPECT_DOUBLE_EQ(h200.memory_bytes, 141e9);
  const cost::HardwareProfile a100 = cost::load_hardware_profile("a100");  // an alias
  EXPECT_EQ(a100.name, "a100-40gb");
  EXPECT_DOUBLE_EQ(a100.memory_bandwidth, 1555e9);
  EXPECT_DOUBLE_EQ(cost::load_hardware_profile("a100-80gb").memory_bandwidth, 2039e9);
  EXPECT_DOUBLE_EQ(cost::load_hardware_profile("h100-sxm").memory_bandwidth, 3.35e12);
}

TEST(CostHardware, BadProfilesAreRefusedWithTheField) {
  auto with = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(kTestProfile);
    edit(j);
    return j.dump();
  };
  auto parse = [](const std::string& s) { return cost::parse_hardware_profile(s, "p.json"); };
  EXPECT_NO_THROW(parse(kTestProfile));
  expect_error([&] { parse("{ not json"); }, {"p.json", "not valid JSON"});
  expect_error([&] { parse(with([](auto& j) { j.erase("format"); })); },
               {"not a sparsim hardware profile"});
  expect_error([&] { parse(with([](auto& j) { j["version"] = 7; })); }, {"version 7"});
  expect_error([&] { parse(with([](auto& j) { j.erase("memory_bandwidth"); })); },
               {"missing field 'memory_bandwidth'"});
  expect_error([&] { parse(with([](auto& j) { j.erase("l2_bytes"); })); },
               {"missing field 'l2_bytes'"});
  expect_error([&] { parse(with([](auto& j) { j.erase("launch_overhead_s"); })); },
               {"missing field 'launch_overhead_s'"});
  expect_error([&] { parse(with([](auto& j) { j["peak_flops"].erase("fp32"); })); },
               {"peak_flops.fp32"});
  expect_error([&] { parse(with([](auto& j) { j["memory_bandwidth"] = -3; })); },
               {"memory_bandwidth", "positive"});
  expect_error([&] { parse(with([](auto& j) { j["memory_bandwidth"] = "fast"; })); },
               {"memory_bandwidth", "must be a number"});
  expect_error([&] { parse(with([](auto& j) { j["sources"].erase("l2_bytes"); })); },
               {"sources.\"l2_bytes\""});
  expect_error([&] { parse(with([](auto& j) { j["kind"] = "guess"; })); }, {"kind"});
  expect_error([&] { parse(with([](auto& j) {
                       j["threads"] = {{{"threads", 2}}};
                     })); },
               {"threads[0].copy_bandwidth"});
  expect_error([] { cost::load_hardware_profile("tpu-v9"); },
               {"unknown hardware profile 'tpu-v9'", "h200"});
  expect_error([] { cost::load_hardware_profile("/no/such/profile.json"); }, {"does not exist"});
  expect_error([&] { parse(kTestProfile).peak("fp8"); }, {"no peak FLOP/s for precision 'fp8'"});
}

TEST(CostHardware, MeasuredProfileAppliesTheRowOfTheThreadCount) {
  nlohmann::json j = nlohmann::json::parse(kTestProfile);
  j["kind"] = "measured";
  j["threads"] = nlohmann::json::array({{{"threads", 1},
                                         {"copy_bandwidth", 8e9},
                                         {"read_bandwidth", 9e9},
                                         {"sgemm_flops", 5e10},
                                         {"gemv_bandwidth", 7e9},
                                         {"launch_overhead_s", 1e-6}},
                                        {{"threads", 2},
                                         {"copy_bandwidth", 1.4e10},
                                         {"read_bandwidth", 1.2e10},
                                         {"sgemm_flops", 9e10},
                                         {"gemv_bandwidth", 1.1e10},
                                         {"launch_overhead_s", 3e-6}}});
  const cost::HardwareProfile p = cost::parse_hardware_profile(j.dump(), "m.json");
  std::string note;
  const cost::HardwareProfile one = p.at_threads(1, &note);
  EXPECT_DOUBLE_EQ(one.peak("fp32"), 5e10);
  EXPECT_DOUBLE_EQ(one.memory_bandwidth, 9e9);  // the faster streaming kernel
  EXPECT_DOUBLE_EQ(one.launch_overhead_s, 1e-6);
  EXPECT_NE(note.find("1 thread"), std::string::npos) << note;
  const cost::HardwareProfile two = p.at_threads(2);
  EXPECT_DOUBLE_EQ(two.peak("fp32"), 9e10);
  EXPECT_DOUBLE_EQ(two.memory_bandwidth, 1.4e10);
  const cost::HardwareProfile none = p.at_threads(8, &note);
  EXPECT_DOUBLE_EQ(none.memory_bandwidth, 1e11);
  EXPECT_NE(note.find("no rates measured at 8 threads"), std::string::npos) << note;
}

TEST_F(CostFiles, RooflineOfAHandMadeLedgerEqualsHandComputedTimes) {
  const flops::LedgerFile lf = flops::read_ledger_file(write_hand_run("run.h5"));
  const cost::HardwareProfile hw = cost::parse_hardware_profile(kTestProfile, "t.json");
  const cost::Prediction pr = cost::predict(lf, hw, "fp32");
  const std::size_t pre = static_cast<std::size_t>(lf.phase_index("prefill"));
  const std::size_t dec = static_cast<std::size_t>(lf.phase_index("decode"));
  const auto q = static_cast<std::size_t>(lf.op_index("q_proj"));
  const auto ms = static_cast<std::size_t>(lf.op_index("mask_select"));
  const auto emb = static_cast<std::size_t>(lf.op_index("embedding"));
  // prefill q_proj, layer 0: max(2e9/1e12, 1e8/1e11) + 1e-5 = 2e-3 + 1e-5
  // layer 1 realised: max(1e9/1e12, 5e7/1e11) + 1e-5 = 1e-3 + 1e-5
  EXPECT_DOUBLE_EQ(pr.realised_op(lf, pre, q).seconds, (2e-3 + 1e-5) + (1e-3 + 1e-5));
  EXPECT_DOUBLE_EQ(pr.dense_op(lf, pre, q).seconds, 2 * (2e-3 + 1e-5));
  EXPECT_STREQ(pr.realised_op(lf, pre, q).bound(), "compute");
  // decode q_proj: 3 launches, 1.5e6 FLOP, 1.8e9 bytes: max(1.5e-6, 1.8e-2) + 3e-5
  EXPECT_DOUBLE_EQ(pr.realised_op(lf, dec, q).seconds, 1.8e-2 + 3e-5);
  EXPECT_DOUBLE_EQ(pr.dense_op(lf, dec, q).seconds, 3e-2 + 3e-5);
  EXPECT_STREQ(pr.realised_op(lf, dec, q).bound(), "memory");
  // mask selection: max(1e-9, 4e-8) + 1e-5 realised, nothing dense (launch included)
  EXPECT_DOUBLE_EQ(pr.realised_op(lf, dec, ms).seconds, 4e-8 + 1e-5);
  EXPECT_DOUBLE_EQ(pr.dense_op(lf, dec, ms).seconds, 0.0);
  EXPECT_STREQ(pr.realised_op(lf, dec, ms).bound(), "launch");
  EXPECT_DOUBLE_EQ(pr.realised_op(lf, dec, emb).seconds, 1e-7 + 1e-5);
  const double dec_real = (1.8e-2 + 3e-5) + (4e-8 + 1e-5) + (1e-7 + 1e-5);
  const double dec_dense = (3e-2 + 3e-5) + (1e-7 + 1e-5);
  EXPECT_NEAR(pr.realised_phase(lf, dec).seconds, dec_real, 1e-15);
  EXPECT_NEAR(pr.dense_phase(lf, dec).seconds, dec_dense, 1e-15);
  // per layer: layer 0 of decode holds q_proj and mask_select
  EXPECT_NEAR(pr.realised_slot(lf, dec, 1).seconds, (1.8e-2 + 3e-5) + (4e-8 + 1e-5), 1e-15);

  // the report: tokens/s and speedups from the same numbers
  const auto j = cost::prediction_json(lf, hw, pr, "");
  EXPECT_NEAR(j["decode_tokens_per_s"].get<double>(), 3.0 / dec_real, 1e-9);
  const double pre_real = (2e-3 + 1e-5) + (1e-3 + 1e-5), pre_dense = 2 * (2e-3 + 1e-5);
  EXPECT_NEAR(j["prefill_tokens_per_s"].get<double>(), 16.0 / pre_real, 1e-9);
  EXPECT_NEAR(j["speedup_vs_dense"]["decode"].get<double>(), dec_dense / dec_real, 1e-12);
  EXPECT_NEAR(j["speedup_vs_dense"]["prefill"].get<double>(), pre_dense / pre_real, 1e-12);
  EXPECT_NEAR(j["speedup_vs_dense"]["total"].get<double>(),
              (dec_dense + pre_dense) / (dec_real + pre_real), 1e-12);
  EXPECT_NEAR(j["phases"]["decode"]["seconds_per_call"].get<double>(), dec_real / 3, 1e-15);
  ASSERT_EQ(j["per_op"].size(), 4u);  // prefill q_proj; decode embedding, q_proj, mask_select
  EXPECT_EQ(j["per_op"][3]["op"], "mask_select");
  EXPECT_TRUE(j["per_op"][3]["method_overhead"].get<bool>());
  EXPECT_FALSE(j["per_op"][2]["method_overhead"].get<bool>());
  EXPECT_FALSE(j.contains("validation"));
  // bf16 Tensor Core peak: the compute-bound prefill gets 4x faster compute
  const cost::Prediction pb = cost::predict(lf, hw, "bf16");
  EXPECT_DOUBLE_EQ(pb.realised_op(lf, pre, q).seconds, std::max(2e9 / 4e12, 1e8 / 1e11) + 1e-5 +
                                                           std::max(1e9 / 4e12, 5e7 / 1e11) + 1e-5);
}

TEST_F(CostFiles, FlopsReportSumsTheLedger) {
  const flops::LedgerFile lf = flops::read_ledger_file(write_hand_run("run.h5"));
  EXPECT_EQ(lf.calls, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(lf.tokens, (std::vector<std::int64_t>{16, 3}));
  const auto j = flops::report_json(lf);
  const auto& d = j["phases"]["decode"];
  EXPECT_DOUBLE_EQ(d["dense_flops"].get<double>(), 3e6);
  EXPECT_DOUBLE_EQ(d["realised_flops"].get<double>(), 1.5e6 + 1e3);
  EXPECT_DOUBLE_EQ(d["dense_bytes"].get<double>(), 3e9 + 1e4);
  EXPECT_DOUBLE_EQ(d["realised_bytes"].get<double>(), 1.8e9 + 4e3 + 1e4);
  EXPECT_DOUBLE_EQ(d["overhead_flops"].get<double>(), 1e3);
  EXPECT_DOUBLE_EQ(d["ops"]["q_proj"]["launches"].get<double>(), 3);
  EXPECT_DOUBLE_EQ(d["ops"]["q_proj"]["flops_saved_fraction"].get<double>(), 0.5);
  EXPECT_TRUE(d["ops"]["mask_select"]["method_overhead"].get<bool>());
  EXPECT_FALSE(d["ops"].contains("k_proj"));  // ops without launches are left out
  const auto& p = j["phases"]["prefill"];
  EXPECT_DOUBLE_EQ(p["realised_flops"].get<double>(), 3e9);
  ASSERT_EQ(p["layers"].size(), 2u);
  EXPECT_EQ(p["layers"][1]["layer"].get<int>(), 1);
  EXPECT_DOUBLE_EQ(p["layers"][1]["realised_flops"].get<double>(), 1e9);
  EXPECT_DOUBLE_EQ(j["total"]["dense_flops"].get<double>(), 4e9 + 3e6);
  const std::string csv = flops::report_csv({lf, lf});
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 2 * 5);  // 5 entries per run
  const std::string text = flops::report_text({lf, lf}, false);
  for (const char* s : {"mask_select +", "side by side", "decode: 3 calls, 3 tokens", "added"})
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
  EXPECT_NE(flops::report_markdown({lf}, true).find("| layer |"), std::string::npos);
}

// An op the reader has never heard of (a method added later) is read and predicted like any.
TEST_F(CostFiles, OpListsAreReadFromTheFile) {
  const std::string p = dir_.file("generic.h5");
  {
    io::H5File f = io::H5File::create(p);
    write_run(f.root());
    io::Group g = f.root().create_group("flops");
    const std::vector<hsize_t> dims = {1, 2, 2};
    const std::vector<double> fd = {0, 0, 4e9, 0}, fr = {0, 1e9, 2e9, 0};
    const std::vector<double> bd = {0, 0, 1e6, 0}, br = {0, 2e6, 5e5, 0};
    const std::vector<std::uint64_t> la = {0, 5, 1, 0};
    g.write("flops_dense", fd.data(), dims);
    g.write("flops_realised", fr.data(), dims);
    g.write("bytes_dense", bd.data(), dims);
    g.write("bytes_realised", br.data(), dims);
    g.write("launches", la.data(), dims);
    g.write_strings("phases", {"prefill"});
    g.write_strings("ops", {"similarity_test", "attn_value"});
    g.write_strings("layers", {"non-layer", "0"});
    g.write("layer_index", std::vector<std::int64_t>{-1, 0});
    g.set_attr("prefill_calls", std::int64_t{1});
    g.set_attr("prefill_tokens", std::int64_t{8});
    f.close();
  }
  const flops::LedgerFile lf = flops::read_ledger_file(p);
  ASSERT_EQ(lf.op_index("similarity_test"), 0);
  EXPECT_TRUE(lf.op_total(0, 0).method_overhead());
  const cost::HardwareProfile hw = cost::parse_hardware_profile(kTestProfile, "t.json");
  const cost::Prediction pr = cost::predict(lf, hw, "fp32");
  EXPECT_DOUBLE_EQ(pr.realised_op(lf, 0, 0).seconds, 1e-3 + 5e-5);
  EXPECT_DOUBLE_EQ(pr.dense_op(lf, 0, 0).seconds, 0.0);
  EXPECT_DOUBLE_EQ(pr.realised_op(lf, 0, 1).seconds, 2e-3 + 1e-5);
  const auto j = flops::report_json(lf);
  EXPECT_DOUBLE_EQ(j["phases"]["prefill"]["ops"]["similarity_test"]["realised_flops"].get<double>(),
                   1e9);
  EXPECT_DOUBLE_EQ(j["phases"]["prefill"]["overhead_flops"].get<double>(), 1e9);
}

TEST_F(CostFiles, BadRunFilesAreRefusedWithAReason) {
  // not HDF5
  const std::string text = dir_.file("notes.txt");
  std::ofstream(text) << "hello\n";
  expect_error([&] { flops::read_ledger_file(text); }, {"cannot read run file", "notes.txt"});
  expect_error([&] { flops::read_ledger_file(dir_.file("missing.h5")); }, {"missing.h5"});
  // another program's HDF5 file
  const std::string other = dir_.file("other.h5");
  {
    io::H5File f = io::H5File::create(other);
    f.root().create_group("data");
    f.close();
  }
  expect_error([&] { flops::read_ledger_file(other); }, {"not a sparsim run file", "no /run"});
  // a sparsim file of another kind (a calibration file has a root format and no /run)
  const std::string cal = dir_.file("cal.h5");
  {
    io::H5File f = io::H5File::create(cal);
    f.root().set_attr("format", "sparsim-calibration");
    f.close();
  }
  expect_error([&] { flops::read_ledger_file(cal); }, {"not a run file", "sparsim-calibration"});
  // schema 1: /run without schema_version
  const std::string old = dir_.file("old.h5");
  {
    io::H5File f = io::H5File::create(old);
    io::Group run = f.root().create_group("run");
    run.set_attr("command", "sparsim forward ...");
    run.set_attr("version", "0.0.9");
    io::Group g = f.root().create_group("flops");
    hand_ledger().write(g);
    f.close();
  }
  expect_error([&] { flops::read_ledger_file(old); },
               {"schema 1", "0.0.9", "run the command again"});
  // a newer schema
  const std::string newer = dir_.file("newer.h5");
  {
    io::H5File f = io::H5File::create(newer);
    write_run(f.root(), io::kRunSchemaVersion + 1);
    f.close();
  }
  expect_error([&] { flops::read_ledger_file(newer); }, {"newer than"});
  // no ledger
  const std::string noledger = dir_.file("noledger.h5");
  {
    io::H5File f = io::H5File::create(noledger);
    write_run(f.root());
    f.root().create_group("profile_budgets");
    f.close();
  }
  expect_error([&] { flops::read_ledger_file(noledger); }, {"no FLOP ledger", "hand-made"});
  // tables that disagree with the name lists; negative and NaN entries; missing counts
  auto broken = [&](const std::string& name, const std::function<void(io::Group&)>& edit) {
    const std::string p = dir_.file(name);
    io::H5File f = io::H5File::create(p);
    write_run(f.root());
    io::Group g = f.root().create_group("flops");
    edit(g);
    f.close();
    return p;
  };
  auto tables = [](io::Group& g, const std::vector<std::string>& ops, double v,
                   bool counts = true) {
    const std::vector<hsize_t> dims = {2, 2, 2};
    std::vector<double> x(8, 1.0);
    x[5] = v;
    const std::vector<std::uint64_t> la(8, 1);
    for (const char* n : {"flops_dense", "flops_realised", "bytes_dense", "bytes_realised"})
      g.write(n, x.data(), dims);
    g.write("launches", la.data(), dims);
    g.write_strings("phases", {"prefill", "decode"});
    g.write_strings("ops", ops);
    g.write_strings("layers", {"non-layer", "0"});
    g.write("layer_index", std::vector<std::int64_t>{-1, 0});
    if (counts)
      for (const char* a : {"prefill_calls", "prefill_tokens", "decode_calls", "decode_tokens"})
        g.set_attr(a, std::int64_t{1});
  };
  expect_error(
      [&] {
        flops::read_ledger_file(broken("shape.h5", [&](io::Group& g) {
          tables(g, {"a", "b", "c"}, 1);
        }));
      },
      {"has shape [2][2][2]", "[2][3][2]"});
  expect_error(
      [&] {
        flops::read_ledger_file(broken("neg.h5", [&](io::Group& g) { tables(g, {"a", "b"}, -4); }));
      },
      {"holds -4", "phase decode, op a, layer 0"});
  expect_error(
      [&] {
        flops::read_ledger_file(broken("nan.h5", [&](io::Group& g) {
          tables(g, {"a", "b"}, NAN);
        }));
      },
      {"holds nan"});
  expect_error(
      [&] {
        flops::read_ledger_file(broken("dup.h5", [&](io::Group& g) { tables(g, {"a", "a"}, 1); }));
      },
      {"op 'a' is listed twice"});
  expect_error(
      [&] {
        flops::read_ledger_file(broken("counts.h5", [&](io::Group& g) {
          tables(g, {"a", "b"}, 1, false);
        }));
      },
      {"prefill_calls"});
  expect_error(
      [&] {
        flops::read_ledger_file(broken("nobytes.h5", [&](io::Group& g) {
          tables(g, {"a", "b"}, 1);
          H5Ldelete(g.id(), "bytes_dense", H5P_DEFAULT);
        }));
      },
      {"/flops/bytes_dense is missing"});
}

}  // namespace
}  // namespace sparsim::test
