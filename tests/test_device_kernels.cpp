// The device kernels (warp GEMV and its fused epilogues, split-K decode attention, tiled prefill
// attention, the team sparse GEMV) against double-precision references and against the host
// kernels, on every backend; and the engine's device path (fused decode) against its op-by-op
// path.
#include "backends.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "kernels/attention.hpp"
#include "kernels/attention_device.hpp"
#include "kernels/attention_gemm.hpp"
#include "kernels/gemv_device.hpp"
#include "kernels/pointwise.hpp"
#include "kernels/sparse_gemv.hpp"
#include "model/loader.hpp"
#include "sparsity/masker.hpp"

#include <algorithm>
#include <cmath>

namespace sparsim::test {
namespace {

template <class E>
class DeviceKernelTest : public ::testing::Test {};
TYPED_TEST_SUITE(DeviceKernelTest, Backends, BackendName);

template <class E>
using Dev = DeviceOf<E>;

template <class E, class T>
Kokkos::View<T**, Layout, Dev<E>> weights_as(const std::vector<float>& v, int rows, int cols) {
  Kokkos::View<T**, Layout, Dev<E>> d("w", rows, cols);
  auto h = Kokkos::create_mirror_view(d);
  for (int i = 0; i < rows * cols; ++i) h.data()[i] = from_f32<T>(v[static_cast<std::size_t>(i)]);
  Kokkos::deep_copy(d, h);
  return d;
}

double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-30, err = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    err = std::max(err, std::fabs(got[i] - want[i]));
  }
  return err / scale;
}

// y = W x (optionally of RMSNorm(x)·g, optionally added to y) for several widths (wide loads and
// the scalar tail), token counts and both storage types.
template <class E, class T>
void check_gemv(int out, int in, int n, bool norm, bool add) {
  const auto wv = random_vec(static_cast<std::size_t>(out) * in, 11 + in, 0.2f);
  const auto xv = random_vec(static_cast<std::size_t>(n) * in, 12 + n);
  const auto gv = random_vec(static_cast<std::size_t>(in), 13);
  const auto y0 = random_vec(static_cast<std::size_t>(n) * out, 14);
  auto w = weights_as<E, T>(wv, out, in);
  auto x = to_device<E>(xv, n, in);
  auto g = to_device<E>(gv, 1, in);
  auto y = to_device<E>(y0, n, out);
  const float eps = 1e-5f;
  gemv_warp(E(), CMat<E>(x), w, Mat<E>(y), add ? GemvOut::AddTo : GemvOut::Store,
            norm ? CVec<E>(g.data(), in) : CVec<E>(), eps);
  std::vector<double> want(static_cast<std::size_t>(n) * out);
  for (int t = 0; t < n; ++t) {
    double ss = 0;
    for (int j = 0; j < in; ++j) ss += static_cast<double>(xv[t * in + j]) * xv[t * in + j];
    const double inv = 1.0 / std::sqrt(ss / in + eps);
    for (int o = 0; o < out; ++o) {
      double a = 0;
      for (int j = 0; j < in; ++j) {
        const double xj = norm ? xv[t * in + j] * inv * gv[j] : xv[t * in + j];
        a += xj * stored<T>(wv[static_cast<std::size_t>(o) * in + j]);
      }
      want[static_cast<std::size_t>(t) * out + o] = (add ? y0[t * out + o] : 0.0) + a;
    }
  }
  EXPECT_LT(rel_err(to_host(y), want), 2e-6)
      << out << "x" << in << " n=" << n << " norm=" << norm << " add=" << add;
}

TYPED_TEST(DeviceKernelTest, WarpGemvMatchesReference) {
  using E = TypeParam;
  for (int in : {64, 72, 131, 576})
    for (int n : {1, 3, 6}) {
      check_gemv<E, float>(37, in, n, false, false);
      check_gemv<E, bf16_t>(37, in, n, n == 3, n == 6);
    }
  check_gemv<E, f16_t>(20, 96, 2, true, true);
  check_gemv<E, f16_t>(20, 96, 2, false, false);
  check_gemv<E, bf16_t>(20, 96, 2, true, true);
  check_gemv<E, f16_t>(20, 97, 2, false, false);
}

