// The run-time dispatched inner loops of the host decode attention (kernels/host_attention.hpp):
// scores and value mixes against a double-precision reference for head widths around the 16
// lanes and the 64-channel slabs (the pruned widths of RAP and KVPruner included, odd ones too),
// query groups around the blocks of two to four heads and chunk lengths around the 8 or 16
// positions a tree reduces together (scores: widths around the 8-channel half blocks; value mixes:
// slabs whose last channels take a block of 8); nothing is written outside the outputs; a score
// does not depend on the positions computed beside it.
#include "helpers.hpp"
#include "kernels/host_attention.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace sparsim::test {
namespace {

constexpr float kGuard = -7.0f;

TEST(HostAttention, ScoresMatchDoublePrecision) {
  std::uint64_t seed = 900;
  for (int d : {1, 2, 7, 8, 9, 10, 15, 16, 17, 18, 24, 31, 36, 42, 50, 58, 64, 65, 100, 128, 130}) {
    for (int group : {1, 3, 4, 5}) {
      for (int len : {1, 5, 16, 17, 40, 256}) {
        const std::size_t ks = d + 5, qs = d + 2, ls = len + 3;
        const auto k = random_vec(ks * len, seed++);
        const auto q = random_vec(qs * group, seed++);
        std::vector<float> s(ls * group, kGuard);
        const float scale = 0.37f;
        host::attn_scores(q.data(), qs, group, k.data(), ks, len, d, scale, s.data(), ls);
        const std::string what = "d=" + std::to_string(d) + " group=" + std::to_string(group) +
                                 " len=" + std::to_string(len);
        for (int g = 0; g < group; ++g) {
          for (int p = 0; p < len; ++p) {
            double ref = 0, mag = 0;
            for (int i = 0; i < d; ++i) {
              const double t = double(q[g * qs + i]) * k[p * ks + i];
              ref += t;
              mag += std::fabs(t);
            }
            ASSERT_NEAR(s[g * ls + p], ref * scale, 1e-6 * (1 + mag))
                << what << " g=" << g << " p=" << p;
          }
          for (std::size_t p = len; p < ls; ++p)
            ASSERT_EQ(s[g * ls + p], kGuard) << what << ": wrote past the chunk";
        }
        // One position alone gives the bits it had among its neighbours of the same tree.
        const int p = len - 1;
        float alone = 0;
        host::attn_scores(q.data(), qs, 1, k.data() + p * ks, ks, 1, d, scale, &alone, 1);
        EXPECT_EQ(std::memcmp(&alone, &s[p], sizeof(float)), 0) << what;
      }
    }
  }
}

TEST(HostAttention, ValuesMatchDoublePrecision) {
  std::uint64_t seed = 1900;
  for (int d :
       {1, 2, 7, 15, 16, 17, 18, 24, 31, 33, 36, 40, 42, 50, 58, 64, 65, 72, 100, 128, 130}) {
    for (int group : {1, 2, 3, 4, 5, 9}) {
      for (int len : {1, 5, 16, 40, 256}) {
        const std::size_t vs = d + 5, ws = len + 1, os = d + 3;
        const auto v = random_vec(vs * len, seed++);
        auto w = random_vec(ws * group, seed++);
        for (auto& x : w) x = std::fabs(x);  // softmax weights are non-negative
        std::vector<float> o(os * group, kGuard);
        host::attn_values(w.data(), ws, group, v.data(), vs, len, d, o.data(), os);
        const std::string what = "d=" + std::to_string(d) + " group=" + std::to_string(group) +
                                 " len=" + std::to_string(len);
        for (int g = 0; g < group; ++g) {
          for (int i = 0; i < d; ++i) {
            double ref = 0, mag = 0;
            for (int p = 0; p < len; ++p) {
              const double t = double(w[g * ws + p]) * v[p * vs + i];
              ref += t;
              mag += std::fabs(t);
            }
            ASSERT_NEAR(o[g * os + i], ref, 1e-6 * (1 + mag)) << what << " g=" << g << " i=" << i;
          }
          for (std::size_t i = d; i < os; ++i)
            ASSERT_EQ(o[g * os + i], kGuard) << what << ": wrote past the head";
        }
      }
    }
  }
}

}  // namespace
}  // namespace sparsim::test
