#include "sparsity/rotation.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/host_tasks.hpp"

#include <cblas.h>
#include <dlfcn.h>
#include <lapacke.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

namespace sparsim::sparsity {
namespace {

constexpr int kChunkRows = 128;   // rows of one product task
constexpr int kBlockRows = 8192;  // rows of a tall matrix widened to float64 at a time
constexpr int kGramRows = 4096;   // rows of one partial Gram matrix WᵀW

using std::size_t;

template <class T>
using HostView = Kokkos::View<T**, Layout, Kokkos::HostSpace>;

/// A host copy of a matrix in its storage type.
struct HostCopy {
  DType dtype = DType::F32;
  int rows = 0, cols = 0;
  HostView<float> f32;
  HostView<bf16_t> bf16;
  HostView<f16_t> f16;

  /// Rows [r0, r0 + nr) in float64 into out (nr × cols), column c times fold[c] when given.
  void widen(int r0, int nr, const std::vector<double>* fold, double* out) const {
    auto run = [&](const auto& v) {
      for (int i = 0; i < nr; ++i) {
        double* o = out + static_cast<size_t>(i) * cols;
        for (int c = 0; c < cols; ++c) {
          const double x = static_cast<double>(to_f32(v(r0 + i, c)));
          o[c] = fold ? x * (*fold)[c] : x;
        }
      }
    };
    switch (dtype) {
      case DType::F32:
        run(f32);
        break;
      case DType::BF16:
        run(bf16);
        break;
      case DType::F16:
        run(f16);
        break;
    }
  }
  std::vector<double> widen_all(const std::vector<double>* fold) const {
    std::vector<double> out(static_cast<size_t>(rows) * cols);
    widen(0, rows, fold, out.data());
    return out;
  }
};

template <class E>
HostCopy host_copy(const Matrix<E>& m) {
  HostCopy h;
  h.dtype = m.dtype;
  h.rows = m.rows;
  h.cols = m.cols;
  switch (m.dtype) {
    case DType::F32:
      h.f32 = HostView<float>("sparsim::rotation::host", m.rows, m.cols);
      Kokkos::deep_copy(h.f32, m.f32);
      break;
    case DType::BF16:
      h.bf16 = HostView<bf16_t>("sparsim::rotation::host", m.rows, m.cols);
      Kokkos::deep_copy(h.bf16, m.bf16);
      break;
    case DType::F16:
      h.f16 = HostView<f16_t>("sparsim::rotation::host", m.rows, m.cols);
      Kokkos::deep_copy(h.f16, m.f16);
      break;
  }
  return h;
}

template <class V>
std::vector<double> host_vec(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(h.extent(0));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(h(i));
  return out;
}

/// Builds a device matrix of a storage type from float64 rows, rounding each value once.
template <class E>
class MatrixSink {
 public:
  MatrixSink(DType storage, int rows, int cols, const std::string& label) {
    m_.dtype = storage;
    m_.rows = rows;
    m_.cols = cols;
    const auto init = Kokkos::view_alloc(label, Kokkos::WithoutInitializing);
    switch (storage) {
      case DType::F32:
        m_.f32 = decltype(m_.f32)(init, rows, cols);
        h32_ = Kokkos::create_mirror_view(m_.f32);
        break;
      case DType::BF16:
        m_.bf16 = decltype(m_.bf16)(init, rows, cols);
        hb16_ = Kokkos::create_mirror_view(m_.bf16);
        break;
      case DType::F16:
        m_.f16 = decltype(m_.f16)(init, rows, cols);
        hf16_ = Kokkos::create_mirror_view(m_.f16);
        break;
    }
  }
  /// Rows [r0, r0 + nr) from src (nr × cols).
  void put(int r0, int nr, const double* src) {
    auto run = [&](auto& h) {
      using T = typename std::decay_t<decltype(h)>::value_type;
      for (int i = 0; i < nr; ++i)
        for (int c = 0; c < m_.cols; ++c)
          h(r0 + i, c) = from_f32<T>(static_cast<float>(src[static_cast<size_t>(i) * m_.cols + c]));
    };
    switch (m_.dtype) {
      case DType::F32:
        run(h32_);
        break;
      case DType::BF16:
        run(hb16_);
        break;
      case DType::F16:
        run(hf16_);
        break;
    }
  }
  Matrix<E> finish() {
    switch (m_.dtype) {
      case DType::F32:
        Kokkos::deep_copy(m_.f32, h32_);
        break;
      case DType::BF16:
        Kokkos::deep_copy(m_.bf16, hb16_);
        break;
      case DType::F16:
        Kokkos::deep_copy(m_.f16, hf16_);
        break;
    }
    return m_;
  }