// Repeated calls give the same bits (a fixed summation order).
TYPED_TEST(DeviceKernelTest, WarpGemvIsDeterministic) {
  using E = TypeParam;
  const int out = 300, in = 1000, n = 2;
  auto w = weights_as<E, float>(random_vec(out * in, 1), out, in);
  auto x = to_device<E>(random_vec(n * in, 2), n, in);
  Mat<E> y1("y1", n, out), y2("y2", n, out);
  gemv_warp(E(), CMat<E>(x), w, y1);
  gemv_warp(E(), CMat<E>(x), w, y2);
  EXPECT_EQ(to_host(y1), to_host(y2));
}

TYPED_TEST(DeviceKernelTest, SwigluGemvMatchesReference) {
  using E = TypeParam;
  const int out = 50, in = 88, n = 5;
  const auto gw = random_vec(out * in, 3, 0.3f), uw = random_vec(out * in, 4, 0.3f);
  const auto xv = random_vec(n * in, 5), nv = random_vec(in, 6);
  auto wg = weights_as<E, bf16_t>(gw, out, in);
  auto wu = weights_as<E, bf16_t>(uw, out, in);
  auto x = to_device<E>(xv, n, in);
  auto g = to_device<E>(nv, 1, in);
  Mat<E> h("h", n, out);
  gemv_swiglu(E(), CMat<E>(x), wg, wu, h, CVec<E>(g.data(), in), 1e-6f);
  std::vector<double> want(static_cast<std::size_t>(n) * out);
  for (int t = 0; t < n; ++t) {
    double ss = 0;
    for (int j = 0; j < in; ++j) ss += static_cast<double>(xv[t * in + j]) * xv[t * in + j];
    const double inv = 1.0 / std::sqrt(ss / in + 1e-6);
    for (int o = 0; o < out; ++o) {
      double a = 0, b = 0;
      for (int j = 0; j < in; ++j) {
        const double xj = xv[t * in + j] * inv * nv[j];
        a += xj * stored<bf16_t>(gw[o * in + j]);
        b += xj * stored<bf16_t>(uw[o * in + j]);
      }
      want[static_cast<std::size_t>(t) * out + o] = a / (1.0 + std::exp(-a)) * b;
    }
  }
  EXPECT_LT(rel_err(to_host(h), want), 5e-6);
}

// Q/K/V + RoPE + cache store in one kernel equals the three projections, rope() and kv_store().
TYPED_TEST(DeviceKernelTest, QkvRopeKernelMatchesOpByOp) {
  using E = TypeParam;
  const int in = 48, hd = 8, nh = 4, nkv = 2, max_ctx = 16, n_seq = 3;
  const int qd = nh * hd, kvd = nkv * hd;
  for (bool adjacent : {true, false}) {
    auto wq = weights_as<E, float>(random_vec(qd * in, 21, 0.3f), qd, in);
    auto wk = weights_as<E, float>(random_vec(kvd * in, 22, 0.3f), kvd, in);
    auto wv = weights_as<E, float>(random_vec(kvd * in, 23, 0.3f), kvd, in);
    auto x = to_device<E>(random_vec(n_seq * in, 24), n_seq, in);
    // angles for positions 0 … max_ctx-1
    Mat<E> cs("cos", max_ctx, hd / 2), sn("sin", max_ctx, hd / 2);
    auto hc = Kokkos::create_mirror_view(cs);
    auto hs = Kokkos::create_mirror_view(sn);
    for (int p = 0; p < max_ctx; ++p)
      for (int j = 0; j < hd / 2; ++j) {
        const double a = p * std::pow(10000.0, -2.0 * j / hd);
        hc(p, j) = static_cast<float>(std::cos(a));
        hs(p, j) = static_cast<float>(std::sin(a));
      }
    Kokkos::deep_copy(cs, hc);
    Kokkos::deep_copy(sn, hs);
    const int p0 = 5;
    IVec<E> pos("pos", n_seq);
    Kokkos::deep_copy(pos, p0);
    // op by op
    Mat<E> q("q", n_seq, qd), k("k", n_seq, kvd), v("v", n_seq, kvd);
    gemv_warp(E(), CMat<E>(x), wq, q);
    gemv_warp(E(), CMat<E>(x), wk, k);
    gemv_warp(E(), CMat<E>(x), wv, v);
    rope(E(), q, k, pos, CMat<E>(cs), CMat<E>(sn), hd, adjacent);
    Cache<E> kc("kc", n_seq, max_ctx, kvd), vc("vc", n_seq, max_ctx, kvd);
    kv_store(E(), CMat<E>(k), CMat<E>(v), kc, vc, n_seq, 1, p0);
    // fused
    Mat<E> q2("q2", n_seq, qd);
    Cache<E> kc2("kc2", n_seq, max_ctx, kvd), vc2("vc2", n_seq, max_ctx, kvd);
    QKVTarget tg;
    tg.q = q2.data();
    tg.kc = kc2.data();
    tg.vc = vc2.data();
    tg.max_ctx = max_ctx;
    tg.pos = pos.data();
    tg.T = 1;
    tg.cos_t = cs.data();
    tg.sin_t = sn.data();
    tg.head_dim = hd;
    tg.adjacent = adjacent;
    gemv_qkv_rope(E(), CMat<E>(x), wq, wk, wv, tg);
    Kokkos::fence();
    const auto a = to_host(q), b = to_host(q2);
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5f) << i;
    const auto ka = to_host(kc), kb = to_host(kc2), va = to_host(vc), vb = to_host(vc2);
    for (std::size_t i = 0; i < ka.size(); ++i) {
      EXPECT_NEAR(ka[i], kb[i], 1e-5f) << "k " << i;
      EXPECT_NEAR(va[i], vb[i], 1e-5f) << "v " << i;
    }
  }
}

