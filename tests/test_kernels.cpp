// Every kernel against a plain host reference (double accumulation) on random inputs.
#include "backends.hpp"
#include "helpers.hpp"
#include "kernels/attention.hpp"
#include "kernels/bandwidth.hpp"
#include "kernels/linear.hpp"
#include "kernels/loss.hpp"
#include "kernels/pointwise.hpp"

#include <cmath>
#include <limits>

namespace sparsim::test {
namespace {

template <class E>
class Kernels : public ::testing::Test {};
TYPED_TEST_SUITE(Kernels, Backends, BackendName);

void expect_close(const std::vector<float>& got, const std::vector<double>& ref, double rtol,
                  double atol, const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]) - rtol * std::fabs(ref[i]);
    worst = std::max(worst, err);
    ASSERT_LE(std::fabs(got[i] - ref[i]), atol + rtol * std::fabs(ref[i]))
        << what << " element " << i << ": " << got[i] << " vs " << ref[i];
  }
}

template <class E>
Matrix<E> make_matrix(const std::vector<float>& w, int rows, int cols, DType t) {
  Matrix<E> m;
  m.dtype = t;
  m.rows = rows;
  m.cols = cols;
  if (t == DType::F32) {
    m.f32 = to_device<E>(w, rows, cols);
  } else if (t == DType::BF16) {
    m.bf16 = decltype(m.bf16)("w", rows, cols);
    auto h = Kokkos::create_mirror_view(m.bf16);
    for (int i = 0; i < rows * cols; ++i) h.data()[i] = bf16_t::from_float(w[i]);
    Kokkos::deep_copy(m.bf16, h);
  } else {
    m.f16 = decltype(m.f16)("w", rows, cols);
    auto h = Kokkos::create_mirror_view(m.f16);
    for (int i = 0; i < rows * cols; ++i) h.data()[i] = f16_t::from_float(w[i]);
    Kokkos::deep_copy(m.f16, h);
  }
  return m;
}

float stored(float x, DType t) {
  if (t == DType::BF16) return bf16_t::from_float(x).to_float();
  if (t == DType::F16) return f16_t::from_float(x).to_float();
  return x;
}

TYPED_TEST(Kernels, LinearAllTypesAndBatchSizes) {
  using E = TypeParam;
  const int in = 72, out = 40;
  const auto w = random_vec(out * in, 11, 0.3f);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    Matrix<E> m = make_matrix<E>(w, out, in, t);
    for (int n : {1, 3, kWidenRows, 37}) {
      const auto x = random_vec(n * in, 100 + n);
      auto xd = to_device<E>(x, n, in);
      Mat<E> y("y", n, out);
      LinearScratch<E> sc;
      linear(E(), CMat<E>(xd), m, y, sc);
      std::vector<double> ref(n * out);
      for (int r = 0; r < n; ++r)
        for (int o = 0; o < out; ++o) {
          double acc = 0;
          for (int i = 0; i < in; ++i) acc += double(x[r * in + i]) * stored(w[o * in + i], t);
          ref[r * out + o] = acc;
        }
      expect_close(to_host(y), ref, 1e-5, 1e-5, "linear");
    }
  }
}

