#pragma once
/// ThinK and GRACE as the engine's K-cache channel selector (engine/hooks.hpp).
///
/// After a prefill, per layer: the Gram matrices G_K = K0ᵀK0 of every (sequence, KV head) over
/// the prompt's cached keys (positions a token gate dropped from the cache, and positions a
/// token evictor evicted from the head, excluded) and
/// G_Q = Q_obsᵀQ_obs over the last w queries of the head's query group (GQA: the group's heads
/// stacked as rows) are computed on the device in double precision, each element by one thread
/// in a fixed order. The d×d Grams go to the host, where policies/channel_scoring.hpp chooses
/// the kept channels of every head (ThinK and GRACE both, for the records; the method's choice
/// is returned). The engine then compacts the layer's prompt keys to those channels, except
/// the last `recent` ones (ThinK's recent window), which stay at full width.
///
/// λ = 0 keeps every channel: nothing is returned and the cache stays dense (the run is the
/// dense run, bit for bit).
#include "engine/hooks.hpp"
#include "policies/channel_scoring.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

namespace sparsim::io {
class Group;
}

namespace sparsim::pruning {

/// Per (layer, KV head) sums over the selections made (one per sequence and prefill).
struct HeadRecord {
  std::uint64_t selections = 0;
  double rel_think = 0, rel_mies = 0, rel_grace = 0;  ///< relative errors ‖Q_P K_Pᵀ‖/‖QKᵀ‖
  double protected_share = 0, salient_share = 0;
  std::uint64_t guard_used = 0;           ///< GRACE took ThinK's choice on its candidates
  std::uint64_t grace_worse = 0;          ///< GRACE's error above ThinK's (protection at work)
  std::uint64_t kept = 0;                 ///< kept channels of the method
  std::vector<std::uint64_t> kept_count;  ///< per channel: selections that kept it
};

template <class E>
class KvChannelPruner final : public ChannelSelector<E> {
 public:
  /// `trace_sequences`: sequences (in the order seen) whose kept-channel masks are recorded.
  KvChannelPruner(const KvPruneOptions& opt, int n_layer, int n_kv_head, int qk_dim, int max_seqs,
                  int trace_sequences = 1);

  int observation_window() const override { return opt_.window; }
  /// λ = 0 prunes nothing: the cache stays dense.
  bool compacts() const override { return prune_count(opt_.lambda, d_) > 0; }
  /// Throws when the prompt is shorter than the observation window.
  KeptChannels select(const E& exec, int layer, const KVLayer<E>& cache, const AttnShape& shape,
                      const CMat<E>& q_obs, int n_seq, int T) override;

  const KvPruneOptions& options() const { return opt_; }
  int n_layer() const { return n_layer_; }
  int n_kv_head() const { return nkv_; }
  int head_dim() const { return d_; }
  /// Channels kept per head: d − ⌈λd⌉.
  int kept_per_head() const { return d_ - prune_count(opt_.lambda, d_); }

  const HeadRecord& record(int layer, int head) const {
    return rec_[static_cast<std::size_t>(layer * nkv_ + head)];
  }
  /// Means over every (layer, head, selection): relative reconstruction error of ThinK's,
  /// MIES's and GRACE's choice, of the method's own choice, and GRACE's protected share.
  double rel_error_mean(KvMethod m) const;
  double rel_error_mies_mean() const;
  double recon_error_mean() const { return rel_error_mean(opt_.method); }
  double protected_share_mean() const;
  std::uint64_t selections() const;  ///< (sequence, layer, head) selections
  std::uint64_t guard_used() const;
  std::uint64_t grace_worse() const;
  /// Wall time of the Gram kernels (device, fenced) and of the host selection of all heads.
  double gram_seconds() const { return gram_s_; }
  double select_seconds() const { return select_s_; }
  std::uint64_t prefills() const { return calls_ / static_cast<std::uint64_t>(n_layer_); }
  void reset_stats();
  /// Kept-channel masks [layer][head][channel] (1: kept) of the traced sequences, in the order
  /// the selector first saw them.
  int traced_sequences() const { return static_cast<int>(trace_masks_.size()); }
  const std::vector<std::uint8_t>& kept_mask(int traced) const {
    return trace_masks_.at(static_cast<std::size_t>(traced));
  }

  /// Options as attributes; [layer][head] tables; kept masks of the traced sequences.
  void write(io::Group& g) const;

 private:
  KvPruneOptions opt_;
  int n_layer_, nkv_, d_, max_seqs_, trace_;
  Kokkos::View<double****, Layout, DeviceOf<E>> gq_, gk_;  // [seq][kv head][d][d]
  std::vector<HeadRecord> rec_;
  std::vector<std::vector<std::uint8_t>> trace_masks_;  // [traced seq] → [layer][head][d]
  int sequences_started_ = 0;
  std::uint64_t calls_ = 0;
  double gram_s_ = 0, select_s_ = 0;
};

}  // namespace sparsim::pruning
