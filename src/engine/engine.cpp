#include "engine/engine.hpp"

#include "core/backends.hpp"
#include "core/device_blas.hpp"
#include "core/error.hpp"
#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "kernels/cached_attention.hpp"
#include "kernels/gather.hpp"
#include "kernels/gemv_device.hpp"
#include "kernels/pointwise.hpp"
#include "kernels/sparse_gemv.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <type_traits>
#include <utility>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

namespace sparsim {

namespace {
template <class E>
constexpr bool kOnHost =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible;

/// The view of m whose type is V (m's storage type must be V's).
template <class V, class E>
const V& view_as(const Matrix<E>& m) {
  if constexpr (std::is_same_v<V, decltype(m.f32)>)
    return m.f32;
  else if constexpr (std::is_same_v<V, decltype(m.bf16)>)
    return m.bf16;
  else
    return m.f16;
}

/// Calls f with the matrix's view in its storage type.
template <class E, class F>
void with_view(const Matrix<E>& m, F&& f) {
  if (m.dtype == DType::F32)
    f(m.f32);
  else if (m.dtype == DType::BF16)
    f(m.bf16);
  else
    f(m.f16);
}
}  // namespace

/// Instantiated CUDA graphs of a decode step, per sequence count.
template <class E>
struct Engine<E>::Graphs {
#if defined(KOKKOS_ENABLE_CUDA)
  std::map<int, cudaGraphExec_t> exec;
  ~Graphs() {
    for (auto& g : exec) cudaGraphExecDestroy(g.second);
  }
#endif
};

template <class E>
Engine<E>::~Engine() = default;

template <class E>
Engine<E>::Engine(std::shared_ptr<const Weights<E>> weights, int max_seqs, int max_ctx,
                  flops::Ledger* ledger, E exec)
    : w_(std::move(weights)),
      max_seqs_(max_seqs),
      max_ctx_(max_ctx),
      ledger_(ledger),
      exec_(exec),
      graphs_(std::make_unique<Graphs>()) {
  const Config& c = w_->cfg;
  scratch_.bf16_compute = w_->bf16_compute;
  require(max_seqs > 0, "engine: need at least one sequence, got {}", max_seqs);
  require(max_ctx > 0 && max_ctx <= c.context_length,
          "engine: context of {} tokens is outside the model's supported 1 … {}", max_ctx,
          c.context_length);
  if constexpr (!kOnHost<E>) {
    // a cache the device cannot hold is refused with its size, before anything is allocated
    double kv = 0, free_b = 0, total_b = 0;
    for (int l = 0; l < c.n_layer; ++l) {
      const AttnShape sh = attn_shape(c, l);
      kv +=
          4.0 * max_seqs * static_cast<double>(max_ctx) * (c.k_cache_width(l) + c.v_cache_width(l));
      (void)sh;
    }
    if (device_blas::memory_info(free_b, total_b))
      require(
          kv <= free_b,
          "out of device memory: the KV cache of {} sequence{} x {} positions needs {:.2f} GiB, "
          "{:.2f} GiB of the GPU's {:.2f} GiB are free (fewer sequences or a shorter context "
          "need less)",
          max_seqs, max_seqs == 1 ? "" : "s", max_ctx, kv / (1 << 30), free_b / (1 << 30),
          total_b / (1 << 30));
  }
  cache_ = KVCache<E>(c, max_seqs, max_ctx);
  if (c.low_rank_kv()) {
    k_rebuilt_ = Cache<E>("sparsim::k_rebuilt", max_seqs, max_ctx, c.kv_dim());
    v_rebuilt_ = Cache<E>("sparsim::v_rebuilt", max_seqs, max_ctx, c.kv_dim());
    ctx_pos_ = IVec<E>("sparsim::ctx_pos", max_ctx);
    auto hp = Kokkos::create_mirror_view(ctx_pos_);
    for (int p = 0; p < max_ctx; ++p) hp(p) = p;
    Kokkos::deep_copy(ctx_pos_, hp);
  }
  // a pruned layer that kept every channel rotates pair by pair, as a dense one (bitwise)
  if (c.pruned())
    for (int l = 0; l < c.n_layer; ++l) {
      bool full = c.qk_head_dim(l) == c.head_dim;
      for (int h = 0; h < c.n_kv_head && full; ++h)
        for (int i = 0; i < c.head_dim && full; ++i) full = c.k_channel(l, h, i) == i;
      const RopeUnits u = c.rope_units(l);
      rope_map_.push_back(full ? RopeMap<E>{} : make_rope_map<E>(u));
      // the fused decode kernel rotates whole pairs only (RAP; KVPruner when no pair was split)
      bool pairs = !full && 2 * u.units == c.qk_head_dim(l);
      for (std::size_t i = 0; i < u.i0.size() && pairs; ++i) pairs = u.i0[i] >= 0 && u.i1[i] >= 0;
      rope_pairs_only_.push_back(full || pairs);
    }
  // RoPE angles in double precision on the host, then rounded once to fp32.
  // (a naively re-paired pruned model adds the frequencies of its reduced heads)
  const std::vector<double> inv = c.rope_inv_freq(w_->rope_freq_factors);
  const int half = static_cast<int>(inv.size());
  cos_ = Mat<E>("sparsim::rope_cos", max_ctx, half);
  sin_ = Mat<E>("sparsim::rope_sin", max_ctx, half);
  auto hc = Kokkos::create_mirror_view(cos_);
  auto hs = Kokkos::create_mirror_view(sin_);
  for (int p = 0; p < max_ctx; ++p)
    for (int j = 0; j < half; ++j) {
      const double a = p * inv[j];
      hc(p, j) = static_cast<float>(std::cos(a));
      hs(p, j) = static_cast<float>(std::sin(a));
    }
  Kokkos::deep_copy(cos_, hc);
  Kokkos::deep_copy(sin_, hs);
  set_device_path(false);  // on devices: on, whatever the argument
}

template <class E>
void Engine<E>::ensure_rows(int n, int n_out) {
  const Config& c = w_->cfg;
  if (n > cap_rows_ || n_out > cap_out_) graphs_ = std::make_unique<Graphs>();  // stale pointers
  if (n > cap_rows_) {
    auto alloc = [](const char* name, int r, int cols) {
      return Mat<E>(Kokkos::view_alloc(std::string(name), Kokkos::WithoutInitializing), r, cols);
    };
    x_ = alloc("sparsim::x", n, c.d_model);
    xn_ = alloc("sparsim::xn", n, c.d_model);
    q_ = alloc("sparsim::q", n, c.max_q_dim());
    k_ = alloc("sparsim::k", n, c.max_k_dim());
    v_ = alloc("sparsim::v", n, c.max_v_dim());
    att_ = alloc("sparsim::att", n, c.max_att_dim());
    tmp_ = alloc("sparsim::tmp", n, c.d_model);
    rx_ = alloc("sparsim::rx", n, c.d_model);
    sparse_flags_ = IVec<E>("sparsim::sparse_rows", n);
    sparse_flags_host_ = Kokkos::create_mirror_view(sparse_flags_);
    gate_ = alloc("sparsim::gate", n, c.max_d_ff());
    up_ = alloc("sparsim::up", n, c.max_d_ff());
    tok_ = IVec<E>("sparsim::tokens", n);
    pos_ = IVec<E>("sparsim::positions", n);
    seq_ = IVec<E>("sparsim::sequences", n);
    skip_ = IVec<E>("sparsim::gate::skip", n);
    skip_host_ = Kokkos::create_mirror_view(skip_);
    keep_rows_ = IVec<E>("sparsim::gate::keep_rows", n);
    keep_seq_ = IVec<E>("sparsim::gate::keep_seq", n);
    keep_pos_ = IVec<E>("sparsim::gate::keep_pos", n);
    keep_slot_ = IVec<E>("sparsim::gate::keep_slot", n);
    keep_flags_ = IVec<E>("sparsim::gate::keep_sparse_flags", n);
    kpre_ = Mat<E>();  // allocated on demand (pre-RoPE gates only)
    xg_ = alloc("sparsim::gate::x_kept", n, c.d_model);
    og_ = alloc("sparsim::gate::o_kept", n, c.d_model);
    cap_rows_ = n;
  }
  if (n_out > cap_out_) {
    logits_ =
        Mat<E>(Kokkos::view_alloc("sparsim::logits", Kokkos::WithoutInitializing), n_out, c.vocab);
    last_ = Mat<E>("sparsim::last", n_out, c.d_model);
    last_rows_ = IVec<E>("sparsim::last_rows", n_out);
    cap_out_ = n_out;
  }
}

template <class E>
void Engine<E>::mark(flops::Op op) {
  if (!profile_) return;
  exec_.fence();
  const double now = clock_seconds(profile_clock_);
  op_seconds_[static_cast<int>(op)] += now - t_mark_;
  t_mark_ = now;
}

namespace {
// A row-major view over the first n rows of a capacity buffer.
template <class E>
Mat<E> rows(const Mat<E>& buf, int n) {
  return Mat<E>(buf.data(), n, buf.extent(1));
}
// The first n·cols elements of a capacity buffer as n rows of `cols` (a layer's own width).
template <class E>
Mat<E> rows(const Mat<E>& buf, int n, int cols) {
  return Mat<E>(buf.data(), n, cols);
}

flops::Op op_of(Proj p) {
  switch (p) {
    case Proj::Q:
      return flops::Op::QProj;
    case Proj::K:
      return flops::Op::KProj;
    case Proj::V:
      return flops::Op::VProj;
    case Proj::O:
      return flops::Op::OProj;
    case Proj::Gate:
      return flops::Op::GateProj;
    case Proj::Up:
      return flops::Op::UpProj;
    case Proj::Down:
      break;
  }
  return flops::Op::DownProj;
}
}  // namespace

template <class E>
void Engine<E>::plain_proj(const CMat<E>& x, const Matrix<E>& w, const Mat<E>& y, flops::Op op,
                           int layer, flops::Phase ph, double realised_fraction, int dense_rows) {
  const double n = static_cast<double>(x.extent(0));
  if (n > 0) {
    linear(exec_, x, w, y, scratch_, seg_);
    mark(op);
  }
  if (ledger_) {
    // A token gate runs the kept rows only: the dense run would have run `dense_rows`.
    const double nd = dense_rows < 0 ? n : static_cast<double>(dense_rows);
    const double fl = 2.0 * nd * w.rows * w.cols;
    const double by = static_cast<double>(w.bytes()) + 4.0 * nd * (w.rows + w.cols);
    // Realised FLOPs are 2 · rows · (multiply-adds kept), an integer: rounding the product
    // removes the error of the fraction, so the sums do not depend on how rows are batched.
    const double fr = std::round(2.0 * n * w.rows * w.cols * realised_fraction);
    const double br =
        n > 0 ? (static_cast<double>(w.bytes()) + 4.0 * n * (w.rows + w.cols)) * realised_fraction
              : 0.0;
    // 16-bit weights over many rows are widened to fp32 first: a second kernel
    const std::uint64_t launches = n == 0 ? 0 : w.dtype != DType::F32 && n >= kWidenRows ? 2 : 1;
    ledger_->add(op, layer, ph, fl, fr, by, br, launches);
  }
}

template <class E>
void Engine<E>::proj(const CMat<E>& x, Proj p, int layer, const Mat<E>& y, flops::Phase ph,
                     const SparseRows<E>& rows, int dense_rows) {
  const Matrix<E>& w = w_->layers[layer].proj(p);
  if (!masker_ || rows.count == 0 || !masker_->active(layer, p) || x.extent(0) == 0) {
    plain_proj(x, w, y, op_of(p), layer, ph, 1.0, dense_rows);
    return;
  }
  int ticket = -1;
  if (!wt_.empty() && x.extent(0) == 1 && dense_rows <= 1) {
    const Matrix<E>& t = wt_[static_cast<std::size_t>(layer)][static_cast<std::size_t>(p)];
    const CVec<E> xr(x.data(), w.cols);
    const Vec<E> yr(y.data(), w.rows);
    float tau = 0;
    IVec<E> nnz;
    if (device_path_ && masker_->threshold_slot(layer, p, w.cols, tau, nnz, ticket)) {
      // a plain threshold: the GEMV keeps |x_j| >= tau itself, no selection kernel
      mark(flops::Op::MaskSelect);
      with_view(t, [&](const auto& v) {
        sparse_gemv_split<true>(exec_, xr, IVec<E>(), nnz, tau, v, yr, sparse_ws_);
      });
    } else {
      nnz = masker_->indices(exec_, layer, p, x, idx_, Vec<E>(), ticket);
      mark(flops::Op::MaskSelect);
      with_view(t, [&](const auto& v) { sparse_gemv(exec_, xr, idx_, nnz, v, yr, sparse_ws_); });
    }
    mark(op_of(p));
    if (ledger_)
      pending_.push_back({op_of(p), layer, ph, static_cast<double>(w.rows),
                          static_cast<double>(w.cols), 1.0, 1.0, static_cast<double>(w.bytes()), -1,
                          ticket});
    return;
  }
  const CMat<E> xm = masker_->apply(exec_, layer, p, x, rows, ticket);
  mark(flops::Op::MaskSelect);
  linear(exec_, xm, w, y, scratch_);
  mark(op_of(p));
  if (ledger_) {
    const double n = static_cast<double>(x.extent(0));
    pending_.push_back({op_of(p), layer, ph, static_cast<double>(w.rows),
                        static_cast<double>(w.cols), n,
                        dense_rows < 0 ? n : static_cast<double>(dense_rows),
                        static_cast<double>(w.bytes()), rows.count, ticket});
  }
}

template <class E>
void Engine<E>::finish_call() {
  if (!masker_) return;
  masker_->end_call(exec_);
  if (ledger_)
    for (const PendingMasked& e : pending_) {
      const double kept = static_cast<double>(masker_->kept(e.ticket));
      if (e.sparse_rows < 0) {  // column-skipping decode: one row, only its kept columns
        const double fl = 2.0 * e.rows * e.cols, f = kept / e.cols;
        const double by = e.bytes + 4.0 * (e.rows + e.cols);
        ledger_->add(flops::Op::MaskSelect, e.layer, e.ph, 0, e.cols, 0, 4.0 * e.cols);
        ledger_->add(e.op, e.layer, e.ph, fl, fl * f, by, by * f);
      } else {
        // selection reads each sparse row a few times; count one compare per entry
        const double sel = e.sparse_rows * e.cols;
        ledger_->add(flops::Op::MaskSelect, e.layer, e.ph, 0, sel, 0, 4.0 * sel);
        // realised work: dense rows use every column, sparse rows only their kept ones; a
        // token gate runs the kept rows only, where the dense run would run dense_n
        const double frac = ((e.n - e.sparse_rows) * e.cols + kept) / (e.n * e.cols);
        const double fl = 2.0 * e.dense_n * e.rows * e.cols;
        const double by = e.bytes + 4.0 * e.dense_n * (e.rows + e.cols);
        const double fr = 2.0 * e.n * e.rows * e.cols * frac;
        const double br = (e.bytes + 4.0 * e.n * (e.rows + e.cols)) * frac;
        ledger_->add(e.op, e.layer, e.ph, fl, fr, by, br);
      }
    }
  pending_.clear();
}

namespace {
template <class E, class T>
void transpose_into(const E& exec, const Kokkos::View<T**, Layout, DeviceOf<E>>& src,
                    const Kokkos::View<T**, Layout, DeviceOf<E>>& dst) {
  Kokkos::parallel_for(
      "sparsim::engine::transpose",
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(
          exec, {0, 0}, {static_cast<int>(src.extent(0)), static_cast<int>(src.extent(1))})),
      KOKKOS_LAMBDA(const int r, const int c) { dst(c, r) = src(r, c); });
}
}  // namespace