// The opt-in bf16 compute: rows rounded to bf16 (nearest even), fp32 accumulation. Shapes cross
// both tile edges (1100 outputs: 512, 512, 76; 1000 tokens: 256 × 3, 232), and tiles of one
// shape run at once on different threads (they once shared oneDNN's scratchpad); two sequences
// of 500 rows (seg) each give every row the bits it gets alone.
TYPED_TEST(Kernels, LinearBf16Compute) {
  using E = TypeParam;
  if constexpr (!Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                            typename E::memory_space>::accessible) {
    GTEST_SKIP() << "bf16 compute is a host path";
  } else {
    if (!host::bf16_gemm_available()) GTEST_SKIP() << host::bf16_gemm_unavailable_reason();
    const int out = 1100, in = 576, n = 1000;
    const auto w = random_vec(out * in, 21);
    const auto x = random_vec(n * in, 22, 3.0f);
    Matrix<E> m = make_matrix<E>(w, out, in, DType::BF16);
    auto xd = to_device<E>(x, n, in);
    LinearScratch<E> sc;
    sc.bf16_compute = true;
    Mat<E> y("y", n, out);
    linear(E(), CMat<E>(xd), m, y, sc);
    std::vector<double> ref(n * out);
    double scale = 0;
    for (int r = 0; r < n; ++r)
      for (int o = 0; o < out; ++o) {
        double acc = 0, mag = 0;
        for (int i = 0; i < in; ++i) {
          const double p =
              double(stored(x[r * in + i], DType::BF16)) * stored(w[o * in + i], DType::BF16);
          acc += p;
          mag += std::fabs(p);
        }
        ref[r * out + o] = acc;
        scale = std::max(scale, mag);
      }
    // fp32 sums of exact products: within a few ulps of the sum of magnitudes
    expect_close(to_host(y), ref, 0.0, 1e-6 * scale, "bf16-compute linear");
    // run after run the same bits (a race between tiles would not be)
    for (int rep = 0; rep < 4; ++rep) {
      Mat<E> yr("yr", n, out);
      linear(E(), CMat<E>(xd), m, yr, sc);
      ASSERT_EQ(to_host(yr), to_host(y)) << "repetition " << rep;
    }
    // not the fp32-activation product: rounding x to bf16 shows
    std::vector<double> exact(n * out);
    double moved = 0;
    for (int r = 0; r < n; ++r)
      for (int o = 0; o < out; ++o) {
        double acc = 0;
        for (int i = 0; i < in; ++i)
          acc += double(x[r * in + i]) * stored(w[o * in + i], DType::BF16);
        moved = std::max(moved, std::fabs(acc - ref[r * out + o]));
      }
    EXPECT_GT(moved, 1e-4 * scale);
    // per-sequence tiling: the rows of two sequences of 150, then the second one alone
    Mat<E> y2("y2", n, out);
    linear(E(), CMat<E>(xd), m, y2, sc, n / 2);
    auto x1 = to_device<E>(std::vector<float>(x.begin() + n / 2 * in, x.end()), n / 2, in);
    Mat<E> y1("y1", n / 2, out);
    linear(E(), CMat<E>(x1), m, y1, sc);
    const auto h2 = to_host(y2), h1 = to_host(y1);
    for (int i = 0; i < n / 2 * out; ++i)
      ASSERT_EQ(h2[static_cast<std::size_t>(n / 2 * out + i)], h1[static_cast<std::size_t>(i)])
          << "row " << i / out;
  }
}

// Tiles of one shape on two threads at once, as a prefill runs them: each must be its own
// product (oneDNN's library-managed scratchpad belongs to the primitive and was shared).
TEST(Bf16GemmTile, ConcurrentTilesOfOneShape) {
  if (!host::bf16_gemm_available()) GTEST_SKIP() << host::bf16_gemm_unavailable_reason();
  const int nt = 256, nr = 512, K = 576, tiles = 8;
  std::vector<std::uint16_t> x(static_cast<std::size_t>(tiles) * nt * K),
      w(static_cast<std::size_t>(nr) * K);
  const auto xf = random_vec(x.size(), 31), wf = random_vec(w.size(), 32, 0.1f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = bf16_t::from_float(xf[i]).bits;
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = bf16_t::from_float(wf[i]).bits;
  std::vector<float> y(static_cast<std::size_t>(tiles) * nt * nr);
  const std::uint16_t* xp = x.data();
  const std::uint16_t* wp = w.data();
  float* yp = y.data();
  for (int rep = 0; rep < 5; ++rep)
    Kokkos::parallel_for(Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, tiles),
                         [=](const int i) {
                           const std::size_t t0 = static_cast<std::size_t>(i) * nt;
                           host::bf16_gemm_tile(xp + t0 * K, K, wp, K, yp + t0 * nr, nr, nt, nr, K);
                         });
  Kokkos::fence();
  auto f = [](std::uint16_t b) { return bf16_t{b}.to_float(); };
  double worst = 0, mag = 0;
  for (int t = 0; t < tiles * nt; t += 5)
    for (int r = 0; r < nr; r += 3) {
      double acc = 0, m = 0;
      for (int k = 0; k < K; ++k) {
        const double p = double(f(x[static_cast<std::size_t>(t) * K + k])) *
                         f(w[static_cast<std::size_t>(r) * K + k]);
        acc += p;
        m += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(acc - y[static_cast<std::size_t>(t) * nr + r]));
      mag = std::max(mag, m);
    }
  EXPECT_LE(worst, 1e-6 * mag);
}

