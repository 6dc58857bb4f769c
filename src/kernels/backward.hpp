#pragma once
/// Kernels of the training-style forward pass and of the backward pass of activation gradients
/// (engine/backprop.hpp), templated on the scalar type T: float in production, double for the
/// finite-difference checks. Every output element is written by one thread that sums in a fixed
/// order, so results do not depend on the thread count; no atomics.
///
/// Shapes: activations are row-major [token][feature] for one sequence of n tokens at positions
/// 0 … n−1. Attention heads: q/k heads `dqk` wide, v/output heads `dv` wide, query head h reads
/// KV head h / (n_head / n_kv).
#include "core/compat.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>

namespace sparsim {

template <class E, class T>
using MatT = Kokkos::View<T**, Layout, DeviceOf<E>>;
template <class E, class T>
using CMatT = Kokkos::View<const T**, Layout, DeviceOf<E>>;
template <class E, class T>
using VecT = Kokkos::View<T*, DeviceOf<E>>;

namespace bwd {

KOKKOS_INLINE_FUNCTION float exp_(float x) {
  return kx::exp(x);
}
KOKKOS_INLINE_FUNCTION double exp_(double x) {
  return kx::exp(x);
}
KOKKOS_INLINE_FUNCTION float log_(float x) {
  return kx::log(x);
}
KOKKOS_INLINE_FUNCTION double log_(double x) {
  return kx::log(x);
}
KOKKOS_INLINE_FUNCTION float sqrt_(float x) {
  return kx::sqrt(x);
}
KOKKOS_INLINE_FUNCTION double sqrt_(double x) {
#if SPARSIM_KOKKOS_VERSION_AT_LEAST(3, 7)
  return Kokkos::sqrt(x);
#else
  return Kokkos::Experimental::sqrt(x);
#endif
}

/// Fixed-order dot product with 8 lanes (vectorises; the order is part of the code).
template <class T>
KOKKOS_INLINE_FUNCTION T dot(const T* a, const T* b, int n) {
  constexpr int kL = 8;
  T acc[kL];
  for (int l = 0; l < kL; ++l) acc[l] = T(0);
  int i = 0;
  for (; i + kL <= n; i += kL)
    for (int l = 0; l < kL; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * b[i + l];
  for (int h = kL / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
  return acc[0];
}

template <class E>
constexpr bool on_host() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible;
}

}  // namespace bwd

/// out[t][:] = E[tokens[t]][:] in T.
template <class E, class T>
void embed_t(const E& exec, const Matrix<E>& emb, const IVec<E>& tokens, const MatT<E, T>& out) {
  const int n = static_cast<int>(tokens.extent(0));
  const int d = emb.cols;
  auto pol = Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d});
  if (emb.dtype == DType::F32) {
    auto w = emb.f32;
    Kokkos::parallel_for(
        "sparsim::backprop::embed", pol,
        KOKKOS_LAMBDA(int t, int j) { out(t, j) = static_cast<T>(w(tokens(t), j)); });
  } else if (emb.dtype == DType::BF16) {
    auto w = emb.bf16;
    Kokkos::parallel_for(
        "sparsim::backprop::embed", pol,
        KOKKOS_LAMBDA(int t, int j) { out(t, j) = static_cast<T>(to_f32(w(tokens(t), j))); });
  } else {
    auto w = emb.f16;
    Kokkos::parallel_for(
        "sparsim::backprop::embed", pol,
        KOKKOS_LAMBDA(int t, int j) { out(t, j) = static_cast<T>(to_f32(w(tokens(t), j))); });
  }
}

/// y = x·r·g with r = 1/sqrt(mean(x²) + eps), one thread per row.
template <class E, class T>
void rmsnorm_t(const E& exec, const CMatT<E, T>& x, const CVec<E>& g, T eps, const MatT<E, T>& y) {
  const int n = static_cast<int>(x.extent(0)), d = static_cast<int>(x.extent(1));
  Kokkos::parallel_for(
      "sparsim::backprop::rmsnorm", Kokkos::RangePolicy<E>(exec, 0, n), KOKKOS_LAMBDA(int t) {
        const T ss = bwd::dot(&x(t, 0), &x(t, 0), d);
        const T r = T(1) / bwd::sqrt_(ss / static_cast<T>(d) + eps);
        for (int j = 0; j < d; ++j) y(t, j) = x(t, j) * r * static_cast<T>(g(j));
      });
}

