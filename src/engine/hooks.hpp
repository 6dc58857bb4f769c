#pragma once
/// Extension points of the forward pass: a per-projection input masker (activation sparsity)
/// and an observer of the activations that feed projections (calibration, dumps).
#include "kernels/views.hpp"
#include "model/weights.hpp"

#include <functional>

namespace sparsim {

/// Rows of one forward call that are sparsified: row r (= s·T + t) is sparse when its flag is
/// 1. `count` is the number of flagged rows (0: the call is dense). The flags live on the
/// device (for kernels) and on the host (for statistics).
template <class E>
struct SparseRows {
  IVec<E> flags;
  typename IVec<E>::HostMirror host_flags;
  int count = 0;
};

/// Decides what input each projection reads. Implementations own their output buffers.
///
/// Masking runs asynchronously: the kept counts of a call stay in device memory until the
/// engine has finished the call's kernels and calls end_call(), once per forward call. Each
/// masked projection gets a ticket; kept(ticket) is valid after end_call().
template <class E>
class ProjectionMasker {
 public:
  virtual ~ProjectionMasker() = default;

  /// Called once at the start of every forward call (and run_block) with its row count.
  virtual void begin_call(int n_rows) { (void)n_rows; }

  /// Whether projection `p` of `layer` is masked at all (false: it reads x unchanged).
  virtual bool active(int layer, Proj p) const = 0;

  /// The input projection `p` of `layer` reads instead of x[n][d]: rows flagged in `rows`
  /// masked, the others copied. `ticket` identifies the call for kept().
  virtual CMat<E> apply(const E& exec, int layer, Proj p, const CMat<E>& x,
                        const SparseRows<E>& rows, int& ticket) = 0;

  /// Decode fast path: kept indices (ascending) of the masked single row x[1][d] of projection
  /// `p` into `idx`, and the masked row into `xm` (nothing when xm is empty). Returns a
  /// one-element view holding the number of kept indices (device memory on devices: nothing is
  /// read back).
  virtual IVec<E> indices(const E& exec, int layer, Proj p, const CMat<E>& x, const IVec<E>& idx,
                          const Vec<E>& xm, int& ticket) = 0;

  /// Decode fast path for a plain threshold rule (keep |x_j| >= tau, no score weights): when
  /// projection `p` of `layer` (input width d) has one, returns true with tau and a one-element
  /// slot (in the execution space's memory) for the kept count, which the caller's kernel
  /// fills; the count is logged like indices()'. No selection kernel is needed then.
  virtual bool threshold_slot(int layer, Proj p, int d, float& tau, IVec<E>& count, int& ticket) {
    (void)layer, (void)p, (void)d, (void)tau, (void)count, (void)ticket;
    return false;
  }

  /// After the kernels of the call have finished: the statistics of the call are complete.
  virtual void end_call(const E& exec) { (void)exec; }

  /// Σ over the flagged rows of a ticket's projection call of the kept entries.
  virtual long long kept(int ticket) const = 0;
};

/// Called with the dense activation at `site` of `layer` ([n][d] rows of the current call).
template <class E>
using ActivationObserver = std::function<void(int layer, Site site, const CMat<E>& x)>;

}  // namespace sparsim