TYPED_TEST(Kernels, RmsNorm) {
  using E = TypeParam;
  const int n = 5, d = 96;
  const auto x = random_vec(n * d, 3, 2.0f);
  const auto g = random_vec(d, 4);
  auto xd = to_device<E>(x, n, d);
  auto gd2 = to_device<E>(g, 1, d);
  Vec<E> gd("g", d);
  Kokkos::deep_copy(gd, Kokkos::subview(gd2, 0, Kokkos::ALL));
  Mat<E> out("out", n, d);
  rmsnorm(E(), CMat<E>(xd), CVec<E>(gd), 1e-5f, out);
  std::vector<double> ref(n * d);
  for (int t = 0; t < n; ++t) {
    double ss = 0;
    for (int j = 0; j < d; ++j) ss += double(x[t * d + j]) * x[t * d + j];
    const double s = 1.0 / std::sqrt(ss / d + 1e-5);
    for (int j = 0; j < d; ++j) ref[t * d + j] = x[t * d + j] * s * g[j];
  }
  expect_close(to_host(out), ref, 1e-5, 1e-6, "rmsnorm");
}

/// RoPE tables cos/sin [position][hd/2] for θ = 10000, rounded from double, as the engine's.
template <class E>
std::pair<Mat<E>, Mat<E>> rope_tables(int ctx, int hd) {
  const int half = hd / 2;
  std::vector<float> c(ctx * half), s(ctx * half);
  for (int p = 0; p < ctx; ++p)
    for (int j = 0; j < half; ++j) {
      const double a = p * std::pow(10000.0, -2.0 * j / hd);
      c[p * half + j] = float(std::cos(a));
      s[p * half + j] = float(std::sin(a));
    }
  return {to_device<E>(c, ctx, half), to_device<E>(s, ctx, half)};
}

/// Positions first, first + step, … of n rows.
template <class E>
IVec<E> positions(int n, int first, int step) {
  IVec<E> pos("pos", n);
  auto hp = Kokkos::create_mirror_view(pos);
  for (int t = 0; t < n; ++t) hp(t) = first + step * t;
  Kokkos::deep_copy(pos, hp);
  return pos;
}

TYPED_TEST(Kernels, RopeBothLayouts) {
  using E = TypeParam;
  const int n = 6, hd = 16, qh = 4, kh = 2, half = hd / 2, ctx = 64;
  const double base = 10000.0;
  for (bool adjacent : {true, false}) {
    const auto q = random_vec(n * qh * hd, 5), k = random_vec(n * kh * hd, 6);
    auto qd = to_device<E>(q, n, qh * hd), kd = to_device<E>(k, n, kh * hd);
    const auto tables = rope_tables<E>(ctx, hd);
    const Mat<E> cd = tables.first, sd = tables.second;
    const IVec<E> pos = positions<E>(n, 3, 7);
    rope(E(), qd, kd, pos, CMat<E>(cd), CMat<E>(sd), hd, adjacent);
    auto ref_rot = [&](const std::vector<float>& v, int heads) {
      std::vector<double> r(v.begin(), v.end());
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < heads; ++h)
          for (int j = 0; j < half; ++j) {
            const double a = (3 + 7 * t) * std::pow(base, -2.0 * j / hd);
            const int b = t * heads * hd + h * hd;
            const int i0 = adjacent ? b + 2 * j : b + j,
                      i1 = adjacent ? b + 2 * j + 1 : b + j + half;
            r[i0] = v[i0] * std::cos(a) - v[i1] * std::sin(a);
            r[i1] = v[i0] * std::sin(a) + v[i1] * std::cos(a);
          }
      return r;
    };
    expect_close(to_host(qd), ref_rot(q, qh), 1e-5, 1e-5, "rope q");
    expect_close(to_host(kd), ref_rot(k, kh), 1e-5, 1e-5, "rope k");
  }
}