/// Backward of rmsnorm_t: dx (+)= r·g⊙dy − (r³/d)·x·Σ_i g_i dy_i x_i; `accumulate` adds to dx.
template <class E, class T>
void rmsnorm_backward(const E& exec, const CMatT<E, T>& x, const CVec<E>& g, T eps,
                      const CMatT<E, T>& dy, const MatT<E, T>& dx, bool accumulate) {
  const int n = static_cast<int>(x.extent(0)), d = static_cast<int>(x.extent(1));
  Kokkos::parallel_for(
      "sparsim::backprop::rmsnorm_backward", Kokkos::RangePolicy<E>(exec, 0, n),
      KOKKOS_LAMBDA(int t) {
        const T ss = bwd::dot(&x(t, 0), &x(t, 0), d);
        const T r = T(1) / bwd::sqrt_(ss / static_cast<T>(d) + eps);
        T gdx = 0;
        for (int j = 0; j < d; ++j) gdx += static_cast<T>(g(j)) * dy(t, j) * x(t, j);
        const T c = r * r * r / static_cast<T>(d) * gdx;
        for (int j = 0; j < d; ++j) {
          const T v = r * static_cast<T>(g(j)) * dy(t, j) - c * x(t, j);
          dx(t, j) = accumulate ? dx(t, j) + v : v;
        }
      });
}

/// x[t][c] *= gate[c] (Fisher channel gates; 1 in normal runs).
template <class E, class T>
void scale_columns(const E& exec, const MatT<E, T>& x, const VecT<E, T>& gate) {
  const int n = static_cast<int>(x.extent(0)), d = static_cast<int>(x.extent(1));
  Kokkos::parallel_for(
      "sparsim::backprop::gate", Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d}),
      KOKKOS_LAMBDA(int t, int c) { x(t, c) *= gate(c); });
}

/// Causal attention of one sequence with the softmax log-normaliser kept for the backward pass:
/// out[t][h·dv + i] = Σ_{p≤t} P_htp v[p][kvh·dv + i], P_htp = exp(scale·q_ht·k_p − lse[t][h]).
/// One thread per (token, head), an online softmax over p in increasing order.
template <class E, class T>
void attention_t(const E& exec, const CMatT<E, T>& q, const CMatT<E, T>& k, const CMatT<E, T>& v,
                 const MatT<E, T>& out, const MatT<E, T>& lse, int n_head, int n_kv, int dqk,
                 int dv, T scale) {
  const int n = static_cast<int>(q.extent(0));
  const int group = n_head / n_kv;
  Kokkos::parallel_for(
      "sparsim::backprop::attention",
      Kokkos::RangePolicy<E, Kokkos::Schedule<Kokkos::Dynamic>>(exec, 0, n * n_head),
      KOKKOS_LAMBDA(const int item) {
        const int t = item / n_head, h = item % n_head, kvh = h / group;
        const T* qr = &q(t, h * dqk);
        T* o = &out(t, h * dv);
        for (int i = 0; i < dv; ++i) o[i] = 0;
        T m = -1e30, l = 0;
        for (int p = 0; p <= t; ++p) {
          const T s = bwd::dot(qr, &k(p, kvh * dqk), dqk) * scale;
          if (s > m) {
            const T f = bwd::exp_(m - s);
            l *= f;
            for (int i = 0; i < dv; ++i) o[i] *= f;
            m = s;
          }
          const T w = bwd::exp_(s - m);
          l += w;
          const T* vr = &v(p, kvh * dv);
          for (int i = 0; i < dv; ++i) o[i] += w * vr[i];
        }
        const T inv = T(1) / l;
        for (int i = 0; i < dv; ++i) o[i] *= inv;
        lse(t, h) = m + bwd::log_(l);
      });
}

