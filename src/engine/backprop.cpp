#include "engine/backprop.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/interrupt.hpp"
#include "kernels/linear.hpp"

#include <KokkosBlas3_gemm.hpp>

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace sparsim {

namespace {

/// The host tile grid of the training products (forward and backward). Finer than the engine's:
/// the projections of a small model have a few hundred rows (576, or 192 for K and V), which the
/// engine's 512-row tiles would split into one large and one small tile (or a single one), leaving
/// a thread idle; 64-row tiles of 128 tokens keep both cores busy. Fixed, like the engine's, so an
/// element's summation does not depend on the thread count.
constexpr detail::TileGrid kTrainTiles{64, 128};

/// dx[n][in] = dy[n][out]·W[out][in] + beta·dx with BLAS, in the fixed tiles of kTrainTiles
/// (input features × tokens) on the host (each one single-threaded BLAS call), so every
/// element has the same summation whatever the thread count; one call on devices.
template <class E>
void blas_nn(const E& exec, const CMat<E>& dy, const CMat<E>& w, const Mat<E>& dx, float beta) {
  using LL = Kokkos::View<const float**, Kokkos::LayoutLeft, DeviceOf<E>,
                          Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using LLout = Kokkos::View<float**, Kokkos::LayoutLeft, DeviceOf<E>,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const int n = static_cast<int>(dy.extent(0));
  const int out = static_cast<int>(w.extent(0));
  const int in = static_cast<int>(w.extent(1));
  // Column-major views of the row-major arrays: W is (in, out), dy is (out, n), dx is (in, n).
  const LL wl(w.data(), in, out), dyl(dy.data(), out, n);
  const LLout dxl(dx.data(), in, n);
  auto call = [=](int r0, int nr, int t0, int nt) {
    const auto rows = Kokkos::make_pair(r0, r0 + nr);
    const auto toks = Kokkos::make_pair(t0, t0 + nt);
    KokkosBlas::gemm("N", "N", 1.0f, Kokkos::subview(wl, rows, Kokkos::ALL),
                     Kokkos::subview(dyl, Kokkos::ALL, toks), beta,
                     Kokkos::subview(dxl, rows, toks));
  };
  exec.fence();
  if constexpr (bwd::on_host<E>()) {
    detail::for_each_host_tile(exec, "sparsim::backprop::blas_nn_tiles", in, n, n, call,
                               kTrainTiles);
  } else {
    call(0, in, 0, n);
  }
}

/// A weight as a T matrix: the stored fp32 view itself when T is float and the weights are fp32,
/// otherwise a widened copy.
template <class E, class T>
CMatT<E, T> as_t(const E& exec, const Matrix<E>& m) {
  if constexpr (std::is_same_v<T, float>) {
    if (m.dtype == DType::F32) return m.f32;
  }
  MatT<E, T> out(
      Kokkos::view_alloc(std::string("sparsim::backprop::weight"), Kokkos::WithoutInitializing),
      m.rows, m.cols);
  auto pol = Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {m.rows, m.cols});
  if (m.dtype == DType::F32) {
    auto s = m.f32;
    Kokkos::parallel_for(
        "sparsim::backprop::widen", pol,
        KOKKOS_LAMBDA(int r, int c) { out(r, c) = static_cast<T>(s(r, c)); });
  } else if (m.dtype == DType::BF16) {
    auto s = m.bf16;
    Kokkos::parallel_for(
        "sparsim::backprop::widen", pol,
        KOKKOS_LAMBDA(int r, int c) { out(r, c) = static_cast<T>(to_f32(s(r, c))); });
  } else {
    auto s = m.f16;
    Kokkos::parallel_for(
        "sparsim::backprop::widen", pol,
        KOKKOS_LAMBDA(int r, int c) { out(r, c) = static_cast<T>(to_f32(s(r, c))); });
  }
  exec.fence();
  return out;
}

}  // namespace

