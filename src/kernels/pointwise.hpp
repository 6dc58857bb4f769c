#pragma once
/// Row-wise kernels of the forward pass: embedding lookup, RMSNorm, RoPE, SwiGLU, residual add.
/// Every output element is written by exactly one thread and every reduction runs in a fixed
/// order, so results do not depend on the thread count.
#include "core/compat.hpp"
#include "core/error.hpp"
#include "kernels/fast_math.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <utility>

namespace sparsim {

/// out[t][:] = E[tokens[t]][:] (widened to fp32).
template <class E>
void embed(const E& exec, const Matrix<E>& emb, const IVec<E>& tokens, const Mat<E>& out) {
  const int n = static_cast<int>(tokens.extent(0));
  const int d = emb.cols;
  auto pol = Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d});
  switch (emb.dtype) {
    case DType::F32: {
      auto w = emb.f32;
      Kokkos::parallel_for(
          "sparsim::kernels::embed", light(pol),
          KOKKOS_LAMBDA(int t, int j) { out(t, j) = w(tokens(t), j); });
      break;
    }
    case DType::BF16: {
      auto w = emb.bf16;
      Kokkos::parallel_for(
          "sparsim::kernels::embed", light(pol),
          KOKKOS_LAMBDA(int t, int j) { out(t, j) = to_f32(w(tokens(t), j)); });
      break;
    }
    case DType::F16: {
      auto w = emb.f16;
      Kokkos::parallel_for(
          "sparsim::kernels::embed", light(pol),
          KOKKOS_LAMBDA(int t, int j) { out(t, j) = to_f32(w(tokens(t), j)); });
      break;
    }
  }
}

/// out[t][j] = x[t][j] / sqrt(mean_j x[t][j]² + eps) · g[j]. One team per row.
template <class E>
void rmsnorm(const E& exec, const CMat<E>& x, const CVec<E>& g, float eps, const Mat<E>& out) {
  const int n = static_cast<int>(x.extent(0));
  const int d = static_cast<int>(x.extent(1));
  using Team = typename Kokkos::TeamPolicy<E>::member_type;
  Kokkos::parallel_for(
      "sparsim::kernels::rmsnorm", light(team_policy(exec, n)), KOKKOS_LAMBDA(const Team& team) {
        const int t = team.league_rank();
        float ss = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, d),
            [&](const int j, float& acc) { acc += x(t, j) * x(t, j); }, ss);
        const float scale = 1.0f / kx::sqrt(ss / static_cast<float>(d) + eps);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, d),
                             [&](const int j) { out(t, j) = x(t, j) * scale * g(j); });
      });
}

namespace detail {
/// The host body of rope(): the nh heads of row t of x rotated by the angles of
/// position p, pair j of a head being (2j, 2j + 1) (adjacent) or (j, j + hd/2). One expression per
/// output, the same as the device bodies'.
template <class X, class Tab>
inline void rope_row_host(const X& x, int t, int nh, int head_dim, bool adjacent, const Tab& cos_t,
                          const Tab& sin_t, int p) {
  const int half = head_dim / 2;
  for (int h = 0; h < nh; ++h) {
    const int base = h * head_dim;
    for (int j = 0; j < half; ++j) {
      const float c = cos_t(p, j), s = sin_t(p, j);
      const int i0 = adjacent ? base + 2 * j : base + j;
      const int i1 = adjacent ? base + 2 * j + 1 : base + j + half;
      const float a = x(t, i0), b = x(t, i1);
      x(t, i0) = a * c - b * s;
      x(t, i1) = a * s + b * c;
    }
  }
}
}  // namespace detail