// A pruned layer's rotation units in either pair order (RAP keeps whole pairs in channel order)
// run through loops without the index lists; they must rotate as the listed units do, each pair
// at its own frequency (the compiler may fuse the vectorised loop's multiply-adds otherwise than
// the listed one's, so the two agree to rounding, not bit for bit), and one launch for queries
// and keys must give the bits of one launch each.
TYPED_TEST(Kernels, RopeUnitsInPairOrderAreTheListedRotations) {
  using E = TypeParam;
  const int n = 5, U = 6, w = 2 * U, nkv = 2, group = 3, hd = 32, half = hd / 2, ctx = 64;
  const auto tables = rope_tables<E>(ctx, hd);
  const Mat<E> cd = tables.first, sd = tables.second;
  const IVec<E> pos = positions<E>(n, 5, 11);
  for (const bool adjacent : {true, false}) {
    RopeUnits u;
    u.units = U;
    for (int h = 0; h < nkv; ++h)
      for (int k = 0; k < U; ++k) {
        u.i0.push_back(adjacent ? 2 * k : k);
        u.i1.push_back(adjacent ? 2 * k + 1 : k + U);
        u.freq.push_back((2 * k + 3 * h) % half);  // kept pairs of the full head, per KV head
      }
    const RopeMap<E> fast = make_rope_map<E>(u);
    EXPECT_EQ(fast.order, adjacent ? RopeMap<E>::kAdjacentPairs : RopeMap<E>::kHalvesPairs);
    RopeMap<E> listed = fast;
    listed.order = RopeMap<E>::kListed;
    const auto q = random_vec(n * nkv * group * w, 21), k = random_vec(n * nkv * w, 22);
    auto run = [&](const RopeMap<E>& m, bool together) {
      auto qd = to_device<E>(q, n, nkv * group * w), kd = to_device<E>(k, n, nkv * w);
      const Mat<E> none;
      if (together) {
        rope_units(E(), qd, kd, pos, CMat<E>(cd), CMat<E>(sd), m, w);
      } else {
        rope_units(E(), qd, none, pos, CMat<E>(cd), CMat<E>(sd), m, w);
        rope_units(E(), none, kd, pos, CMat<E>(cd), CMat<E>(sd), m, w);
      }
      return std::make_pair(to_host(qd), to_host(kd));
    };
    const auto a = run(fast, true), b = run(listed, true), d = run(fast, false);
    EXPECT_EQ(a, d) << "one launch against two, adjacent " << adjacent;
    auto ref = [&](const std::vector<float>& v, int heads) {
      std::vector<double> r(v.begin(), v.end());
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < heads; ++h) {
          const int kvh = heads == nkv ? h : h / group, b0 = (t * heads + h) * w;
          for (int j = 0; j < U; ++j) {
            const double ang = (5 + 11 * t) * std::pow(10000.0, -2.0 * u.freq[kvh * U + j] / hd);
            const int i0 = b0 + u.i0[kvh * U + j], i1 = b0 + u.i1[kvh * U + j];
            r[i0] = v[i0] * std::cos(ang) - v[i1] * std::sin(ang);
            r[i1] = v[i0] * std::sin(ang) + v[i1] * std::cos(ang);
          }
        }
      return r;
    };
    expect_close(a.first, ref(q, nkv * group), 1e-5, 1e-5, "rope units q");
    expect_close(a.second, ref(k, nkv), 1e-5, 1e-5, "rope units k");
    expect_close(b.first, ref(q, nkv * group), 1e-5, 1e-5, "listed rope units q");
    expect_close(b.second, ref(k, nkv), 1e-5, 1e-5, "listed rope units k");
  }
  // a unit with a cut partner keeps the listed loops
  RopeUnits o;
  o.units = 2;
  o.i0 = {0, 2};
  o.i1 = {1, -1};
  o.freq = {0, 4};
  EXPECT_EQ(make_rope_map<E>(o).order, RopeMap<E>::kListed);
}

TYPED_TEST(Kernels, SwigluEmbedResidual) {
  using E = TypeParam;
  const int n = 4, d = 33;
  const auto g = random_vec(n * d, 8, 3.0f), u = random_vec(n * d, 9);
  auto gd = to_device<E>(g, n, d), ud = to_device<E>(u, n, d);
  swiglu(E(), gd, CMat<E>(ud));
  std::vector<double> ref(n * d);
  for (int i = 0; i < n * d; ++i) ref[i] = g[i] / (1 + std::exp(-double(g[i]))) * u[i];
  expect_close(to_host(gd), ref, 1e-5, 1e-6, "swiglu");

  add_inplace(E(), ud, CMat<E>(ud));
  std::vector<double> twice(u.begin(), u.end());
  for (auto& v : twice) v *= 2;
  expect_close(to_host(ud), twice, 0, 0, "residual");

  const int vocab = 10;
  const auto emb = random_vec(vocab * d, 10);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    Matrix<E> m = make_matrix<E>(emb, vocab, d, t);
    IVec<E> tok("tok", n);
    auto ht = Kokkos::create_mirror_view(tok);
    const int ids[] = {9, 0, 4, 4};
    for (int i = 0; i < n; ++i) ht(i) = ids[i];
    Kokkos::deep_copy(tok, ht);
    Mat<E> out("e", n, d);
    embed(E(), m, tok, out);
    std::vector<double> r(n * d);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j) r[i * d + j] = stored(emb[ids[i] * d + j], t);
    expect_close(to_host(out), r, 0, 0, "embed");
  }
}

