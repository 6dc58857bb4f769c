#pragma once
/// KV-cache token eviction after prefill: StreamingLLM, H2O, SnapKV and PyramidKV as the
/// engine's token evictor (engine/hooks.hpp).
///
/// Per layer and (sequence, KV head), a prompt of T tokens keeps at most C tokens (the layer's
/// budget, recent window included); the others are masked out of the head's cache.
///   streaming  the first `sinks` tokens and the last C − sinks
///   h2o        the last w tokens, and the C − w earlier ones with the largest accumulated
///              attention: Σ over every prompt query (causal softmax) and over the KV head's
///              query group of the weight they give the token
///   snapkv     the last w tokens (the observation window), and the C − w earlier ones with the
///              largest pooled votes: the weights the w window queries give each earlier token
///              (causal softmax over the whole prompt, summed over the group), then a 1-D
///              average (or max) pooling of kernel k, stride 1, padding k/2, over the earlier
///              tokens
///   pyramidkv  snapkv with a budget per layer that falls linearly with depth (the mean is C)
/// A budget C ≥ T keeps the whole prompt (the layer is left alone: the run is the dense run).
/// docs/eviction.md gives the sources and the choices.
///
/// The votes are computed on the device in double precision, each (sequence, KV head, position)
/// by one thread in a fixed order; pooling and top-k run on the host (ties: the earlier
/// position), so the choice is deterministic.
#include "engine/hooks.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace sparsim::io {
class Group;
}

namespace sparsim::pruning {

enum class EvictMethod { Streaming, H2O, SnapKV, PyramidKV };
const char* to_string(EvictMethod m);
/// "streaming", "h2o", "snapkv", "pyramidkv"; throws naming --evict otherwise.
EvictMethod parse_evict_method(const std::string& s);

enum class EvictPool { Avg, Max };
const char* to_string(EvictPool p);

struct EvictOptions {
  EvictMethod method = EvictMethod::SnapKV;
  /// Tokens kept per head and layer: a fraction of the prompt in (0, 1] (⌈b·T⌉ tokens), or a
  /// whole number of tokens > 1.
  double budget = 0.5;
  /// SnapKV / PyramidKV: observation window w (the last w prompt queries vote; those w tokens
  /// are kept). H2O: the recent window kept besides the heavy hitters. SnapKV's code: 32.
  int window = 32;
  int sinks = 4;                    ///< StreamingLLM: attention sinks, the first tokens always kept
  int kernel = 5;                   ///< SnapKV / PyramidKV pooling kernel (odd; SnapKV's code: 5)
  EvictPool pool = EvictPool::Avg;  ///< SnapKV / PyramidKV pooling (SnapKV's code: avgpool)
  int beta = 20;  ///< PyramidKV: the shallowest budget over the deepest (PyramidKV's code: 20)
  /// Throws OptionError naming the quantity for values no prompt can use (needs no model).
  void validate() const;
  /// C for a prompt of T tokens (the same in every layer but PyramidKV's).
  int budget_tokens(int T) const;
  /// Whether the method reads queries (all but StreamingLLM).
  bool scores() const { return method != EvictMethod::Streaming; }
};

/// The kept budget (tokens per head, window included) of `layer` of `n_layer` for a prompt of
/// T tokens: C, or PyramidKV's schedule (docs/eviction.md).
int layer_budget(const EvictOptions& o, int layer, int n_layer, int T);

/// The pooled votes (the input of SnapKV's top-k): 1-D pooling of kernel k (odd), stride 1,
/// padding k/2 (average: the padding counts as zeros and every output is divided by k; max:
/// the padding is ignored).
std::vector<double> pool_votes(const std::vector<double>& v, int kernel, EvictPool pool);

/// The kept positions (ascending) of one head for a prompt of T tokens with `budget` C:
/// `votes` (size T; empty for streaming) are its accumulated (H2O) or observed (SnapKV) votes;
/// `candidate` (size T; empty: every position) marks the positions that may be kept (a token a
/// gate dropped may not). The direct computation the tests compare the evictor with.
std::vector<int> choose_tokens(const EvictOptions& o, int T, int budget,
                               const std::vector<double>& votes,
                               const std::vector<char>& candidate = {});

/// Per (layer, KV head) sums over the selections made (one per sequence and prefill).
struct EvictRecord {
  std::uint64_t selections = 0, evicting = 0;  ///< selections, and those that evicted anything
  double kept = 0, budget = 0, prompt = 0;     ///< Σ tokens kept, Σ budgets, Σ prompt lengths
};

template <class E>
class TokenEvictorPolicy final : public TokenEvictor<E> {
 public:
  TokenEvictorPolicy(const EvictOptions& opt, int n_layer, int n_kv_head, int max_seqs);

