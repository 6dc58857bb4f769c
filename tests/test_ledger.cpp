// Tests of the FLOP/byte ledger (flops/ledger) and its HDF5 tables.
#include "core/error.hpp"
#include "flops/ledger.hpp"
#include "io/hdf5.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using sparsim::flops::Ledger;
using sparsim::flops::Op;
using sparsim::flops::Phase;

namespace {

void expect_totals(const Ledger::Totals& t, double fd, double fr, double bd, double br,
                   std::uint64_t launches, const char* what) {
  EXPECT_DOUBLE_EQ(t.flops_dense, fd) << what;
  EXPECT_DOUBLE_EQ(t.flops_realised, fr) << what;
  EXPECT_DOUBLE_EQ(t.bytes_dense, bd) << what;
  EXPECT_DOUBLE_EQ(t.bytes_realised, br) << what;
  EXPECT_EQ(t.launches, launches) << what;
}

/// Seven launches over two layers, both phases and non-layer ops; the expected sums in the
/// tests below are worked out by hand from this list.
Ledger sample() {
  Ledger l(2);
  l.add(Op::Embedding, -1, Phase::Prefill, 0, 0, 1000, 1000);
  l.add(Op::QProj, 0, Phase::Prefill, 100, 40, 50, 20);
  l.add(Op::QProj, 1, Phase::Prefill, 100, 30, 50, 15);
  l.add(Op::QProj, 0, Phase::Decode, 10, 4, 50, 20);
  l.add(Op::DownProj, 1, Phase::Decode, 200, 20, 80, 8);
  l.add(Op::DownProj, 1, Phase::Decode, 200, 20, 80, 8);
  l.add(Op::LMHead, -1, Phase::Decode, 500, 500, 250, 250);
  return l;
}

}  // namespace

TEST(Ledger, NamesAreDistinct) {
  std::set<std::string> names;
  for (int o = 0; o < sparsim::flops::kNumOps; ++o)
    names.insert(sparsim::flops::to_string(static_cast<Op>(o)));
  EXPECT_EQ(names.size(), static_cast<std::size_t>(sparsim::flops::kNumOps));
  EXPECT_EQ(sparsim::flops::kNumOps, 24);
  EXPECT_STREQ(sparsim::flops::to_string(Op::KVReconstruct), "kv_reconstruct");
  EXPECT_STREQ(sparsim::flops::to_string(Op::TokenEvict), "token_evict");
  EXPECT_STREQ(sparsim::flops::to_string(Op::GateSimilarity), "gate_similarity");
  EXPECT_STREQ(sparsim::flops::to_string(Op::QProj), "q_proj");
  EXPECT_STREQ(sparsim::flops::to_string(Op::LMHead), "lm_head");
  EXPECT_STREQ(sparsim::flops::to_string(Phase::Prefill), "prefill");
  EXPECT_STREQ(sparsim::flops::to_string(Phase::Decode), "decode");
}

TEST(Ledger, EmptyLedgerIsZero) {
  Ledger l;
  EXPECT_EQ(l.num_layers(), 0);
  expect_totals(l.total(), 0, 0, 0, 0, 0, "total");
  expect_totals(l.total(Phase::Decode), 0, 0, 0, 0, 0, "decode");
  expect_totals(l.by_layer(3, Phase::Prefill), 0, 0, 0, 0, 0, "unseen layer");
}

TEST(Ledger, SumsAndQueries) {
  const Ledger l = sample();
  EXPECT_EQ(l.num_layers(), 2);
  expect_totals(l.total(), 1110, 614, 1560, 1321, 7, "total");
  expect_totals(l.total(Phase::Prefill), 200, 70, 1100, 1035, 3, "prefill");
  expect_totals(l.total(Phase::Decode), 910, 544, 460, 286, 4, "decode");
  expect_totals(l.by_op(Op::QProj, Phase::Prefill), 200, 70, 100, 35, 2, "q_proj prefill");
  expect_totals(l.by_op(Op::QProj), 210, 74, 150, 55, 3, "q_proj");
  expect_totals(l.by_op(Op::DownProj, Phase::Decode), 400, 40, 160, 16, 2, "down_proj decode");
  expect_totals(l.by_op(Op::DownProj, Phase::Prefill), 0, 0, 0, 0, 0, "down_proj prefill");
  expect_totals(l.by_op(Op::VProj), 0, 0, 0, 0, 0, "v_proj");
  expect_totals(l.by_layer(0, Phase::Prefill), 100, 40, 50, 20, 1, "layer 0 prefill");
  expect_totals(l.by_layer(1, Phase::Decode), 400, 40, 160, 16, 2, "layer 1 decode");
  expect_totals(l.by_layer(-1, Phase::Decode), 500, 500, 250, 250, 1, "non-layer decode");
  expect_totals(l.by_layer(-1), 500, 500, 1250, 1250, 2, "non-layer");
  expect_totals(l.by_layer(1), 500, 70, 210, 31, 3, "layer 1");
  expect_totals(l.by_layer(7, Phase::Decode), 0, 0, 0, 0, 0, "layer 7");
  expect_totals(l.at(Phase::Decode, Op::DownProj, 1), 400, 40, 160, 16, 2, "cell");
  expect_totals(l.at(Phase::Decode, Op::DownProj, 0), 0, 0, 0, 0, 0, "empty cell");

  // The per-op and per-layer views partition the phase totals.
  for (Phase p : {Phase::Prefill, Phase::Decode}) {
    Ledger::Totals ops, layers;
    for (int o = 0; o < sparsim::flops::kNumOps; ++o) ops += l.by_op(static_cast<Op>(o), p);
    for (int layer = -1; layer < l.num_layers(); ++layer) layers += l.by_layer(layer, p);
    const auto t = l.total(p);
    expect_totals(ops, t.flops_dense, t.flops_realised, t.bytes_dense, t.bytes_realised, t.launches,
                  "ops partition");
    expect_totals(layers, t.flops_dense, t.flops_realised, t.bytes_dense, t.bytes_realised,
                  t.launches, "layers partition");
  }
}

