#include "engine/engine.hpp"

#include "core/error.hpp"
#include "kernels/pointwise.hpp"
#include "kernels/sparse_gemv.hpp"

#include <algorithm>
#include <cmath>

namespace sparsim {

template <class E>
Engine<E>::Engine(std::shared_ptr<const Weights<E>> weights, int max_seqs, int max_ctx,
                  flops::Ledger* ledger, E exec)
    : w_(std::move(weights)), max_seqs_(max_seqs), max_ctx_(max_ctx), ledger_(ledger), exec_(exec) {
  const Config& c = w_->cfg;
  require(max_seqs > 0, "engine: need at least one sequence, got {}", max_seqs);
  require(max_ctx > 0 && max_ctx <= c.context_length,
          "engine: context of {} tokens is outside the model's supported 1 … {}", max_ctx,
          c.context_length);
  for (int l = 0; l < c.n_layer; ++l) {
    kcache_.emplace_back("sparsim::kcache", max_seqs, max_ctx, c.kv_dim());
    vcache_.emplace_back("sparsim::vcache", max_seqs, max_ctx, c.kv_dim());
  }
  // RoPE angles in double precision on the host, then rounded once to fp32.
  const int half = c.head_dim / 2;
  const std::vector<double> inv = c.rope_inv_freq(w_->rope_freq_factors);
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
}

template <class E>
void Engine<E>::ensure_rows(int n, int n_out) {
  const Config& c = w_->cfg;
  if (n > cap_rows_) {
    auto alloc = [](const char* name, int r, int cols) {
      return Mat<E>(Kokkos::view_alloc(std::string(name), Kokkos::WithoutInitializing), r, cols);
    };
    x_ = alloc("sparsim::x", n, c.d_model);
    xn_ = alloc("sparsim::xn", n, c.d_model);
    q_ = alloc("sparsim::q", n, c.q_dim());
    k_ = alloc("sparsim::k", n, c.kv_dim());
    v_ = alloc("sparsim::v", n, c.kv_dim());
    att_ = alloc("sparsim::att", n, c.q_dim());
    tmp_ = alloc("sparsim::tmp", n, c.d_model);
    rx_ = alloc("sparsim::rx", n, c.d_model);
    sparse_flags_ = IVec<E>("sparsim::sparse_rows", n);
    gate_ = alloc("sparsim::gate", n, c.d_ff);
    up_ = alloc("sparsim::up", n, c.d_ff);
    tok_ = IVec<E>("sparsim::tokens", n);
    pos_ = IVec<E>("sparsim::positions", n);
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
                           int layer, flops::Phase ph, double realised_fraction) {
  linear(exec_, x, w, y, scratch_);
  mark(op);
  if (ledger_) {
    const double n = static_cast<double>(x.extent(0));
    const double fl = 2.0 * n * w.rows * w.cols;
    const double by = static_cast<double>(w.bytes()) + 4.0 * n * (w.rows + w.cols);
    // 16-bit weights over many rows are widened to fp32 first: a second kernel
    const std::uint64_t launches = w.dtype != DType::F32 && n >= kWidenRows ? 2 : 1;
    ledger_->add(op, layer, ph, fl, fl * realised_fraction, by, by * realised_fraction, launches);
  }
}

template <class E>
void Engine<E>::proj(const CMat<E>& x, Proj p, int layer, const Mat<E>& y, flops::Phase ph) {
  const Matrix<E>& w = w_->layers[layer].proj(p);
  if (!masker_ || sparse_.count == 0 || !masker_->active(layer, p)) {
    plain_proj(x, w, y, op_of(p), layer, ph);
    return;
  }
  long long kept = 0;
  if (!wt_.empty() && x.extent(0) == 1) {
    const int nnz = masker_->indices(exec_, layer, p, x, idx_, Vec<E>());
    mark(flops::Op::MaskSelect);
    const Matrix<E>& t = wt_[static_cast<std::size_t>(layer)][static_cast<std::size_t>(p)];
    const CVec<E> xr(x.data(), w.cols);
    const Vec<E> yr(y.data(), w.rows);
    if (t.dtype == DType::F32)
      sparse_gemv(exec_, xr, idx_, nnz, t.f32, yr);
    else if (t.dtype == DType::BF16)
      sparse_gemv(exec_, xr, idx_, nnz, t.bf16, yr);
    else
      sparse_gemv(exec_, xr, idx_, nnz, t.f16, yr);
    mark(op_of(p));
    if (ledger_) {
      const double fl = 2.0 * w.rows * w.cols, f = static_cast<double>(nnz) / w.cols;
      const double by = static_cast<double>(w.bytes()) + 4.0 * (w.rows + w.cols);
      ledger_->add(flops::Op::MaskSelect, layer, ph, 0, w.cols, 0, 4.0 * w.cols);
      ledger_->add(op_of(p), layer, ph, fl, fl * f, by, by * f);
    }
    return;
  }
  const CMat<E> xm = masker_->apply(exec_, layer, p, x, sparse_, kept);
  mark(flops::Op::MaskSelect);
  const double n = static_cast<double>(x.extent(0));
  const double d = static_cast<double>(w.cols);
  if (ledger_) {  // selection reads each sparse row a few times; count one compare per entry
    const double sel = static_cast<double>(sparse_.count) * d;
    ledger_->add(flops::Op::MaskSelect, layer, ph, 0, sel, 0, 4.0 * sel);
  }
  // Realised work: dense rows use every column, sparse rows only their kept ones.
  const double frac = ((n - sparse_.count) * d + static_cast<double>(kept)) / (n * d);
  plain_proj(xm, w, y, op_of(p), layer, ph, frac);
}

namespace {
template <class E, class T>
void transpose_into(const E& exec, const Kokkos::View<T**, Layout, DeviceOf<E>>& src,
                    const Kokkos::View<T**, Layout, DeviceOf<E>>& dst) {
  Kokkos::parallel_for(
      "sparsim::engine::transpose",
      Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(
          exec, {0, 0}, {static_cast<int>(src.extent(0)), static_cast<int>(src.extent(1))}),
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
  exec_.fence();
}

template <class E>
void Engine<E>::set_positions(int n_seq, int T, int p0) {
  auto hp = Kokkos::create_mirror_view(pos_);
  for (int s = 0; s < n_seq; ++s)
    for (int t = 0; t < T; ++t) hp(s * T + t) = p0 + t;
  Kokkos::deep_copy(exec_, pos_, hp);
  // rows the masker sparsifies
  const int t0 = sparse_from_ == kDecodeOnly ? (T == 1 ? 0 : T) : sparse_from_;
  sparse_.count = masker_ ? n_seq * std::max(0, T - std::min(T, t0)) : 0;
  if (sparse_.count > 0) {
    auto hf = Kokkos::create_mirror_view(sparse_flags_);
    for (int s = 0; s < n_seq; ++s)
      for (int t = 0; t < T; ++t) hf(s * T + t) = t >= t0 ? 1 : 0;
    Kokkos::deep_copy(exec_, sparse_flags_, hf);
  }
  sparse_.flags = IVec<E>(sparse_flags_.data(), n_seq * T);
  if (masker_) masker_->begin_call(n_seq * T);
}

template <class E>
void Engine<E>::block(int l, const Mat<E>& x_in, int n_seq, int T, int p0, flops::Phase ph) {
  const Config& c = w_->cfg;
  const LayerWeights<E>& lw = w_->layers[l];
  const int n = n_seq * T;
  IVec<E> pos(pos_.data(), n);
  Mat<E> x = x_in, xn = rows(xn_, n), q = rows(q_, n), k = rows(k_, n), v = rows(v_, n),
         att = rows(att_, n), tmp = rows(tmp_, n), gate = rows(gate_, n), up = rows(up_, n),
         rx = rows(rx_, n);
  const bool rot = w_->rotated();
  // x ← x·Rᵀ + tmp (rotated model: the residual stream changes basis) or x ← x + tmp
  auto residual = [&](const Matrix<E>* r) {
    if (rot) {
      // WINA's online re-rotation: work a dense, unrotated model does not do (dense = 0)
      linear(exec_, CMat<E>(x), *r, rx, scratch_);
      mark(flops::Op::Rotation);
      if (ledger_) {
        const double fl = 2.0 * n * r->rows * r->cols;
        ledger_->add(flops::Op::Rotation, l, ph, 0, fl, 0,
                     static_cast<double>(r->bytes()) + 8.0 * n * r->rows);
      }
      add_inplace(exec_, rx, CMat<E>(tmp));
      Kokkos::deep_copy(exec_, x, rx);
    } else {
      add_inplace(exec_, x, CMat<E>(tmp));
    }
    mark(flops::Op::Residual);
  };
  observe(l, Site::BlockIn, x);
  rmsnorm(exec_, CMat<E>(x), CVec<E>(lw.attn_norm), c.rms_eps, xn);
  mark(flops::Op::RMSNorm);
  observe(l, Site::Attn, xn);
  proj(xn, Proj::Q, l, q, ph);
  proj(xn, Proj::K, l, k, ph);
  proj(xn, Proj::V, l, v, ph);
  rope(exec_, q, k, pos, CMat<E>(cos_), CMat<E>(sin_), c.head_dim,
       c.rope_layout == RopeLayout::Adjacent);
  mark(flops::Op::RoPE);
  kv_store(exec_, CMat<E>(k), CMat<E>(v), kcache_[l], vcache_[l], n_seq, T, p0);
  attention(exec_, CMat<E>(q), kcache_[l], vcache_[l], att, n_seq, T, p0, c.n_head, c.n_kv_head,
            c.head_dim);
  mark(flops::Op::AttnScore);
  observe(l, Site::O, att);
  proj(att, Proj::O, l, tmp, ph);
  residual(rot ? &w_->rot_attn_mlp[l] : nullptr);
  rmsnorm(exec_, CMat<E>(x), CVec<E>(lw.ffn_norm), c.rms_eps, xn);
  mark(flops::Op::RMSNorm);
  observe(l, Site::Mlp, xn);
  proj(xn, Proj::Gate, l, gate, ph);
  proj(xn, Proj::Up, l, up, ph);
  swiglu(exec_, gate, CMat<E>(up));
  mark(flops::Op::SwiGLU);
  observe(l, Site::Down, gate);
  proj(gate, Proj::Down, l, tmp, ph);
  residual(rot ? &w_->rot_mlp_next[l] : nullptr);
  if (ledger_) {
    const double nd = static_cast<double>(n) * c.d_model;
    double att_pairs = 0;  // scores and value mixing over all visible positions
    for (int t = 0; t < T; ++t) att_pairs += p0 + t + 1;
    att_pairs *= n_seq;
    const double hd = c.head_dim, nh = c.n_head;
    // launches: the kernels each entry stands for (two norms, two residual updates; the KV
    // append and the attention kernel, which computes scores, softmax and the value mix)
    ledger_->add(flops::Op::RMSNorm, l, ph, 2 * 4.0 * nd, 2 * 4.0 * nd, 2 * 8.0 * nd, 2 * 8.0 * nd,
                 2);
    const double rf = 6.0 * n * (c.q_dim() + c.kv_dim()) / 2;
    ledger_->add(flops::Op::RoPE, l, ph, rf, rf, 8.0 * n * (c.q_dim() + c.kv_dim()),
                 8.0 * n * (c.q_dim() + c.kv_dim()));
    const double sf = 2.0 * att_pairs * nh * hd;
    const double kvb = 4.0 * att_pairs * c.kv_dim();
    ledger_->add(flops::Op::AttnScore, l, ph, sf, sf, kvb, kvb, 2);
    ledger_->add(flops::Op::AttnSoftmax, l, ph, 5.0 * att_pairs * nh, 5.0 * att_pairs * nh, 0, 0,
                 0);
    ledger_->add(flops::Op::AttnValue, l, ph, sf, sf, kvb, kvb, 0);
    const double sw = 6.0 * n * c.d_ff;
    ledger_->add(flops::Op::SwiGLU, l, ph, sw, sw, 12.0 * n * c.d_ff, 12.0 * n * c.d_ff);
    ledger_->add(flops::Op::Residual, l, ph, 2 * nd, 2 * nd, 2 * 12.0 * nd, 2 * 12.0 * nd,
                 rot ? 4 : 2);  // rotated: each update is an add and a copy back
  }
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
  set_positions(n_seq, T, p0);
  if (profile_) {
    exec_.fence();
    t_mark_ = clock_seconds(profile_clock_);
  }
  block(layer, x, n_seq, T, p0, T > 1 ? flops::Phase::Prefill : flops::Phase::Decode);
  exec_.fence();
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
  IVec<E> tok(tok_.data(), n);
  Mat<E> x = rows(x_, n);

  if (profile_) {
    exec_.fence();
    t_mark_ = clock_seconds(profile_clock_);
  }
  embed(exec_, w_->tok_embd, tok, x);
  mark(flops::Op::Embedding);
  if (ledger_) ledger_->count_call(ph, n);
  if (ledger_)
    ledger_->add(flops::Op::Embedding, -1, ph, 0, 0, 4.0 * n * c.d_model * 2,
                 4.0 * n * c.d_model * 2);
  for (int l = 0; l < c.n_layer; ++l) block(l, x, n_seq, T, p0, ph);

  Mat<E> src = x;
  if (tail < T) {
    Mat<E> last = rows(last_, n_out);
    auto xs = x;
    const int d = c.d_model;
    const int skip = T - tail;
    Kokkos::parallel_for(
        "sparsim::engine::gather_tail",
        Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec_, {0, 0}, {n_out, d}),
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
  if (ledger_) {
    const double od = static_cast<double>(n_out) * c.d_model;
    ledger_->add(flops::Op::RMSNorm, -1, ph, 4.0 * od, 4.0 * od, 8.0 * od, 8.0 * od);
  }
  Mat<E> logits = rows(logits_, n_out);
  plain_proj(hn, w_->output, logits, flops::Op::LMHead, -1, ph);
  exec_.fence();
  return logits;
}

#ifdef KOKKOS_ENABLE_SERIAL
template class Engine<Kokkos::Serial>;
#endif
#ifdef KOKKOS_ENABLE_OPENMP
template class Engine<Kokkos::OpenMP>;
#endif
#ifdef KOKKOS_ENABLE_CUDA
template class Engine<Kokkos::Cuda>;
#endif

}  // namespace sparsim