/// Rotates the heads of q[t][n_head·hd] and k[t][n_kv·hd] in place by the angle of position
/// pos[t]: cos/sin come from a table [position][hd/2] built in double precision on the host.
/// Either of q and k may be empty (rotate the other alone: the same code as both together).
/// On the host one work item per row (a decode step's few rotations cost less than the set-up of
/// a three-dimensional range); on a device one thread per rotation.
template <class E>
void rope(const E& exec, const Mat<E>& q, const Mat<E>& k, const IVec<E>& pos, const CMat<E>& cos_t,
          const CMat<E>& sin_t, int head_dim, bool adjacent) {
  const int half = head_dim / 2;
  const int qh = q.extent(0) > 0 ? static_cast<int>(q.extent(1)) / head_dim : 0;
  const int kh = k.extent(0) > 0 ? static_cast<int>(k.extent(1)) / head_dim : 0;
  const int n = static_cast<int>(qh > 0 ? q.extent(0) : k.extent(0));
  if (n == 0) return;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    Kokkos::parallel_for("sparsim::kernels::rope", light(Kokkos::RangePolicy<E>(exec, 0, n)),
                         [=](const int t) {
                           const int p = pos(t);
                           detail::rope_row_host(q, t, qh, head_dim, adjacent, cos_t, sin_t, p);
                           detail::rope_row_host(k, t, kh, head_dim, adjacent, cos_t, sin_t, p);
                         });
    return;
  }
  Kokkos::parallel_for(
      "sparsim::kernels::rope",
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<3>>(exec, {0, 0, 0}, {n, qh + kh, half})),
      KOKKOS_LAMBDA(const int t, const int h, const int j) {
        const int p = pos(t);
        const float c = cos_t(p, j), s = sin_t(p, j);
        const bool is_q = h < qh;
        const int base = (is_q ? h : h - qh) * head_dim;
        const int i0 = adjacent ? base + 2 * j : base + j;
        const int i1 = adjacent ? base + 2 * j + 1 : base + j + half;
        if (is_q) {
          const float a = q(t, i0), b = q(t, i1);
          q(t, i0) = a * c - b * s;
          q(t, i1) = a * s + b * c;
        } else {
          const float a = k(t, i0), b = k(t, i1);
          k(t, i0) = a * c - b * s;
          k(t, i1) = a * s + b * c;
        }
      });
}

/// RoPE rotation units of one layer on the device (Config::rope_units): [n_kv_head][units].
template <class E>
struct RopeMap {
  IVec<E> i0, i1, freq;
  int units = 0;
  /// Where every head's units are its channels' pairs in order, the host loops go through them
  /// without the index lists: kAdjacentPairs, unit u = channels (2u, 2u + 1); kHalvesPairs,
  /// unit u = (u, u + units); else kListed. The rotations are the same.
  enum Order { kListed, kAdjacentPairs, kHalvesPairs };
  Order order = kListed;
};

template <class E>
RopeMap<E> make_rope_map(const RopeUnits& u) {
  RopeMap<E> m;
  m.units = u.units;
  auto put = [](const std::vector<int>& src, const char* name) {
    IVec<E> d(std::string(name), src.size());
    auto h = Kokkos::create_mirror_view(d);
    for (std::size_t i = 0; i < src.size(); ++i) h(i) = src[i];
    Kokkos::deep_copy(d, h);
    return d;
  };
  const auto all_units = [&](auto pair) {
    if (u.units == 0 || u.i0.size() % static_cast<std::size_t>(u.units) != 0) return false;
    for (std::size_t i = 0; i < u.i0.size(); ++i) {
      const int k = static_cast<int>(i % static_cast<std::size_t>(u.units));
      if (std::make_pair(u.i0[i], u.i1[i]) != pair(k)) return false;
    }
    return true;
  };
  if (all_units([](int k) { return std::make_pair(2 * k, 2 * k + 1); }))
    m.order = RopeMap<E>::kAdjacentPairs;
  else if (all_units([&](int k) { return std::make_pair(k, k + u.units); }))
    m.order = RopeMap<E>::kHalvesPairs;
  m.i0 = put(u.i0, "sparsim::rope::i0");
  m.i1 = put(u.i1, "sparsim::rope::i1");
  m.freq = put(u.freq, "sparsim::rope::freq");
  return m;
}

/// Rotation units per head rope_units' host path holds in registers (a head of up to 512 channels).
inline constexpr int kMaxRopeUnits = 512;