template <class E>
void Engine<E>::use_column_skipping(bool on) {
  wt_.clear();
  if (!on) return;
  const Config& c = w_->cfg;
  int widest = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    std::array<Matrix<E>, kNumProj> m;
    for (int i = 0; i < kNumProj; ++i) {
      const Matrix<E>& w = w_->layers[l].proj(static_cast<Proj>(i));
      Matrix<E>& t = m[static_cast<std::size_t>(i)];
      t.dtype = w.dtype;
      t.rows = w.cols;  // the transposed matrix is stored [in][out]
      t.cols = w.rows;
      widest = std::max(widest, w.cols);
      if (w.dtype == DType::F32) {
        t.f32 = decltype(t.f32)("sparsim::wt", w.cols, w.rows);
        transpose_into(exec_, w.f32, t.f32);
      } else if (w.dtype == DType::BF16) {
        t.bf16 = decltype(t.bf16)("sparsim::wt", w.cols, w.rows);
        transpose_into(exec_, w.bf16, t.bf16);
      } else {
        t.f16 = decltype(t.f16)("sparsim::wt", w.cols, w.rows);
        transpose_into(exec_, w.f16, t.f16);
      }
    }
    wt_.push_back(std::move(m));
  }
  idx_ = IVec<E>("sparsim::engine::kept_idx", widest);
  int widest_out = 0;
  for (const auto& lw : w_->layers)
    for (int i = 0; i < kNumProj; ++i)
      widest_out = std::max(widest_out, lw.proj(static_cast<Proj>(i)).rows);
  sparse_ws_.ensure(widest, widest_out);
  exec_.fence();
}

