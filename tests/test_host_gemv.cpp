// The run-time dispatched host decode kernels (kernels/host_gemv.hpp): the dense rows against a
// double-precision reference for every storage type, row counts around the block of eight and
// lengths around the 16 lanes and around the short-row limit; blocking rows never changes a row's
// bits, nor does summing several tokens through one pass over the rows; the ISA reported is one
// the CPU has.
#include "helpers.hpp"
#include "kernels/host_clones.hpp"
#include "kernels/host_gemv.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace sparsim::test {
namespace {

template <class T>
void check_dot_rows() {
  std::uint64_t seed = 500;
  // up to kShortRow rows are summed one by one, longer ones eight at a time
  for (int n : {1, 15, 16, 17, 100, 577, host::kShortRow, host::kShortRow + 1, 4100}) {
    for (int rows : {1, 7, 8, 9, 16, 19})
      for (const std::size_t ld : {std::size_t(n) + 3, std::size_t(n)}) {  // padded rows, or none
        const auto wv = random_vec(ld * rows, seed++, 0.3f);
        const auto x = random_vec(n, seed++);
        std::vector<T> w(wv.size());
        for (std::size_t i = 0; i < w.size(); ++i) w[i] = from_f32<T>(wv[i]);
        std::vector<float> y(2 * rows, -1.0f);
        host::dot_rows(x.data(), w.data(), ld, n, rows, y.data(), 2);  // every other slot
        const std::string what = "n=" + std::to_string(n) + " rows=" + std::to_string(rows) +
                                 " ld=" + std::to_string(ld);
        for (int r = 0; r < rows; ++r) {
          double ref = 0, mag = 0;
          for (int i = 0; i < n; ++i) {
            const double t = double(x[i]) * to_f32(w[r * ld + i]);
            ref += t;
            mag += std::fabs(t);
          }
          ASSERT_NEAR(y[2 * r], ref, 1e-6 * (1 + mag)) << what << " r=" << r;
          EXPECT_EQ(y[2 * r + 1], -1.0f) << what << ": wrote outside its slot";
          // the same row alone: the same bits (blocks of eight share x, not their sums)
          float alone = 0;
          host::dot_rows(x.data(), w.data() + r * ld, ld, n, 1, &alone, 1);
          EXPECT_EQ(std::memcmp(&alone, &y[2 * r], sizeof(float)), 0) << what << " r=" << r;
        }
      }
  }
}

/// dot_rows_batch: every (token, row) the bits of dot_rows for that token alone, for token counts
/// around the block of eight, rows short and long, with and without a row after the block.
template <class T>
void check_dot_rows_batch() {
  std::uint64_t seed = 700;
  for (int n : {1, 15, 16, 17, 216, 577, host::kShortRow + 1})
    for (int nt : {1, 2, 7, 8, 9, 17})
      for (const bool more : {false, true}) {
        const int rows = 9, ld = n + 5;
        const auto wv = random_vec(std::size_t(ld) * (rows + 1), seed++, 0.3f);
        const std::size_t xs = n + 3, yt = 2 * rows + 1;
        const auto x = random_vec(xs * nt, seed++);
        std::vector<T> w(wv.size());
        for (std::size_t i = 0; i < w.size(); ++i) w[i] = from_f32<T>(wv[i]);
        std::vector<float> y(yt * nt, -1.0f);
        host::dot_rows_batch(x.data(), xs, nt, w.data(), ld, n, rows, y.data(), yt, 2, more);
        const std::string what =
            "n=" + std::to_string(n) + " tokens=" + std::to_string(nt) + (more ? " more" : "");
        for (int t = 0; t < nt; ++t) {
          std::vector<float> one(rows);
          host::dot_rows(x.data() + t * xs, w.data(), ld, n, rows, one.data(), 1, more);
          for (int r = 0; r < rows; ++r) {
            EXPECT_EQ(std::memcmp(&one[r], &y[t * yt + 2 * r], sizeof(float)), 0)
                << what << " t=" << t << " r=" << r;
            EXPECT_EQ(y[t * yt + 2 * r + 1], -1.0f) << what << ": wrote outside its slot";
          }
        }
      }
}

TEST(HostGemv, DotRowsBatchIsDotRowsPerToken) {
  check_dot_rows_batch<float>();
  check_dot_rows_batch<bf16_t>();
  check_dot_rows_batch<f16_t>();
}

TEST(HostGemv, DotRowsFloat32) {
  check_dot_rows<float>();
}
TEST(HostGemv, DotRowsBFloat16) {
  check_dot_rows<bf16_t>();
}
TEST(HostGemv, DotRowsFloat16) {
  check_dot_rows<f16_t>();
}

TEST(HostGemv, ReportsAnIsaTheCpuHas) {
  // With run-time dispatch the level the CPU runs; without (SPARSIM_KERNEL_CLONES=OFF, e.g. the
  // avx2 preset) the build's own level, marked " (build)", whatever the CPU has beyond it.
  std::string isa = host::gemv_isa();
  const std::string mark = " (build)";
  const bool fixed =
      isa.size() > mark.size() && isa.compare(isa.size() - mark.size(), mark.size(), mark) == 0;
  if (fixed) isa.resize(isa.size() - mark.size());
  ASSERT_TRUE(isa == "x86-64-v4" || isa == "x86-64-v3" || isa == "baseline") << isa;
  if (SPARSIM_HAS_CLONES) {
    EXPECT_FALSE(fixed) << host::gemv_isa();
  }
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  if (isa == "x86-64-v4") {
    EXPECT_TRUE(__builtin_cpu_supports("avx512f"));
  }
  if (isa == "x86-64-v3") {
    EXPECT_TRUE(__builtin_cpu_supports("avx2"));
  }
  if (SPARSIM_HAS_CLONES && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
    EXPECT_EQ(isa, "x86-64-v4");
  }
#endif
}

}  // namespace
}  // namespace sparsim::test