namespace detail {
/// One rotation unit u of head h (query heads first, then KV heads) of row t: rope_units' body.
template <class E, class T>
struct RopeUnitOp {
  Kokkos::View<T**, Layout, DeviceOf<E>> q, k;
  IVec<E> pos;
  Kokkos::View<const T**, Layout, DeviceOf<E>> cos_t, sin_t;
  IVec<E> i0, i1, fr;
  int qh, group, U, width;
  bool inverse;
  /// Unit (a0, a1) of the head at column `base` of row t of x by the angle with cosine c and
  /// sine s (a1 < 0: a single channel, scaled by c).
  template <class X>
  KOKKOS_INLINE_FUNCTION static void turn(const X& x, const int t, const int base, const int a0,
                                          const int a1, const T c, const T s) {
    if (a1 < 0) {
      x(t, base + a0) = x(t, base + a0) * c;
    } else {
      const T a = x(t, base + a0), b = x(t, base + a1);
      x(t, base + a0) = a * c - b * s;
      x(t, base + a1) = a * s + b * c;
    }
  }
  KOKKOS_INLINE_FUNCTION void operator()(const int t, const int h, const int u) const {
    const bool is_q = h < qh;
    const int kvh = is_q ? h / group : h - qh;
    const int a0 = i0(kvh * U + u);
    if (a0 < 0) return;
    const int a1 = i1(kvh * U + u);
    const int j = fr(kvh * U + u);
    const int p = pos(t);
    const T c = cos_t(p, j), s = inverse ? -sin_t(p, j) : sin_t(p, j);
    turn(is_q ? q : k, t, (is_q ? h : h - qh) * width, a0, a1, c, s);
  }
};
}  // namespace detail

/// RoPE by rotation units: the heads of q[t][n_head·w] and k[t][n_kv·w] (w = the layer's
/// q/k head width) are rotated in place by the angle of position pos[t], each unit (a pair, or a
/// single channel whose partner was pruned) by its own frequency index into cos/sin tables
/// [position][head_dim/2]; query head h uses the units of KV head h / (n_head / n_kv). With
/// `inverse` every rotation is by the opposite angle: the transpose, which carries gradients
/// back through RoPE. For a dense layer this is exactly rope() above.
template <class E, class T>
void rope_units(const E& exec, const Kokkos::View<T**, Layout, DeviceOf<E>>& q,
                const Kokkos::View<T**, Layout, DeviceOf<E>>& k, const IVec<E>& pos,
                const Kokkos::View<const T**, Layout, DeviceOf<E>>& cos_t,
                const Kokkos::View<const T**, Layout, DeviceOf<E>>& sin_t, const RopeMap<E>& m,
                int width, bool inverse = false) {
  // either of q and k may be empty (rotate the other alone)
  const int qh = q.extent(0) > 0 ? static_cast<int>(q.extent(1)) / width : 0;
  const int kh = k.extent(0) > 0 ? static_cast<int>(k.extent(1)) / width : 0;
  const int n = static_cast<int>(qh > 0 ? q.extent(0) : k.extent(0));
  const int U = m.units;
  const int n_kv = U > 0 ? static_cast<int>(m.i0.extent(0)) / U : 1;
  const int group = n_kv > 0 && qh > 0 ? qh / n_kv : 1;
  const int heads = qh + kh;
  const detail::RopeUnitOp<E, T> rotate{q,      k,  pos,   cos_t, sin_t, m.i0,   m.i1,
                                        m.freq, qh, group, U,     width, inverse};
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    // A row per work item, its KV heads in turn: each KV head's units' cos/sin are read once
    // and serve the KV head and its group of query heads; no integer division per rotation (a
    // 2,048-token prefill of a pruned SmolLM2 spent 83 ms here with a flat range and three
    // divisions per rotation), and a decode step is one small launch.
    const int n_kv_rot = kh > 0 ? kh : n_kv;
    const auto order = m.order;
    require(U <= kMaxRopeUnits, "rope_units: {} rotation units per head, at most {}", U,
            kMaxRopeUnits);
    Kokkos::parallel_for("sparsim::kernels::rope_units", light(Kokkos::RangePolicy<E>(exec, 0, n)),
                         [=](const int t) {
                           T c[kMaxRopeUnits], sn[kMaxRopeUnits];
                           const int p = rotate.pos(t);
                           for (int g = 0; g < n_kv_rot; ++g) {
                             for (int u = 0; u < U; ++u) {
                               const int f = rotate.fr(g * U + u);
                               c[u] = rotate.cos_t(p, f);
                               sn[u] = inverse ? -rotate.sin_t(p, f) : rotate.sin_t(p, f);
                             }
                             auto head = [&](const auto& x, const int base) {
                               if (order == RopeMap<E>::kAdjacentPairs) {
                                 for (int u = 0; u < U; ++u)
                                   rotate.turn(x, t, base, 2 * u, 2 * u + 1, c[u], sn[u]);
                               } else if (order == RopeMap<E>::kHalvesPairs) {
                                 for (int u = 0; u < U; ++u)
                                   rotate.turn(x, t, base, u, u + U, c[u], sn[u]);
                               } else {
                                 for (int u = 0; u < U; ++u) {
                                   const int a0 = rotate.i0(g * U + u);
                                   if (a0 < 0) continue;
                                   rotate.turn(x, t, base, a0, rotate.i1(g * U + u), c[u], sn[u]);
                                 }
                               }
                             };
                             for (int h = g * group; h < (g + 1) * group && h < qh; ++h)
                               head(q, h * width);
                             if (g < kh) head(k, g * width);
                           }
                         });
    return;
  }
  // One flat range over (row, head, unit): a decode step's few hundred units are too little
  // work for a three-dimensional range's tiling, whose set-up cost more than the rotations.
  Kokkos::parallel_for(
      "sparsim::kernels::rope_units", light(Kokkos::RangePolicy<E>(exec, 0, n * heads * U)),
      KOKKOS_LAMBDA(const int i) { rotate(i / U / heads, i / U % heads, i % U); });
}