template <class E>
void Engine<E>::set_positions(int n_seq, int T, int p0) {
  seg_ = T;
  auto hp = Kokkos::create_mirror_view(pos_);
  auto hs = Kokkos::create_mirror_view(seq_);
  for (int s = 0; s < n_seq; ++s)
    for (int t = 0; t < T; ++t) {
      hp(s * T + t) = p0 + t;
      hs(s * T + t) = s;
    }
  Kokkos::deep_copy(exec_, pos_, hp);
  Kokkos::deep_copy(exec_, seq_, hs);
  // A call at position 0 starts new sequences: the cache returns to its dense layout.
  if (p0 == 0)
    for (int l = 0; l < cache_.n_layer(); ++l) {
      // the dense key buffer is reallocated: captured decode graphs hold the old one
      if (cache_.layer(l).compacted() || cache_.layer(l).has_evictions())
        graphs_ = std::make_unique<Graphs>();
      cache_.reset_layout(l);
      cache_.clear_dropped(l);
      cache_.clear_evicted(l);
      cache_.reset_tokens(l);
      // a gate that drops skipped tokens: its layers keep only the kept tokens (unless a
      // channel selector or token evictor, which read the prompt at its positions, runs too)
      const bool compact = drop_compaction_ && tgate_ && tgate_->drop_skipped() &&
                           tgate_->active(l) && !selector_ && !evictor_;
      if (compact != cache_.token_compacted(l)) {
        graphs_ = std::make_unique<Graphs>();
        cache_.set_token_compaction(l, compact);
      }
    }
  // rows the masker sparsifies
  const int t0 = sparse_from_ == kDecodeOnly ? (T == 1 ? 0 : T) : sparse_from_;
  sparse_.count = masker_ ? n_seq * std::max(0, T - std::min(T, t0)) : 0;
  h_sparse_flags_.assign(static_cast<std::size_t>(n_seq) * T, 0);
  if (sparse_.count > 0) {
    auto& hf = sparse_flags_host_;
    for (int s = 0; s < n_seq; ++s)
      for (int t = 0; t < T; ++t) {
        hf(s * T + t) = t >= t0 ? 1 : 0;
        h_sparse_flags_[static_cast<std::size_t>(s * T + t)] = t >= t0 ? 1 : 0;
      }
    Kokkos::deep_copy(exec_, sparse_flags_, hf);
  }
  sparse_.flags = IVec<E>(sparse_flags_.data(), n_seq * T);
  sparse_.host_flags = Kokkos::subview(sparse_flags_host_, std::make_pair(0, n_seq * T));
  pending_.clear();
  if (masker_) masker_->begin_call(n_seq * T);
  if (tgate_) tgate_->begin_call(exec_, n_seq, T, p0);
}

template <class E>
void Engine<E>::block(int l, const Mat<E>& x_in, int n_seq, int T, int p0, flops::Phase ph) {
  if (use_fused(T) && fusable(l)) {
    cache_.note_written(l, n_seq, 1, p0);
    block_fused(l, x_in, n_seq, p0, ph);
    return;
  }
  const Config& c = w_->cfg;
  const LayerWeights<E>& lw = w_->layers[l];
  const int n = n_seq * T;
  IVec<E> pos(pos_.data(), n);
  Mat<E> x = x_in, xn = rows(xn_, n), q = rows(q_, n, c.q_dim(l)), k = rows(k_, n, c.k_dim(l)),
         v = rows(v_, n, c.v_dim(l)), att = rows(att_, n, c.att_dim(l)), tmp = rows(tmp_, n),
         gate = rows(gate_, n, c.d_ff_at(l)), up = rows(up_, n, c.d_ff_at(l)), rx = rows(rx_, n);
  const bool rot = w_->rotated();
  observe(l, Site::BlockIn, x);
  rmsnorm(exec_, CMat<E>(x), CVec<E>(lw.attn_norm), c.rms_eps, xn);
  mark(flops::Op::RMSNorm);
  observe(l, Site::Attn, xn);
  const bool gated = tgate_ && tgate_->active(l);
  const bool tok_compact = cache_.token_compacted(l);
  check_layer_policies(l, gated, tok_compact);
  h_slot_.clear();

  // Attention: Q, K, V of the rows, RoPE, the cache, attention and W_o into tmp.
  std::vector<int> h_skip;  // the gate's decisions on the host (empty: none skipped, or not needed)
  int n_keep = n;
  if (c.low_rank_kv()) {
    attention_low_rank(l, xn, q, att, tmp, n_seq, T, p0, ph);
  } else {
    if (!gated)
      qkv_rows(l, xn, q, k, v, pos, n_seq, T, p0, ph);
    else
      n_keep = gate_rows(l, xn, k, v, pos, n_seq, T, p0, ph, tok_compact, h_skip);
    if (n_keep == n)
      attend_rows(l, x, xn, q, att, tmp, pos, n, n_seq, T, p0, ph, gated);
    else
      attend_kept_rows(l, xn, tmp, h_skip, n, n_keep, n_seq, T, p0, ph, tok_compact);
  }
  if (record_mass_ && !cache_.layer(l).compacted() && !tok_compact && n_keep == n &&
      !c.low_rank_kv())
    sparsim::attention_mass(exec_, CMat<E>(q), cache_.layer(l), cache_.shape(l), n_seq, T, p0,
                            mass_[static_cast<std::size_t>(l)],
                            mass_queries_[static_cast<std::size_t>(l)]);
  add_output_bias(l, lw.o_bias, tmp, n, ph);
  residual_add(l, x, tmp, rx, rot ? &w_->rot_attn_mlp[l] : nullptr, n, ph);

  // MLP: SwiGLU of the normed rows into tmp.
  rmsnorm(exec_, CMat<E>(x), CVec<E>(lw.ffn_norm), c.rms_eps, xn);
  mark(flops::Op::RMSNorm);
  observe(l, Site::Mlp, xn);
  proj(xn, Proj::Gate, l, gate, ph);
  proj(xn, Proj::Up, l, up, ph);
  swiglu(exec_, gate, CMat<E>(up));
  mark(flops::Op::SwiGLU);
  observe(l, Site::Down, gate);
  prune_structured(l, Site::Down, x, gate, ph);
  proj(gate, Proj::Down, l, tmp, ph);
  add_output_bias(l, lw.down_bias, tmp, n, ph);
  residual_add(l, x, tmp, rx, rot ? &w_->rot_mlp_next[l] : nullptr, n, ph);
  block_ledger(l, n, n_keep, n_seq, T, p0, ph, h_skip.empty() ? nullptr : h_skip.data(), false,
               gated, h_slot_.empty() ? nullptr : h_slot_.data());
}

template <class E>
void Engine<E>::check_layer_policies(int l, bool gated, bool tok_compact) const {
  const Config& c = w_->cfg;
  require(!c.structured() || (!gated && !selector_),
          "a structurally pruned model ({}) runs without token gating and K-channel pruning",
          c.prune.method);
  require(!(pruner_ && pruner_->active(l)) || (!c.structured() && !c.low_rank_kv() && !gated),
          "Probe Pruning runs on a model that is neither structurally pruned nor low-rank, "
          "without token gating");
  require(!tok_compact || (gated && tgate_->drop_skipped()),
          "layer {} holds only the tokens a dropping token gate kept (these sequences started "
          "with it); continue them with that gate, or start new sequences at position 0",
          l);
  require(!c.low_rank_kv() || (!gated && !selector_ && !evictor_),
          "a low-rank K/V model ({}) caches latents: token gating, K-channel pruning and token "
          "eviction act on cached keys and do not apply to it",
          c.prune.method);
}

template <class E>
void Engine<E>::residual_add(int l, const Mat<E>& x, const Mat<E>& tmp, const Mat<E>& rx,
                             const Matrix<E>* r, int n, flops::Phase ph) {
  if (r) {
    // x ← x·Rᵀ + tmp: WINA's online re-rotation of a rotated model's residual stream, work a
    // dense, unrotated model does not do (dense = 0)
    linear(exec_, CMat<E>(x), *r, rx, scratch_, seg_);
    mark(flops::Op::Rotation);
    if (ledger_) {
      const double fl = 2.0 * n * r->rows * r->cols;
      ledger_->add(flops::Op::Rotation, l, ph, 0, fl, 0,
                   static_cast<double>(r->bytes()) + 8.0 * n * r->rows);
    }
    add_inplace(exec_, rx, CMat<E>(tmp));
    Kokkos::deep_copy(exec_, x, rx);
  } else {
    add_inplace(exec_, x, CMat<E>(tmp));  // x ← x + tmp
  }
  mark(flops::Op::Residual);
}

template <class E>
void Engine<E>::add_output_bias(int l, const Kokkos::View<float*, DeviceOf<E>>& b,
                                const Mat<E>& tmp, int n, flops::Phase ph) {
  // a structurally pruned layer: W_o and W_down outputs carry biases
  if (b.extent(0) == 0) return;
  const Config& c = w_->cfg;
  add_row_bias(exec_, tmp, CVec<E>(b));
  mark(flops::Op::Residual);
  if (ledger_) {
    const double nd = static_cast<double>(n) * c.d_model;
    ledger_->add(flops::Op::Residual, l, ph, nd, nd, 8.0 * nd + 4.0 * c.d_model,
                 8.0 * nd + 4.0 * c.d_model, 1);
  }
}

template <class E>
void Engine<E>::attention_low_rank(int l, const Mat<E>& xn, const Mat<E>& q, const Mat<E>& att,
                                   const Mat<E>& tmp, int n_seq, int T, int p0, flops::Phase ph) {
  // the cache holds the latents A·x; keys and values are rebuilt at attention time
  const Config& c = w_->cfg;
  const int n = n_seq * T;
  IVec<E> pos(pos_.data(), n);
  Mat<E> hk = rows(k_, n, c.k_cache_width(l)), hv = rows(v_, n, c.v_cache_width(l));
  proj(xn, Proj::Q, l, q, ph);
  proj(xn, Proj::K, l, hk, ph);
  proj(xn, Proj::V, l, hv, ph);
  rope(l, q, pos, true);
  mark(flops::Op::RoPE);
  cache_.store(exec_, l, CMat<E>(hk), CMat<E>(hv), n_seq, T, p0);
  attend_low_rank(l, CMat<E>(q), att, n_seq, T, p0, ph);
  observe(l, Site::O, att);
  proj(att, Proj::O, l, tmp, ph);
}

