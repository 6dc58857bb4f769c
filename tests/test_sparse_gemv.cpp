// The column-skipping GEMV against a double-precision host reference and against the dense
// projection kernel on the same masked input.
#include "backends.hpp"
#include "helpers.hpp"
#include "kernels/linear.hpp"
#include "kernels/sparse_gemv.hpp"

#include <cmath>

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

}  // namespace
}  // namespace sparsim::test
