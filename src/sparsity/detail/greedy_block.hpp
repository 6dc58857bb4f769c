#pragma once
/// The block evaluator of the greedy per-projection search (calibrate.cpp): one block on the
/// calibration inputs of G sequences of T tokens, with threshold masks, computing only what the
/// search's error reads and only what a candidate step changes.
///
/// The search scores the block output at the positions t0 … T−1 of each sequence (TEAL: the last
/// quarter). Every op of a Llama block is per token except attention, and attention of a scored
/// token reads the keys and values of every earlier position. So keys and values are computed for
/// all G·T tokens, everything else for the r = G·(T − t0) scored tokens only. The intermediate
/// results of the committed masks are kept; a candidate that raises projection i's threshold
/// recomputes from projection i on (q: its attention, o and the MLP; k or v: their own projection
/// over all tokens, then attention onwards; o: o and the MLP; gate or up: that projection and
/// down; down: down), into a scratch state of its own. commit(i) swaps candidate i's results in.
///
/// The ops and their order are those of Engine::block (rmsnorm, linear, rope, attention,
/// residual, swiglu), so the outputs equal run_block's with the same masks up to the rounding
/// of GEMM tiles of a different shape. 16-bit weights are widened once per block.
#include "core/error.hpp"
#include "kernels/attention.hpp"
#include "kernels/linear.hpp"
#include "kernels/mask.hpp"
#include "kernels/pointwise.hpp"
#include "model/weights.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

namespace sparsim::sparsity::detail {

/// An fp32 copy of m (m itself when it is fp32).
template <class E>
Matrix<E> as_f32(const E& exec, const Matrix<E>& m) {
  if (m.dtype == DType::F32) return m;
  Matrix<E> out;
  out.dtype = DType::F32;
  out.rows = m.rows;
  out.cols = m.cols;
  out.f32 = decltype(out.f32)(
      Kokkos::view_alloc("sparsim::calibrate::wide", Kokkos::WithoutInitializing), m.rows, m.cols);
  if (m.dtype == DType::BF16)
    sparsim::detail::widen(exec, m.bf16, Mat<E>(out.f32));
  else
    sparsim::detail::widen(exec, m.f16, Mat<E>(out.f32));
  return out;
}

template <class E>
class GreedyBlock {
 public:
  /// x: the block's dense input, [G·T][d_model], row s·T + t at position t.
  GreedyBlock(const Weights<E>& w, int layer, const CMat<E>& x, int G, int T, int t0,
              const E& exec = E())
      : c_(w.cfg), exec_(exec), G_(G), T_(T), t0_(t0), R_(T - t0) {
    require(G >= 1 && T >= 1 && t0 >= 0 && t0 < T, "GreedyBlock: {} sequences of {} tokens from {}",
            G, T, t0);
    require(static_cast<int>(x.extent(0)) == G * T && static_cast<int>(x.extent(1)) == c_.d_model,
            "GreedyBlock: input is {}x{}, expected {}x{}", x.extent(0), x.extent(1), G * T,
            c_.d_model);
    const LayerWeights<E>& lw = w.layers[static_cast<std::size_t>(layer)];
    for (int i = 0; i < kNumProj; ++i)
      w_[static_cast<std::size_t>(i)] = as_f32(exec_, lw.proj(static_cast<Proj>(i)));
    attn_norm_ = lw.attn_norm;
    ffn_norm_ = lw.ffn_norm;
    rot_ = w.rotated();
    if (rot_) {
      rot_am_ = as_f32(exec_, w.rot_attn_mlp[static_cast<std::size_t>(layer)]);
      rot_mn_ = as_f32(exec_, w.rot_mlp_next[static_cast<std::size_t>(layer)]);
    }
    {  // RoPE angles as the engine makes them: double precision, rounded once
      const int half = c_.head_dim / 2;
      const std::vector<double> inv = c_.rope_inv_freq(w.rope_freq_factors);
      Mat<E> cs("sparsim::calibrate::rope_cos", T, half),
          sn("sparsim::calibrate::rope_sin", T, half);
      auto hc = Kokkos::create_mirror_view(cs);
      auto hs = Kokkos::create_mirror_view(sn);
      for (int p = 0; p < T; ++p)
        for (int j = 0; j < half; ++j) {
          const double a = p * inv[static_cast<std::size_t>(j)];
          hc(p, j) = static_cast<float>(std::cos(a));
          hs(p, j) = static_cast<float>(std::sin(a));
        }
      Kokkos::deep_copy(cs, hc);
      Kokkos::deep_copy(sn, hs);
      cos_ = cs;
      sin_ = sn;
    }
    const int n = G * T, r = G * R_, D = c_.d_model;
    auto alloc = [](int a, int b) {
      return Mat<E>(Kokkos::view_alloc("sparsim::calibrate::greedy", Kokkos::WithoutInitializing),
                    a, b);
    };
    // positions: every token, and the scored ones
    pos_all_ = IVec<E>("sparsim::calibrate::pos", n);
    pos_r_ = IVec<E>("sparsim::calibrate::pos_r", r);
    auto ha = Kokkos::create_mirror_view(pos_all_);
    auto hr = Kokkos::create_mirror_view(pos_r_);
    for (int s = 0; s < G; ++s) {
      for (int t = 0; t < T; ++t) ha(s * T + t) = t;
      for (int t = 0; t < R_; ++t) hr(s * R_ + t) = t0 + t;
    }
    Kokkos::deep_copy(pos_all_, ha);
    Kokkos::deep_copy(pos_r_, hr);
    // the inputs that no mask changes
    xn_ = alloc(n, D);
    rmsnorm(exec_, x, CVec<E>(attn_norm_), c_.rms_eps, xn_);
    xr_ = alloc(r, D);
    xnr_ = alloc(r, D);
    gather_scored(x, xr_);
    gather_scored(CMat<E>(xn_), xnr_);
    if (rot_) {
      xrm_ = alloc(r, D);
      linear(exec_, CMat<E>(xr_), rot_am_, xrm_, scratch_);
    }
    mx_ = alloc(std::max(n, r), std::max({D, c_.q_dim(), c_.d_ff}));
    d_ = alloc(r, D);
    for (State* s : all_states()) s->alloc(alloc, n, r, c_);
    row_err_ = Kokkos::View<double*, DeviceOf<E>>("sparsim::calibrate::row_err", r);
    // the dense block, then the committed state starts dense
    std::array<MaskParams, kNumProj> none{};
    masks_ = none;
    run_all(dense_);
    cur_.copy_from(exec_, dense_);
    exec_.fence();
  }