namespace {
/// One attention call against a float64 brute-force softmax: n_seq sequences of T new rows at
/// cache positions p0 …, query/key heads qk wide, value heads vd wide, scores times `scale`.
struct AttnCase {
  int n_seq, T, p0, nh, nkv, qk, vd, ctx;
  float scale;
};

template <class E>
void check_attention_against_naive(const AttnCase& c) {
  const int n_seq = c.n_seq, T = c.T, p0 = c.p0, nh = c.nh, nkv = c.nkv, ctx = c.ctx;
  const int kd = nkv * c.qk, vdw = nkv * c.vd, qd = nh * c.qk, od = nh * c.vd;
  // The cache already holds p0 positions per sequence; the new rows are stored by kv_store.
  const auto old_k = random_vec(n_seq * ctx * kd, 20), old_v = random_vec(n_seq * ctx * vdw, 21);
  const auto q = random_vec(n_seq * T * qd, 22), k = random_vec(n_seq * T * kd, 23),
             v = random_vec(n_seq * T * vdw, 24);
  Cache<E> kc("kc", n_seq, ctx, kd), vc("vc", n_seq, ctx, vdw);
  {
    auto hk = Kokkos::create_mirror_view(kc), hv = Kokkos::create_mirror_view(vc);
    for (int i = 0; i < n_seq * ctx * kd; ++i) hk.data()[i] = old_k[i];
    for (int i = 0; i < n_seq * ctx * vdw; ++i) hv.data()[i] = old_v[i];
    Kokkos::deep_copy(kc, hk);
    Kokkos::deep_copy(vc, hv);
  }
  auto qd_ = to_device<E>(q, n_seq * T, qd), kdv = to_device<E>(k, n_seq * T, kd),
       vdv = to_device<E>(v, n_seq * T, vdw);
  kv_store(E(), CMat<E>(kdv), CMat<E>(vdv), kc, vc, n_seq, T, p0);
  Mat<E> out("out", n_seq * T, od);
  attention(E(), CMat<E>(qd_), kc, vc, out, n_seq, T, p0, nh, nkv, c.qk, c.vd, c.scale);

  auto K = [&](int s, int p, int j) {
    return p < p0 ? old_k[(s * ctx + p) * kd + j] : k[(s * T + p - p0) * kd + j];
  };
  auto V = [&](int s, int p, int j) {
    return p < p0 ? old_v[(s * ctx + p) * vdw + j] : v[(s * T + p - p0) * vdw + j];
  };
  std::vector<double> ref(n_seq * T * od);
  for (int s = 0; s < n_seq; ++s)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < nh; ++h) {
        const int kvh = h / (nh / nkv), r = s * T + t, np = p0 + t + 1;
        std::vector<double> sc(np);
        double mx = -1e300;
        for (int p = 0; p < np; ++p) {
          double a = 0;
          for (int i = 0; i < c.qk; ++i)
            a += double(q[r * qd + h * c.qk + i]) * K(s, p, kvh * c.qk + i);
          sc[p] = a * c.scale;
          mx = std::max(mx, sc[p]);
        }
        double z = 0;
        for (auto& x : sc) z += (x = std::exp(x - mx));
        for (int i = 0; i < c.vd; ++i) {
          double a = 0;
          for (int p = 0; p < np; ++p) a += sc[p] * V(s, p, kvh * c.vd + i);
          ref[r * od + h * c.vd + i] = a / z;
        }
      }
  expect_close(to_host(out), ref, 1e-5, 1e-5, "attention");
}
}  // namespace

TYPED_TEST(Kernels, AttentionAgainstNaiveCausalGqa) {
  const int hd = 8;
  check_attention_against_naive<TypeParam>(
      {2, 5, 3, 4, 2, hd, hd, 16, 1.0f / std::sqrt(float(hd))});
}

// Prefill over several row tiles with the first rows past a cached prefix, and decode over a
// cache of several position chunks, with pruned widths (Q/K 24 or 22, V 40 or 30 wide) and the
// full model's scale, as a RAP layer has them.
TYPED_TEST(Kernels, AttentionTilesChunksAndPrunedWidths) {
  const float scale = 0.125f;
  check_attention_against_naive<TypeParam>({2, 150, 70, 6, 2, 24, 40, 256, scale});
  check_attention_against_naive<TypeParam>({3, 1, 600, 6, 3, 22, 30, 640, scale});
  check_attention_against_naive<TypeParam>({1, 1, 0, 4, 4, 16, 16, 8, scale});
}