TEST(Ledger, GrowsOnDemandAndRejectsBadLayers) {
  Ledger l;
  l.add(Op::RMSNorm, 5, Phase::Decode, 8, 8, 16, 16);
  EXPECT_EQ(l.num_layers(), 6);
  expect_totals(l.by_layer(5, Phase::Decode), 8, 8, 16, 16, 1, "layer 5");
  expect_totals(l.by_layer(3, Phase::Decode), 0, 0, 0, 0, 0, "layer 3");
  l.add(Op::RMSNorm, 2, Phase::Decode, 1, 1, 1, 1);
  EXPECT_EQ(l.num_layers(), 6);
  EXPECT_THROW(l.add(Op::RMSNorm, -2, Phase::Decode, 1, 1, 1, 1), sparsim::Error);
  EXPECT_THROW(l.by_layer(-3, Phase::Decode), sparsim::Error);
  EXPECT_THROW(Ledger(-1), sparsim::Error);
  expect_totals(l.total(), 9, 9, 17, 17, 2, "after rejected add");
}

TEST(Ledger, ResetKeepsShape) {
  Ledger l = sample();
  l.reset();
  EXPECT_EQ(l.num_layers(), 2);
  expect_totals(l.total(), 0, 0, 0, 0, 0, "after reset");
  l.add(Op::OProj, 1, Phase::Prefill, 3, 2, 1, 1);
  expect_totals(l.total(), 3, 2, 1, 1, 1, "after reset and add");
}

TEST(Ledger, Merge) {
  Ledger small;
  small.add(Op::QProj, 0, Phase::Prefill, 1, 1, 1, 1);
  Ledger big;
  big.add(Op::QProj, 3, Phase::Decode, 10, 5, 2, 1);
  big.add(Op::QProj, 0, Phase::Prefill, 2, 2, 2, 2);

  Ledger a = small;
  a.merge(big);  // grows to big's extent
  EXPECT_EQ(a.num_layers(), 4);
  expect_totals(a.by_layer(0, Phase::Prefill), 3, 3, 3, 3, 2, "layer 0");
  expect_totals(a.by_layer(3, Phase::Decode), 10, 5, 2, 1, 1, "layer 3");

  Ledger b = big;
  b.merge(small);  // smaller into larger
  EXPECT_EQ(b.num_layers(), 4);
  expect_totals(b.total(), 13, 8, 5, 4, 3, "merged total");

  Ledger c = sample();
  c.merge(sample());
  expect_totals(c.total(), 2220, 1228, 3120, 2642, 14, "doubled");
}