template <class E>
struct AttnCase {
  int n_seq, nh, nkv, hd, max_ctx;
  Cache<E> kc, vc;
  AttnCase(int s, int h, int kv, int d, int ctx, std::uint64_t seed)
      : n_seq(s),
        nh(h),
        nkv(kv),
        hd(d),
        max_ctx(ctx),
        kc("kc", s, ctx, kv * d),
        vc("vc", s, ctx, kv * d) {
    auto hk = Kokkos::create_mirror_view(kc);
    auto hv = Kokkos::create_mirror_view(vc);
    const auto a = random_vec(hk.size(), seed), b = random_vec(hv.size(), seed + 1);
    for (std::size_t i = 0; i < hk.size(); ++i) {
      hk.data()[i] = a[i];
      hv.data()[i] = b[i];
    }
    Kokkos::deep_copy(kc, hk);
    Kokkos::deep_copy(vc, hv);
  }
};

// Split-K decode attention equals the reference kernel, for contexts within one split and
// across many, GQA and MHA, several sequences, and again on a second call (the counters reset).
TYPED_TEST(DeviceKernelTest, SplitDecodeAttentionMatchesReference) {
  using E = TypeParam;
  for (const auto& shape : {std::array<int, 4>{3, 6, 2, 16}, std::array<int, 4>{2, 4, 4, 32}}) {
    AttnCase<E> c(shape[0], shape[1], shape[2], shape[3], 300, 31);
    attn::DecodeWorkspace<E> ws;
    ws.ensure(c.n_seq, c.nh, c.nkv, c.hd, c.max_ctx);
    for (int p0 : {0, 17, attn::kChunk - 1, attn::kChunk, 250, 299}) {
      auto q = to_device<E>(random_vec(static_cast<std::size_t>(c.n_seq) * c.nh * c.hd, 40 + p0),
                            c.n_seq, c.nh * c.hd);
      Mat<E> ref("ref", c.n_seq, c.nh * c.hd), got("got", c.n_seq, c.nh * c.hd);
      attention(E(), CMat<E>(q), c.kc, c.vc, ref, c.n_seq, 1, p0, c.nh, c.nkv, c.hd);
      IVec<E> pos("pos", c.n_seq);
      Kokkos::deep_copy(pos, p0);
      for (int rep = 0; rep < 2; ++rep) {
        attention_decode_split(E(), CMat<E>(q), c.kc, c.vc, pos, got, c.n_seq, c.nh, c.nkv, c.hd,
                               ws);
        const auto a = to_host(ref), b = to_host(got);
        double err = 0;
        for (std::size_t i = 0; i < a.size(); ++i)
          err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
        EXPECT_LT(err, 2e-6) << "p0 " << p0 << " rep " << rep << " heads " << c.nh << "/" << c.nkv;
      }
    }
  }
}