template <class E>
void Engine<E>::qkv_rows(int l, const Mat<E>& xn, const Mat<E>& q, const Mat<E>& k, const Mat<E>& v,
                         const IVec<E>& pos, int n_seq, int T, int p0, flops::Phase ph) {
  // (the same kernels as the gated path, so that a gate that skips nothing is bitwise dense)
  proj(xn, Proj::Q, l, q, ph);
  proj(xn, Proj::K, l, k, ph);
  proj(xn, Proj::V, l, v, ph);
  rope_qk(l, q, k, pos);
  mark(flops::Op::RoPE);
  cache_.store(exec_, l, CMat<E>(k), CMat<E>(v), n_seq, T, p0);
}

template <class E>
int Engine<E>::gate_rows(int l, const Mat<E>& xn, const Mat<E>& k, const Mat<E>& v,
                         const IVec<E>& pos, int n_seq, int T, int p0, flops::Phase ph,
                         bool tok_compact, std::vector<int>& h_skip) {
  const int n = n_seq * T;
  // K and V of every row enter the cache before the gate looks at them.
  proj(xn, Proj::K, l, k, ph);
  proj(xn, Proj::V, l, v, ph);
  Mat<E> kg = k;
  if (tgate_->pre_rope_keys()) {
    if (kpre_.extent(0) < static_cast<std::size_t>(n) || kpre_.extent(1) != k.extent(1))
      kpre_ = Mat<E>(
          Kokkos::view_alloc(std::string("sparsim::gate::k_pre_rope"), Kokkos::WithoutInitializing),
          cap_rows_, k.extent(1));
    kg = rows(kpre_, n);
    Kokkos::deep_copy(exec_, kg, k);
  }
  rope(l, k, pos, false);
  mark(flops::Op::RoPE);
  // (a token-compacted layer stores after the decision: only the kept rows enter it)
  if (!tok_compact) cache_.store(exec_, l, CMat<E>(k), CMat<E>(v), n_seq, T, p0);
  IVec<E> skip(skip_.data(), n);
  PolicyCost gc;
  const int n_skip = tgate_->decide(exec_, l, CMat<E>(kg), CMat<E>(v), skip, gc);
  mark(flops::Op::GateSimilarity);
  if (ledger_) ledger_->add(flops::Op::GateSimilarity, l, ph, 0, gc.flops, 0, gc.bytes);
  if (n_skip > 0 && gate_on_host(tok_compact, T, p0)) {
    const auto hs = Kokkos::subview(skip_host_, std::make_pair(0, n));
    Kokkos::deep_copy(exec_, hs, skip);
    exec_.fence();
    h_skip.assign(hs.data(), hs.data() + n);
  }
  const int* hsk = h_skip.empty() ? nullptr : h_skip.data();
  if (tok_compact) {
    h_slot_ = cache_.store_kept(exec_, l, CMat<E>(k), CMat<E>(v), hsk, n_seq, T, p0);
    mark(flops::Op::RoPE);  // (the cache append's time goes with RoPE's, as on the dense path)
  } else if (tgate_->drop_skipped()) {
    cache_.set_dropped(exec_, l, skip, hsk, n_seq, T, p0);
  }
  return n - n_skip;
}

template <class E>
bool Engine<E>::gate_on_host(bool tok_compact, int T, int p0) const {
  return ledger_ || tok_compact || tgate_->drop_skipped() || (masker_ && sparse_.count > 0) ||
         (p0 == 0 && T > 1 && (selector_ || evictor_));
}

template <class E>
void Engine<E>::attend_rows(int l, const Mat<E>& x, const Mat<E>& xn, const Mat<E>& q,
                            const Mat<E>& att, const Mat<E>& tmp, const IVec<E>& pos, int n,
                            int n_seq, int T, int p0, flops::Phase ph, bool gated) {
  if (gated) {  // the gate kept every row: their queries now
    proj(xn, Proj::Q, l, q, ph);
    rope(l, q, pos, true);
    mark(flops::Op::RoPE);
  }
  attend(l, CMat<E>(q), att, n_seq, T, p0);
  if (p0 == 0 && T > 1) after_prefill(l, n_seq, T, CMat<E>(q), nullptr, n, ph);
  observe(l, Site::O, att);  // (the probe's states: the unpruned input)
  prune_structured(l, Site::O, x, att, ph);
  proj(att, Proj::O, l, tmp, ph);
}

template <class E>
void Engine<E>::attend_kept_rows(int l, const Mat<E>& xn, const Mat<E>& tmp,
                                 const std::vector<int>& h_skip, int n, int n_keep, int n_seq,
                                 int T, int p0, flops::Phase ph, bool tok_compact) {
  // Gather the kept rows, run Q projection, attention and O projection on them alone, and
  // scatter the O output back; skipped rows get zeros (the residual passes through).
  const Config& c = w_->cfg;
  const AttnShape& sh = cache_.shape(l);
  const IVec<E> kr(keep_rows_.data(), n_keep), ks(keep_seq_.data(), n_keep),
      kp(keep_pos_.data(), n_keep), kf(keep_flags_.data(), n_keep);
  // the lists are made on the device from the gate's flags
  if (n_keep > 0)
    list_kept_rows(exec_, IVec<E>(skip_.data(), n), sparse_.count > 0 ? sparse_.flags : IVec<E>(),
                   T, p0, kr, ks, kp, kf);
  SparseRows<E> krows;
  krows.flags = kf;
  h_keep_rows_.clear();
  if (!h_skip.empty()) {
    // the host's copy, for the masker's per-row statistics, the selector's or evictor's
    // observed rows and a token-compacted layer's slots
    for (int r = 0; r < n; ++r)
      if (!h_skip[static_cast<std::size_t>(r)]) h_keep_rows_.push_back(r);
    if (n_keep > 0 && sparse_.count > 0) {
      auto hf = Kokkos::create_mirror_view(kf);
      for (int i = 0; i < n_keep; ++i) {
        hf(i) =
            h_sparse_flags_[static_cast<std::size_t>(h_keep_rows_[static_cast<std::size_t>(i)])];
        krows.count += hf(i);
      }
      krows.host_flags = hf;
    }
    krows.origin = h_keep_rows_.data();
  }
  const Mat<E> xg = rows(xg_, n_keep), qg = rows(q_, n_keep, c.q_dim(l)),
               ag = rows(att_, n_keep, c.att_dim(l)), og = rows(og_, n_keep);
  if (n_keep > 0) {
    gather_rows(exec_, CMat<E>(xn), kr, xg);
    mark(flops::Op::GatherScatter);
  }
  proj(CMat<E>(xg), Proj::Q, l, qg, ph, krows, n);
  if (n_keep > 0) {
    rope(l, qg, kp, true);
    mark(flops::Op::RoPE);
    IVec<E> kat = kp;  // the cache index each kept row attends up to
    if (tok_compact) {
      kat = IVec<E>(keep_slot_.data(), n_keep);
      auto hsl = Kokkos::create_mirror_view(kat);
      for (int i = 0; i < n_keep; ++i)
        hsl(i) = h_slot_[static_cast<std::size_t>(h_keep_rows_[static_cast<std::size_t>(i)])];
      Kokkos::deep_copy(exec_, kat, hsl);
    }
    cached_attention(exec_, CMat<E>(qg), ks, kat, cache_.layer(l), sh, ag, p0 + T);
    mark(flops::Op::AttnScore);
  }
  if (p0 == 0 && T > 1) after_prefill(l, n_seq, T, CMat<E>(qg), h_keep_rows_.data(), n_keep, ph);
  proj(CMat<E>(ag), Proj::O, l, og, ph, krows, n);
  scatter_rows(exec_, CMat<E>(og), kr, tmp);
  mark(flops::Op::GatherScatter);
  if (ledger_) {  // read and write the kept rows twice (gather, scatter), zero the output
    const double g = static_cast<double>(n_keep) * c.d_model;
    const double z = static_cast<double>(n) * c.d_model;
    ledger_->add(flops::Op::GatherScatter, l, ph, 0, 0, 0, 4.0 * (4.0 * g + z));
  }
}

template <class E>
void Engine<E>::prune_structured(int l, Site site, const Mat<E>& x, const Mat<E>& in,
                                 flops::Phase ph) {
  if (!pruner_ || !pruner_->active(l)) return;
  PolicyCost pc;
  pruner_->prune(exec_, l, site, CMat<E>(x), in, pc);
  mark(flops::Op::Other);
  if (ledger_) ledger_->add(flops::Op::Other, l, ph, 0, pc.flops, 0, pc.bytes);
}

