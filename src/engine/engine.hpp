#pragma once
/// The Llama forward pass (prefill and decode) over a KV cache.
///
///   x = embed(tokens)
///   for each block l:
///     h  = rmsnorm(x) ; q,k,v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ ; rope(q, k) ; cache ← k, v
///     x += attention(q, cache)·Woᵀ
///     h  = rmsnorm(x) ; x += (silu(h·Wgateᵀ) ⊙ h·Wupᵀ)·Wdownᵀ
///   logits = rmsnorm(x)·Woutputᵀ
///
/// Prefill runs many tokens of several sequences at once (GEMM); decode runs one token per
/// sequence (GEMV). Both write the same cache and produce the same logits.
#include "core/timer.hpp"
#include "engine/hooks.hpp"
#include "flops/ledger.hpp"
#include "kernels/attention.hpp"
#include "kernels/linear.hpp"
#include "kernels/views.hpp"
#include "model/weights.hpp"

#include <Kokkos_Core.hpp>

#include <array>
#include <chrono>
#include <memory>
#include <vector>

namespace sparsim {

template <class E>
class Engine {
 public:
  /// `max_seqs` sequences of up to `max_ctx` positions each share the cache.
  Engine(std::shared_ptr<const Weights<E>> weights, int max_seqs, int max_ctx,
         flops::Ledger* ledger = nullptr, E exec = E());

  /// Runs tokens[s][t] (every sequence the same length T ≥ 1) at cache positions p0 … p0+T−1.
  /// Returns logits [n_seq·T][vocab] (row s·T + t) when `all_logits`, else [n_seq][vocab] for
  /// each sequence's last token. The view stays valid until the next call.
  Mat<E> forward(const std::vector<std::vector<int>>& tokens, int p0, bool all_logits = true) {
    return forward_tail(tokens, p0, all_logits ? -1 : 1);
  }

  /// As forward(), with logits for the last `tail` positions of each sequence only (−1: all):
  /// [n_seq·tail][vocab], row s·tail + i for position T − tail + i. Scoring a window needs
  /// only the positions it scores, which keeps the LM head and the logits small.
  Mat<E> forward_tail(const std::vector<std::vector<int>>& tokens, int p0, int tail);

  const Config& config() const { return w_->cfg; }
  const Weights<E>& weights() const { return *w_; }
  int max_ctx() const { return max_ctx_; }
  int max_seqs() const { return max_seqs_; }
  void set_ledger(flops::Ledger* l) { ledger_ = l; }
  const E& exec() const { return exec_; }

  /// Activation sparsity: `m` (not owned; nullptr: dense) masks projection inputs of the rows
  /// chosen by set_sparse_from().
  void set_masker(ProjectionMasker<E>* m) { masker_ = m; }
  ProjectionMasker<E>* masker() const { return masker_; }
  /// Rows the masker sparsifies: token index t ≥ `t0` of every sequence of a call, or with
  /// kDecodeOnly (the default) every row of single-token calls and none of longer ones.
  static constexpr int kDecodeOnly = -1;
  void set_sparse_from(int t0) { sparse_from_ = t0; }
  /// Column-skipping decode: with `on`, single-token calls of one sequence run masked
  /// projections through the sparse GEMV on transposed copies of the projection weights
  /// (built here; they double the projection memory). Off: masked inputs go through the dense
  /// kernels (same result within fp32 reordering).
  void use_column_skipping(bool on);
  bool column_skipping() const { return !wt_.empty(); }

  /// Called with the dense activations feeding projections (calibration, dumps); empty: none.
  void set_observer(ActivationObserver<E> obs) { observer_ = std::move(obs); }

  /// Runs block `layer` in place on x[n_seq·T][d_model] (tokens s·T + t at positions p0 + t),
  /// exactly as forward() does, writing that layer's cache. For calibration and profiling.
  void run_block(int layer, const Mat<E>& x, int n_seq, int T, int p0);

  /// Per-op wall time (fences after every kernel, so only for profiling runs), accumulated
  /// until reset_profile(); see profile_timer() for which timer measures which op.
  void set_profile(bool on) { profile_ = on; }
  /// The clock of the per-op times: wall (default) or the process's CPU time.
  void set_profile_clock(Clock c) { profile_clock_ = c; }
  const std::array<double, flops::kNumOps>& op_seconds() const { return op_seconds_; }
  void reset_profile() { op_seconds_.fill(0.0); }

 private:
  void ensure_rows(int n, int n_out);
  void set_positions(int n_seq, int T, int p0);
  void mark(flops::Op op);
  void proj(const CMat<E>& x, Proj p, int layer, const Mat<E>& y, flops::Phase ph);
  void plain_proj(const CMat<E>& x, const Matrix<E>& w, const Mat<E>& y, flops::Op op, int layer,
                  flops::Phase ph, double realised_fraction = 1.0);
  void block(int l, const Mat<E>& x, int n_seq, int T, int p0, flops::Phase ph);
  void observe(int l, Site s, const Mat<E>& x) {
    if (observer_) observer_(l, s, CMat<E>(x));
  }

  std::shared_ptr<const Weights<E>> w_;
  int max_seqs_, max_ctx_;
  flops::Ledger* ledger_;
  E exec_;
  std::vector<Cache<E>> kcache_, vcache_;  // per layer: [seq][pos][kv_dim]
  Mat<E> cos_, sin_;                       // [max_ctx][head_dim/2]
  int cap_rows_ = 0, cap_out_ = 0;
  Mat<E> x_, xn_, q_, k_, v_, att_, tmp_, rx_, gate_, up_, logits_, last_;
  IVec<E> tok_, pos_, last_rows_, sparse_flags_;
  SparseRows<E> sparse_;
  std::vector<std::array<Matrix<E>, kNumProj>> wt_;  // transposed projections [in][out]
  IVec<E> idx_;
  ProjectionMasker<E>* masker_ = nullptr;
  int sparse_from_ = kDecodeOnly;
  ActivationObserver<E> observer_;
  LinearScratch<E> scratch_;
  bool profile_ = false;
  std::array<double, flops::kNumOps> op_seconds_{};
  Clock profile_clock_ = Clock::Wall;
  double t_mark_ = 0;
};

/// The op whose timer measures `op` in a profiled forward pass: the attention kernel computes
/// scores, softmax and the value mix in one launch (after the KV-cache append), all timed as
/// attn_score; every other op has its own timer.
inline flops::Op profile_timer(flops::Op op) {
  return op == flops::Op::AttnSoftmax || op == flops::Op::AttnValue ? flops::Op::AttnScore : op;
}

}  // namespace sparsim