  /// Error ‖Y_dense − Ŷ‖₂ over the scored outputs when projection i is masked by `m` and the
  /// others by their committed masks.
  double error(int i, const MaskParams& m) {
    State& s = cand_[static_cast<std::size_t>(i)];
    std::array<MaskParams, kNumProj> mk = masks_;
    mk[static_cast<std::size_t>(i)] = m;
    run_from(static_cast<Proj>(i), mk, s);
    cand_mask_[static_cast<std::size_t>(i)] = m;
    return distance(s.y);
  }

  /// Takes candidate i's last evaluation as the committed state.
  void commit(int i) {
    State& s = cand_[static_cast<std::size_t>(i)];
    masks_[static_cast<std::size_t>(i)] = cand_mask_[static_cast<std::size_t>(i)];
    // swap in what candidate i wrote (the rest of the committed state stands)
    switch (static_cast<Proj>(i)) {
      case Proj::Q:
        std::swap(cur_.q, s.q);
        swap_att_on(s);
        break;
      case Proj::K:
        std::swap(cur_.k, s.k);
        swap_att_on(s);
        break;
      case Proj::V:
        std::swap(cur_.v, s.v);
        swap_att_on(s);
        break;
      case Proj::O:
        swap_o_on(s);
        break;
      case Proj::Gate:
        std::swap(cur_.g, s.g);
        swap_act_on(s);
        break;
      case Proj::Up:
        std::swap(cur_.u, s.u);
        swap_act_on(s);
        break;
      case Proj::Down:
        std::swap(cur_.y, s.y);
        break;
    }
  }

  /// The committed state's output of the scored tokens, [r][d_model].
  CMat<E> output() const { return CMat<E>(cur_.y); }
  /// The dense output of the scored tokens.
  CMat<E> dense_output() const { return CMat<E>(dense_.y); }

  // The two helpers below hold device lambdas, which nvcc does not accept inside private
  // member functions; they are implementation details all the same.
  /// Rows s·T + t0 + i of src (i < T − t0) into dst, in sequence order.
  void gather_scored(const CMat<E>& src, const Mat<E>& dst) {
    const int T = T_, R = R_, t0 = t0_, d = static_cast<int>(src.extent(1));
    Kokkos::parallel_for(
        "sparsim::calibrate::gather_scored",
        Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec_, {0, 0}, {G_ * R, d}),
        KOKKOS_LAMBDA(const int r, const int j) { dst(r, j) = src((r / R) * T + t0 + r % R, j); });
  }