template <class E, class T>
struct Backprop<E, T>::State {
  using M = MatT<E, T>;
  using CM = CMatT<E, T>;
  struct LayerW {
    CM wq, wk, wv, wo, wg, wu, wd;
    CM ku, vu;  // a low-rank K/V layer's up factors B_k, B_v (wk, wv: the down factors A)
  };
  struct Acts {
    M x, xn, q, kpre, k, v, a, lse, x2, xn2, g, u;
  };
  std::vector<LayerW> lw;
  CM out_w;
  std::vector<RopeMap<E>> rope;
  M cos, sin;
  std::vector<Acts> acts;
  M xL, hf, z;
  M dX, dh, dq, dk, dv, da, dm, dg, du, dsum, mid;
  M lat;  // a low-rank layer's latent A·x (forward) or its gradient dy·B (backward)
  IVec<E> tok, pos;
  Kokkos::View<double*, DeviceOf<E>> nll, colsum;
  int n = 0;
  bool gated = false;
  bool have_forward = false;
};

template <class E, class T>
Backprop<E, T>::Backprop(std::shared_ptr<const Weights<E>> w, int max_tokens, E exec)
    : w_(std::move(w)), max_n_(max_tokens), exec_(exec), s_(std::make_unique<State>()) {
  const Config& c = w_->cfg;
  require(max_tokens >= 2, "backprop: sequences need at least 2 tokens, got {}", max_tokens);
  require(max_tokens <= c.context_length,
          "backprop: {} tokens exceed the model's context of {} tokens", max_tokens,
          c.context_length);
  require(!w_->rotated(), "backprop: a WINA-rotated model is not supported");
  require(!c.structured(), "backprop: a structurally pruned model ({}) is not supported",
          c.prune.method);
  State& s = *s_;
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights<E>& L = w_->layers[static_cast<std::size_t>(l)];
    s.lw.push_back({as_t<E, T>(exec_, L.wq), as_t<E, T>(exec_, L.wk), as_t<E, T>(exec_, L.wv),
                    as_t<E, T>(exec_, L.wo), as_t<E, T>(exec_, L.w_gate), as_t<E, T>(exec_, L.w_up),
                    as_t<E, T>(exec_, L.w_down)});
    if (c.low_rank_kv()) {
      s.lw.back().ku = as_t<E, T>(exec_, L.k_up);
      s.lw.back().vu = as_t<E, T>(exec_, L.v_up);
    }
    s.rope.push_back(make_rope_map<E>(c.rope_units(l)));
  }
  s.out_w = as_t<E, T>(exec_, w_->output);
  // RoPE angles in double precision on the host, rounded once to T (as the engine does).
  const std::vector<double> inv = c.rope_inv_freq(w_->rope_freq_factors);
  const int half = static_cast<int>(inv.size());  // (more for a naively re-paired model)
  s.cos = MatT<E, T>("sparsim::backprop::cos", max_tokens, half);
  s.sin = MatT<E, T>("sparsim::backprop::sin", max_tokens, half);
  auto hc = Kokkos::create_mirror_view(s.cos);
  auto hs = Kokkos::create_mirror_view(s.sin);
  for (int p = 0; p < max_tokens; ++p)
    for (int j = 0; j < half; ++j) {
      const double a = p * inv[static_cast<std::size_t>(j)];
      hc(p, j) = static_cast<T>(std::cos(a));
      hs(p, j) = static_cast<T>(std::sin(a));
    }
  Kokkos::deep_copy(s.cos, hc);
  Kokkos::deep_copy(s.sin, hs);
}

template <class E, class T>
Backprop<E, T>::~Backprop() = default;

namespace {

template <class E, class T>
MatT<E, T> alloc(const char* name, int rows, int cols) {
  return MatT<E, T>(Kokkos::view_alloc(std::string(name), Kokkos::WithoutInitializing), rows, cols);
}

/// y = x·Wᵀ.
template <class E, class T>
void mm_nt(const E& exec, const CMatT<E, T>& x, const CMatT<E, T>& w, const MatT<E, T>& y) {
  if constexpr (std::is_same_v<T, float>) {
    exec.fence();
    detail::blas_linear<E>(exec, x, w, y, static_cast<int>(x.extent(0)),  // one sequence
                           kTrainTiles);
  } else {
    matmul_nt_generic<E, T>(exec, x, w, y);
  }
}

/// dx (+)= dy·W.
template <class E, class T>
void mm_nn(const E& exec, const CMatT<E, T>& dy, const CMatT<E, T>& w, const MatT<E, T>& dx,
           bool accumulate) {
  if constexpr (std::is_same_v<T, float>)
    blas_nn<E>(exec, dy, w, dx, accumulate ? 1.0f : 0.0f);
  else
    matmul_nn_generic<E, T>(exec, dy, w, dx, accumulate);
}

/// The first n·cols elements of a scratch buffer as an [n][cols] matrix.
template <class E, class T>
MatT<E, T> part(const MatT<E, T>& buf, int n, int cols) {
  return MatT<E, T>(buf.data(), n, cols);
}

}  // namespace

