#pragma once
/// The KV cache as an object with a layout per layer and head.
///
/// Dense layout of one layer: keys [seq][pos][n_kv·qk] and values [seq][pos][n_kv·vd].
/// K-channel pruning (ThinK, GRACE) compacts the keys of the first P positions (the prompt)
/// after prefill: they are stored with only the kept channels of each (sequence, KV head),
/// the channel indices beside them, and keys written later stay full width:
///
///   kc  [seq][P][cap]          compact prompt keys; head h of sequence s owns the columns
///                              koff(s, h) … koff(s, h + 1) − 1, holding channels kidx(s, c)
///   k   [seq][max_ctx − P][n_kv·qk]   full-width keys of positions P … max_ctx − 1
///
/// The full-width region is reallocated smaller on compaction, so the bytes really shrink. The
/// attention kernel (kernels/cached_attention.hpp) reads each region with the matching part of
/// the query. Optionally each position carries a "dropped" flag (a token gate that removes
/// skipped tokens from the cache): dropped positions take no part in later attention.
/// Token eviction (StreamingLLM, H2O, SnapKV, PyramidKV) marks, per (sequence, KV head), the
/// prompt positions a head no longer holds; the attention kernels give them no weight. The
/// mask does not shrink the buffers: prompt_bytes() says what a cache holding only the kept
/// tokens (at their compacted key widths) needs, beside the bytes allocated.
///
/// Token compaction (set_token_compaction): a layer whose skipped tokens leave the cache keeps
/// only the kept tokens of each sequence, in position order, at slots 0 … held − 1 of buffers of
/// `capacity` slots (grown in pages of kTokenPage as tokens arrive, released at a new prompt).
/// Keys are cached after RoPE, so a query needs only the slots, not the positions: it attends
/// to slots 0 … its own (KVLayer::tokens_compact). The host keeps the original position of
/// every held slot (held_positions) and, per sequence, the positions written and held, for the
/// byte accounting of every layer (dense layers hold every position written; a masked layer,
/// set_dropped, all but the dropped ones).
///
/// Shapes come from AttnShape per layer, so per-layer Q/K and V head widths (a pruned model)
/// need only attn_shape() to read them from the model.
#include "core/compat.hpp"
#include "kernels/kv_layout.hpp"
#include "model/config.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sparsim {

/// The attention shape of `layer` (the one place the engine reads head widths from).
inline AttnShape attn_shape(const Config& c, int layer) {
  AttnShape s;
  s.n_head = c.n_head_at(layer);  // a structurally pruned model's kept heads (Config::structure)
  s.n_kv_head = c.n_kv_head_at(layer);
  s.qk_dim = c.qk_head_dim(layer);  // a pruned model's own widths (Config::attn)
  s.v_dim = c.v_head_dim(layer);
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return s;
}

template <class E>
class KVCache {
 public:
  KVCache() = default;
  /// Dense layout for `max_seqs` sequences of `max_ctx` positions in every layer.
  KVCache(const Config& c, int max_seqs, int max_ctx);

  int n_layer() const { return static_cast<int>(layers_.size()); }
  int max_seqs() const { return max_seqs_; }
  int max_ctx() const { return max_ctx_; }
  const AttnShape& shape(int l) const { return shapes_[static_cast<std::size_t>(l)]; }
  const KVLayer<E>& layer(int l) const { return layers_[static_cast<std::size_t>(l)]; }

  /// Writes rows r = s·T + t of k [n][k_width] and v [n][v_width] at positions p0 + t. The
  /// positions must lie in the full-width region (p0 ≥ the compacted length).
  void store(const E& exec, int l, const CMat<E>& k, const CMat<E>& v, int n_seq, int T, int p0);

