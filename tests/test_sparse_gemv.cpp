// The column-skipping GEMV against a double-precision host reference and against the dense
// projection kernel on the same masked input; every storage type, tile tails and kept-row
// remainders; bitwise identical results for any tile width (= any thread count) and for Serial
// against OpenMP.
#include "backends.hpp"
#include "compare_helpers.hpp"
#include "helpers.hpp"
#include "kernels/linear.hpp"
#include "kernels/sparse_gemv.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace sparsim::test {
namespace {

template <class E>
class SparseGemv : public ::testing::Test {};
TYPED_TEST_SUITE(SparseGemv, Backends, BackendName);

TYPED_TEST(SparseGemv, MatchesReferenceAndDenseOnMaskedInput) {
  using E = TypeParam;
  const int in = 200, out = 150;  // out is not a multiple of the block: exercises the tail
  const auto w = random_vec(out * in, 50, 0.2f);  // W[out][in]
  std::vector<float> wt(in * out);
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i) wt[i * out + o] = w[o * in + i];
  auto wd = to_device<E>(w, out, in);
  auto wtd = to_device<E>(wt, in, out);
  Matrix<E> m;
  m.dtype = DType::F32;
  m.rows = out;
  m.cols = in;
  m.f32 = wd;
  for (double s : {0.0, 0.3, 0.5, 0.9, 1.0}) {
    const auto x = random_vec(in, 60);
    // keep the largest |x| entries: the mask a TopK policy would choose
    std::vector<int> order(in);
    for (int i = 0; i < in; ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    const int keep = static_cast<int>(std::floor(in * (1.0 - s)));
    std::vector<int> kept(order.begin(), order.begin() + keep);
    std::sort(kept.begin(), kept.end());
    std::vector<float> masked(in, 0.0f);
    for (int i : kept) masked[i] = x[i];

    auto xd = to_device<E>(x, 1, in);
    Vec<E> xv("x", in), y("y", out);
    Kokkos::deep_copy(xv, Kokkos::subview(xd, 0, Kokkos::ALL));
    IVec<E> idx("idx", std::max(keep, 1));
    auto hi = Kokkos::create_mirror_view(idx);
    for (int k = 0; k < keep; ++k) hi(k) = kept[k];
    Kokkos::deep_copy(idx, hi);
    sparse_gemv(E(), CVec<E>(xv), idx, keep, wtd, y);
    const auto got = to_host(y);

    auto md = to_device<E>(masked, 1, in);
    Mat<E> yd("yd", 1, out);
    LinearScratch<E> sc;
    linear(E(), CMat<E>(md), m, yd, sc);
    const auto dense = to_host(yd);
    for (int o = 0; o < out; ++o) {
      double ref = 0, mag = 0;
      for (int i : kept) {
        ref += double(x[i]) * w[o * in + i];
        mag += std::fabs(double(x[i]) * w[o * in + i]);
      }
      EXPECT_NEAR(got[o], ref, 1e-6 * (1 + mag)) << "s=" << s << " o=" << o;
      EXPECT_NEAR(got[o], dense[o], 1e-6 * (1 + mag)) << "dense vs sparse, s=" << s;
    }
  }
}

/// A random Wt[in][out] of storage type T on E, its exact fp32 values on the host, a random
/// input and a seeded sorted subset of `keep` kept indices.
template <class E, class T>
struct Problem {
  int in, out, keep;
  std::vector<float> wt, x;
  std::vector<int> kept;
  Kokkos::View<T**, Layout, DeviceOf<E>> wtd;
  Vec<E> xd;
  IVec<E> idx;

