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

  /// Per-op wall time (fences after every kernel, so only for profiling runs).
  void set_profile(bool on) { profile_ = on; }
  const std::array<double, flops::kNumOps>& op_seconds() const { return op_seconds_; }

 private:
  void ensure_rows(int n, int n_out);
  void mark(flops::Op op);
  void proj(const CMat<E>& x, const Matrix<E>& w, const Mat<E>& y, flops::Op op, int layer,
            flops::Phase ph);

  std::shared_ptr<const Weights<E>> w_;
  int max_seqs_, max_ctx_;
  flops::Ledger* ledger_;
  E exec_;
  std::vector<Cache<E>> kcache_, vcache_;  // per layer: [seq][pos][kv_dim]
  Mat<E> cos_, sin_;                       // [max_ctx][head_dim/2]
  int cap_rows_ = 0, cap_out_ = 0;
  Mat<E> x_, xn_, q_, k_, v_, att_, tmp_, gate_, up_, logits_, last_;
  IVec<E> tok_, pos_, last_rows_;
  LinearScratch<E> scratch_;
  bool profile_ = false;
  std::array<double, flops::kNumOps> op_seconds_{};
  std::chrono::steady_clock::time_point t_mark_;
};

}  // namespace sparsim