 private:
  Matrix<E> m_;
  typename decltype(Matrix<E>::f32)::HostMirror h32_;
  typename decltype(Matrix<E>::bf16)::HostMirror hb16_;
  typename decltype(Matrix<E>::f16)::HostMirror hf16_;
};

/// One single-threaded product C = A·B (A m×k) or C = Aᵀ·B (A k×m), all row-major.
struct Gemm {
  bool trans_a;
  int m, n, k;
  const double* a;
  int lda;
  const double* b;
  double* c;
};

/// Adds C = op(A)·B to `tasks`, split into fixed chunks of output rows.
void add_gemm(std::vector<Gemm>& tasks, bool trans_a, int m, int n, int k, const double* a,
              const double* b, double* c) {
  for (int r0 = 0; r0 < m; r0 += kChunkRows) {
    const int nr = std::min(kChunkRows, m - r0);
    tasks.push_back({trans_a, nr, n, k, trans_a ? a + r0 : a + static_cast<size_t>(r0) * k,
                     trans_a ? m : k, b, c + static_cast<size_t>(r0) * n});
  }
}

void run_gemms(const std::vector<Gemm>& tasks) {
  parallel_tasks(static_cast<int>(tasks.size()), [&](int i) {
    const Gemm& g = tasks[static_cast<size_t>(i)];
    cblas_dgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, CblasNoTrans, g.m, g.n, g.k,
                1.0, g.a, g.lda, g.b, g.n, 0.0, g.c, g.n);
  });
}

/// Fixes the sign of each column of q (n×n) so that its largest-magnitude entry is positive.
void fix_signs(std::vector<double>& q, int n) {
  for (int j = 0; j < n; ++j) {
    int arg = 0;
    for (int i = 1; i < n; ++i)
      if (std::fabs(q[static_cast<size_t>(i) * n + j]) >
          std::fabs(q[static_cast<size_t>(arg) * n + j]))
        arg = i;
    if (q[static_cast<size_t>(arg) * n + j] < 0)
      for (int i = 0; i < n; ++i)
        q[static_cast<size_t>(i) * n + j] = -q[static_cast<size_t>(i) * n + j];
  }
}

/// Eigenvectors of the symmetric g (n×n, upper triangle read, destroyed) as the columns of q, by
/// descending eigenvalue. Returns LAPACK's info.
int eig_descending(std::vector<double>& g, int n, std::vector<double>& q) {
  std::vector<double> ev(static_cast<size_t>(n));
  const int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', n, g.data(), n, ev.data());
  q.assign(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      q[static_cast<size_t>(i) * n + j] = g[static_cast<size_t>(i) * n + (n - 1 - j)];
  fix_signs(q, n);
  return info;
}

/// One basis to compute: V of the folded matrix `src`·diag(fold), into *out.
struct BasisJob {
  std::string what;
  HostCopy src;
  std::vector<double> fold;
  std::vector<double>* out = nullptr;
  std::vector<std::vector<double>> partial;  // one partial WᵀW per block of kGramRows rows
  int info = 0;
};

/// out (rows × D) ← src·diag(fold)·q, streamed over row blocks, rounded into a device matrix.
template <class E>
Matrix<E> rotate_right(const HostCopy& src, const std::vector<double>* fold,
                       const std::vector<double>& q, DType storage, const std::string& label) {
  const int rows = src.rows, d = src.cols;
  MatrixSink<E> sink(storage, rows, d, label);
  const int blk = std::min(rows, kBlockRows);
  std::vector<double> a(static_cast<size_t>(blk) * d), c(static_cast<size_t>(blk) * d);
  for (int r0 = 0; r0 < rows; r0 += blk) {
    const int nr = std::min(blk, rows - r0);
    src.widen(r0, nr, fold, a.data());
    std::vector<Gemm> tasks;
    add_gemm(tasks, false, nr, d, d, a.data(), q.data(), c.data());
    run_gemms(tasks);
    sink.put(r0, nr, c.data());
  }
  return sink.finish();
}

template <class E>
Kokkos::View<float*, DeviceOf<E>> ones(int n, const char* label) {
  Kokkos::View<float*, DeviceOf<E>> v(std::string(label), n);
  Kokkos::deep_copy(v, 1.0f);
  return v;
}

}  // namespace

template <class E>
Rotation compute_rotation(const Weights<E>& w) {
  const Config& c = w.cfg;
  const int D = c.d_model, L = c.n_layer;
  require(!w.rotated(), "compute_rotation: the model is already rotated");
  require(static_cast<int>(w.layers.size()) == L, "compute_rotation: {} layers, config says {}",
          w.layers.size(), L);
  Rotation r;
  r.d_model = D;
  r.n_layer = L;
  r.q_attn.resize(static_cast<size_t>(L) + 1);
  r.q_mlp.resize(static_cast<size_t>(L));

  std::vector<BasisJob> jobs(2 * static_cast<size_t>(L) + 1);
  for (int l = 0; l < L; ++l) {
    const LayerWeights<E>& lw = w.layers[static_cast<size_t>(l)];
    BasisJob& k = jobs[2 * static_cast<size_t>(l)];
    k.what = fmt::format("blk.{}.attn_k", l);
    k.src = host_copy(lw.wk);
    k.fold = host_vec(lw.attn_norm);
    k.out = &r.q_attn[static_cast<size_t>(l)];
    BasisJob& g = jobs[2 * static_cast<size_t>(l) + 1];
    g.what = fmt::format("blk.{}.ffn_gate", l);
    g.src = host_copy(lw.w_gate);
    g.fold = host_vec(lw.ffn_norm);
    g.out = &r.q_mlp[static_cast<size_t>(l)];
  }
  BasisJob& head = jobs.back();
  head.what = "output";
  head.src = host_copy(w.output);
  head.fold = host_vec(w.out_norm);
  head.out = &r.q_attn[static_cast<size_t>(L)];
  for (auto& j : jobs) {
    require(j.src.cols == D, "compute_rotation: {} has {} columns, d_model is {}", j.what,
            j.src.cols, D);
  }

  SingleThreadedBlas single;
  // Stage 1: partial Gram matrices W'ᵀW' (upper triangle), one per block of kGramRows rows.
  struct Task {
    int job, block;
  };
  std::vector<Task> tasks;
  for (int j = 0; j < static_cast<int>(jobs.size()); ++j) {
    BasisJob& b = jobs[static_cast<size_t>(j)];
    b.partial.resize(static_cast<size_t>((b.src.rows + kGramRows - 1) / kGramRows));
    for (int k = 0; k < static_cast<int>(b.partial.size()); ++k) tasks.push_back({j, k});
  }
  parallel_tasks(static_cast<int>(tasks.size()), [&](int i) {
    const Task& t = tasks[static_cast<size_t>(i)];
    BasisJob& b = jobs[static_cast<size_t>(t.job)];
    const int r0 = t.block * kGramRows, nr = std::min(kGramRows, b.src.rows - r0);
    std::vector<double> a(static_cast<size_t>(nr) * D);
    b.src.widen(r0, nr, &b.fold, a.data());
    auto& g = b.partial[static_cast<size_t>(t.block)];
    g.assign(static_cast<size_t>(D) * D, 0.0);
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, nr, 1.0, a.data(), D, 0.0, g.data(), D);
  });
  // Stage 2: sum the partial Gram matrices in block order, then their eigenvectors.
  parallel_tasks(static_cast<int>(jobs.size()), [&](int i) {
    BasisJob& b = jobs[static_cast<size_t>(i)];
    std::vector<double> g = std::move(b.partial[0]);
    for (size_t p = 1; p < b.partial.size(); ++p)
      for (size_t e = 0; e < g.size(); ++e) g[e] += b.partial[p][e];
    b.partial.clear();
    b.info = eig_descending(g, D, *b.out);
  });
  for (const auto& j : jobs)
    require(j.info == 0, "compute_rotation: LAPACK dsyevd for {} failed (info {})", j.what, j.info);
  return r;
}