  Problem(int in_, int out_, int keep_, std::uint64_t seed) : in(in_), out(out_), keep(keep_) {
    wt = random_vec(static_cast<std::size_t>(in) * out, seed, 0.2f);
    for (auto& v : wt) v = stored<T>(v);
    x = random_vec(in, seed + 1);
    std::vector<int> order(in);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(seed)));
    kept.assign(order.begin(), order.begin() + keep);
    std::sort(kept.begin(), kept.end());
    wtd = decltype(wtd)("wt", in, out);
    auto hw = Kokkos::create_mirror_view(wtd);
    for (int i = 0; i < in; ++i)
      for (int o = 0; o < out; ++o)
        hw(i, o) = from_f32<T>(wt[static_cast<std::size_t>(i) * out + o]);
    Kokkos::deep_copy(wtd, hw);
    xd = Vec<E>("x", in);
    auto hx = Kokkos::create_mirror_view(xd);
    for (int i = 0; i < in; ++i) hx(i) = x[i];
    Kokkos::deep_copy(xd, hx);
    idx = IVec<E>("idx", std::max(keep, 1));
    auto hi = Kokkos::create_mirror_view(idx);
    for (int k = 0; k < keep; ++k) hi(k) = kept[k];
    Kokkos::deep_copy(idx, hi);
  }

  std::vector<float> run() const {
    Vec<E> y("y", out);
    Kokkos::deep_copy(y, -1.0f);  // every output must be written
    sparse_gemv(E(), CVec<E>(xd), idx, keep, wtd, y);
    return to_host(y);
  }
  std::vector<float> run_tiled(int tile) const {
    Vec<E> y("y", out);
    Kokkos::deep_copy(y, -1.0f);
    sparse_gemv_tiled(E(), CVec<E>(xd), idx, keep, wtd, y, tile);
    return to_host(y);
  }

  void check(const std::vector<float>& got, const std::string& what) const {
    ASSERT_EQ(static_cast<int>(got.size()), out);
    for (int o = 0; o < out; ++o) {
      double ref = 0, mag = 0;
      for (int i : kept) {
        const double t = double(x[i]) * wt[static_cast<std::size_t>(i) * out + o];
        ref += t;
        mag += std::fabs(t);
      }
      ASSERT_NEAR(got[o], ref, 1e-5 * (1 + mag)) << what << " o=" << o;
    }
  }
};

/// Shapes around the tiling: out below one tile alignment, a ragged tail, exactly one aligned
/// tile, and wider than kMaxTile (several tiles per thread); keep covers every remainder mod
/// kGroup, nothing kept, and everything kept.
template <class E, class T>
void check_storage_type() {
  const int shapes[][2] = {{9, 5}, {67, 150}, {40, 2 * kTileAlign}, {13, kMaxTile + 100}};
  std::uint64_t seed = 100;
  for (auto& sh : shapes) {
    const int in = sh[0], out = sh[1];
    for (int keep : {0, 1, 2, 3, 4, 5, 6, 7, in / 2, in - 1, in}) {
      if (keep > in) continue;
      const Problem<E, T> p(in, out, keep, seed++);
      const std::string what = "in=" + std::to_string(in) + " out=" + std::to_string(out) +
                               " keep=" + std::to_string(keep);
      const auto y = p.run();
      p.check(y, what);
      if constexpr (detail::kHostSpace<E>) {
        // The tile only decides which thread owns which outputs: every width, including the
        // width sparse_gemv would pick for any thread count, gives the same bits.
        std::vector<int> tiles = {1, 3, kTileAlign, 100, kMaxTile, out};
        for (int threads : {1, 2, 3, 8, 64}) tiles.push_back(sparse_gemv_tile(out, threads));
        for (int tile : tiles)
          EXPECT_TRUE(same_bits(p.run_tiled(tile), y)) << what << " tile=" << tile;
      }
    }
  }
}

TYPED_TEST(SparseGemv, Float32) {
  check_storage_type<TypeParam, float>();
}
TYPED_TEST(SparseGemv, BFloat16) {
  check_storage_type<TypeParam, bf16_t>();
}
TYPED_TEST(SparseGemv, Float16) {
  check_storage_type<TypeParam, f16_t>();
}

TEST(SparseGemvTile, BalancedAlignedAndBounded) {
  for (int out : {1, 5, 31, 32, 150, 192, 576, 1536, 4096, 11008, 32000})
    for (int threads : {1, 2, 3, 4, 16, 64}) {
      const int tile = sparse_gemv_tile(out, threads);
      EXPECT_EQ(tile % kTileAlign, 0) << out << " " << threads;
      EXPECT_LE(tile, std::max(kMaxTile, kTileAlign)) << out << " " << threads;
      const int tiles = (out + tile - 1) / tile;
      EXPECT_GE(tiles * tile, out);
      // the busiest thread owns at most one alignment step per tile beyond its fair share
      const int per_thread = (tiles + threads - 1) / threads;
      EXPECT_LE(per_thread * tile, (out + threads - 1) / threads + per_thread * kTileAlign)
          << out << " " << threads;
    }
  EXPECT_EQ(sparse_gemv_tile(4096, 2), 2048);
  EXPECT_EQ(sparse_gemv_tile(576, 2), 288);
}

#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
TEST(SparseGemvDeterminism, SerialAndOpenMPBitwiseIdentical) {
  for (int out : {150, 576, kMaxTile + 100}) {
    const Problem<Kokkos::Serial, bf16_t> a(301, out, 203, 7);
    const Problem<Kokkos::OpenMP, bf16_t> b(301, out, 203, 7);
    const auto ya = a.run(), yb = b.run();
    a.check(ya, "serial");
    EXPECT_TRUE(same_bits(ya, yb)) << "out=" << out;
  }
}
#endif

}  // namespace
}  // namespace sparsim::test
