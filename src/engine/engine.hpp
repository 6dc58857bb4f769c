#pragma once
/// The Llama forward pass (prefill and decode) over a KV cache.
///
///   x = embed(tokens)
///   for each block l:
///     h  = rmsnorm(x) ; q,k,v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ ; rope(q, k) ; cache ← k, v
///     (token gate: rows it skips compute no q, attention or O and add nothing to x)
///     x += attention(q, cache)·Woᵀ        (channel selector: compact cached keys after prefill)
///     h  = rmsnorm(x) ; x += (silu(h·Wgateᵀ) ⊙ h·Wupᵀ)·Wdownᵀ
///   logits = rmsnorm(x)·Woutputᵀ
///
/// Prefill runs many tokens of several sequences at once (GEMM); decode runs one token per
/// sequence (GEMV). Both write the same cache and produce the same logits.
///
/// A pruned model (RAP, KVPruner; Config::attn) has narrower heads per layer: q/k heads
/// qk_head_dim(l) wide, v heads v_head_dim(l) wide, a per-layer KV cache of those widths, RoPE
/// by rotation units at each kept pair's original frequency (Config::rope_units), and the full
/// model's softmax scale 1/√head_dim.
#include "core/timer.hpp"
#include "engine/hooks.hpp"
#include "engine/kv_cache.hpp"
#include "flops/ledger.hpp"
#include "kernels/attention.hpp"
#include "kernels/attention_device.hpp"
#include "kernels/attention_gemm.hpp"
#include "kernels/linear.hpp"
#include "kernels/pointwise.hpp"
#include "kernels/sparse_gemv.hpp"
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
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

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

  /// Token gate before attention (Token Filtering); `g` is not owned; nullptr: none.
  void set_token_gate(TokenGate<E>* g) { tgate_ = g; }
  TokenGate<E>* token_gate() const { return tgate_; }
  /// Where a gate's dropped tokens go (gate->drop_skipped()): with `on` (the default) the gated
  /// layers of sequences started (position 0) under the gate keep only the kept tokens
  /// (KVCache::set_token_compaction), so their bytes are freed; off, or with a channel
  /// selector or token evictor attached, the dropped positions stay allocated and are masked
  /// out of attention. Both give the same attention up to the order of the sums. Takes effect
  /// at the next call at position 0.
  void set_drop_compaction(bool on) { drop_compaction_ = on; }
  bool drop_compaction() const { return drop_compaction_; }
  /// K-cache channel selector run after prefill (ThinK, GRACE); not owned; nullptr: none.
  void set_channel_selector(ChannelSelector<E>* s) { selector_ = s; }
  ChannelSelector<E>* channel_selector() const { return selector_; }
  /// Token evictor run after prefill (StreamingLLM, H2O, SnapKV, PyramidKV), before the channel
  /// selector; not owned; nullptr: none.
  void set_token_evictor(TokenEvictor<E>* v) { evictor_ = v; }
  TokenEvictor<E>* token_evictor() const { return evictor_; }
  /// Structured pruner of heads and FFN channels per call (Probe Pruning); not owned; nullptr:
  /// none. Runs op by op (no fused decode) on models that are neither structurally pruned nor
  /// low-rank, without a token gate.
  void set_structured_pruner(StructuredPruner<E>* p) { pruner_ = p; }
  StructuredPruner<E>* structured_pruner() const { return pruner_; }

  /// The KV cache (layout per layer and head, bytes allocated).
  const KVCache<E>& cache() const { return cache_; }
  /// Compacts the cached keys of positions 0 … kept.positions − 1 of `layer` to the kept
  /// channels (what a channel selector's result is applied with); recorded in the ledger as
  /// channel_select with the selector's own cost.
  void compact_keys(int layer, const KeptChannels& kept, flops::Phase ph = flops::Phase::Prefill);

  /// Attention-mass recording (the dense model's attention a position receives from later
  /// queries): with `on`, every call adds per layer, sequence and position the softmax weight
  /// summed over later rows and heads, and the number of later rows. Costs as much as the
  /// attention again; dense-layout layers only.
  void record_attention_mass(bool on);
  /// Host copies [seq][position] of the accumulated mass and query counts of `layer`.
  std::vector<double> attention_mass(int layer) const;
  std::vector<double> attention_mass_queries(int layer) const;

  /// Called with the dense activations feeding projections (calibration, dumps); empty: none.
  void set_observer(ActivationObserver<E> obs) { observer_ = std::move(obs); }

  /// Runs block `layer` in place on x[n_seq·T][d_model] (tokens s·T + t at positions p0 + t),
  /// exactly as forward() does, writing that layer's cache. For calibration and profiling.
  void run_block(int layer, const Mat<E>& x, int n_seq, int T, int p0);

  /// Device decode path: single-token calls without a masker, observer, rotation, token gate or
  /// compacted cache run each block as five kernels (RMSNorm+Q/K/V+RoPE+cache store, attention,
  /// O+residual, RMSNorm+gate/up+SwiGLU, down+residual). On by default; off: the op-by-op
  /// kernels (which `set_profile` also selects, to time each op). Host backends always run op
  /// by op.
  void set_fused_decode(bool on) { fused_ = on; }
  bool fused_decode() const { return fused_; }
  /// CUDA: capture a single-token decode step (fused path, no ledger) as a CUDA graph once per
  /// sequence count and replay it; a step whose capture fails runs normally and turns graphs
  /// off. No effect on other backends.
  void set_graph(bool on) { graph_ = on; }
  bool graph() const { return graph_; }
  /// Runs the device kernels (fused decode, split-K decode and tiled prefill attention, the
  /// split sparse GEMV) on a host backend too: for tests of those kernels' wiring. Devices
  /// always run them.
  void set_device_path(bool on);

  /// Per-op time (fences after every kernel, so only for profiling runs), accumulated until
  /// clear_op_seconds(); see profile_timer() for which timer measures which op.
  void set_profile(bool on) { profile_ = on; }
  /// The clock of the per-op times: wall (default) or the process's CPU time.
  void set_profile_clock(Clock c) { profile_clock_ = c; }
  const std::array<double, flops::kNumOps>& op_seconds() const { return op_seconds_; }
  void clear_op_seconds() { op_seconds_.fill(0.0); }

 private:
  void ensure_rows(int n, int n_out);
  void set_positions(int n_seq, int T, int p0);
  void mark(flops::Op op);
  void proj(const CMat<E>& x, Proj p, int layer, const Mat<E>& y, flops::Phase ph,
            const SparseRows<E>& rows, int dense_rows = -1);
  void proj(const CMat<E>& x, Proj p, int layer, const Mat<E>& y, flops::Phase ph) {
    proj(x, p, layer, y, ph, sparse_);
  }
  void plain_proj(const CMat<E>& x, const Matrix<E>& w, const Mat<E>& y, flops::Op op, int layer,
                  flops::Phase ph, double realised_fraction = 1.0, int dense_rows = -1);
  void attend(int l, const CMat<E>& q, const Mat<E>& out, int n_seq, int T, int p0);
  /// A low-rank K/V layer (PaLU, SVD-LLM): rebuilds the keys (then rotates them) and values of
  /// positions 0 … p0+T−1 from the cached latents and attends over them.
  void attend_low_rank(int l, const CMat<E>& q, const Mat<E>& out, int n_seq, int T, int p0,
                       flops::Phase ph);
  /// RoPE of layer l on the query (is_q) or key rows x at positions pos: a pruned layer by its
  /// rotation units (each kept pair at its own frequency), a dense one pair by pair.
  void rope(int l, const Mat<E>& x, const IVec<E>& pos, bool is_q);
  /// Queries and keys of layer l in one launch (the same rotations as rope() on each).
  void rope_qk(int l, const Mat<E>& q, const Mat<E>& k, const IVec<E>& pos);
  /// slots (token-compacted layer): per row the held slot it attends up to (nullptr: its
  /// position)
  void attention_ledger(int l, flops::Phase ph, int n_seq, int T, int p0, const int* skip,
                        int kernels = 2, const int* slots = nullptr);
  void select_channels(int l, int n_seq, int T, const CMat<E>& q, const int* kept_rows, int n_rows,
                       flops::Phase ph);
  /// End of a prefill in layer l: the token evictor, then the channel selector, then the
  /// evictor's byte accounting. q holds the queries of the call's rows (kept_rows: of those
  /// rows only).
  void after_prefill(int l, int n_seq, int T, const CMat<E>& q, const int* kept_rows, int n_rows,
                     flops::Phase ph);
  void evict_tokens(int l, int n_seq, int T, const CMat<E>& q, const int* kept_rows, int n_rows,
                    flops::Phase ph);
  /// Evicts a layer's tokens (when `kept` holds any) and counts the selection in the ledger.
  void finish_eviction(int l, const KeptTokens& kept, flops::Phase ph);
  /// The key-mass output the prefill attention of layer l fills for H2O (nullptr: none).
  KeyMass<E>* key_mass(int l, int n_seq, int T, int p0);
  /// One transformer block over the call's rows: attention (one of the paths below), then the
  /// MLP, each added to the residual stream x.
  void block(int l, const Mat<E>& x, int n_seq, int T, int p0, flops::Phase ph);
  /// Refuses a combination of model and policies layer l cannot run.
  void check_layer_policies(int l, bool gated, bool tok_compact) const;
  /// Low-rank K/V layer: Q and the latents of the rows, the cache, attention over the rebuilt
  /// keys and values, W_o into tmp.
  void attention_low_rank(int l, const Mat<E>& xn, const Mat<E>& q, const Mat<E>& att,
                          const Mat<E>& tmp, int n_seq, int T, int p0, flops::Phase ph);
  /// Ungated layer: Q, K and V of every row, RoPE, the cache append.
  void qkv_rows(int l, const Mat<E>& xn, const Mat<E>& q, const Mat<E>& k, const Mat<E>& v,
                const IVec<E>& pos, int n_seq, int T, int p0, flops::Phase ph);
  /// Gated layer: K and V of every row into the cache, the gate's decision (in skip_; h_skip
  /// filled when a row is skipped and gate_on_host()), the dropped rows' cache entries; returns
  /// the kept rows' count.
  int gate_rows(int l, const Mat<E>& xn, const Mat<E>& k, const Mat<E>& v, const IVec<E>& pos,
                int n_seq, int T, int p0, flops::Phase ph, bool tok_compact,
                std::vector<int>& h_skip);
  /// Every row attends (after a gate that kept them all: their queries first), W_o into tmp.
  void attend_rows(int l, const Mat<E>& x, const Mat<E>& xn, const Mat<E>& q, const Mat<E>& att,
                   const Mat<E>& tmp, const IVec<E>& pos, int n, int n_seq, int T, int p0,
                   flops::Phase ph, bool gated);
  /// The kept rows alone: gathered, Q, attention and W_o, scattered into tmp (skipped rows 0).
  /// h_skip: the gate's decisions on the host, where gate_on_host() needs them (else empty).
  void attend_kept_rows(int l, const Mat<E>& xn, const Mat<E>& tmp, const std::vector<int>& h_skip,
                        int n, int n_keep, int n_seq, int T, int p0, flops::Phase ph,
                        bool tok_compact);
  /// Whether a gated layer's decisions must come to the host: for the ledger's per-row
  /// attention counts, a token-compacted layer's slots, a dropping gate's counts of held
  /// positions, the masker's per-row statistics, or the prompt rows a channel selector or token
  /// evictor observes. Otherwise they stay on the device and only their count is read.
  bool gate_on_host(bool tok_compact, int T, int p0) const;
  /// x ← x + tmp, or x ← x·Rᵀ + tmp with the rotation r of a WINA-rotated model.
  void residual_add(int l, const Mat<E>& x, const Mat<E>& tmp, const Mat<E>& rx, const Matrix<E>* r,
                    int n, flops::Phase ph);
  /// tmp += b per row (a structurally pruned layer's W_o / W_down bias; none: nothing).
  void add_output_bias(int l, const Kokkos::View<float*, DeviceOf<E>>& b, const Mat<E>& tmp, int n,
                       flops::Phase ph);
  bool use_fused(int T) const;
  bool fusable(int l) const;
  /// The RoPE unit table of a pruned layer whose heads were cut (null: the dense rotation).
  const RopeMap<E>* pruned_rope(int l) const {
    return w_->cfg.pruned() && rope_map_[static_cast<std::size_t>(l)].units > 0
               ? &rope_map_[static_cast<std::size_t>(l)]
               : nullptr;
  }
  void block_fused(int l, const Mat<E>& x, int n_seq, int p0, flops::Phase ph);
  void block_ledger(int l, int n, int n_keep, int n_seq, int T, int p0, flops::Phase ph,
                    const int* skip, bool fused = false, bool gated = false,
                    const int* slots = nullptr);
  /// End of a call with a gate that drops skipped tokens: every layer's cache occupancy.
  void account_cache(int n_seq);
  void finish_call();
  void decode_kernels(int n_seq, const Mat<E>& x, const Mat<E>& logits, flops::Phase ph);
  bool graph_step(int n_seq, const Mat<E>& x, const Mat<E>& logits);
  /// The structured pruner's pass over the input `in` of W_o or W_down (site) of layer l.
  void prune_structured(int l, Site site, const Mat<E>& x, const Mat<E>& in, flops::Phase ph);
  void observe(int l, Site s, const Mat<E>& x) {
    if (observer_) observer_(l, s, CMat<E>(x));
  }

  std::shared_ptr<const Weights<E>> w_;
  int max_seqs_, max_ctx_;
  flops::Ledger* ledger_;
  E exec_;
  KVCache<E> cache_;
  Cache<E> k_rebuilt_, v_rebuilt_;     // low-rank layers: keys and values rebuilt from the latents
  IVec<E> ctx_pos_;                    // 0 … max_ctx−1, the positions of rebuilt keys
  std::vector<RopeMap<E>> rope_map_;   // pruned model, per layer: RoPE units of the reduced heads
  std::vector<bool> rope_pairs_only_;  // pruned model, per layer: every RoPE unit a whole pair
  Mat<E> cos_, sin_;                   // [max_ctx][frequencies], by index (Config::rope_inv_freq)
  int cap_rows_ = 0, cap_out_ = 0;
  Mat<E> x_, xn_, q_, k_, v_, att_, tmp_, rx_, gate_, up_, logits_, last_;
  Mat<E> kpre_, xg_, og_, qobs_;  // token gate: pre-RoPE keys, kept rows in and out
  Mat<E> qevict_;                 // token evictor: observed queries
  KeyMass<E> key_mass_;           // token evictor: votes summed by the prefill attention
  int key_mass_layer_ = -1;       // the layer key_mass_ holds (-1: none)
  IVec<E> tok_, pos_, seq_, last_rows_, sparse_flags_;
  typename IVec<E>::HostMirror sparse_flags_host_;
  IVec<E> skip_, keep_rows_, keep_seq_, keep_pos_, keep_flags_;
  typename IVec<E>::HostMirror skip_host_;
  IVec<E> keep_slot_;            // token-compacted layer: the slot each attending row reads up to
  std::vector<int> h_slot_;      // token-compacted layer: the slot of each row of the call
  bool drop_compaction_ = true;  // see set_drop_compaction
  std::vector<int> h_sparse_flags_, h_keep_rows_;
  TokenGate<E>* tgate_ = nullptr;
  ChannelSelector<E>* selector_ = nullptr;
  TokenEvictor<E>* evictor_ = nullptr;
  StructuredPruner<E>* pruner_ = nullptr;
  bool record_mass_ = false;
  std::vector<Kokkos::View<double**, Layout, DeviceOf<E>>> mass_, mass_queries_;
  SparseRows<E> sparse_;
  attn::DecodeWorkspace<E> attn_ws_;
  attn::GemmWorkspace<E> attn_gemm_ws_;  ///< scores of the GEMM prefill attention (GPUs)
  SparseGemvWork<E> sparse_ws_;
  bool fused_ = true;
  bool device_path_ = false;  ///< device kernels on a host backend (tests)
  bool graph_ = false;
  int cur_p0_ = 0;
  struct Graphs;
  std::unique_ptr<Graphs> graphs_;
  /// Ledger entries of masked projections, completed once the call's kept counts are known.
  struct PendingMasked {
    flops::Op op;
    int layer;
    flops::Phase ph;
    double rows, cols, n, dense_n, bytes;
    int sparse_rows;  ///< flagged rows of the call (-1: the single-row column-skipping path)
    int ticket;
  };
  std::vector<PendingMasked> pending_;
  std::vector<std::array<Matrix<E>, kNumProj>> wt_;  // transposed projections [in][out]
  IVec<E> idx_;
  ProjectionMasker<E>* masker_ = nullptr;
  int sparse_from_ = kDecodeOnly;
  int seg_ = 0;  // rows per sequence of the current call, for linear()
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