  /// ‖dense − y‖₂ over every element: one row per thread in a fixed order, rows summed in order.
  double distance(const Mat<E>& y) {
    const Mat<E> yd = dense_.y;
    const auto re = row_err_;
    const int d = static_cast<int>(y.extent(1));
    Kokkos::parallel_for(
        "sparsim::calibrate::row_error",
        Kokkos::RangePolicy<E>(exec_, 0, static_cast<int>(y.extent(0))),
        KOKKOS_LAMBDA(const int r) {
          double acc = 0;
          for (int j = 0; j < d; ++j) {
            const double e = static_cast<double>(yd(r, j)) - static_cast<double>(y(r, j));
            acc += e * e;
          }
          re(r) = acc;
        });
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), re);
    double total = 0;
    for (std::size_t r = 0; r < h.extent(0); ++r) total += h(r);
    return std::sqrt(total);
  }

 private:
  struct State {
    Mat<E> q, k, v, att, o, h, xn2, g, u, a, hn, y;
    template <class Alloc>
    void alloc(Alloc& al, int n, int r, const Config& c) {
      q = al(r, c.q_dim());
      k = al(n, c.kv_dim());
      v = al(n, c.kv_dim());
      att = al(r, c.q_dim());
      o = al(r, c.d_model);
      h = al(r, c.d_model);
      xn2 = al(r, c.d_model);
      g = al(r, c.d_ff);
      u = al(r, c.d_ff);
      a = al(r, c.d_ff);
      hn = al(r, c.d_model);
      y = al(r, c.d_model);
    }
    void copy_from(const E& ex, const State& o2) {
      Kokkos::deep_copy(ex, q, o2.q);
      Kokkos::deep_copy(ex, k, o2.k);
      Kokkos::deep_copy(ex, v, o2.v);
      Kokkos::deep_copy(ex, att, o2.att);
      Kokkos::deep_copy(ex, o, o2.o);
      Kokkos::deep_copy(ex, h, o2.h);
      Kokkos::deep_copy(ex, xn2, o2.xn2);
      Kokkos::deep_copy(ex, g, o2.g);
      Kokkos::deep_copy(ex, u, o2.u);
      Kokkos::deep_copy(ex, a, o2.a);
      Kokkos::deep_copy(ex, hn, o2.hn);
      Kokkos::deep_copy(ex, y, o2.y);
    }
  };

  std::vector<State*> all_states() {
    std::vector<State*> v{&dense_, &cur_};
    for (State& s : cand_) v.push_back(&s);
    return v;
  }
  void swap_act_on(State& s) {
    std::swap(cur_.a, s.a);
    std::swap(cur_.y, s.y);
  }
  void swap_o_on(State& s) {
    std::swap(cur_.o, s.o);
    std::swap(cur_.h, s.h);
    std::swap(cur_.xn2, s.xn2);
    std::swap(cur_.g, s.g);
    std::swap(cur_.u, s.u);
    std::swap(cur_.hn, s.hn);
    swap_act_on(s);
  }
  void swap_att_on(State& s) {
    std::swap(cur_.att, s.att);
    swap_o_on(s);
  }

  /// The input projection i reads: x itself when unmasked, else x masked into the scratch.
  CMat<E> masked(const CMat<E>& x, const MaskParams& m) {
    if (m.rule == MaskRule::None) return x;
    const int n = static_cast<int>(x.extent(0)), d = static_cast<int>(x.extent(1));
    const Mat<E> y(mx_.data(), n, d);
    mask_rows(exec_, x, CVec<E>(), IVec<E>(), m, y, IVec<E>());
    return CMat<E>(y);
  }
  void proj(Proj p, const CMat<E>& x, const MaskParams& m, const Mat<E>& y) {
    linear(exec_, masked(x, m), w_[static_cast<std::size_t>(p)], y, scratch_);
  }
  void rope_rows(const Mat<E>& q, const Mat<E>& k, const IVec<E>& pos) {
    rope(exec_, q, k, pos, cos_, sin_, c_.head_dim, c_.rope_layout == RopeLayout::Adjacent);
  }

  // The stages, reading earlier results from `src` and writing into `dst`.
  void stage_q(const MaskParams& m, State& dst) {
    proj(Proj::Q, CMat<E>(xnr_), m, dst.q);
    rope_rows(dst.q, Mat<E>(dst.q.data(), dst.q.extent(0), 0), pos_r_);
  }
  void stage_kv(Proj p, const MaskParams& m, State& dst) {
    const Mat<E>& out = p == Proj::K ? dst.k : dst.v;
    proj(p, CMat<E>(xn_), m, out);
    if (p == Proj::K) rope_rows(Mat<E>(out.data(), out.extent(0), 0), out, pos_all_);
  }
  void stage_att(const Mat<E>& q, const Mat<E>& k, const Mat<E>& v, State& dst) {
    const int kvd = c_.kv_dim();
    // [G·T][kv_dim] rows are the cache layout [G][T][kv_dim]
    const Cache<E> kc(k.data(), G_, T_, kvd), vc(v.data(), G_, T_, kvd);
    attention(exec_, CMat<E>(q), kc, vc, dst.att, G_, R_, t0_, c_.n_head, c_.n_kv_head,
              c_.head_dim);
  }
  void stage_o(const Mat<E>& att, const MaskParams& m, State& dst) {
    proj(Proj::O, CMat<E>(att), m, dst.o);
    // h = x + o (rotated: x·Mᵀ + o), as the engine's residual adds o to the stream
    Kokkos::deep_copy(exec_, dst.h, rot_ ? xrm_ : xr_);
    add_inplace(exec_, dst.h, CMat<E>(dst.o));
    rmsnorm(exec_, CMat<E>(dst.h), CVec<E>(ffn_norm_), c_.rms_eps, dst.xn2);
    if (rot_)
      linear(exec_, CMat<E>(dst.h), rot_mn_, dst.hn, scratch_);
    else
      Kokkos::deep_copy(exec_, dst.hn, dst.h);
  }
  void stage_act(const Mat<E>& g, const Mat<E>& u, State& dst) {
    Kokkos::deep_copy(exec_, dst.a, g);
    swiglu(exec_, dst.a, CMat<E>(u));
  }
  void stage_down(const Mat<E>& a, const Mat<E>& hn, const MaskParams& m, State& dst) {
    proj(Proj::Down, CMat<E>(a), m, d_);
    Kokkos::deep_copy(exec_, dst.y, hn);
    add_inplace(exec_, dst.y, CMat<E>(d_));
  }

  void run_all(State& s) {
    const auto& m = masks_;
    stage_q(m[0], s);
    stage_kv(Proj::K, m[1], s);
    stage_kv(Proj::V, m[2], s);
    stage_att(s.q, s.k, s.v, s);
    mlp_from_o(s.att, m, s);
  }
  void mlp_from_o(const Mat<E>& att, const std::array<MaskParams, kNumProj>& m, State& s) {
    stage_o(att, m[3], s);
    proj(Proj::Gate, CMat<E>(s.xn2), m[4], s.g);
    proj(Proj::Up, CMat<E>(s.xn2), m[5], s.u);
    stage_act(s.g, s.u, s);
    stage_down(s.a, s.hn, m[6], s);
  }
  /// Recomputes into s what changes when projection p's mask changes to m[p].
  void run_from(Proj p, const std::array<MaskParams, kNumProj>& m, State& s) {
    const std::size_t i = static_cast<std::size_t>(p);
    switch (p) {
      case Proj::Q:
        stage_q(m[i], s);
        stage_att(s.q, cur_.k, cur_.v, s);
        mlp_from_o(s.att, m, s);
        break;
      case Proj::K:
        stage_kv(p, m[i], s);
        stage_att(cur_.q, s.k, cur_.v, s);
        mlp_from_o(s.att, m, s);
        break;
      case Proj::V:
        stage_kv(p, m[i], s);
        stage_att(cur_.q, cur_.k, s.v, s);
        mlp_from_o(s.att, m, s);
        break;
      case Proj::O:
        mlp_from_o(cur_.att, m, s);
        break;
      case Proj::Gate:
        proj(Proj::Gate, CMat<E>(cur_.xn2), m[i], s.g);
        stage_act(s.g, cur_.u, s);
        stage_down(s.a, cur_.hn, m[6], s);
        break;
      case Proj::Up:
        proj(Proj::Up, CMat<E>(cur_.xn2), m[i], s.u);
        stage_act(cur_.g, s.u, s);
        stage_down(s.a, cur_.hn, m[6], s);
        break;
      case Proj::Down:
        stage_down(cur_.a, cur_.hn, m[i], s);
        break;
    }
  }

  Config c_;
  E exec_;
  int G_, T_, t0_, R_;
  CMat<E> cos_, sin_;
  std::array<Matrix<E>, kNumProj> w_;
  Kokkos::View<float*, DeviceOf<E>> attn_norm_, ffn_norm_;
  bool rot_ = false;
  Matrix<E> rot_am_, rot_mn_;
  IVec<E> pos_all_, pos_r_;
  Mat<E> xn_, xr_, xnr_, xrm_, mx_, d_;
  State dense_, cur_;
  std::array<State, kNumProj> cand_;
  std::array<MaskParams, kNumProj> masks_{}, cand_mask_{};
  Kokkos::View<double*, DeviceOf<E>> row_err_;
  LinearScratch<E> scratch_;
};

}  // namespace sparsim::sparsity::detail