TEST(KernelsHost, SoftmaxExponentWithinTwoUlpAndZeroBelowRange) {
  for (float x = -90.0f; x <= 0.0f; x += 0.0137f) {
    const double ref = std::exp(double(x));
    const float got = sparsim::detail::exp_nonpos(x);
    if (x < -87.0f) {
      EXPECT_EQ(got, 0.0f) << x;
    } else {
      EXPECT_NEAR(got, ref, 2.5 * ref * std::numeric_limits<float>::epsilon()) << x;
    }
  }
  EXPECT_EQ(sparsim::detail::exp_nonpos(0.0f), 1.0f);
}

TEST(KernelsHost, SiluWithinFourUlpEverywhere) {
  // both branches, the crossover at 0, and beyond exp_nonpos's range on both sides
  for (float g = -120.0f; g <= 120.0f; g += 0.00731f) {
    const double ref = double(g) / (1.0 + std::exp(-double(g)));
    const float got = sparsim::detail::silu(g);
    // below g = −87 (e^g out of the normal range) silu is flushed to 0, an error under 1e-35
    ASSERT_NEAR(got, ref, 4.0 * std::fabs(ref) * std::numeric_limits<float>::epsilon() + 1e-35)
        << g;
  }
  EXPECT_EQ(sparsim::detail::silu(0.0f), 0.0f);
  EXPECT_EQ(sparsim::detail::silu(100.0f), 100.0f);
}

TYPED_TEST(Kernels, NllAndArgmaxRows) {
  using E = TypeParam;
  const int n = 7, V = 1000;
  auto z = random_vec(n * V, 40, 4.0f);
  z[3 * V + 17] = z[3 * V + 18] = 50.0f;  // a tie: the lower id wins
  auto zd = to_device<E>(z, n, V);
  IVec<E> tgt("tgt", n), am("am", n);
  Kokkos::View<double*, DeviceOf<E>> nll("nll", n);
  auto ht = Kokkos::create_mirror_view(tgt);
  const int targets[] = {0, 999, 5, 17, 500, -1, 42};  // -1: not scored
  for (int r = 0; r < n; ++r) ht(r) = targets[r];
  Kokkos::deep_copy(tgt, ht);
  nll_rows(E(), CMat<E>(zd), tgt, nll, am);
  auto hn = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), nll);
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), am);
  for (int r = 0; r < n; ++r) {
    double mx = -1e300;
    int best = 0;
    for (int v = 0; v < V; ++v)
      if (z[r * V + v] > mx) mx = z[r * V + v], best = v;
    double s = 0;
    for (int v = 0; v < V; ++v) s += std::exp(double(z[r * V + v]) - mx);
    const double ref = targets[r] < 0 ? 0.0 : std::log(s) + mx - z[r * V + targets[r]];
    EXPECT_NEAR(hn(r), ref, 1e-6 * (1 + std::fabs(ref))) << "row " << r;
    EXPECT_EQ(ha(r), best) << "row " << r;
  }
  EXPECT_EQ(ha(3), 17);
}

// The bandwidth measurement copies and reads every element once per repetition (the checksum
// counts the copied ones), rounds the array to whole 16-lane blocks and orders its statistics.
TYPED_TEST(Kernels, StreamBandwidthTouchesEveryElementAndOrdersItsStatistics) {
  using E = TypeParam;
  const std::size_t bytes = (std::size_t(1) << 20) + 100;  // not a whole number of blocks
  const kernels::StreamBandwidth bw = kernels::stream_bandwidth(E(), bytes, 4);
  EXPECT_EQ(bw.array_bytes, bytes / 64 * 64);  // whole blocks of 16 floats
  EXPECT_EQ(bw.reps, 4);
  EXPECT_EQ(bw.checksum, 5.0f * static_cast<float>(bw.array_bytes / sizeof(float)));
  for (const auto* st : {&bw.copy, &bw.read, &bw.runtime_copy}) {
    EXPECT_GT(st->min, 0);
    EXPECT_LE(st->min, st->median);
    EXPECT_LE(st->median, st->max);
    EXPECT_GE(st->spread(), 0);
  }
  EXPECT_EQ(bw.reference(), std::max(bw.copy.median, bw.runtime_copy.median));
  EXPECT_GE(kernels::host_stream_bytes(), std::size_t(256) << 20);
  EXPECT_LE(kernels::host_stream_bytes(), std::size_t(1024) << 20);
}

}  // namespace
}  // namespace sparsim::test