/// Backward of attention_t. Inputs: q, k (after RoPE), v, the output `a`, lse and the output
/// gradient da. Writes dq (one thread per (token, head)), then dk and dv (one thread per
/// (position, KV head), summing over the group's query heads and the tokens t ≥ p in order):
///   dP_htp = da_ht·v_p,  D_ht = da_ht·a_ht,  dS_htp = P_htp (dP_htp − D_ht),
///   dq_ht = scale Σ_p dS_htp k_p,  dk_p = scale Σ_h Σ_t dS_htp q_ht,  dv_p = Σ_h Σ_t P_htp da_ht.
/// `dsum` [n][n_head] is scratch for D.
template <class E, class T>
void attention_backward(const E& exec, const CMatT<E, T>& q, const CMatT<E, T>& k,
                        const CMatT<E, T>& v, const CMatT<E, T>& a, const CMatT<E, T>& lse,
                        const CMatT<E, T>& da, const MatT<E, T>& dq, const MatT<E, T>& dk,
                        const MatT<E, T>& dv, const MatT<E, T>& dsum, int n_head, int n_kv, int dqk,
                        int dvw, T scale) {
  const int n = static_cast<int>(q.extent(0));
  const int group = n_head / n_kv;
  using Dyn = Kokkos::RangePolicy<E, Kokkos::Schedule<Kokkos::Dynamic>>;
  Kokkos::parallel_for(
      "sparsim::backprop::attention_dq", Dyn(exec, 0, n * n_head), KOKKOS_LAMBDA(const int item) {
        const int t = item / n_head, h = item % n_head, kvh = h / group;
        const T* qr = &q(t, h * dqk);
        const T* dar = &da(t, h * dvw);
        const T D = bwd::dot(dar, &a(t, h * dvw), dvw);
        dsum(t, h) = D;
        const T L = lse(t, h);
        T* g = &dq(t, h * dqk);
        for (int i = 0; i < dqk; ++i) g[i] = 0;
        for (int p = 0; p <= t; ++p) {
          const T* kr = &k(p, kvh * dqk);
          const T P = bwd::exp_(bwd::dot(qr, kr, dqk) * scale - L);
          const T dS = P * (bwd::dot(dar, &v(p, kvh * dvw), dvw) - D) * scale;
          for (int i = 0; i < dqk; ++i) g[i] += dS * kr[i];
        }
      });
  Kokkos::parallel_for(
      "sparsim::backprop::attention_dkv", Dyn(exec, 0, n * n_kv), KOKKOS_LAMBDA(const int item) {
        // later positions have fewer tokens to visit: hand them out last-first
        const int p = n - 1 - item / n_kv, kvh = item % n_kv;
        const T* kr = &k(p, kvh * dqk);
        const T* vr = &v(p, kvh * dvw);
        T* gk = &dk(p, kvh * dqk);
        T* gv = &dv(p, kvh * dvw);
        for (int i = 0; i < dqk; ++i) gk[i] = 0;
        for (int i = 0; i < dvw; ++i) gv[i] = 0;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h)
          for (int t = p; t < n; ++t) {
            const T* qr = &q(t, h * dqk);
            const T* dar = &da(t, h * dvw);
            const T P = bwd::exp_(bwd::dot(qr, kr, dqk) * scale - lse(t, h));
            const T dS = P * (bwd::dot(dar, vr, dvw) - dsum(t, h)) * scale;
            for (int i = 0; i < dqk; ++i) gk[i] += dS * qr[i];
            for (int i = 0; i < dvw; ++i) gv[i] += P * dar[i];
          }
      });
}

/// m = silu(gate) ⊙ up (gate and up kept for the backward pass).
template <class E, class T>
void swiglu_t(const E& exec, const CMatT<E, T>& gate, const CMatT<E, T>& up, const MatT<E, T>& m) {
  const int n = static_cast<int>(gate.extent(0)), d = static_cast<int>(gate.extent(1));
  Kokkos::parallel_for(
      "sparsim::backprop::swiglu", Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d}),
      KOKKOS_LAMBDA(int t, int j) {
        const T g = gate(t, j);
        m(t, j) = g / (T(1) + bwd::exp_(-g)) * up(t, j);
      });
}

/// From dm: dgate = dm·up·silu'(gate), dup = dm·silu(gate); silu'(x) = σ(x)(1 + x(1 − σ(x))).
template <class E, class T>
void swiglu_backward(const E& exec, const CMatT<E, T>& gate, const CMatT<E, T>& up,
                     const CMatT<E, T>& dm, const MatT<E, T>& dgate, const MatT<E, T>& dup) {
  const int n = static_cast<int>(gate.extent(0)), d = static_cast<int>(gate.extent(1));
  Kokkos::parallel_for(
      "sparsim::backprop::swiglu_backward",
      Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d}), KOKKOS_LAMBDA(int t, int j) {
        const T g = gate(t, j);
        const T sg = T(1) / (T(1) + bwd::exp_(-g));
        dup(t, j) = dm(t, j) * g * sg;
        dgate(t, j) = dm(t, j) * up(t, j) * sg * (T(1) + g * (T(1) - sg));
      });
}

