#pragma once
/// Extension points of the forward pass: a per-projection input masker (activation sparsity)
/// and an observer of the activations that feed projections (calibration, dumps).
#include "kernels/views.hpp"
#include "model/weights.hpp"

#include <functional>

namespace sparsim {

/// Rows of one forward call that are sparsified: row r (= s·T + t) is sparse when its flag is
/// 1. `count` is the number of flagged rows (0: the call is dense).
template <class E>
struct SparseRows {
  IVec<E> flags;
  int count = 0;
};

/// Decides what input each projection reads. Implementations own their output buffers.
template <class E>
class ProjectionMasker {
 public:
  virtual ~ProjectionMasker() = default;

  /// Called once at the start of every forward call (and run_block) with its row count.
  virtual void begin_call(int n_rows) { (void)n_rows; }

  /// Whether projection `p` of `layer` is masked at all (false: it reads x unchanged).
  virtual bool active(int layer, Proj p) const = 0;

  /// The input projection `p` of `layer` reads instead of x[n][d]: rows flagged in `rows`
  /// masked, the others copied. Returns the sum over flagged rows of kept entries.
  virtual CMat<E> apply(const E& exec, int layer, Proj p, const CMat<E>& x,
                        const SparseRows<E>& rows, long long& kept) = 0;

  /// Decode fast path: kept indices (ascending) of the masked single row x[1][d] of projection
  /// `p`, for the column-skipping GEMV. Returns their number; fills `idx` and `xm` (the masked
  /// row, or nothing when xm is empty).
  virtual int indices(const E& exec, int layer, Proj p, const CMat<E>& x, const IVec<E>& idx,
                      const Vec<E>& xm) = 0;
};

/// Called with the dense activation at `site` of `layer` ([n][d] rows of the current call).
template <class E>
using ActivationObserver = std::function<void(int layer, Site site, const CMat<E>& x)>;

}  // namespace sparsim