template <class E, class T>
double Backprop<E, T>::forward(const std::vector<int>& tokens, const BackpropProbe* probe) {
  const Config& c = w_->cfg;
  State& s = *s_;
  const int n = static_cast<int>(tokens.size());
  require(n >= 2 && n <= max_n_, "backprop: {} tokens, expected 2 … {}", n, max_n_);
  for (int t : tokens)
    require(t >= 0 && t < c.vocab, "backprop: token id {} outside the vocabulary 0 … {}", t,
            c.vocab - 1);
  const int L = c.n_layer, D = c.d_model, F = c.d_ff, H = c.n_head;
  using M = MatT<E, T>;
  using CM = CMatT<E, T>;
  if (n != s.n) {  // (re)allocate for this sequence length
    s.acts.clear();
    for (int l = 0; l < L; ++l) {
      typename State::Acts a;
      a.x = alloc<E, T>("sparsim::backprop::x", n, D);
      a.xn = alloc<E, T>("sparsim::backprop::xn", n, D);
      a.q = alloc<E, T>("sparsim::backprop::q", n, c.q_dim(l));
      a.kpre = alloc<E, T>("sparsim::backprop::kpre", n, c.k_dim(l));
      a.k = alloc<E, T>("sparsim::backprop::k", n, c.k_dim(l));
      a.v = alloc<E, T>("sparsim::backprop::v", n, c.v_dim(l));
      a.a = alloc<E, T>("sparsim::backprop::att", n, c.att_dim(l));
      a.lse = alloc<E, T>("sparsim::backprop::lse", n, H);
      a.x2 = alloc<E, T>("sparsim::backprop::x2", n, D);
      a.xn2 = alloc<E, T>("sparsim::backprop::xn2", n, D);
      a.g = alloc<E, T>("sparsim::backprop::gate", n, F);
      a.u = alloc<E, T>("sparsim::backprop::up", n, F);
      s.acts.push_back(a);
    }
    s.xL = alloc<E, T>("sparsim::backprop::xL", n, D);
    s.hf = alloc<E, T>("sparsim::backprop::hf", n, D);
    s.z = alloc<E, T>("sparsim::backprop::logits", n, c.vocab);
    s.dX = alloc<E, T>("sparsim::backprop::dx", n, D);
    s.dh = alloc<E, T>("sparsim::backprop::dh", n, D);
    s.dq = alloc<E, T>("sparsim::backprop::dq", n, c.max_q_dim());
    s.dk = alloc<E, T>("sparsim::backprop::dk", n, c.max_k_dim());
    s.dv = alloc<E, T>("sparsim::backprop::dv", n, c.max_v_dim());
    s.da = alloc<E, T>("sparsim::backprop::da", n, c.max_att_dim());
    s.dm = alloc<E, T>("sparsim::backprop::dm", n, F);
    s.dg = alloc<E, T>("sparsim::backprop::dgate", n, F);
    s.du = alloc<E, T>("sparsim::backprop::dup", n, F);
    s.dsum = alloc<E, T>("sparsim::backprop::dsum", n, H);
    s.mid = alloc<E, T>("sparsim::backprop::mid", n, std::max(D, F));
    if (c.low_rank_kv()) {
      int widest = 1;
      for (int l = 0; l < L; ++l)
        widest = std::max({widest, c.k_cache_width(l), c.v_cache_width(l)});
      s.lat = alloc<E, T>("sparsim::backprop::latent", n, widest);
    }
    s.tok = IVec<E>("sparsim::backprop::tokens", n);
    s.pos = IVec<E>("sparsim::backprop::positions", n);
    s.nll = Kokkos::View<double*, DeviceOf<E>>("sparsim::backprop::nll", n);
    s.colsum = Kokkos::View<double*, DeviceOf<E>>("sparsim::backprop::colsum",
                                                  std::max(c.max_k_dim(), c.max_v_dim()));
    auto hp = Kokkos::create_mirror_view(s.pos);
    for (int t = 0; t < n; ++t) hp(t) = t;
    Kokkos::deep_copy(s.pos, hp);
    s.n = n;
  }
  {
    auto ht = Kokkos::create_mirror_view(s.tok);
    for (int t = 0; t < n; ++t) ht(t) = tokens[static_cast<std::size_t>(t)];
    Kokkos::deep_copy(s.tok, ht);
  }
  s.gated = false;
  auto gate_view = [&](const std::vector<std::vector<double>>& g, int l, int width) {
    VecT<E, T> v("sparsim::backprop::gate", width);
    auto h = Kokkos::create_mirror_view(v);
    const auto& src = g[static_cast<std::size_t>(l)];
    require(static_cast<int>(src.size()) == width,
            "backprop probe: layer {} gate has {} entries, "
            "expected {}",
            l, src.size(), width);
    for (int i = 0; i < width; ++i) h(i) = static_cast<T>(src[static_cast<std::size_t>(i)]);
    Kokkos::deep_copy(v, h);
    return v;
  };
  const T eps = static_cast<T>(c.rms_eps);
  const T scale = T(1) / std::sqrt(static_cast<T>(c.head_dim));
  // y = x·Wᵀ, plus the hook's term where it has one
  auto proj = [&](int l, Proj p, const M& x, const CM& w, const M& y) {
    mm_nt<E, T>(exec_, CM(x), w, y);
    if (hook_ && hook_->active(l, p)) hook_->forward(exec_, l, p, CM(x), y);
  };
  // K or V of a layer: y = x·Wᵀ, or for a low-rank layer y = (x·Aᵀ)·Bᵀ with the hook on the
  // down factor A (the projection whose output the cache holds)
  auto kv_proj = [&](int l, Proj p, const M& x, const CM& w, const CM& up, const M& y) {
    if (!c.low_rank_kv()) return proj(l, p, x, w, y);
    const M lat = part<E, T>(s.lat, n, static_cast<int>(w.extent(0)));
    proj(l, p, x, w, lat);
    mm_nt<E, T>(exec_, CM(lat), up, y);
  };

  embed_t<E, T>(exec_, w_->tok_embd, s.tok, s.acts[0].x);
  if (probe && probe->x0_row >= 0) {
    require(probe->x0_row < n && probe->x0_col >= 0 && probe->x0_col < D,
            "backprop probe: input entry ({}, {}) outside {}×{}", probe->x0_row, probe->x0_col, n,
            D);
    auto x0 = s.acts[0].x;
    const int r = probe->x0_row, col = probe->x0_col;
    const T delta = static_cast<T>(probe->x0_delta);
    Kokkos::parallel_for(
        "sparsim::backprop::probe", Kokkos::RangePolicy<E>(exec_, 0, 1),
        KOKKOS_LAMBDA(int) { x0(r, col) += delta; });
    s.gated = true;
  }
  for (int l = 0; l < L; ++l) {
    interruption_point("backprop");
    auto& a = s.acts[static_cast<std::size_t>(l)];
    const auto& W = s.lw[static_cast<std::size_t>(l)];
    const LayerWeights<E>& lw = w_->layers[static_cast<std::size_t>(l)];
    rmsnorm_t<E, T>(exec_, CM(a.x), CVec<E>(lw.attn_norm), eps, a.xn);
    proj(l, Proj::Q, a.xn, W.wq, a.q);
    kv_proj(l, Proj::K, a.xn, W.wk, W.ku, a.kpre);
    kv_proj(l, Proj::V, a.xn, W.wv, W.vu, a.v);
    if (probe && !probe->k_gate.empty()) {
      scale_columns<E, T>(exec_, a.kpre, gate_view(probe->k_gate, l, c.k_dim(l)));
      s.gated = true;
    }
    if (probe && !probe->v_gate.empty()) {
      scale_columns<E, T>(exec_, a.v, gate_view(probe->v_gate, l, c.v_dim(l)));
      s.gated = true;
    }
    Kokkos::deep_copy(exec_, a.k, a.kpre);
    rope_units<E, T>(exec_, a.q, a.k, s.pos, CM(s.cos), CM(s.sin),
                     s.rope[static_cast<std::size_t>(l)], c.qk_head_dim(l));
    attention_t<E, T>(exec_, CM(a.q), CM(a.k), CM(a.v), a.a, a.lse, H, c.n_kv_head,
                      c.qk_head_dim(l), c.v_head_dim(l), scale);
    // x2 = x + a·Woᵀ
    M o = part<E, T>(s.mid, n, D);
    proj(l, Proj::O, a.a, W.wo, o);
    Kokkos::deep_copy(exec_, a.x2, a.x);
    add_t<E, T>(exec_, a.x2, CM(o));
    rmsnorm_t<E, T>(exec_, CM(a.x2), CVec<E>(lw.ffn_norm), eps, a.xn2);
    proj(l, Proj::Gate, a.xn2, W.wg, a.g);
    proj(l, Proj::Up, a.xn2, W.wu, a.u);
    M m = part<E, T>(s.dm, n, F);  // dm is free during the forward pass
    swiglu_t<E, T>(exec_, CM(a.g), CM(a.u), m);
    M next = l + 1 < L ? s.acts[static_cast<std::size_t>(l) + 1].x : s.xL;
    proj(l, Proj::Down, m, W.wd, o);
    Kokkos::deep_copy(exec_, next, a.x2);
    add_t<E, T>(exec_, next, CM(o));
  }
  rmsnorm_t<E, T>(exec_, CM(s.xL), CVec<E>(w_->out_norm), eps, s.hf);
  mm_nt<E, T>(exec_, CM(s.hf), s.out_w, s.z);
  if (loss_) {
    const double loss = loss_->loss_and_gradient(exec_, s.z, s.tok);
    exec_.fence();
    s.have_forward = true;
    return loss;
  }
  cross_entropy_backward<E, T>(exec_, s.z, s.tok, s.nll);
  exec_.fence();
  auto hn = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.nll);
  double sum = 0;
  for (int t = 0; t + 1 < n; ++t) sum += hn(t);
  s.have_forward = true;
  return sum / (n - 1);
}