// Tiled prefill attention equals the reference kernel, from position 0 and after a cached
// prefix, for token counts that do and do not fill the blocks.
TYPED_TEST(DeviceKernelTest, TiledPrefillAttentionMatchesReference) {
  using E = TypeParam;
  for (const auto& shape : {std::array<int, 4>{2, 6, 3, 16}, std::array<int, 4>{1, 2, 2, 64}}) {
    AttnCase<E> c(shape[0], shape[1], shape[2], shape[3], 200, 51);
    for (const auto& tp : {std::array<int, 2>{1, 0}, std::array<int, 2>{37, 0},
                           std::array<int, 2>{70, 13}, std::array<int, 2>{64, 64}}) {
      const int T = tp[0], p0 = tp[1];
      auto q = to_device<E>(random_vec(static_cast<std::size_t>(c.n_seq) * T * c.nh * c.hd, 60 + T),
                            c.n_seq * T, c.nh * c.hd);
      Mat<E> ref("ref", c.n_seq * T, c.nh * c.hd), got("got", c.n_seq * T, c.nh * c.hd);
      attention(E(), CMat<E>(q), c.kc, c.vc, ref, c.n_seq, T, p0, c.nh, c.nkv, c.hd);
      attention_prefill_tiled(E(), CMat<E>(q), c.kc, c.vc, got, c.n_seq, T, p0, c.nh, c.nkv, c.hd);
      const auto a = to_host(ref), b = to_host(got);
      double err = 0;
      for (std::size_t i = 0; i < a.size(); ++i)
        err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
      EXPECT_LT(err, 2e-6) << "T " << T << " p0 " << p0 << " hd " << c.hd;
    }
  }
}

/// The first `vd` channels of every `hd`-wide head of a cache [seq][pos][nkv·hd].
template <class E>
Cache<E> narrow_heads(const Cache<E>& full, int nkv, int hd, int vd) {
  const int ns = static_cast<int>(full.extent(0)), np = static_cast<int>(full.extent(1));
  Cache<E> out("narrow", ns, np, nkv * vd);
  Kokkos::parallel_for(
      "narrow", Kokkos::RangePolicy<E>(0, ns * np * nkv * vd), KOKKOS_LAMBDA(const int i) {
        const int e = i % vd, g = (i / vd) % nkv, p = (i / (vd * nkv)) % np, s = i / (vd * nkv * np);
        out(s, p, g * vd + e) = full(s, p, g * hd + e);
      });
  Kokkos::fence();
  return out;
}

// Prefill attention as batched products around a causal softmax equals the reference kernel:
// GQA and MHA, from position 0 and after a cached prefix, value heads narrower than the query
// heads with another scale (a pruned layer), and prompts split into several chunks of scores.
TYPED_TEST(DeviceKernelTest, GemmPrefillAttentionMatchesReference) {
  using E = TypeParam;
  for (const auto& shape : {std::array<int, 4>{2, 6, 3, 16}, std::array<int, 4>{1, 2, 2, 32}}) {
    AttnCase<E> c(shape[0], shape[1], shape[2], shape[3], 200, 53);
    attn::GemmWorkspace<E> ws;
    for (const auto& tp : {std::array<int, 2>{1, 0}, std::array<int, 2>{37, 0},
                           std::array<int, 2>{70, 13}, std::array<int, 2>{64, 64}}) {
      const int T = tp[0], p0 = tp[1];
      const int widths[2] = {c.hd, c.hd / 2};
      for (const int vd : widths) {
        const float scale = vd == c.hd ? 1.0f / std::sqrt(static_cast<float>(c.hd)) : 0.3f;
        // a value cache vd wide: the first vd channels of each head of the full one
        const Cache<E> vc = narrow_heads<E>(c.vc, c.nkv, c.hd, vd);
        auto q = to_device<E>(
            random_vec(static_cast<std::size_t>(c.n_seq) * T * c.nh * c.hd, 80 + T + vd),
            c.n_seq * T, c.nh * c.hd);
        Mat<E> ref("ref", c.n_seq * T, c.nh * vd), got("got", c.n_seq * T, c.nh * vd);
        attention(E(), CMat<E>(q), c.kc, vc, ref, c.n_seq, T, p0, c.nh, c.nkv, c.hd, vd, scale);
        const auto a = to_host(ref);
        // all (sequence, head) pairs in one chunk, and three pairs' scores per chunk
        const std::size_t caps[2] = {attn::kMaxScores, std::size_t(3) * T * (p0 + T)};
        for (const std::size_t cap : caps) {
          attention_prefill_gemm(E(), CMat<E>(q), c.kc, vc, got, c.n_seq, T, p0, c.nh, c.nkv,
                                 c.hd, vd, scale, ws, false, cap);
          const auto b = to_host(got);
          double err = 0;
          for (std::size_t i = 0; i < a.size(); ++i)
            err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
          EXPECT_LT(err, 2e-6) << "T " << T << " p0 " << p0 << " hd " << c.hd << " vd " << vd
                               << " chunk " << cap;
        }
      }
    }
  }
}

