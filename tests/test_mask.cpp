// Activation masks (TEAL threshold, WINA TopK, TopK-Guided) against a brute-force host
// reference that sorts by score (std::stable_sort, so equal scores keep the lower index first).
#include "backends.hpp"
#include "helpers.hpp"
#include "kernels/mask.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sparsim::test {
namespace {

template <class E>
class Mask : public ::testing::Test {};
TYPED_TEST_SUITE(Mask, Backends, BackendName);

/// Keep count k = floor(d (1 - s)) clamped to [1, d], written independently of the kernel.
int ref_k(int d, double s) {
  const double k = std::floor(d * (1.0 - s));
  return static_cast<int>(std::min<double>(d, std::max(1.0, k)));
}

/// Keep flags of one row by sorting: the reference for every rule.
std::vector<char> ref_keep(const float* x, int d, const std::vector<float>& norms,
                           const MaskParams& prm) {
  std::vector<char> keep(d, 0);
  if (prm.rule == MaskRule::None) return std::vector<char>(d, 1);
  if (prm.rule == MaskRule::Threshold) {
    for (int j = 0; j < d; ++j) keep[j] = std::fabs(x[j]) >= prm.tau;
    return keep;
  }
  double s = prm.p;
  if (prm.rule == MaskRule::Guided) {
    int below = 0;
    for (int j = 0; j < d; ++j) below += std::fabs(x[j]) < prm.tau;
    const double sh = static_cast<double>(below) / d;
    s = std::min(double(prm.p) + double(prm.delta),
                 std::max(double(prm.p) - double(prm.delta), sh));
  }
  const int k = ref_k(d, s);
  std::vector<float> score(d);
  for (int j = 0; j < d; ++j) score[j] = std::fabs(x[j]) * (norms.empty() ? 1.0f : norms[j]);
  std::vector<int> order(d);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
  for (int i = 0; i < k; ++i) keep[order[i]] = 1;
  return keep;
}

template <class E>
CVec<E> dvec(const std::vector<float>& v) {
  Vec<E> d("v", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

template <class E>
IVec<E> divec(const std::vector<int>& v) {
  IVec<E> d("iv", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

template <class E>
std::vector<int> ihost(const IVec<E>& d) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  return std::vector<int>(h.data(), h.data() + h.extent(0));
}

struct Masked {
  std::vector<float> y;
  std::vector<int> kept;
};

/// Runs mask_rows on n rows of width d. sparse: per-row flags, or empty for all rows sparse.
template <class E>
Masked run_rows(const std::vector<float>& x, int n, int d, const std::vector<float>& norms,
                const MaskParams& prm, const std::vector<int>& sparse = {}) {
  auto xd = to_device<E>(x, n, d);
  Mat<E> y("y", n, d);
  IVec<E> kept("kept", n);
  mask_rows(E(), CMat<E>(xd), dvec<E>(norms), divec<E>(sparse), prm, y, kept);
  E().fence();
  return {to_host(y), ihost(kept)};
}

/// Checks mask_rows on every row against the sorting reference, bitwise.
template <class E>
void expect_rows_match(const std::vector<float>& x, int n, int d, const std::vector<float>& norms,
                       const MaskParams& prm, const std::string& what) {
  const Masked m = run_rows<E>(x, n, d, norms, prm);
  for (int r = 0; r < n; ++r) {
    const auto keep = ref_keep(&x[r * d], d, norms, prm);
    int nk = 0;
    for (int j = 0; j < d; ++j) {
      const float want = keep[j] ? x[r * d + j] : 0.0f;
      nk += keep[j];
      ASSERT_EQ(m.y[r * d + j], want) << what << " row " << r << " j " << j;
    }
    ASSERT_EQ(m.kept[r], nk) << what << " row " << r;
  }
}

std::vector<float> positive_norms(int d, std::uint64_t seed) {
  auto v = random_vec(d, seed);
  for (auto& a : v) a = 0.1f + std::fabs(a);
  return v;
}

const int kSizes[] = {1, 2, 7, 100, 576, 1536, 4096};

TYPED_TEST(Mask, TopKMatchesSortReferenceAndKeepsExactlyK) {
  using E = TypeParam;
  const int n = 3;
  for (int d : kSizes) {
    const auto x = random_vec(n * d, 100 + d);
    for (bool with_norms : {false, true}) {
      const auto norms = with_norms ? positive_norms(d, 200 + d) : std::vector<float>{};
      for (float p : {0.0f, 0.3f, 0.5f, 0.7f, 0.9f, 0.99f}) {
        MaskParams prm;
        prm.rule = MaskRule::TopK;
        prm.p = p;
        const std::string what = "d=" + std::to_string(d) + " p=" + std::to_string(p) +
                                 " norms=" + (with_norms ? "1" : "0");
        expect_rows_match<E>(x, n, d, norms, prm, what);
        const Masked m = run_rows<E>(x, n, d, norms, prm);
        const int k = std::max(1, static_cast<int>(std::floor(d * (1.0 - double(p)))));
        for (int r = 0; r < n; ++r) EXPECT_EQ(m.kept[r], k) << what;
      }
    }
  }
}

TYPED_TEST(Mask, GuidedMatchesReferenceStaysInBandAndEqualsTopKWithoutMargin) {
  using E = TypeParam;
  const int n = 8;
  for (int d : kSizes) {
    // rows of different scales: one tau gives each row a different estimate ŝ, so the clip
    // is hit from below, from above and not at all
    auto x = random_vec(n * d, 300 + d);
    for (int r = 0; r < n; ++r)
      for (int j = 0; j < d; ++j) x[r * d + j] *= 0.25f * (r + 1);
    for (bool with_norms : {false, true}) {
      const auto norms = with_norms ? positive_norms(d, 400 + d) : std::vector<float>{};
      for (float p : {0.3f, 0.5f, 0.9f}) {
        MaskParams prm;
        prm.rule = MaskRule::Guided;
        prm.p = p;
        prm.tau = 0.8f;
        prm.delta = 0.05f;
        const std::string what = "d=" + std::to_string(d) + " p=" + std::to_string(p);
        expect_rows_match<E>(x, n, d, norms, prm, what);
        const Masked m = run_rows<E>(x, n, d, norms, prm);
        for (int r = 0; r < n; ++r) {
          if (d < 20) continue;  // k >= 1 dominates the band for tiny rows
          const double s = 1.0 - double(m.kept[r]) / d;
          EXPECT_GE(s, double(p) - double(prm.delta) - 1e-9) << what << " row " << r;
          EXPECT_LE(s, double(p) + double(prm.delta) + 1.0 / d + 1e-9) << what << " row " << r;
        }
        prm.delta = 0.0f;
        const Masked g = run_rows<E>(x, n, d, norms, prm);
        prm.rule = MaskRule::TopK;
        const Masked t = run_rows<E>(x, n, d, norms, prm);
        EXPECT_EQ(g.y, t.y) << what;
        EXPECT_EQ(g.kept, t.kept) << what;
      }
    }
  }
}

TYPED_TEST(Mask, HeavyTiesKeepTheLowestIndices) {
  using E = TypeParam;
  const int n = 4;
  for (int d : {7, 64, 576, 1537}) {
    SynthRng rng(500 + d);
    std::vector<float> x(n * d), norms(d);
    const float levels[] = {0.0f, 1.0f, -1.0f, 2.0f, -2.0f, -0.0f};
    for (auto& v : x) v = levels[rng.next() % 6];
    for (auto& v : norms) v = (rng.next() % 2) ? 2.0f : 1.0f;
    for (bool with_norms : {false, true}) {
      const auto nv = with_norms ? norms : std::vector<float>{};
      for (MaskRule rule : {MaskRule::TopK, MaskRule::Guided}) {
        for (float p : {0.1f, 0.5f, 0.8f, 0.95f}) {
          MaskParams prm;
          prm.rule = rule;
          prm.p = p;
          prm.tau = 1.5f;
          prm.delta = 0.1f;
          expect_rows_match<E>(x, n, d, nv, prm, "ties d=" + std::to_string(d));
          // directly on the kernel's output: at the boundary score (the lowest kept one), the
          // kept entries are the lowest indices. Kept flags are read from y, so only nonzero
          // boundaries are checked.
          const Masked m = run_rows<E>(x, n, d, nv, prm);
          for (int r = 0; r < n; ++r) {
            const auto score = [&](int j) {
              return std::fabs(x[r * d + j]) * (nv.empty() ? 1.0f : nv[j]);
            };
            float lowest = 1e30f;
            for (int j = 0; j < d; ++j)
              if (m.y[r * d + j] != 0.0f) lowest = std::min(lowest, score(j));
            if (lowest == 1e30f) continue;
            bool dropped = false;
            int ties = 0;
            for (int j = 0; j < d; ++j) {
              if (score(j) != lowest) continue;
              ++ties;
              const bool kept = m.y[r * d + j] != 0.0f;
              EXPECT_FALSE(kept && dropped) << "d=" << d << " row " << r << " j=" << j;
              dropped = dropped || !kept;
            }
            if (d >= 64) {
              EXPECT_GT(ties, 1) << "few levels: the boundary should be tied";
            }
          }
        }
      }
    }
  }
}

TYPED_TEST(Mask, ThresholdMatchesBruteForce) {
  using E = TypeParam;
  const int n = 5;
  for (int d : kSizes) {
    const auto x = random_vec(n * d, 600 + d);
    for (float tau : {0.0f, 0.1f, 0.67f, 1.5f, 10.0f}) {
      MaskParams prm;
      prm.rule = MaskRule::Threshold;
      prm.tau = tau;
      // norms must not change a threshold mask
      expect_rows_match<E>(x, n, d, {}, prm, "tau=" + std::to_string(tau));
      const Masked a = run_rows<E>(x, n, d, {}, prm);
      const Masked b = run_rows<E>(x, n, d, positive_norms(d, 1), prm);
      EXPECT_EQ(a.y, b.y);
      for (int r = 0; r < n; ++r) {
        int nk = 0;
        for (int j = 0; j < d; ++j) nk += !(std::fabs(x[r * d + j]) < tau);
        EXPECT_EQ(a.kept[r], nk);
      }
    }
  }
}

TYPED_TEST(Mask, DenseRowsAreCopiedUnchanged) {
  using E = TypeParam;
  const int n = 6, d = 333;
  const auto x = random_vec(n * d, 700);
  const std::vector<int> sparse = {1, 0, 0, 1, 0, 1};
  for (MaskRule rule : {MaskRule::Threshold, MaskRule::TopK, MaskRule::Guided}) {
    MaskParams prm;
    prm.rule = rule;
    prm.p = 0.6f;
    prm.tau = 0.5f;
    prm.delta = 0.02f;
    const Masked m = run_rows<E>(x, n, d, positive_norms(d, 2), prm, sparse);
    const Masked all = run_rows<E>(x, n, d, positive_norms(d, 2), prm);
    for (int r = 0; r < n; ++r) {
      const auto* want = sparse[r] ? &all.y[r * d] : &x[r * d];
      for (int j = 0; j < d; ++j) ASSERT_EQ(m.y[r * d + j], want[j]) << "row " << r;
      EXPECT_EQ(m.kept[r], sparse[r] ? all.kept[r] : d);
      if (sparse[r]) {
        EXPECT_LT(m.kept[r], d);
      }
    }
  }
  MaskParams none;  // MaskRule::None copies every row
  const Masked m = run_rows<E>(x, n, d, {}, none);
  EXPECT_EQ(m.y, x);
  EXPECT_EQ(m.kept, std::vector<int>(n, d));
}

TYPED_TEST(Mask, MasksInPlace) {
  using E = TypeParam;
  const int n = 3, d = 1000;
  const auto x = random_vec(n * d, 800);
  MaskParams prm;
  prm.rule = MaskRule::TopK;
  prm.p = 0.7f;
  const Masked want = run_rows<E>(x, n, d, {}, prm);
  auto xd = to_device<E>(x, n, d);
  mask_rows(E(), CMat<E>(xd), CVec<E>(), IVec<E>(), prm, Mat<E>(xd), IVec<E>());
  EXPECT_EQ(to_host(xd), want.y);
}

TYPED_TEST(Mask, MaskIndicesListsTheKeptEntriesInOrder) {
  using E = TypeParam;
  MaskScratch<E> sc;
  for (int d : {1, 7, 576, 1536, 4096, 11008}) {
    const auto x = random_vec(d, 900 + d);
    const auto xd = dvec<E>(x);
    for (bool with_norms : {false, true}) {
      const auto norms = with_norms ? positive_norms(d, 3) : std::vector<float>{};
      const auto nd = dvec<E>(norms);
      for (MaskRule rule :
           {MaskRule::None, MaskRule::Threshold, MaskRule::TopK, MaskRule::Guided}) {
        MaskParams prm;
        prm.rule = rule;
        prm.p = 0.6f;
        prm.tau = 0.7f;
        prm.delta = 0.05f;
        const auto keep = ref_keep(x.data(), d, norms, prm);
        std::vector<int> want;
        for (int j = 0; j < d; ++j)
          if (keep[j]) want.push_back(j);
        IVec<E> idx("idx", d);
        Vec<E> y("y", d);
        const int nnz = mask_indices(E(), xd, nd, prm, idx, y, sc);
        const auto got = ihost(idx);
        ASSERT_EQ(nnz, static_cast<int>(want.size())) << "d=" << d;
        EXPECT_EQ(std::vector<int>(got.begin(), got.begin() + nnz), want) << "d=" << d;
        // the masked row's nonzeros are exactly the listed indices (random rows have no zeros)
        const auto yh = to_host(y);
        std::vector<int> nz;
        for (int j = 0; j < d; ++j)
          if (yh[j] != 0.0f) nz.push_back(j);
        EXPECT_EQ(nz, want);
        for (int j : want) EXPECT_EQ(yh[j], x[j]);
        // without a masked row the indices are the same
        IVec<E> idx2("idx2", d);
        EXPECT_EQ(mask_indices(E(), xd, nd, prm, idx2, Vec<E>(), sc), nnz);
        const auto got2 = ihost(idx2);
        EXPECT_TRUE(std::equal(got2.begin(), got2.begin() + nnz, want.begin()));
      }
    }
  }
}

/// Rows that steer the host selection (detail::select_row_serial) down each of its paths.
/// kind: 0 random, 1 all zero (+0 and -0), 2 all equal, 3 few levels (heavy exact ties),
/// 4 keys that share their top bits (the boundary bin overflows the candidate buffer and is
/// refined by more passes), 5 heavy tails with exact zeros and infinities.
std::vector<float> edge_row(int d, int kind, std::uint64_t seed) {
  SynthRng rng(seed);
  auto x = random_vec(d, seed);
  for (int j = 0; j < d; ++j) {
    switch (kind) {
      case 1:
        x[j] = (j % 3 == 0) ? -0.0f : 0.0f;
        break;
      case 2:
        x[j] = (j % 2) ? -1.25f : 1.25f;
        break;
      case 3:
        x[j] = static_cast<float>(static_cast<int>(rng.next() % 5) - 2);
        break;
      case 4:  // 1 + a few ulps: one top-11-bit bin, about 1.0 .. 1.0005
        x[j] = 1.0f + static_cast<float>(rng.next() % 4096) * 1.1920929e-7f;
        break;
      case 5:
        x[j] *= std::exp(3.0f * x[(j * 7 + 1) % d]);
        if (rng.next() % 7 == 0) x[j] = 0.0f;
        if (rng.next() % 97 == 0) x[j] = -INFINITY;
        break;
      default:
        break;
    }
  }
  return x;
}

// The host selection's paths, against the sorting reference, through mask_rows (masked rows
// only), mask_indices (indices with and without the masked row) and in place: widths around the
// vector width and the key block (kMaskChunk), several blocks, every row kind above, p from
// k = d down to k = 1, with and without norms.
TYPED_TEST(Mask, SelectionEdgeCasesMatchReference) {
  using E = TypeParam;
  MaskScratch<E> sc;
  const int chunk = detail::kMaskChunk, cand = detail::kMaskCandidates;
  const int widths[] = {1,           2,  3,  5,  8,         9,     15,        17,
                        31,          33, 63, 65, chunk - 1, chunk, chunk + 1, 2 * chunk + 7,
                        3 * cand + 5};
  for (int d : widths) {
    for (int kind = 0; kind < 6; ++kind) {
      const auto x = edge_row(d, kind, 1100 + 10 * d + kind);
      const auto xd = dvec<E>(x);
      for (bool with_norms : {false, true}) {
        const auto norms = with_norms ? positive_norms(d, 1200 + d) : std::vector<float>{};
        const auto nd = dvec<E>(norms);
        // p = 0: k = d; 1 - 1/(2d): k = 1
        const float p_k1 = 1.0f - 0.5f / static_cast<float>(d);
        for (float p : {0.0f, 0.25f, 0.5f, 0.9f, p_k1}) {
          for (MaskRule rule : {MaskRule::TopK, MaskRule::Guided}) {
            MaskParams prm;
            prm.rule = rule;
            prm.p = p;
            prm.tau = 0.7f;
            prm.delta = 0.02f;
            const std::string what = "d=" + std::to_string(d) + " kind=" + std::to_string(kind) +
                                     " p=" + std::to_string(p) +
                                     " norms=" + (with_norms ? "1" : "0") +
                                     (rule == MaskRule::Guided ? " guided" : " topk");
            expect_rows_match<E>(x, 1, d, norms, prm, what);
            const auto keep = ref_keep(x.data(), d, norms, prm);
            std::vector<int> want;
            for (int j = 0; j < d; ++j)
              if (keep[j]) want.push_back(j);
            if (rule == MaskRule::TopK) {
              ASSERT_EQ(static_cast<int>(want.size()), ref_k(d, p)) << what;
            }
            IVec<E> idx("idx", d);
            Vec<E> y("y", d);
            const int nnz = mask_indices(E(), xd, nd, prm, idx, y, sc);
            ASSERT_EQ(nnz, static_cast<int>(want.size())) << what;
            const auto got = ihost(idx);
            ASSERT_EQ(std::vector<int>(got.begin(), got.begin() + nnz), want) << what;
            const auto yh = to_host(y);
            for (int j = 0; j < d; ++j)
              ASSERT_EQ(yh[j], keep[j] ? x[j] : 0.0f) << what << " j=" << j;
            IVec<E> idx2("idx2", d);
            ASSERT_EQ(mask_indices(E(), xd, nd, prm, idx2, Vec<E>(), sc), nnz) << what;
            const auto got2 = ihost(idx2);
            ASSERT_TRUE(std::equal(want.begin(), want.end(), got2.begin())) << what;
            // in place: y aliases x
            Vec<E> xy("xy", d);
            Kokkos::deep_copy(xy, xd);
            ASSERT_EQ(mask_indices(E(), CVec<E>(xy), nd, prm, idx2, xy, sc), nnz) << what;
            ASSERT_EQ(to_host(xy), yh) << what;
          }
        }
      }
    }
  }
}

// The team-per-row kernel is what device backends run; on host backends it runs here with one
// and with several threads per team and must agree with the one-thread-per-row kernel bitwise.
TYPED_TEST(Mask, TeamKernelMatchesRowKernelForAnyTeamSize) {
  using E = TypeParam;
  const int n = 5;
  std::vector<int> team_sizes = {1};
  if (E::concurrency() > 1) team_sizes.push_back(std::min(E::concurrency(), 4));
  for (int d : {1, 7, 576, 1537, 4096}) {
    auto x = random_vec(n * d, 1000 + d);
    for (int j = 0; j < d; j += 3) x[j] = std::round(x[j]);  // ties in row 0
    const auto norms = positive_norms(d, 4);
    for (MaskRule rule : {MaskRule::Threshold, MaskRule::TopK, MaskRule::Guided}) {
      for (bool with_norms : {false, true}) {
        MaskParams prm;
        prm.rule = rule;
        prm.p = 0.75f;
        prm.tau = 0.6f;
        prm.delta = 0.03f;
        const auto nv = with_norms ? norms : std::vector<float>{};
        const std::vector<int> sparse = {1, 1, 0, 1, 1};
        const Masked want = run_rows<E>(x, n, d, nv, prm, sparse);
        for (int ts : team_sizes) {
          auto xd = to_device<E>(x, n, d);
          Mat<E> y("y", n, d);
          IVec<E> kept("kept", n);
          detail::mask_rows_team(E(), CMat<E>(xd), dvec<E>(nv), divec<E>(sparse), prm, y, kept,
                                 IVec<E>(), IVec<E>(), ts);
          EXPECT_EQ(to_host(y), want.y) << "team size " << ts << " d=" << d;
          EXPECT_EQ(ihost(kept), want.kept) << "team size " << ts << " d=" << d;
          // single row with indices, as the device path of mask_indices runs it
          IVec<E> idx("idx", d), cnt("cnt", 1);
          Mat<E> y1("y1", 1, d);
          auto x1 = Kokkos::subview(xd, std::make_pair(0, 1), Kokkos::ALL);
          detail::mask_rows_team(E(), CMat<E>(x1), dvec<E>(nv), IVec<E>(), prm, y1, IVec<E>(), idx,
                                 cnt, ts);
          const int nnz = ihost(cnt)[0];
          const auto ix = ihost(idx);
          const auto keep = ref_keep(x.data(), d, nv, prm);
          std::vector<int> wi;
          for (int j = 0; j < d; ++j)
            if (keep[j]) wi.push_back(j);
          ASSERT_EQ(nnz, static_cast<int>(wi.size()));
          EXPECT_EQ(std::vector<int>(ix.begin(), ix.begin() + nnz), wi) << "team size " << ts;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sparsim::test