template <class E>
void Engine<E>::block_ledger(int l, int n, int n_keep, int n_seq, int T, int p0, flops::Phase ph,
                             const int* skip, bool fused, bool gated, const int* slots) {
  if (!ledger_) return;
  const Config& c = w_->cfg;
  const AttnShape& sh = cache_.shape(l);
  const double nd = static_cast<double>(n) * c.d_model;
  // launches: the kernels each entry stands for. Op by op: two norms, the K and Q rotations
  // (one launch; two where a token gate rotates the keys before it decides), the KV append and the
  // attention kernel (scores, softmax and value mix in one), SwiGLU, two residual updates (rotated
  // model: each an add and a copy back). Fused decode: norms, RoPE, SwiGLU and the residual updates
  // run inside the projections' kernels; attention is the split-K kernel and its combine.
  // Fused, each of these ops takes part in a projection's launch (launches) and owns no kernel
  // of its own (kernels 0).
  const bool rot = w_->rotated();
  ledger_->add(flops::Op::RMSNorm, l, ph, 2 * 4.0 * nd, 2 * 4.0 * nd, 2 * 8.0 * nd, 2 * 8.0 * nd, 2,
               fused ? 0 : 2);
  const double qw = sh.q_width(), kw = sh.k_width();
  const double rf = 6.0 * n * (qw + kw) / 2, rr = 6.0 * (n_keep * qw + n * kw) / 2;
  const int rope_launches = fused || !(gated && n_keep > 0) ? 1 : 2;
  ledger_->add(flops::Op::RoPE, l, ph, rf, rr, 8.0 * n * (qw + kw), 8.0 * (n_keep * qw + n * kw),
               rope_launches, fused ? 0 : rope_launches);
  attention_ledger(l, ph, n_seq, T, p0, skip, fused ? 1 : 2, slots);
  const double ff = c.d_ff_at(l), sw = 6.0 * n * ff;
  ledger_->add(flops::Op::SwiGLU, l, ph, sw, sw, 12.0 * n * ff, 12.0 * n * ff, 1, fused ? 0 : 1);
  const int res_launches = fused || !rot ? 2 : 4;
  ledger_->add(flops::Op::Residual, l, ph, 2 * nd, 2 * nd, 2 * 12.0 * nd, 2 * 12.0 * nd,
               res_launches, fused ? 0 : res_launches);
}

template <class E>
void Engine<E>::rope(int l, const Mat<E>& x, const IVec<E>& pos, bool is_q) {
  const Mat<E> none;
  if (is_q)
    rope_qk(l, x, none, pos);
  else
    rope_qk(l, none, x, pos);
}

template <class E>
void Engine<E>::rope_qk(int l, const Mat<E>& q, const Mat<E>& k, const IVec<E>& pos) {
  const Config& c = w_->cfg;
  if (const RopeMap<E>* map = pruned_rope(l)) {
    rope_units(exec_, q, k, pos, CMat<E>(cos_), CMat<E>(sin_), *map, c.qk_head_dim(l));
    return;
  }
  sparsim::rope(exec_, q, k, pos, CMat<E>(cos_), CMat<E>(sin_), c.head_dim,
                c.rope_layout == RopeLayout::Adjacent);
}

template <class E>
KeyMass<E>* Engine<E>::key_mass(int l, int n_seq, int T, int p0) {
  // H2O's votes are the weights of this prompt's attention: summed by its kernel as it goes
  if (!kOnHost<E> || p0 != 0 || T < 2 || !evictor_ || !evictor_->votes_are_key_mass() ||
      !evictor_->evicts(T))
    return nullptr;
  // the kernel's partial sums, a row of T floats per (sequence, query head, tile of rows): past
  // kKeyMassBytes the separate pass, whose scores go in bounded blocks, is the cheaper in memory
  constexpr double kKeyMassBytes = 256.0 * (1 << 20);
  const double tiles = (T + detail::kAttnTileRows - 1) / detail::kAttnTileRows;
  if (4.0 * n_seq * cache_.shape(l).n_head * tiles * T > kKeyMassBytes) return nullptr;
  const int nkv = cache_.shape(l).n_kv_head;
  if (key_mass_.votes.extent(0) < static_cast<std::size_t>(n_seq) ||
      key_mass_.votes.extent(1) != static_cast<std::size_t>(nkv) ||
      key_mass_.votes.extent(2) < static_cast<std::size_t>(T))
    key_mass_.votes = Kokkos::View<double***, Layout, DeviceOf<E>>(
        Kokkos::view_alloc(std::string("sparsim::evictor::key_mass"), Kokkos::WithoutInitializing),
        max_seqs_, nkv, max_ctx_);
  key_mass_.seconds = 0;
  key_mass_layer_ = l;
  return &key_mass_;
}

template <class E>
void Engine<E>::attend(int l, const CMat<E>& q, const Mat<E>& out, int n_seq, int T, int p0) {
  key_mass_layer_ = -1;
  const KVLayer<E>& kv = cache_.layer(l);
  const AttnShape& sh = cache_.shape(l);
  const int hd = w_->cfg.head_dim;
  if (kv.token_compacted()) {
    // every row of the call was kept: row r attends to the held slots up to its own
    const int n = n_seq * T;
    const IVec<E> at(keep_slot_.data(), n);
    auto hsl = Kokkos::create_mirror_view(at);
    int top = 0;
    for (int r = 0; r < n; ++r) top = std::max(top, hsl(r) = h_slot_[static_cast<std::size_t>(r)]);
    Kokkos::deep_copy(exec_, at, hsl);
    if (device_path_ && T == 1 && sh.v_dim <= hd)
      attention_decode_split(exec_, q, kv, at, out, n_seq, sh, attn_ws_);
    else
      cached_attention(exec_, q, IVec<E>(seq_.data(), n), at, kv, sh, out, top + 1);
  } else if (device_path_ && T == 1 && sh.v_dim <= hd) {
    // pruned widths (the model's scale), compacted prompt keys and dropped positions too
    attention_decode_split(exec_, q, kv, IVec<E>(pos_.data(), n_seq), out, n_seq, sh, attn_ws_);
  } else if (!kv.compacted() && !kv.has_drops() && !kv.has_evictions()) {
    if (device_path_ && T > 1 && !kOnHost<E>)  // a GPU: the vendor BLAS does the products
      attention_prefill_gemm(exec_, q, kv.k, kv.v, out, n_seq, T, p0, sh.n_head, sh.n_kv_head,
                             sh.qk_dim, sh.v_dim, sh.scale, attn_gemm_ws_, w_->bf16_compute);
    else if (device_path_ && T > 1 && sh.qk_dim == hd && sh.v_dim == hd)
      attention_prefill_tiled(exec_, q, kv.k, kv.v, out, n_seq, T, p0, sh.n_head, sh.n_kv_head,
                              sh.qk_dim);
    else
      attention(exec_, q, kv.k, kv.v, out, n_seq, T, p0, sh.n_head, sh.n_kv_head, sh.qk_dim,
                sh.v_dim, sh.scale, key_mass(l, n_seq, T, p0));
  } else {
    const int n = n_seq * T;
    cached_attention(exec_, q, IVec<E>(seq_.data(), n), IVec<E>(pos_.data(), n), kv, sh, out,
                     p0 + T);
  }
  mark(flops::Op::AttnScore);
}

template <class E>
void Engine<E>::attend_low_rank(int l, const CMat<E>& q, const Mat<E>& out, int n_seq, int T,
                                int p0, flops::Phase ph) {
  const Config& c = w_->cfg;
  const LayerWeights<E>& lw = w_->layers[static_cast<std::size_t>(l)];
  const KVLayer<E>& kv = cache_.layer(l);
  const int ctx = p0 + T, kd = c.kv_dim(), rk = c.k_cache_width(l), rv = c.v_cache_width(l);
  const IVec<E> pos(ctx_pos_.data(), ctx);
  const Mat<E> none;
  for (int s = 0; s < n_seq; ++s) {
    // sequence s's first ctx cached rows are contiguous (LayoutRight [seq][pos][width])
    const CMat<E> hk(kv.k.data() + static_cast<std::size_t>(s) * kv.k.stride(0), ctx, rk);
    const CMat<E> hv(kv.v.data() + static_cast<std::size_t>(s) * kv.v.stride(0), ctx, rv);
    const Mat<E> k(k_rebuilt_.data() + static_cast<std::size_t>(s) * k_rebuilt_.stride(0), ctx, kd);
    const Mat<E> v(v_rebuilt_.data() + static_cast<std::size_t>(s) * v_rebuilt_.stride(0), ctx, kd);
    linear(exec_, hk, lw.k_up, k, scratch_, seg_);
    linear(exec_, hv, lw.v_up, v, scratch_, seg_);
    rope_qk(l, none, k, pos);  // keys rotate after they are rebuilt (PaLU: K before RoPE)
  }
  mark(flops::Op::KVReconstruct);
  attention(exec_, q, k_rebuilt_, v_rebuilt_, out, n_seq, T, p0, c.n_head, c.n_kv_head, c.head_dim,
            c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim)));
  mark(flops::Op::AttnScore);
  if (ledger_) {
    // per sequence: read ctx latents and the block-diagonal up factors, write the rebuilt keys and
    // values; rotate the rebuilt keys. The same work whatever the runtime methods (dense = real).
    const LayerLowRank& r = c.low_rank[static_cast<std::size_t>(l)];
    const double gd = static_cast<double>(c.lr_group) * c.head_dim, rows = 1.0 * n_seq * ctx;
    const double fl = 2.0 * rows * gd * (r.k_rank() + r.v_rank()) + 6.0 * rows * kd / 2;
    const double by = static_cast<double>(lw.k_up.bytes() + lw.v_up.bytes()) * n_seq +
                      4.0 * rows * (rk + rv) + 4.0 * rows * 2 * kd;
    ledger_->add(flops::Op::KVReconstruct, l, ph, fl, fl, by, by, 3 * n_seq);
  }
}