template <class E, class T>
void Backprop<E, T>::backward() {
  const Config& c = w_->cfg;
  State& s = *s_;
  require(s.have_forward, "backprop: backward() needs a forward() first");
  require(!s.gated, "backprop: backward() after a forward() with a probe is not supported");
  const int n = s.n, L = c.n_layer, H = c.n_head;
  using M = MatT<E, T>;
  using CM = CMatT<E, T>;
  const T eps = static_cast<T>(c.rms_eps);
  const T scale = T(1) / std::sqrt(static_cast<T>(c.head_dim));
  gk_.assign(static_cast<std::size_t>(L), {});
  gv_.assign(static_cast<std::size_t>(L), {});

  // LM head and final norm: dX = rmsnorm'(xL)·(dz·W_out)
  mm_nn<E, T>(exec_, CM(s.z), s.out_w, s.dh, false);
  rmsnorm_backward<E, T>(exec_, CM(s.xL), CVec<E>(w_->out_norm), eps, CM(s.dh), s.dX, false);
  // dx (+)= dy·W, plus the hook's input gradient (and its weight gradients)
  auto proj_back = [&](int l, Proj p, const M& x, const M& dy, const CM& w, const M& dx,
                       bool accumulate) {
    mm_nn<E, T>(exec_, CM(dy), w, dx, accumulate);
    if (hook_ && hook_->active(l, p)) hook_->backward(exec_, l, p, CM(x), CM(dy), dx);
  };
  // the K or V projection's: through the up factor B of a low-rank layer first (dy·B)
  auto kv_proj_back = [&](int l, Proj p, const M& x, const M& dy, const CM& w, const CM& up,
                          const M& dx) {
    if (!c.low_rank_kv()) return proj_back(l, p, x, dy, w, dx, true);
    const M dl = part<E, T>(s.lat, n, static_cast<int>(w.extent(0)));
    mm_nn<E, T>(exec_, CM(dy), up, dl, false);
    proj_back(l, p, x, dl, w, dx, true);
  };
  auto column_grad = [&](const M& g, const M& x, int width, std::vector<double>& out) {
    auto cs = Kokkos::subview(s.colsum, Kokkos::make_pair(0, width));
    column_products<E, T>(exec_, CM(g), CM(x), cs);
    exec_.fence();
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cs);
    out.assign(h.data(), h.data() + width);
  };
  for (int l = L - 1; l >= 0; --l) {
    interruption_point("backprop");
    auto& a = s.acts[static_cast<std::size_t>(l)];
    const auto& W = s.lw[static_cast<std::size_t>(l)];
    const LayerWeights<E>& lw = w_->layers[static_cast<std::size_t>(l)];
    const int dqk = c.qk_head_dim(l), dvw = c.v_head_dim(l);
    // MLP: x_next = x2 + (silu(g) ⊙ u)·W_downᵀ
    M m = part<E, T>(s.mid, n, c.d_ff);
    if (hook_ && hook_->active(l, Proj::Down))  // the input of W_down, recomputed
      swiglu_t<E, T>(exec_, CM(a.g), CM(a.u), m);
    proj_back(l, Proj::Down, m, s.dX, W.wd, s.dm, false);
    swiglu_backward<E, T>(exec_, CM(a.g), CM(a.u), CM(s.dm), s.dg, s.du);
    proj_back(l, Proj::Gate, a.xn2, s.dg, W.wg, s.dh, false);
    proj_back(l, Proj::Up, a.xn2, s.du, W.wu, s.dh, true);
    rmsnorm_backward<E, T>(exec_, CM(a.x2), CVec<E>(lw.ffn_norm), eps, CM(s.dh), s.dX, true);
    // attention: x2 = x + attention(rope(q), rope(k), v)·W_oᵀ
    M da = part<E, T>(s.da, n, c.att_dim(l)), dq = part<E, T>(s.dq, n, c.q_dim(l)),
      dk = part<E, T>(s.dk, n, c.k_dim(l)), dv = part<E, T>(s.dv, n, c.v_dim(l));
    proj_back(l, Proj::O, a.a, s.dX, W.wo, da, false);
    attention_backward<E, T>(exec_, CM(a.q), CM(a.k), CM(a.v), CM(a.a), CM(a.lse), CM(da), dq, dk,
                             dv, s.dsum, H, c.n_kv_head, dqk, dvw, scale);
    rope_units<E, T>(exec_, dq, dk, s.pos, CM(s.cos), CM(s.sin),
                     s.rope[static_cast<std::size_t>(l)], dqk, true);
    column_grad(dk, a.kpre, c.k_dim(l), gk_[static_cast<std::size_t>(l)]);
    column_grad(dv, a.v, c.v_dim(l), gv_[static_cast<std::size_t>(l)]);
    proj_back(l, Proj::Q, a.xn, dq, W.wq, s.dh, false);
    kv_proj_back(l, Proj::K, a.xn, dk, W.wk, W.ku, s.dh);
    kv_proj_back(l, Proj::V, a.xn, dv, W.wv, W.vu, s.dh);
    rmsnorm_backward<E, T>(exec_, CM(a.x), CVec<E>(lw.attn_norm), eps, CM(s.dh), s.dX, true);
  }
  exec_.fence();
}

template <class E, class T>
std::vector<double> Backprop<E, T>::input_grad() const {
  const State& s = *s_;
  require(s.have_forward, "backprop: no backward pass yet");
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.dX);
  return std::vector<double>(h.data(), h.data() + h.size());
}

#define SPARSIM_INSTANTIATE_BACKPROP(E) \
  template class Backprop<E, float>;    \
  template class Backprop<E, double>;
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_BACKPROP)

}  // namespace sparsim