// The team sparse GEMV (kept count in device memory) equals the dense product over the kept rows.
TYPED_TEST(DeviceKernelTest, TeamSparseGemvMatchesReference) {
  using E = TypeParam;
  const int in = 300, out = 131;
  const auto wv = random_vec(static_cast<std::size_t>(in) * out, 71, 0.2f);
  const auto xv = random_vec(in, 72);
  auto wt = weights_as<E, bf16_t>(wv, in, out);
  auto x = to_device<E>(xv, 1, in);
  for (int keep : {0, 1, 7, 150, 300}) {
    IVec<E> idx("idx", in), count("count", 1);
    auto hi = Kokkos::create_mirror_view(idx);
    std::vector<int> kept;
    for (int k = 0; k < keep; ++k) kept.push_back((k * 97) % in);
    std::sort(kept.begin(), kept.end());
    kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
    for (std::size_t k = 0; k < kept.size(); ++k) hi(static_cast<int>(k)) = kept[k];
    Kokkos::deep_copy(idx, hi);
    Kokkos::deep_copy(count, static_cast<int>(kept.size()));
    Vec<E> y("y", out);
    SparseGemvWork<E> work;
    sparse_gemv_split<false>(E(), CVec<E>(x.data(), in), idx, count, 0.0f, wt, y, work);
    std::vector<double> want(out, 0.0);
    for (int i : kept)
      for (int o = 0; o < out; ++o) want[o] += xv[i] * stored<bf16_t>(wv[i * out + o]);
    const auto got = to_host(y);
    double err = 0, scale = 1e-30;
    for (int o = 0; o < out; ++o) {
      err = std::max(err, std::fabs(got[o] - want[o]));
      scale = std::max(scale, std::fabs(want[o]));
    }
    EXPECT_LT(err, keep ? 2e-6 * scale : 1e-30) << "kept " << kept.size();
  }
}

// Threshold mode of the split sparse GEMV: the kept rows are |x_i| >= tau, found by the kernel,
// and their number lands in count(0); f32 (4 outputs per lane) and bf16 (8), odd widths (the
// scalar path) too.
TYPED_TEST(DeviceKernelTest, ThresholdSparseGemvMatchesReference) {
  using E = TypeParam;
  for (const auto& shape : {std::array<int, 2>{300, 131}, std::array<int, 2>{5000, 256},
                            std::array<int, 2>{64, 1024}}) {
    const int in = shape[0], out = shape[1];
    const auto wv = random_vec(static_cast<std::size_t>(in) * out, 81, 0.2f);
    const auto xv = random_vec(in, 82);
    auto x = to_device<E>(xv, 1, in);
    for (float tau : {0.0f, 0.7f, 1.5f, 100.0f}) {
      IVec<E> count("count", 1);
      SparseGemvWork<E> work;
      std::vector<double> want(out, 0.0);
      int kept = 0;
      for (int i = 0; i < in; ++i) {
        if (std::fabs(xv[i]) < tau) continue;
        ++kept;
        for (int o = 0; o < out; ++o) want[o] += xv[i] * stored<bf16_t>(wv[i * out + o]);
      }
      auto wt = weights_as<E, bf16_t>(wv, in, out);
      Vec<E> y("y", out);
      for (int rep = 0; rep < 2; ++rep) {  // again: the counters were reset
        sparse_gemv_split<true>(E(), CVec<E>(x.data(), in), IVec<E>(), count, tau, wt, y, work);
        const auto got = to_host(y);
        double err = 0, scale = 1e-30;
        for (int o = 0; o < out; ++o) {
          err = std::max(err, std::fabs(got[o] - want[o]));
          scale = std::max(scale, std::fabs(want[o]));
        }
        EXPECT_LT(err, kept ? 3e-6 * scale : 1e-30) << in << "x" << out << " tau " << tau;
        auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), count);
        EXPECT_EQ(hc(0), kept) << in << "x" << out << " tau " << tau;
      }
    }
  }
}