/// gate[t][j] = silu(gate[t][j]) · up[t][j], in place.
template <class E>
void swiglu(const E& exec, const Mat<E>& gate, const CMat<E>& up) {
  const int n = static_cast<int>(gate.extent(0));
  const int d = static_cast<int>(gate.extent(1));
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    // A row per work item, a plain loop over its columns: vectorised with the branch-free silu.
    Kokkos::parallel_for("sparsim::kernels::swiglu", light(Kokkos::RangePolicy<E>(exec, 0, n)),
                         [=](const int t) {
                           float* g = &gate(t, 0);
                           const float* u = &up(t, 0);
                           for (int j = 0; j < d; ++j) g[j] = detail::silu(g[j]) * u[j];
                         });
    return;
  }
  Kokkos::parallel_for(
      "sparsim::kernels::swiglu", light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d})),
      KOKKOS_LAMBDA(const int t, const int j) {
        gate(t, j) = detail::silu(gate(t, j)) * up(t, j);
      });
}

/// x += y.
template <class E>
void add_inplace(const E& exec, const Mat<E>& x, const CMat<E>& y) {
  const int n = static_cast<int>(x.extent(0));
  const int d = static_cast<int>(x.extent(1));
  Kokkos::parallel_for(
      "sparsim::kernels::residual", light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d})),
      KOKKOS_LAMBDA(const int t, const int j) { x(t, j) += y(t, j); });
}

/// x(t, j) += b(j): a projection's output bias, added to every row.
template <class E>
void add_row_bias(const E& exec, const Mat<E>& x, const CVec<E>& b) {
  const int n = static_cast<int>(x.extent(0));
  const int d = static_cast<int>(x.extent(1));
  Kokkos::parallel_for(
      "sparsim::kernels::row_bias",
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d})),
      KOKKOS_LAMBDA(const int t, const int j) { x(t, j) += b(j); });
}

}  // namespace sparsim