  /// Sets the dropped flag of positions p0 … p0+T−1 of the call's sequences from `skip`
  /// (row s·T + t; 1: drop). Allocates the flags on first use. `h_skip`: the same flags on the
  /// host (nullptr: none set), for the count of positions held.
  void set_dropped(const E& exec, int l, const IVec<E>& skip, const int* h_skip, int n_seq, int T,
                   int p0);
  /// The same, reading the host flags from `skip`.
  void set_dropped(const E& exec, int l, const IVec<E>& skip, int n_seq, int T, int p0) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), skip);
    set_dropped(exec, l, skip, h.data(), n_seq, T, p0);
  }

  /// Slots a token-compacted layer's buffers grow by.
  static constexpr int kTokenPage = 64;
  /// Turns token compaction of layer `l` on (the dense buffers are released; nothing is held)
  /// or off (dense buffers, nothing held). Throws when the layer's keys are channel-compacted
  /// or it evicts tokens.
  void set_token_compaction(int l, bool on);
  bool token_compacted(int l) const { return layer(l).tokens_compact; }
  /// Token-compacted layer: appends the rows r = s·T + t of k and v whose h_skip[r] is 0
  /// (h_skip nullptr: every row) at the next slots of their sequences, growing the buffers
  /// when needed. A call at p0 below a sequence's written positions first forgets the slots of
  /// positions ≥ p0. Returns per row its slot (−1: skipped, not stored).
  std::vector<int> store_kept(const E& exec, int l, const CMat<E>& k, const CMat<E>& v,
                              const int* h_skip, int n_seq, int T, int p0);
  /// Forgets what every sequence holds in layer `l` (a new prompt); a token-compacted layer
  /// releases its buffers.
  void reset_tokens(int l);
  /// Records that rows at positions p0 … p0+T−1 of sequences 0 … n_seq−1 were written to
  /// layer `l` by a kernel of its own (the fused decode); store() records its own writes.
  void note_written(int l, int n_seq, int T, int p0);
  /// Positions written to sequence s of layer l (p0 + T of its latest call) and positions
  /// held (written less dropped / not stored).
  int positions(int l, int s) const {
    return written_[static_cast<std::size_t>(l)][static_cast<std::size_t>(s)];
  }
  int held(int l, int s) const;
  /// Token-compacted layer: the original position of each held slot of sequence s, ascending.
  const std::vector<int>& held_positions(int l, int s) const {
    return slot_pos_[static_cast<std::size_t>(l)][static_cast<std::size_t>(s)];
  }
  /// Slots allocated per sequence of a token-compacted layer (max_ctx otherwise).
  int capacity(int l) const {
    return layer(l).tokens_compact ? static_cast<int>(layer(l).v.extent(1)) : max_ctx_;
  }
  /// Bytes of one position's key and value at the layer's full widths.
  std::size_t position_bytes(int l) const {
    return sizeof(float) * static_cast<std::size_t>(shape(l).k_width() + shape(l).v_width());
  }

  /// Compacts the keys of positions 0 … kept.positions − 1 of layer `l` to the kept channels.
  /// Sequences beyond kept.idx.size() keep no channel. The full-width region shrinks to the
  /// positions after the compacted ones. Throws when the layer is already compacted or the
  /// indices are invalid.
  void compact_keys(const E& exec, int l, const KeptChannels& kept);

  /// Restores the dense layout of layer `l` (a new prompt starts at position 0); contents are
  /// not kept. Nothing happens when the layer is dense.
  void reset_layout(int l);
  /// Clears the dropped flags of layer `l` (when allocated).
  void clear_dropped(int l);

  /// Evicts from layer `l` the positions 0 … kept.positions − 1 that kept.idx[s][h] does not
  /// list, per (sequence, KV head); sequences beyond kept.idx.size() keep everything. Allocates
  /// the mask on first use. Throws when the layer already evicts or the positions are invalid.
  void evict(const E& exec, int l, const KeptTokens& kept);
  /// Ends the evictions of layer `l` (a new prompt starts at position 0).
  void clear_evicted(int l);
  /// Moves the kept prompt tokens of every head of evicting layer `l` to the first slots of their
  /// key region (compact keys below k_base, full-width keys from k_base on; values alike), marks
  /// the other prompt slots evicted and records the whole chunks no head uses as the layer's gap
  /// (KVLayer), so that decode reads the kept tokens only. kept_tokens(l) keeps the positions.
  /// A token gate's dropped positions are not moved (the head does not attend to them) and the
  /// prompt's dropped flags are cleared. The attention after it differs from the masked cache's
  /// by rounding only (its sums run over other chunks).
  void compact_evicted(const E& exec, int l);
  /// Kept prompt positions [seq][head] of an evicting layer (empty otherwise), and the
  /// prompt length the eviction covered.
  const std::vector<std::vector<std::vector<int>>>& kept_tokens(int l) const {
    return kept_tokens_[static_cast<std::size_t>(l)];
  }
  int evicted_positions(int l) const { return evict_len_[static_cast<std::size_t>(l)]; }
  /// Bytes of keys and values of the prompt positions 0 … evicted_positions(l) − 1 of sequences
  /// 0 … n_seq − 1: held densely (dense) and held by a cache that keeps only the unevicted
  /// tokens of each head, compacted keys at their kept widths (kept). Dense layer: equal.
  void prompt_bytes(int l, int n_seq, int T, double& dense, double& kept) const;

  /// Bytes allocated for keys (compact region, indices and full-width region) and values.
  std::size_t k_bytes(int l) const;
  std::size_t v_bytes(int l) const;
  std::size_t bytes() const;
  /// Kept channels per (sequence, head) of a compacted layer, as the host sees them.
  const std::vector<std::vector<int>>& kept_counts(int l) const {
    return kept_counts_[static_cast<std::size_t>(l)];
  }

 private:
  int max_seqs_ = 0, max_ctx_ = 0;
  std::vector<AttnShape> shapes_;
  std::vector<KVLayer<E>> layers_;
  std::vector<std::vector<std::vector<int>>> kept_counts_;               // [layer][seq][head]
  std::vector<std::vector<std::vector<std::vector<int>>>> kept_tokens_;  // [layer][seq][head]
  std::vector<int> evict_len_;                                           // [layer]
  std::vector<std::vector<int>> written_;                // [layer][seq] positions written
  std::vector<std::vector<int>> n_dropped_;              // [layer][seq] masked: dropped count
  std::vector<std::vector<std::uint8_t>> h_dropped_;     // [layer][seq·max_ctx] masked flags
  std::vector<std::vector<std::vector<int>>> slot_pos_;  // [layer][seq] compacted: positions
  IVec<E> slot_dev_;                                     // store_kept: the slot of each row
  void forget_from(int l, int s, int p0);  // positions ≥ p0 of sequence s are no longer written
};

}  // namespace sparsim