TEST(Ledger, WriteAndReadBack) {
  const fs::path dir = fs::temp_directory_path() / ("sparsim_ledger_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "ledger.h5").string();
  {
    sparsim::io::H5File f = sparsim::io::H5File::create(path);
    sparsim::io::Group g = f.root().create_group("flops");
    sample().write(g);
    f.close();
  }
  sparsim::io::H5File f = sparsim::io::H5File::open_read(path);
  sparsim::io::Group g = f.root().open_group("flops");
  std::vector<hsize_t> dims;
  const std::vector<double> fd = g.read<double>("flops_dense", &dims);
  ASSERT_EQ(dims, (std::vector<hsize_t>{2, static_cast<hsize_t>(sparsim::flops::kNumOps), 3}));
  auto at = [](int p, Op o, int layer) {
    return (static_cast<std::size_t>(p) * sparsim::flops::kNumOps + static_cast<std::size_t>(o)) *
               3 +
           static_cast<std::size_t>(layer + 1);
  };
  EXPECT_DOUBLE_EQ(fd[at(0, Op::QProj, 0)], 100);
  EXPECT_DOUBLE_EQ(fd[at(1, Op::DownProj, 1)], 400);
  EXPECT_DOUBLE_EQ(fd[at(1, Op::LMHead, -1)], 500);
  EXPECT_DOUBLE_EQ(std::accumulate(fd.begin(), fd.end(), 0.0), 1110);
  const std::vector<double> fr = g.read<double>("flops_realised");
  EXPECT_DOUBLE_EQ(fr[at(0, Op::QProj, 1)], 30);
  EXPECT_DOUBLE_EQ(std::accumulate(fr.begin(), fr.end(), 0.0), 614);
  const std::vector<double> bd = g.read<double>("bytes_dense");
  EXPECT_DOUBLE_EQ(bd[at(0, Op::Embedding, -1)], 1000);
  EXPECT_DOUBLE_EQ(std::accumulate(bd.begin(), bd.end(), 0.0), 1560);
  const std::vector<double> br = g.read<double>("bytes_realised");
  EXPECT_DOUBLE_EQ(br[at(1, Op::QProj, 0)], 20);
  EXPECT_DOUBLE_EQ(std::accumulate(br.begin(), br.end(), 0.0), 1321);
  const std::vector<std::uint64_t> launches = g.read<std::uint64_t>("launches", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{2, static_cast<hsize_t>(sparsim::flops::kNumOps), 3}));
  EXPECT_EQ(launches[at(1, Op::DownProj, 1)], 2u);
  EXPECT_EQ(std::accumulate(launches.begin(), launches.end(), std::uint64_t{0}), 7u);

  EXPECT_EQ(g.read_strings("phases"), (std::vector<std::string>{"prefill", "decode"}));
  const std::vector<std::string> ops = g.read_strings("ops");
  ASSERT_EQ(ops.size(), static_cast<std::size_t>(sparsim::flops::kNumOps));
  EXPECT_EQ(ops[static_cast<int>(Op::QProj)], "q_proj");
  EXPECT_EQ(ops[static_cast<int>(Op::Other)], "other");
  EXPECT_EQ(g.read_strings("layers"), (std::vector<std::string>{"non-layer", "0", "1"}));
  EXPECT_EQ(g.read<std::int64_t>("layer_index"), (std::vector<std::int64_t>{-1, 0, 1}));

  EXPECT_EQ(g.dataset("flops_dense").get_attr<std::string>("units"), "FLOP");
  EXPECT_EQ(g.dataset("flops_realised").get_attr<std::string>("units"), "FLOP");
  EXPECT_EQ(g.dataset("bytes_dense").get_attr<std::string>("units"), "byte");
  EXPECT_EQ(g.dataset("bytes_realised").get_attr<std::string>("units"), "byte");
  EXPECT_TRUE(g.dataset("launches").has_attr("meaning"));

  EXPECT_DOUBLE_EQ(g.get_attr<double>("total_flops_dense"), 1110);
  EXPECT_DOUBLE_EQ(g.get_attr<double>("total_flops_realised"), 614);
  EXPECT_DOUBLE_EQ(g.get_attr<double>("total_bytes_dense"), 1560);
  EXPECT_DOUBLE_EQ(g.get_attr<double>("total_bytes_realised"), 1321);
  EXPECT_EQ(g.get_attr<std::int64_t>("total_launches"), 7);
  EXPECT_DOUBLE_EQ(g.get_attr<double>("prefill_flops_realised"), 70);
  EXPECT_DOUBLE_EQ(g.get_attr<double>("decode_bytes_dense"), 460);
  EXPECT_EQ(g.get_attr<std::int64_t>("decode_launches"), 4);
  EXPECT_EQ(g.get_attr<std::int64_t>("num_layers"), 2);
  f.close();
  fs::remove_all(dir);
}

TEST(Ledger, Table) {
  const std::string t = sample().table();
  for (const char* s : {"phase", "GFLOP", "GB", "share", "prefill", "decode", "q_proj", "down_proj",
                        "lm_head", "embedding", "total"})
    EXPECT_NE(t.find(s), std::string::npos) << s << "\n" << t;
  EXPECT_EQ(t.find("v_proj"), std::string::npos) << t;  // never launched: no row
  EXPECT_NE(t.find("81.4%"), std::string::npos) << t;   // lm_head: 500 of 614 realised FLOP
  EXPECT_NE(t.find("100.0%"), std::string::npos) << t;  // the total row
  EXPECT_NE(Ledger().table().find("total"), std::string::npos);
}