template <class E>
std::shared_ptr<Weights<E>> apply_rotation(const Weights<E>& w, const Rotation& r, DType storage,
                                           DType rotation_storage) {
  const Config& c = w.cfg;
  const int D = c.d_model, L = c.n_layer;
  require(!w.rotated(), "apply_rotation: the model is already rotated");
  require(r.d_model == D && r.n_layer == L && r.q_attn.size() == static_cast<size_t>(L) + 1 &&
              r.q_mlp.size() == static_cast<size_t>(L),
          "apply_rotation: the rotation is for d_model {} and {} layers, the model has {} and {}",
          r.d_model, r.n_layer, D, L);
  for (const auto* qs : {&r.q_attn, &r.q_mlp})
    for (const auto& q : *qs)
      require(q.size() == static_cast<size_t>(D) * D, "apply_rotation: a basis is not {}x{}", D, D);

  auto out = std::make_shared<Weights<E>>();
  out->cfg = c;
  out->cfg.tied_embeddings = false;
  out->storage = storage;
  out->bf16_compute = w.bf16_compute && storage == DType::BF16;
  out->rope_freq_factors = w.rope_freq_factors;

  SingleThreadedBlas single;
  out->tok_embd = rotate_right<E>(host_copy(w.tok_embd), nullptr, r.q_attn[0], storage,
                                  "token_embd.weight.rot");
  const std::vector<double> g_out = host_vec(w.out_norm);
  out->output = rotate_right<E>(host_copy(w.output), &g_out, r.q_attn[static_cast<size_t>(L)],
                                storage, "output.weight.rot");
  out->out_norm = ones<E>(D, "output_norm.weight.rot");

  for (int l = 0; l < L; ++l) {
    const LayerWeights<E>& src = w.layers[static_cast<size_t>(l)];
    const std::vector<double>& qa = r.q_attn[static_cast<size_t>(l)];
    const std::vector<double>& qm = r.q_mlp[static_cast<size_t>(l)];
    const std::vector<double>& qn = r.q_attn[static_cast<size_t>(l) + 1];
    const std::vector<double> ga = host_vec(src.attn_norm), gf = host_vec(src.ffn_norm);

    // Inputs in float64 (q, k, v, gate, up folded), outputs of the same shapes.
    struct Prod {
      const Matrix<E>* m;
      const char* name;
      std::vector<double> in, out;
    };
    Prod p[kNumProj] = {{&src.wq, "attn_q", {}, {}},       {&src.wk, "attn_k", {}, {}},
                        {&src.wv, "attn_v", {}, {}},       {&src.wo, "attn_output", {}, {}},
                        {&src.w_gate, "ffn_gate", {}, {}}, {&src.w_up, "ffn_up", {}, {}},
                        {&src.w_down, "ffn_down", {}, {}}};
    for (int i = 0; i < kNumProj; ++i) {
      const Proj pr = static_cast<Proj>(i);
      const std::vector<double>* fold = site_of(pr) == Site::Attn  ? &ga
                                        : site_of(pr) == Site::Mlp ? &gf
                                                                   : nullptr;
      p[i].in = host_copy(*p[i].m).widen_all(fold);
      p[i].out.resize(p[i].in.size());
    }
    std::vector<double> rot_am(static_cast<size_t>(D) * D), rot_mn(static_cast<size_t>(D) * D);
    std::vector<Gemm> tasks;
    auto right = [&](Prod& x, const std::vector<double>& q) {  // W'·Q
      add_gemm(tasks, false, x.m->rows, D, D, x.in.data(), q.data(), x.out.data());
    };
    auto left = [&](Prod& x, const std::vector<double>& q) {  // Qᵀ·W
      add_gemm(tasks, true, D, x.m->cols, D, q.data(), x.in.data(), x.out.data());
    };
    right(p[0], qa);
    right(p[1], qa);
    right(p[2], qa);
    left(p[3], qm);
    right(p[4], qm);
    right(p[5], qm);
    left(p[6], qn);
    add_gemm(tasks, true, D, D, D, qm.data(), qa.data(), rot_am.data());  // M = Q_mlpᵀ·Q_attn
    add_gemm(tasks, true, D, D, D, qn.data(), qm.data(), rot_mn.data());  // N = Q_nextᵀ·Q_mlp
    run_gemms(tasks);

    LayerWeights<E> lw;
    lw.attn_norm = ones<E>(D, "attn_norm.weight.rot");
    lw.ffn_norm = ones<E>(D, "ffn_norm.weight.rot");
    for (int i = 0; i < kNumProj; ++i) {
      MatrixSink<E> sink(storage, p[i].m->rows, p[i].m->cols,
                         fmt::format("blk.{}.{}.weight.rot", l, p[i].name));
      sink.put(0, p[i].m->rows, p[i].out.data());
      lw.proj(static_cast<Proj>(i)) = sink.finish();
    }
    out->layers.push_back(std::move(lw));
    MatrixSink<E> am(rotation_storage, D, D, fmt::format("blk.{}.rot_attn_mlp", l));
    am.put(0, D, rot_am.data());
    out->rot_attn_mlp.push_back(am.finish());
    MatrixSink<E> mn(rotation_storage, D, D, fmt::format("blk.{}.rot_mlp_next", l));
    mn.put(0, D, rot_mn.data());
    out->rot_mlp_next.push_back(mn.finish());
  }
  return out;
}

#define SPARSIM_INSTANTIATE_ROTATION(E)                                                      \
  template Rotation compute_rotation<E>(const Weights<E>&);                                  \
  template std::shared_ptr<Weights<E>> apply_rotation<E>(const Weights<E>&, const Rotation&, \
                                                         DType, DType);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_ROTATION)

}  // namespace sparsim::sparsity