/// y += x (same shape).
template <class E, class T>
void add_t(const E& exec, const MatT<E, T>& y, const CMatT<E, T>& x) {
  const int n = static_cast<int>(y.extent(0)), d = static_cast<int>(y.extent(1));
  Kokkos::parallel_for(
      "sparsim::backprop::add", Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d}),
      KOKKOS_LAMBDA(int t, int j) { y(t, j) += x(t, j); });
}

/// Next-token cross-entropy of one sequence, in place: row t < n−1 of z (logits) becomes
/// (softmax(z_t) − e_{tok[t+1]}) / (n−1), the gradient of the mean loss; the last row becomes 0.
/// nll[t] receives −log softmax(z_t)[tok[t+1]] in double (0 for the last row).
template <class E, class T>
void cross_entropy_backward(const E& exec, const MatT<E, T>& z, const IVec<E>& tok,
                            const Kokkos::View<double*, DeviceOf<E>>& nll) {
  const int n = static_cast<int>(z.extent(0)), V = static_cast<int>(z.extent(1));
  const T inv_n = T(1) / static_cast<T>(n > 1 ? n - 1 : 1);
  Kokkos::parallel_for(
      "sparsim::backprop::cross_entropy", Kokkos::RangePolicy<E>(exec, 0, n), KOKKOS_LAMBDA(int t) {
        if (t == n - 1) {
          for (int v = 0; v < V; ++v) z(t, v) = 0;
          nll(t) = 0;
          return;
        }
        const int y = tok(t + 1);
        T mx = z(t, 0);
        for (int v = 1; v < V; ++v) mx = z(t, v) > mx ? z(t, v) : mx;
        double sum = 0;
        for (int v = 0; v < V; ++v) sum += kx::exp(static_cast<double>(z(t, v) - mx));
        nll(t) = kx::log(sum) - static_cast<double>(z(t, y) - mx);
        const T inv = static_cast<T>(1.0 / sum);
        for (int v = 0; v < V; ++v) z(t, v) = bwd::exp_(z(t, v) - mx) * inv * inv_n;
        z(t, y) -= inv_n;
      });
}

/// out[c] = Σ_t g[t][c]·x[t][c] in double, one thread per column, t in order.
template <class E, class T>
void column_products(const E& exec, const CMatT<E, T>& g, const CMatT<E, T>& x,
                     const Kokkos::View<double*, DeviceOf<E>>& out) {
  const int n = static_cast<int>(g.extent(0)), d = static_cast<int>(g.extent(1));
  Kokkos::parallel_for(
      "sparsim::backprop::gate_gradient", Kokkos::RangePolicy<E>(exec, 0, d), KOKKOS_LAMBDA(int c) {
        double s = 0;
        for (int t = 0; t < n; ++t)
          s += static_cast<double>(g(t, c)) * static_cast<double>(x(t, c));
        out(c) = s;
      });
}

/// y[t][o] = Σ_i x[t][i]·w[o][i] (generic kernel, any T; the float path uses BLAS instead).
template <class E, class T>
void matmul_nt_generic(const E& exec, const CMatT<E, T>& x, const CMatT<E, T>& w,
                       const MatT<E, T>& y) {
  const int n = static_cast<int>(x.extent(0)), in = static_cast<int>(x.extent(1));
  const int out = static_cast<int>(w.extent(0));
  Kokkos::parallel_for(
      "sparsim::backprop::matmul_nt",
      Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, out}),
      KOKKOS_LAMBDA(int t, int o) { y(t, o) = bwd::dot(&x(t, 0), &w(o, 0), in); });
}

/// dx[t][i] (+)= Σ_o dy[t][o]·w[o][i] (generic kernel; o in increasing order).
template <class E, class T>
void matmul_nn_generic(const E& exec, const CMatT<E, T>& dy, const CMatT<E, T>& w,
                       const MatT<E, T>& dx, bool accumulate) {
  const int n = static_cast<int>(dy.extent(0)), out = static_cast<int>(dy.extent(1));
  const int in = static_cast<int>(w.extent(1));
  Kokkos::parallel_for(
      "sparsim::backprop::matmul_nn",
      Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, in}),
      KOKKOS_LAMBDA(int t, int i) {
        T s = 0;
        for (int o = 0; o < out; ++o) s += dy(t, o) * w(o, i);
        dx(t, i) = accumulate ? dx(t, i) + s : s;
      });
}

}  // namespace sparsim