template <class E>
void Engine<E>::attention_ledger(int l, flops::Phase ph, int n_seq, int T, int p0, const int* skip,
                                 int kernels, const int* slots) {
  const AttnShape& sh = cache_.shape(l);
  const KVLayer<E>& kv = cache_.layer(l);
  const int base = kv.k_base;
  const auto& kept = cache_.kept_counts(l);
  const double nh = sh.n_head, qk = sh.qk_dim, vd = sh.v_dim, g = sh.group();
  const double kw = sh.k_width(), vw = sh.v_width();
  double pairs = 0, pairs_real = 0, sf_real = 0, kb_real = 0;
  if (kv.has_evictions()) {
    // Per KV head: the positions evicted from it (among the prompt's first evicted_positions(l),
    // those below k_base in the compacted region) are neither scored nor mixed by rows after
    // the prompt. Head-weighted pairs (Σ over query heads of the positions read) replace the
    // row count times n_head of the dense layout below.
    const auto& toks = cache_.kept_tokens(l);
    const int P = cache_.evicted_positions(l);
    std::vector<double> ev_c(static_cast<std::size_t>(n_seq * sh.n_kv_head), 0.0), ev_f = ev_c;
    for (int s = 0; s < n_seq && s < static_cast<int>(toks.size()); ++s)
      for (int h = 0; h < sh.n_kv_head; ++h) {
        const auto& kp = toks[static_cast<std::size_t>(s)][static_cast<std::size_t>(h)];
        const int cb = std::min(base, P);  // evictable positions in the compacted region
        const int kc = static_cast<int>(std::lower_bound(kp.begin(), kp.end(), cb) - kp.begin());
        const std::size_t i = static_cast<std::size_t>(s * sh.n_kv_head + h);
        ev_c[i] = cb - kc;
        ev_f[i] = (P - cb) - (static_cast<int>(kp.size()) - kc);
      }
    double hp = 0, hp_real = 0, vb_real = 0;
    for (int s = 0; s < n_seq; ++s) {
      const std::size_t su = static_cast<std::size_t>(s);
      for (int t = 0; t < T; ++t) {
        const double np = p0 + t + 1;
        pairs += np;
        hp += np * nh;
        if (skip && skip[s * T + t]) continue;
        const double nb = std::min<double>(base, np), nf = np - nb;
        for (int h = 0; h < sh.n_kv_head; ++h) {
          const std::size_t hu = static_cast<std::size_t>(h), i = su * sh.n_kv_head + hu;
          const bool after = np > P;  // the prompt's own rows attended before the eviction
          const double evc = after ? ev_c[i] : 0.0, evf = after ? ev_f[i] : 0.0;
          const double ck = base > 0 && su < kept.size() ? static_cast<double>(kept[su][hu]) : qk;
          const double nbh = nb - evc, nfh = nf - evf;
          sf_real += 2.0 * g * (nfh * qk + nbh * ck);
          kb_real += 4.0 * (nfh * qk + nbh * ck);
          hp_real += g * (nbh + nfh);
          vb_real += 4.0 * (nbh + nfh) * vd;
        }
      }
    }
    const double sf = 2.0 * pairs * nh * qk, kb = 4.0 * pairs * kw;
    ledger_->add(flops::Op::AttnScore, l, ph, sf, sf_real, kb, kb_real, kernels);
    ledger_->add(flops::Op::AttnSoftmax, l, ph, 5.0 * hp, 5.0 * hp_real, 0, 0, kernels, 0);
    ledger_->add(flops::Op::AttnValue, l, ph, 2.0 * hp * vd, 2.0 * hp_real * vd, 4.0 * pairs * vw,
                 vb_real, kernels, 0);
    return;
  }
  for (int s = 0; s < n_seq; ++s) {
    // score FLOPs and key bytes of one query row against the compacted positions
    double ck = 0;
    if (base > 0 && s < static_cast<int>(kept.size()))
      for (int c : kept[static_cast<std::size_t>(s)]) ck += c;
    for (int t = 0; t < T; ++t) {
      const double np = p0 + t + 1;
      pairs += np;
      if (skip && skip[s * T + t]) continue;
      // a token-compacted layer: the row reads the held slots up to its own
      const double nr = slots ? slots[s * T + t] + 1.0 : np;
      pairs_real += nr;
      const double nb = std::min<double>(base, nr), nf = nr - nb;
      sf_real += 2.0 * (nf * nh * qk + nb * g * ck);
      kb_real += 4.0 * (nf * kw + nb * ck);
    }
  }
  const double sf = 2.0 * pairs * nh * qk, kb = 4.0 * pairs * kw;
  // the scores own the attention's kernels; the softmax and the value mix run inside them
  ledger_->add(flops::Op::AttnScore, l, ph, sf, sf_real, kb, kb_real, kernels);
  ledger_->add(flops::Op::AttnSoftmax, l, ph, 5.0 * pairs * nh, 5.0 * pairs_real * nh, 0, 0,
               kernels, 0);
  ledger_->add(flops::Op::AttnValue, l, ph, 2.0 * pairs * nh * vd, 2.0 * pairs_real * nh * vd,
               4.0 * pairs * vw, 4.0 * pairs_real * vw, kernels, 0);
}

template <class E>
void Engine<E>::select_channels(int l, int n_seq, int T, const CMat<E>& q, const int* kept_rows,
                                int n_rows, flops::Phase ph) {
  const AttnShape& sh = cache_.shape(l);
  const int w = std::max(1, std::min(selector_->observation_window(), T));
  const int qw = sh.q_width();
  if (qobs_.extent(0) < static_cast<std::size_t>(n_seq * w) ||
      qobs_.extent(1) != static_cast<std::size_t>(qw))
    qobs_ = Mat<E>("sparsim::selector::q_obs", max_seqs_ * w, qw);
  const Mat<E> qo = rows(qobs_, n_seq * w);
  Kokkos::deep_copy(exec_, qo, 0.0f);
  // row i of q stands for call row r (gathered rows: kept_rows[i]); the last w of each
  // sequence are observed
  std::vector<int> h_dst(static_cast<std::size_t>(n_rows), -1);
  for (int i = 0; i < n_rows; ++i) {
    const int r = kept_rows ? kept_rows[i] : i, t = r % T;
    if (t >= T - w) h_dst[static_cast<std::size_t>(i)] = (r / T) * w + (t - (T - w));
  }
  IVec<E> dst("sparsim::selector::obs_rows", std::max(1, n_rows));
  auto hd = Kokkos::create_mirror_view(dst);
  for (int i = 0; i < n_rows; ++i) hd(i) = h_dst[static_cast<std::size_t>(i)];
  Kokkos::deep_copy(exec_, dst, hd);
  copy_rows_to(exec_, q, IVec<E>(dst.data(), n_rows), qo);
  const KeptChannels kept = selector_->select(exec_, l, cache_.layer(l), sh, CMat<E>(qo), n_seq, T);
  if (!kept.empty()) compact_keys(l, kept, ph);
}

template <class E>
void Engine<E>::after_prefill(int l, int n_seq, int T, const CMat<E>& q, const int* kept_rows,
                              int n_rows, flops::Phase ph) {
  if (evictor_) evict_tokens(l, n_seq, T, q, kept_rows, n_rows, ph);
  if (selector_) select_channels(l, n_seq, T, q, kept_rows, n_rows, ph);
  // Decode reads only the kept tokens once they are moved together (with a token gate too: its
  // anchor is its own state, and its dropped prompt positions are left behind). Not done where
  // the prompt's cache is read by position afterwards (the attention-mass record).
  double dense = 0, kept = 0;
  if (evictor_) cache_.prompt_bytes(l, n_seq, T, dense, kept);
  const KVLayer<E>& kv = cache_.layer(l);
  if (!record_mass_ && kv.has_evictions() && !kv.tokens_compact) {
    cache_.compact_evicted(exec_, l);
    mark(flops::Op::TokenEvict);
    // each kept token's key and value read and written once: twice the kept prompt's bytes
    if (ledger_) ledger_->add(flops::Op::TokenEvict, l, ph, 0, 0, 0, 2.0 * kept);
  }
  if (evictor_) evictor_->account(l, dense, kept);
}

template <class E>
void Engine<E>::evict_tokens(int l, int n_seq, int T, const CMat<E>& q, const int* kept_rows,
                             int n_rows, flops::Phase ph) {
  const AttnShape& sh = cache_.shape(l);
  if (key_mass_layer_ == l) {  // the prefill attention summed the votes: no queries to copy
    key_mass_layer_ = -1;
    finish_eviction(l,
                    evictor_->select_voted(exec_, l, cache_.layer(l), sh, key_mass_.votes,
                                           key_mass_.seconds, n_seq, T),
                    ph);
    return;
  }
  const int w = std::max(0, std::min(evictor_->observation_window(T), T));
  const int qw = sh.q_width();
  const int nw = std::max(1, n_seq * w);
  if (qevict_.extent(0) < static_cast<std::size_t>(nw) ||
      qevict_.extent(1) != static_cast<std::size_t>(qw))
    qevict_ = Mat<E>("sparsim::evictor::q_obs", std::max(nw, max_seqs_ * w), qw);
  const Mat<E> qo = rows(qevict_, n_seq * w);
  IVec<E> ok("sparsim::evictor::q_ok", nw);
  if (w > 0) {
    Kokkos::deep_copy(exec_, qo, 0.0f);
    // row i of q stands for call row r (gathered rows: kept_rows[i]); the last w of each
    // sequence are observed
    std::vector<int> h_dst(static_cast<std::size_t>(n_rows), -1);
    auto hok = Kokkos::create_mirror_view(ok);
    Kokkos::deep_copy(hok, 0);
    for (int i = 0; i < n_rows; ++i) {
      const int r = kept_rows ? kept_rows[i] : i, t = r % T;
      if (t >= T - w) {
        const int d = (r / T) * w + (t - (T - w));
        h_dst[static_cast<std::size_t>(i)] = d;
        hok(d) = 1;
      }
    }
    Kokkos::deep_copy(exec_, ok, hok);
    IVec<E> dst("sparsim::evictor::obs_rows", std::max(1, n_rows));
    auto hd = Kokkos::create_mirror_view(dst);
    for (int i = 0; i < n_rows; ++i) hd(i) = h_dst[static_cast<std::size_t>(i)];
    Kokkos::deep_copy(exec_, dst, hd);
    copy_rows_to(exec_, q, IVec<E>(dst.data(), n_rows), qo);
  }
  finish_eviction(l,
                  evictor_->select(exec_, l, cache_.layer(l), sh, CMat<E>(qo),
                                   IVec<E>(ok.data(), n_seq * w), n_seq, T),
                  ph);
}

