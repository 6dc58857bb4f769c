#pragma once
/// What the attention kernels read of a layer's KV cache: its widths (AttnShape) and its
/// regions (KVLayer). The cache object that owns them is engine/kv_cache.hpp.
#include "kernels/attention.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <vector>

namespace sparsim {

template <class E>
using IMat = Kokkos::View<int**, Layout, DeviceOf<E>>;
template <class E>
using IMat3 = Kokkos::View<int***, Layout, DeviceOf<E>>;

/// Attention widths of one layer. Dense Llama: every layer alike; a RAP / KVPruner model has
/// its own Q/K width (2·pairs kept) and V width per layer. The softmax scale stays the full
/// model's 1/√head_dim.
struct AttnShape {
  int n_head = 0;     ///< query heads
  int n_kv_head = 0;  ///< key/value heads
  int qk_dim = 0;     ///< per-head width of queries and keys
  int v_dim = 0;      ///< per-head width of values (and of the attention output)
  float scale = 1.0f;
  int group() const { return n_head / n_kv_head; }
  int q_width() const { return n_head * qk_dim; }
  int k_width() const { return n_kv_head * qk_dim; }
  int v_width() const { return n_kv_head * v_dim; }
  int out_width() const { return n_head * v_dim; }
};

/// What kernels read of one layer's cache (views are reference-counted handles: copy freely).
template <class E>
struct KVLayer {
  Cache<E> k;  ///< full-width keys of positions k_base …: k(s, p − k_base, j)
  Cache<E> v;  ///< values: v(s, p, j)
  /// compact keys of positions 0 … k_base − 1 (empty when k_base = 0), one contiguous block
  /// per KV head: compact_key_row(kc, s, k_base, koff(s, h), n_h, p)[j] is the j-th kept
  /// channel of head h (kidx(s, koff(s, h) + j)) at position p
  Cache<E> kc;
  IMat<E> kidx;  ///< [seq][cap] channel within its head of each compact column
  IMat<E> koff;  ///< [seq][n_kv + 1] first compact column of each head
  int k_base = 0;
  IMat<E> dropped;  ///< [seq][pos] 1: excluded from attention (empty: no position is)
  /// Token compaction (a token gate whose skipped tokens leave the cache): k and v hold only
  /// the kept tokens of each sequence, in position order, at slots 0 … held − 1; a query
  /// attends to the slots up to its own (RoPE is applied before caching, so the slot order is
  /// all the kernels need). k and v then have `cap` slots, not max_ctx positions.
  bool tokens_compact = false;
  /// [seq][kv head][pos] 1: evicted from that head's cache (token eviction; read only while
  /// `evicts`, so the buffer outlives the prompts that used it)
  IMat3<E> evicted;
  bool evicts = false;
  /// Evicted tokens moved out (KVCache::compact_evicted): each head's kept prompt tokens sit at
  /// the first slots of their key region (compact, full-width) in position order, its other
  /// prompt slots are marked evicted, and slots
  /// gap_begin … gap_end − 1 (whole kAttnChunk chunks) hold no kept token of any head, so the
  /// host kernel skips them. Keys are cached after RoPE: queries after the prompt need no
  /// positions of the prompt's keys, only the slots.
  int gap_begin = 0, gap_end = 0;
  bool compacted() const { return k_base > 0; }
  bool has_gap() const { return gap_end > gap_begin; }
  bool has_drops() const { return dropped.extent(0) > 0; }
  bool has_evictions() const { return evicts; }
  bool token_compacted() const { return tokens_compact; }
};

/// Row p of a head's block in a compact key cache: sequence s's k_base·cap floats (LayoutRight)
/// hold the block of the head whose columns start at c0 (koff) at offset c0·k_base, its rows
/// nc (its kept channel count) apart.
template <class View>
KOKKOS_INLINE_FUNCTION auto* compact_key_row(const View& kc, int s, int k_base, int c0, int nc,
                                             int p) {
  return kc.data() + static_cast<std::size_t>(s) * kc.stride(0) +
         static_cast<std::size_t>(c0) * k_base + static_cast<std::size_t>(p) * nc;
}

/// Kept key channels of every (sequence, KV head) of one layer, for the first `positions`
/// cached positions. idx[s][h] lists channels within the head, ascending and distinct.
/// What a channel selector returns; flops/bytes are its own cost (ledger op channel_select).
struct KeptChannels {
  int positions = 0;
  std::vector<std::vector<std::vector<int>>> idx;  ///< [seq][kv head] → kept channels
  double flops = 0, bytes = 0;
  bool empty() const { return idx.empty(); }
};

/// Kept prompt tokens of every (sequence, KV head) of one layer after a token-eviction policy
/// ran: positions 0 … positions − 1 not listed in idx[s][h] are evicted from head h of
/// sequence s. `budget` is the layer's per-head token budget; flops/bytes are the policy's own
/// cost (ledger op token_evict).
struct KeptTokens {
  int positions = 0;
  int budget = 0;
  std::vector<std::vector<std::vector<int>>> idx;  ///< [seq][kv head] → kept positions, ascending
  double flops = 0, bytes = 0;
  bool empty() const { return idx.empty(); }
};

}  // namespace sparsim
