#pragma once
/// Extension points of the forward pass: a per-projection input masker (activation sparsity),
/// a token gate before attention (Token Filtering), a K-cache channel selector run after
/// prefill (ThinK, GRACE), a token evictor run after prefill (StreamingLLM, H2O, SnapKV,
/// PyramidKV), a structured pruner of heads and FFN channels per call (Probe Pruning) and an
/// observer of the activations that feed projections
/// (calibration, dumps).
#include "kernels/kv_layout.hpp"
#include "kernels/views.hpp"
#include "model/weights.hpp"

#include <functional>
#include <stdexcept>
#include <vector>

namespace sparsim {

/// Rows of one forward call that are sparsified: row r (= s·T + t) is sparse when its flag is
/// 1. `count` is the number of flagged rows (0: the call is dense). The flags live on the
/// device (for kernels) and on the host (for statistics).
template <class E>
struct SparseRows {
  IVec<E> flags;
  typename IVec<E>::HostMirror host_flags;
  int count = 0;
  /// Host table: the call's row each row of x stands for (nullptr: row r is row r). Set when a
  /// token gate runs a projection on the gathered kept rows only.
  const int* origin = nullptr;
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

/// What a policy's own work cost in one call, for the FLOP ledger.
struct PolicyCost {
  double flops = 0, bytes = 0;
};

/// One layer's KV cache at the end of a call (over the call's sequences), reported to a token
/// gate that drops skipped tokens (TokenGate::account_cache).
struct KVOccupancy {
  double positions = 0;        ///< Σ over the call's sequences of the positions written
  double held = 0;             ///< Σ of the positions held (written less dropped)
  double position_bytes = 0;   ///< bytes of one position's key and value at full widths
  double allocated = 0;        ///< bytes of the layer's key and value buffers as allocated
  double allocated_dense = 0;  ///< bytes of the dense layout's buffers (max_seqs × max_ctx)
  bool compacted = false;      ///< the layer holds only kept tokens (else every position)
};

/// Decides, per layer and row, whether a token skips attention. The engine calls it after the
/// row's K and V are computed and cached; a skipped row's Q projection, attention and O
/// projection are not computed and its attention output is zero (the residual passes through).
/// The decision for token t must depend only on tokens ≤ t of its sequence, so that a
/// teacher-forced call over many tokens and token-by-token calls decide alike.
template <class E>
class TokenGate {
 public:
  virtual ~TokenGate() = default;
  /// Start of a forward call (or run_block) of n_seq × T rows at positions p0 … p0 + T − 1;
  /// p0 = 0 starts new sequences.
  virtual void begin_call(const E& exec, int n_seq, int T, int p0) = 0;
  /// Whether `layer` is gated at all.
  virtual bool active(int layer) const = 0;
  /// Keys the gate reads: before RoPE (true) or as cached, after RoPE (false).
  virtual bool pre_rope_keys() const { return false; }
  /// Whether skipped tokens are removed from the KV cache (no later token attends to them).
  virtual bool drop_skipped() const { return false; }
  /// Sets skip(r) ∈ {0, 1} for the rows r = s·T + t of the call, from their keys k [n][k_width]
  /// and values v [n][v_width] in `layer`; returns the number of skipped rows and the test's
  /// cost.
  virtual int decide(const E& exec, int layer, const CMat<E>& k, const CMat<E>& v,
                     const IVec<E>& skip, PolicyCost& cost) = 0;
  /// With drop_skipped(): the KV cache of every layer at the end of the call (index = layer),
  /// called just before end_call().
  virtual void account_cache(const std::vector<KVOccupancy>& layers) { (void)layers; }
  /// End of the call (all layers done).
  virtual void end_call(const E& exec) { (void)exec; }
};

/// Chooses which key channels of each (sequence, KV head) stay in the cache after a prefill.
/// The engine calls select() once per layer at the end of a call that starts new sequences
/// (p0 = 0, T > 1), after that layer's attention, and compacts the layer's cached prompt keys
/// to the channels returned (KVCache::compact_keys); later tokens' keys stay full width and
/// read the query's full width.
template <class E>
class ChannelSelector {
 public:
  virtual ~ChannelSelector() = default;
  /// Queries observed per sequence: the last w positions of the prefill (ThinK: 32).
  virtual int observation_window() const { return 32; }
  /// Whether select() may return channels to compact. False (e.g. nothing to prune): the cache
  /// stays dense whatever the prompt, so a protocol need not split a call at the prefill and the
  /// run is the dense run bit for bit.
  virtual bool compacts() const { return true; }
  /// `cache`: the layer's cache (dense layout; positions 0 … T − 1 hold the prompt's keys
  /// after RoPE); `q_obs` [n_seq·w][n_head·qk]: the queries (after RoPE) of the last
  /// w = min(observation_window(), T) positions of each sequence, row s·w + i (zero rows for
  /// tokens a gate skipped). Returns the kept channels (positions = T), or an empty result to
  /// leave the layer dense; its flops/bytes are recorded as the ledger op channel_select.
  virtual KeptChannels select(const E& exec, int layer, const KVLayer<E>& cache,
                              const AttnShape& shape, const CMat<E>& q_obs, int n_seq, int T) = 0;
};

/// Chooses which prompt tokens each (sequence, KV head) keeps in the cache after a prefill.
/// The engine calls select() once per layer at the end of a call that starts new sequences
/// (p0 = 0, T > 1), after that layer's attention (the prompt attends densely) and before a
/// channel selector, and masks the evicted positions of each head (KVCache::evict): no later
/// query attends to them. Tokens written later are all kept.
template <class E>
class TokenEvictor {
 public:
  virtual ~TokenEvictor() = default;
  /// Queries the policy reads for a prompt of T tokens: the last w positions (SnapKV's
  /// observation window; H2O: T, every query; StreamingLLM: none, 0).
  virtual int observation_window(int T) const = 0;
  /// Whether a prompt of T tokens loses any token in some layer (false: the budget covers it, the
  /// cache stays dense, and a protocol need not split a call at the prompt's end).
  virtual bool evicts(int T) const = 0;
  /// `cache`: the layer's cache (dense layout; positions 0 … T − 1 hold the prompt's keys after
  /// RoPE); `q_obs` [n_seq·w][n_head·qk]: the queries (after RoPE) of the last
  /// w = observation_window(T) positions of each sequence, row s·w + i; `q_ok` [n_seq·w]: 1
  /// where the row has a query (0: a token gate skipped it). Returns the kept tokens, or an
  /// empty result to keep the whole prompt (budget not below T).
  virtual KeptTokens select(const E& exec, int layer, const KVLayer<E>& cache,
                            const AttnShape& shape, const CMat<E>& q_obs, const IVec<E>& q_ok,
                            int n_seq, int T) = 0;
  /// Whether the votes are the weight every prompt query gives each key (H2O's accumulated
  /// attention). The engine's host prefill attention then sums them as it computes the weights
  /// (KeyMass) and calls select_voted() instead of select().
  virtual bool votes_are_key_mass() const { return false; }
  /// select() with the votes summed by the prefill attention: votes [n_seq][n_kv_head][≥ T]
  /// over every row of the prompt (no token gate, no dropped positions); `seconds`: the time
  /// the sums took, counted as the selection's.
  virtual KeptTokens select_voted(const E& exec, int layer, const KVLayer<E>& cache,
                                  const AttnShape& shape,
                                  const Kokkos::View<double***, Layout, DeviceOf<E>>& votes,
                                  double seconds, int n_seq, int T) {
    (void)exec, (void)layer, (void)cache, (void)shape, (void)votes, (void)seconds, (void)n_seq,
        (void)T;
    throw std::logic_error("this token evictor does not take summed attention as its votes");
  }
  /// After the layer's eviction and channel selection: the bytes of the prompt's keys and
  /// values, dense and as held by a cache of only the kept tokens (KVCache::prompt_bytes).
  virtual void account(int layer, double dense_bytes, double kept_bytes) {
    (void)layer, (void)dense_bytes, (void)kept_bytes;
  }
};

/// Zeroes whole attention heads and FFN channels of a call (Probe Pruning). The engine calls
/// prune() twice per active layer: with the input of W_o (the attention output
/// [n][n_head·v_dim], Site::O) after attention, and with the input of W_down (act(gate)·up
/// [n][d_ff], Site::Down) after SwiGLU, each time with the residual stream [n][d_model] that
/// feeds that module (the block input; the state after attention). The policy zeroes the pruned
/// columns in place; the kept columns are left untouched, so a policy that keeps everything
/// leaves the run bitwise dense.
template <class E>
class StructuredPruner {
 public:
  virtual ~StructuredPruner() = default;
  /// Start of a forward call (or run_block) of n_seq × T rows at positions p0 … p0 + T − 1.
  virtual void begin_call(int n_seq, int T, int p0) = 0;
  /// Whether `layer` is pruned at all (false: prune() is not called).
  virtual bool active(int layer) const = 0;
  /// Zeroes the pruned columns of `in` (site O or Down of `layer`); `cost`: the policy's work.
  virtual void prune(const E& exec, int layer, Site site, const CMat<E>& resid, const Mat<E>& in,
                     PolicyCost& cost) = 0;
};

/// Called with the dense activation at `site` of `layer` ([n][d] rows of the current call).
template <class E>
using ActivationObserver = std::function<void(int layer, Site site, const CMat<E>& x)>;

}  // namespace sparsim