template <class E>
void Engine<E>::finish_eviction(int l, const KeptTokens& kept, flops::Phase ph) {
  if (!kept.empty()) {
    cache_.evict(exec_, l, kept);
    graphs_ = std::make_unique<Graphs>();  // captured decode graphs read no eviction mask
  }
  mark(flops::Op::TokenEvict);
  if (ledger_) ledger_->add(flops::Op::TokenEvict, l, ph, 0, kept.flops, 0, kept.bytes);
}

template <class E>
void Engine<E>::compact_keys(int layer, const KeptChannels& kept, flops::Phase ph) {
  require(layer >= 0 && layer < cache_.n_layer(), "compact_keys: layer {} outside 0 … {}", layer,
          cache_.n_layer() - 1);
  const std::size_t before = cache_.k_bytes(layer);
  cache_.compact_keys(exec_, layer, kept);
  graphs_ = std::make_unique<Graphs>();  // the full-width key region was reallocated
  mark(flops::Op::ChannelSelect);
  if (ledger_) {  // the selector's own work, plus reading the old keys and writing the new ones
    const double moved = static_cast<double>(before + cache_.k_bytes(layer));
    ledger_->add(flops::Op::ChannelSelect, layer, ph, 0, kept.flops, 0, kept.bytes + moved);
  }
}

template <class E>
void Engine<E>::account_cache(int n_seq) {
  if (!tgate_ || !tgate_->drop_skipped()) return;
  std::vector<KVOccupancy> occ(static_cast<std::size_t>(cache_.n_layer()));
  for (int l = 0; l < cache_.n_layer(); ++l) {
    KVOccupancy& o = occ[static_cast<std::size_t>(l)];
    for (int s = 0; s < n_seq; ++s) {
      o.positions += cache_.positions(l, s);
      o.held += cache_.held(l, s);
    }
    o.position_bytes = static_cast<double>(cache_.position_bytes(l));
    o.allocated = static_cast<double>(cache_.k_bytes(l) + cache_.v_bytes(l));
    o.allocated_dense = o.position_bytes * max_seqs_ * max_ctx_;
    o.compacted = cache_.token_compacted(l);
  }
  tgate_->account_cache(occ);
}

template <class E>
void Engine<E>::record_attention_mass(bool on) {
  record_mass_ = on;
  mass_.clear();
  mass_queries_.clear();
  if (!on) return;
  for (int l = 0; l < cache_.n_layer(); ++l) {
    mass_.emplace_back("sparsim::attention_mass", max_seqs_, max_ctx_);
    mass_queries_.emplace_back("sparsim::attention_mass_queries", max_seqs_, max_ctx_);
  }
}

template <class E>
std::vector<double> Engine<E>::attention_mass(int layer) const {
  require(record_mass_, "attention mass was not recorded");
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                               mass_[static_cast<std::size_t>(layer)]);
  return std::vector<double>(h.data(), h.data() + h.size());
}

template <class E>
std::vector<double> Engine<E>::attention_mass_queries(int layer) const {
  require(record_mass_, "attention mass was not recorded");
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                               mass_queries_[static_cast<std::size_t>(layer)]);
  return std::vector<double>(h.data(), h.data() + h.size());
}

template <class E>
void Engine<E>::run_block(int layer, const Mat<E>& x, int n_seq, int T, int p0) {
  const Config& c = w_->cfg;
  require(layer >= 0 && layer < c.n_layer, "run_block: layer {} outside 0 … {}", layer,
          c.n_layer - 1);
  require(n_seq >= 1 && n_seq <= max_seqs_ && T >= 1 && p0 >= 0 && p0 + T <= max_ctx_,
          "run_block: {} sequences × {} tokens at position {} do not fit the engine", n_seq, T, p0);
  require(static_cast<int>(x.extent(0)) == n_seq * T && static_cast<int>(x.extent(1)) == c.d_model,
          "run_block: input is {}×{}, expected {}×{}", x.extent(0), x.extent(1), n_seq * T,
          c.d_model);
  ensure_rows(n_seq * T, 1);
  check_interrupt();
  set_positions(n_seq, T, p0);
  if (pruner_) pruner_->begin_call(n_seq, T, p0);
  if (profile_) {
    exec_.fence();
    t_mark_ = clock_seconds(profile_clock_);
  }
  block(layer, x, n_seq, T, p0, T > 1 ? flops::Phase::Prefill : flops::Phase::Decode);
  account_cache(n_seq);
  if (tgate_) tgate_->end_call(exec_);
  exec_.fence();
  finish_call();
}

template <class E>
Mat<E> Engine<E>::forward_tail(const std::vector<std::vector<int>>& tokens, int p0, int tail) {
  const Config& c = w_->cfg;
  const int n_seq = static_cast<int>(tokens.size());
  require(n_seq >= 1 && n_seq <= max_seqs_, "forward: {} sequences, engine holds 1 … {}", n_seq,
          max_seqs_);
  const int T = static_cast<int>(tokens[0].size());
  require(T >= 1, "forward: empty token sequence");
  for (const auto& s : tokens)
    require(static_cast<int>(s.size()) == T, "forward: sequences of unequal length ({} vs {})",
            s.size(), T);
  require(p0 >= 0 && p0 + T <= max_ctx_,
          "forward: positions {} … {} exceed the context of {} tokens", p0, p0 + T - 1, max_ctx_);
  const int n = n_seq * T;
  if (tail < 0) tail = T;
  require(tail >= 1 && tail <= T, "forward: logits for the last {} positions of {}", tail, T);
  const int n_out = n_seq * tail;
  ensure_rows(n, n_out);
  const flops::Phase ph = T > 1 ? flops::Phase::Prefill : flops::Phase::Decode;

  {
    auto ht = Kokkos::create_mirror_view(tok_);
    for (int s = 0; s < n_seq; ++s)
      for (int t = 0; t < T; ++t) {
        const int id = tokens[s][t];
        require(id >= 0 && id < c.vocab, "forward: token id {} outside the vocabulary 0 … {}", id,
                c.vocab - 1);
        ht(s * T + t) = id;
      }
    Kokkos::deep_copy(exec_, tok_, ht);
  }
  set_positions(n_seq, T, p0);
  cur_p0_ = p0;
  if (pruner_) pruner_->begin_call(n_seq, T, p0);
  IVec<E> tok(tok_.data(), n);
  Mat<E> x = rows(x_, n);

  if (profile_) {
    exec_.fence();
    t_mark_ = clock_seconds(profile_clock_);
  }
  Mat<E> logits = rows(logits_, n_out);
  if (ledger_) ledger_->count_call(ph, n);
  if (T == 1 && use_fused(1)) {  // device decode: five kernels a block, or a replayed graph
    bool all = true;
    for (int l = 0; l < c.n_layer && all; ++l) all = fusable(l);
    if (all && !(graph_ && !ledger_ && graph_step(n_seq, x, logits)))
      decode_kernels(n_seq, x, logits, ph);
    if (all) {
      for (int l = 0; l < c.n_layer; ++l) cache_.note_written(l, n_seq, 1, p0);
      account_cache(n_seq);
      if (tgate_) tgate_->end_call(exec_);
      exec_.fence();
      finish_call();
      return logits;
    }
  }
  embed(exec_, w_->tok_embd, tok, x);
  mark(flops::Op::Embedding);
  if (ledger_)
    ledger_->add(flops::Op::Embedding, -1, ph, 0, 0, 4.0 * n * c.d_model * 2,
                 4.0 * n * c.d_model * 2);
  for (int l = 0; l < c.n_layer; ++l) {
    check_interrupt();  // between layers: SIGINT / SIGTERM stop the run here
    block(l, x, n_seq, T, p0, ph);
  }
  account_cache(n_seq);
  if (tgate_) tgate_->end_call(exec_);

  Mat<E> src = x;
  if (tail < T) {
    Mat<E> last = rows(last_, n_out);
    auto xs = x;
    const int d = c.d_model;
    const int skip = T - tail;
    Kokkos::parallel_for(
        "sparsim::engine::gather_tail",
        light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec_, {0, 0}, {n_out, d})),
        KOKKOS_LAMBDA(const int r, const int j) {
          last(r, j) = xs((r / tail) * T + skip + r % tail, j);
        });
    src = last;
    if (ledger_)  // the gather of the scored rows: a copy
      ledger_->add(flops::Op::Other, -1, ph, 0, 0, 8.0 * n_out * d, 8.0 * n_out * d);
  }
  Mat<E> hn = rows(xn_, n_out);
  rmsnorm(exec_, CMat<E>(src), CVec<E>(w_->out_norm), c.rms_eps, hn);
  mark(flops::Op::RMSNorm);
  seg_ = tail;  // the LM head sees `tail` rows per sequence
  if (ledger_) {
    const double od = static_cast<double>(n_out) * c.d_model;
    ledger_->add(flops::Op::RMSNorm, -1, ph, 4.0 * od, 4.0 * od, 8.0 * od, 8.0 * od);
  }
  plain_proj(hn, w_->output, logits, flops::Op::LMHead, -1, ph);
  exec_.fence();
  finish_call();
  return logits;
}