// Column-skipping decode on the device path (TEAL's threshold through the fused GEMV, TopK
// through selection + list GEMV) gives the masked dense decode's logits and the same kept
// counts.
TYPED_TEST(DeviceKernelTest, DeviceColumnSkippingMatchesMaskedDense) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(12);
  const std::string path = make_model(dir, "m.gguf", spec);
  for (DType st : {DType::F32, DType::BF16}) {
    LoadOptions lo;
    lo.storage = st;
    auto w = load_model<E>(path, lo);
    for (const MaskRule rule : {MaskRule::Threshold, MaskRule::TopK}) {
      sparsity::ActivationMasker<E> ma(spec.cfg.n_layer), mb(spec.cfg.n_layer);
      for (auto* m : {&ma, &mb})
        for (int l = 0; l < spec.cfg.n_layer; ++l)
          for (int i = 0; i < kNumProj; ++i) {
            MaskParams prm;
            prm.rule = rule;
            prm.p = 0.4f + 0.05f * i;
            prm.tau = 0.3f + 0.1f * i;
            m->set(l, static_cast<Proj>(i), prm);
          }
      // both on the device path (same attention kernels, so the same inputs reach the masks);
      // b decodes masked projections with the column-skipping kernels
      Engine<E> a(w, 1, 64), b(w, 1, 64);
      a.set_device_path(true);
      b.set_device_path(true);
      b.use_column_skipping(true);
      a.set_masker(&ma);
      b.set_masker(&mb);
      std::vector<int> prompt;
      for (int t = 0; t < 10; ++t) prompt.push_back(3 + (t * 53) % (spec.cfg.vocab - 3));
      a.forward({prompt}, 0, false);
      b.forward({prompt}, 0, false);
      for (int step = 0; step < 4; ++step) {
        const int tok = 5 + 17 * step;
        const auto la = to_host(a.forward({{tok}}, 10 + step, false));
        const auto lb = to_host(b.forward({{tok}}, 10 + step, false));
        double err = 0, scale = 0;
        for (std::size_t i = 0; i < la.size(); ++i) {
          err = std::max(err, static_cast<double>(std::fabs(la[i] - lb[i])));
          scale = std::max(scale, static_cast<double>(std::fabs(la[i])));
        }
        EXPECT_LT(err / scale, 1e-5)
            << to_string(st) << " rule " << static_cast<int>(rule) << " step " << step;
      }
      for (int l = 0; l < spec.cfg.n_layer; ++l)
        for (int i = 0; i < kNumProj; ++i)
          EXPECT_EQ(ma.stats(l, static_cast<Proj>(i)).kept, mb.stats(l, static_cast<Proj>(i)).kept)
              << "layer " << l << " proj " << i;
    }
  }
}

// The engine's device path (fused single-token decode, split-K and tiled attention) gives the
// logits of the op-by-op path: prefill, then token-by-token decode of two sequences, f32 and
// bf16, both RoPE layouts' models.
TYPED_TEST(DeviceKernelTest, EngineDevicePathMatchesOpByOp) {
  using E = TypeParam;
  TempDir dir;
  SynthSpec spec = tiny_spec(5);
  spec.cfg.n_layer = 3;
  const std::string path = make_model(dir, "m.gguf", spec);
  for (DType st : {DType::F32, DType::BF16}) {
    LoadOptions lo;
    lo.storage = st;
    auto w = load_model<E>(path, lo);
    Engine<E> a(w, 2, 96), b(w, 2, 96);
    b.set_device_path(true);
    const int V = spec.cfg.vocab;
    std::vector<std::vector<int>> prompt(2);
    for (int s = 0; s < 2; ++s)
      for (int t = 0; t < 70; ++t) prompt[s].push_back(3 + (t * 37 + s * 101) % (V - 3));
    auto la = to_host(a.forward(prompt, 0, false));
    auto lb = to_host(b.forward(prompt, 0, false));
    const auto cmp = [&](const std::vector<float>& x, const std::vector<float>& y, const char* what,
                         int step) {
      double err = 0, scale = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        err = std::max(err, static_cast<double>(std::fabs(x[i] - y[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(x[i])));
      }
      EXPECT_LT(err / scale, 1e-5) << what << " step " << step << " storage " << to_string(st);
    };
    cmp(la, lb, "prefill", 0);
    for (int step = 0; step < 5; ++step) {
      std::vector<std::vector<int>> next = {{3 + step * 11}, {7 + step * 13}};
      la = to_host(a.forward(next, 70 + step, false));
      lb = to_host(b.forward(next, 70 + step, false));
      cmp(la, lb, "decode", step + 1);
    }
  }
}

}  // namespace
}  // namespace sparsim::test