  int observation_window(int T) const override;
  bool evicts(int T) const override;
  KeptTokens select(const E& exec, int layer, const KVLayer<E>& cache, const AttnShape& shape,
                    const CMat<E>& q_obs, const IVec<E>& q_ok, int n_seq, int T) override;
  bool votes_are_key_mass() const override { return opt_.method == EvictMethod::H2O; }
  KeptTokens select_voted(const E& exec, int layer, const KVLayer<E>& cache, const AttnShape& shape,
                          const Kokkos::View<double***, Layout, DeviceOf<E>>& votes, double seconds,
                          int n_seq, int T) override;
  void account(int layer, double dense_bytes, double kept_bytes) override;

  const EvictOptions& options() const { return opt_; }
  int n_layer() const { return n_layer_; }
  int n_kv_head() const { return nkv_; }
  const EvictRecord& record(int layer, int head) const {
    return rec_[static_cast<std::size_t>(layer * nkv_ + head)];
  }
  /// Over every (layer, head, selection): Σ kept / Σ prompt tokens and Σ kept / Σ budget.
  double kept_fraction() const;
  double budget_use() const;
  /// Prompt KV bytes (keys and values) of a dense cache and of one holding only the kept tokens
  /// (compacted keys at their kept width), summed over prefills, per layer and in total.
  double kv_bytes_dense(int layer) const { return bytes_dense_[static_cast<std::size_t>(layer)]; }
  double kv_bytes_kept(int layer) const { return bytes_kept_[static_cast<std::size_t>(layer)]; }
  double kv_bytes_dense() const;
  double kv_bytes_kept() const;
  std::uint64_t selections() const;
  std::uint64_t prefills() const { return calls_ / static_cast<std::uint64_t>(n_layer_); }
  double select_seconds() const { return select_s_; }

  /// Options as attributes; [layer][head] and [layer] tables.
  void write(io::Group& g) const;

 private:
  /// Checks the call, counts it, and returns the layer's budget C.
  int begin(int layer, const KVLayer<E>& cache, const AttnShape& shape, int n_seq, int T);
  /// Counts one selection of `head` in `layer`: `kept` of T prompt tokens at budget C.
  void record(int layer, int head, int kept, int T, int C);
  /// Records a layer the whole prompt of which fits its budget.
  void keep_all(int layer, int n_seq, int T, int C);
  /// The kept tokens of every (sequence, head) from the votes on the host ([seq][head][T];
  /// empty for StreamingLLM), with the records; the positions a gate dropped are not kept.
  KeptTokens choose(int layer, const KVLayer<E>& cache, int n_seq, int T, int C,
                    const std::vector<double>& hvotes);
  /// votes [seq][head][≥ T] on the host as [seq][head][T].
  std::vector<double> host_votes(const Kokkos::View<double***, Layout, DeviceOf<E>>& v, int n_seq,
                                 int T) const;
  EvictOptions opt_;
  int n_layer_, nkv_, max_seqs_;
  Kokkos::View<double***, Layout, DeviceOf<E>> votes_;  // [seq][kv head][pos]
  std::vector<EvictRecord> rec_;
  std::vector<double> bytes_dense_, bytes_kept_;
  std::uint64_t calls_ = 0;
  double select_s_ = 0;
};

}  // namespace sparsim::pruning