template <class E>
void Engine<E>::set_device_path(bool on) {
  const Config& c = w_->cfg;
  device_path_ = on || !kOnHost<E>;
  if (device_path_) attn_ws_.ensure(max_seqs_, c.n_head, c.n_kv_head, c.head_dim, max_ctx_);
}

template <class E>
bool Engine<E>::use_fused(int T) const {
  const Config& c = w_->cfg;
  return device_path_ && fused_ && T == 1 && !profile_ && !observer_ && !w_->rotated() &&
         !c.low_rank_kv() && !(masker_ && sparse_.count > 0) && !record_mass_ &&
         c.head_dim % 2 == 0 && max_seqs_ < kWidenRows;
}

template <class E>
bool Engine<E>::fusable(int l) const {
  const Config& c = w_->cfg;
  const LayerWeights<E>& lw = w_->layers[static_cast<std::size_t>(l)];
  const KVLayer<E>& kv = cache_.layer(l);
  const AttnShape& sh = cache_.shape(l);
  // a pruned layer: whole RoPE pairs (rotated by the layer's unit table), an even number of
  // value rows, value heads no wider than the model's
  const bool widths =
      pruned_rope(l) ? rope_pairs_only_[static_cast<std::size_t>(l)] : sh.qk_dim == c.head_dim;
  (void)kv;  // compacted prompt keys and dropped positions: the split kernel reads them
  // (the fused kernels add no output biases: a structurally pruned layer runs op by op)
  return !c.structured() && lw.o_bias.extent(0) == 0 && lw.down_bias.extent(0) == 0 &&
         !(tgate_ && tgate_->active(l)) && !(pruner_ && pruner_->active(l)) && widths &&
         sh.v_dim <= c.head_dim && (sh.n_kv_head * sh.v_dim) % 2 == 0 && sh.n_head == c.n_head &&
         sh.n_kv_head == c.n_kv_head && lw.wk.dtype == lw.wq.dtype && lw.wv.dtype == lw.wq.dtype &&
         lw.w_up.dtype == lw.w_gate.dtype;
}

template <class E>
void Engine<E>::block_fused(int l, const Mat<E>& x, int n_seq, int p0, flops::Phase ph) {
  const Config& c = w_->cfg;
  const LayerWeights<E>& lw = w_->layers[static_cast<std::size_t>(l)];
  const KVLayer<E>& kv = cache_.layer(l);
  const int n = n_seq;
  Mat<E> q = rows(q_, n, c.q_dim(l)), att = rows(att_, n, c.att_dim(l)), gate = rows(gate_, n);
  QKVTarget tg;
  tg.q = q.data();
  tg.kc = kv.k.data();
  tg.vc = kv.v.data();
  tg.max_ctx = static_cast<int>(kv.v.extent(1));
  tg.k_ctx = static_cast<int>(kv.k.extent(1));  // the full-width key region (after compaction)
  tg.k_base = kv.k_base;
  tg.pos = pos_.data();
  tg.T = 1;
  tg.cos_t = cos_.data();
  tg.sin_t = sin_.data();
  tg.rope_cols = static_cast<int>(cos_.extent(1));
  tg.head_dim = c.head_dim;
  tg.adjacent = c.rope_layout == RopeLayout::Adjacent;
  const AttnShape& sh = cache_.shape(l);
  if (const RopeMap<E>* m = pruned_rope(l)) {
    tg.unit_i0 = m->i0.data();
    tg.unit_i1 = m->i1.data();
    tg.unit_freq = m->freq.data();
    tg.units = m->units;
    tg.qk_dim = sh.qk_dim;
  }
  const CMat<E> xc(x);
  const CVec<E> an(lw.attn_norm), fn(lw.ffn_norm);
  with_view(lw.wq, [&](const auto& wq) {
    using V = std::decay_t<decltype(wq)>;
    gemv_qkv_rope(exec_, xc, wq, view_as<V>(lw.wk), view_as<V>(lw.wv), tg, an, c.rms_eps);
  });
  attention_decode_split(exec_, CMat<E>(q), kv, IVec<E>(pos_.data(), n_seq), att, n_seq, sh,
                         attn_ws_);
  with_view(lw.wo, [&](const auto& w) { gemv_warp(exec_, CMat<E>(att), w, x, GemvOut::AddTo); });
  with_view(lw.w_gate, [&](const auto& wg) {
    using V = std::decay_t<decltype(wg)>;
    gemv_swiglu(exec_, xc, wg, view_as<V>(lw.w_up), gate, fn, c.rms_eps);
  });
  with_view(lw.w_down,
            [&](const auto& w) { gemv_warp(exec_, CMat<E>(gate), w, x, GemvOut::AddTo); });
  if (ledger_) {  // the same work as the op-by-op path
    for (Proj p : {Proj::Q, Proj::K, Proj::V, Proj::O, Proj::Gate, Proj::Up, Proj::Down}) {
      const Matrix<E>& w = lw.proj(p);
      const double fl = 2.0 * n * w.rows * w.cols;
      const double b = static_cast<double>(w.bytes()) + 4.0 * n * (w.rows + w.cols);
      // Q, K and V in one kernel, gate and up in another: each takes part in one launch
      const bool own = p == Proj::Q || p == Proj::O || p == Proj::Gate || p == Proj::Down;
      ledger_->add(op_of(p), l, ph, fl, fl, b, b, 1, own ? 1 : 0);
    }
  }
  block_ledger(l, n, n, n_seq, 1, p0, ph, nullptr, true);
}

template <class E>
void Engine<E>::decode_kernels(int n_seq, const Mat<E>& x, const Mat<E>& logits, flops::Phase ph) {
  const Config& c = w_->cfg;
  const int p0 = cur_p0_;
  embed(exec_, w_->tok_embd, IVec<E>(tok_.data(), n_seq), x);
  if (ledger_)
    ledger_->add(flops::Op::Embedding, -1, ph, 0, 0, 4.0 * n_seq * c.d_model * 2,
                 4.0 * n_seq * c.d_model * 2);
  for (int l = 0; l < c.n_layer; ++l) block_fused(l, x, n_seq, p0, ph);
  // the final RMSNorm inside the LM head's GEMV
  if (ledger_) {
    const double od = static_cast<double>(n_seq) * c.d_model;
    ledger_->add(flops::Op::RMSNorm, -1, ph, 4.0 * od, 4.0 * od, 8.0 * od, 8.0 * od, 1, 0);
  }
  const CVec<E> on(w_->out_norm);
  with_view(w_->output, [&](const auto& w) {
    gemv_warp(exec_, CMat<E>(x), w, logits, GemvOut::Store, on, c.rms_eps);
  });
  if (ledger_) {
    const Matrix<E>& w = w_->output;
    const double fl = 2.0 * n_seq * w.rows * w.cols;
    const double by = static_cast<double>(w.bytes()) + 4.0 * n_seq * (w.rows + w.cols);
    ledger_->add(flops::Op::LMHead, -1, ph, fl, fl, by, by);
  }
}

template <class E>
bool Engine<E>::graph_step(int n_seq, const Mat<E>& x, const Mat<E>& logits) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<E, Kokkos::Cuda>) {
    cudaStream_t st = exec_.cuda_stream();
    auto it = graphs_->exec.find(n_seq);
    if (it == graphs_->exec.end()) {
      exec_.fence();
      cudaGraph_t g = nullptr;
      const auto give_up = [&](const char* what, cudaError_t e) {
        log().warn("decode graph: {} failed ({}); decoding without graphs", what,
                   cudaGetErrorString(e));
        cudaGetLastError();
        graph_ = false;
        return false;
      };
      cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed);
      if (e != cudaSuccess) return give_up("capture start", e);
      try {
        decode_kernels(n_seq, x, logits, flops::Phase::Decode);
      } catch (const std::exception& ex) {
        cudaStreamEndCapture(st, &g);
        if (g) cudaGraphDestroy(g);
        log().warn("decode graph: capture failed: {}", ex.what());
        return give_up("capture", cudaErrorStreamCaptureInvalidated);
      }
      e = cudaStreamEndCapture(st, &g);
      if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        return give_up("capture end", e);
      }
      cudaGraphExec_t ge = nullptr;
      e = cudaGraphInstantiate(&ge, g, 0);
      cudaGraphDestroy(g);
      if (e != cudaSuccess) return give_up("instantiation", e);
      it = graphs_->exec.emplace(n_seq, ge).first;
    }
    const cudaError_t e = cudaGraphLaunch(it->second, st);
    if (e != cudaSuccess) {
      log().warn("decode graph: launch failed ({}); decoding without graphs",
                 cudaGetErrorString(e));
      cudaGetLastError();
      graph_ = false;
      return false;
    }
    return true;
  }
#endif
  (void)n_seq;
  (void)x;
  (void)logits;
  return false;
}

#define SPARSIM_INSTANTIATE_ENGINE(E) template class Engine<E>;
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_ENGINE)

}  // namespace sparsim
