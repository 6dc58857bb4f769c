#pragma once
/// Token Filtering: an online, calibration-free token gate before attention.
///
/// Per gated layer ℓ, for token t of a sequence, after its K and V are computed:
///   c_k[h] = cos(k_t[h], Ā_k[h]),  c_v[h] = cos(v_t[h], Ā_v[h])    per KV head h
/// where the anchor Ā is the mean of the previous tokens' keys / values of that layer, head and
/// sequence (or their EMA with weight γ on the old anchor). With μ, σ² the mean and the
/// (population) variance of the head cosines, the similarity is
///   key: S = μ_k     value: S = μ_v     kv: S = (σ²_v·μ_k + σ²_k·μ_v) / (σ²_k + σ²_v)
/// (kv: equal weights when both variances are 0). The token skips attention in layer ℓ when
/// S > τ_ℓ. During the warm-up (positions < W) nothing is skipped and τ_ℓ follows the
/// (1 − r_ℓ) quantile of the S seen so far; afterwards τ_ℓ ← τ_ℓ + η·(skip_ratio_ℓ − r_ℓ) after
/// every token, skip_ratio_ℓ being the fraction of decided tokens of the sequence skipped in ℓ.
/// r is the model-wide target (fraction of all (token, layer) blocks skipped); the N gated
/// layers (tail, head or uniform) each aim at r_ℓ = r·L/N.
///
/// All state is per (layer, sequence) and is updated token by token in order, so a call over T
/// tokens decides exactly as T calls over one token (the decision for t uses tokens ≤ t only).
#include "core/compat.hpp"
#include "engine/hooks.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace sparsim::io {
class Group;
}

namespace sparsim::gating {

enum class Criterion { Key, Value, KV };
enum class AnchorKind { Mean, Ema };
enum class LayerSet { Tail, Head, Uniform };

const char* to_string(Criterion c);
const char* to_string(AnchorKind a);
const char* to_string(LayerSet s);
/// Parse the setting spellings (key|value|kv, mean|ema, tail|head|uniform); throw OptionError
/// listing the accepted values.
Criterion parse_criterion(const std::string& s);
AnchorKind parse_anchor(const std::string& s);
LayerSet parse_layer_set(const std::string& s);

struct TokenFilterOptions {
  double ratio = 0.2;  ///< r: model-wide fraction of (token, layer) blocks to skip, in [0, 1)
  Criterion criterion = Criterion::KV;
  AnchorKind anchor = AnchorKind::Mean;
  double gamma = 0.9;     ///< EMA: Ā ← γ·Ā + (1 − γ)·x
  bool pre_rope = false;  ///< compare keys before RoPE (default: as cached, after RoPE)
  int warmup = 16;        ///< W: positions 0 … W − 1 of a sequence are never skipped
  double eta = 0.01;      ///< controller gain η
  LayerSet layers = LayerSet::Tail;
  int num_layers = 0;         ///< N gated layers; 0: ⌈3L/4⌉
  bool drop_skipped = false;  ///< skipped tokens leave the KV cache and the anchor
  bool observe_only = false;  ///< compute and record S and τ, never skip (dense reference)
  int trace_sequences = 4;    ///< sequences whose per-token S, τ and decisions are kept

  /// N for a model of `n_layer` layers.
  int gated_layers(int n_layer) const;
  /// r_ℓ = r·L/N.
  double layer_target(int n_layer) const;
  /// What needs no model: throws OptionError naming the quantity for r outside [0, 1), N < 0,
  /// W < 2, η < 0, γ outside [0, 1), a negative trace count.
  void check_values() const;
  /// check_values(), and against a model of `n_layer` layers: N outside 1 … L, r_ℓ = r·L/N > 1.
  void validate(int n_layer) const;
};

/// The gated layers, ascending: the last N (tail), the first N (head), or N spread evenly
/// (uniform: layer ⌊(i + ½)·L/N⌋ for i < N).
std::vector<int> select_layers(LayerSet set, int n, int n_layer);

/// Variance-aware fusion of the head means and variances of the key and value cosines.
KOKKOS_INLINE_FUNCTION double fuse_kv(double mu_k, double var_k, double mu_v, double var_v) {
  const double den = var_k + var_v;
  return den > 0 ? (var_v * mu_k + var_k * mu_v) / den : 0.5 * (mu_k + mu_v);
}

/// The q-quantile of sorted[0 … m−1] with linear interpolation between order statistics (the
/// numpy default): position q·(m − 1).
KOKKOS_INLINE_FUNCTION double sorted_quantile(const double* sorted, int m, double q) {
  if (m <= 0) return 0.0;
  const double pos = q * (m - 1);
  int lo = static_cast<int>(pos);
  if (lo > m - 1) lo = m - 1;
  const int hi = lo + 1 < m ? lo + 1 : lo;
  const double f = pos - lo;
  return sorted[lo] + f * (sorted[hi] - sorted[lo]);
}

/// Per-token record of one traced sequence in one gated layer.
struct GateTrace {
  std::vector<float> similarity;  ///< S (NaN at position 0, which has no anchor)
  std::vector<float> threshold;   ///< τ after the token
  std::vector<std::uint8_t> skipped;
};

/// The KV cache of a run whose skipped tokens are dropped (--tf-drop-skipped), from the
/// engine's occupancy at the end of every call (TokenGate::account_cache). Bytes are those of
/// the call's sequences: `held` the positions the cache still holds, `dense` every position
/// written (what a dense cache holds), `allocated` the buffers as allocated (a token-compacted
/// layer's grow with what it holds; a dense or masked layer's are max_seqs × max_ctx).
struct KVCacheRecord {
  struct Layer {
    bool compacted = false;      ///< held only the kept tokens (at the latest call)
    double position_bytes = 0;   ///< key + value bytes of one position
    double positions_final = 0;  ///< Σ over sequences of positions written, latest call
    double held_final = 0;       ///< Σ of positions held, latest call
    double positions_sum = 0;    ///< Σ over calls of positions_final
    double held_sum = 0;         ///< Σ over calls of held_final
    double held_bytes_peak = 0;  ///< max over calls of held · position_bytes
    double allocated_final = 0, allocated_peak = 0, allocated_dense = 0;
  };
  std::vector<Layer> layers;  ///< every layer of the model
  std::uint64_t calls = 0;
  /// Model totals (Σ over layers) at the latest call and their maxima over calls.
  double held_final = 0, dense_final = 0, allocated_final = 0;
  double held_peak = 0, dense_peak = 0, allocated_peak = 0;
  double allocated_dense = 0;          ///< the dense cache's buffers, all layers
  double held_sum = 0, dense_sum = 0;  ///< Σ over calls of the model totals
  /// Σ held / Σ dense bytes over the calls (the time-averaged fraction of the cache kept).
  double held_fraction() const { return dense_sum > 0 ? held_sum / dense_sum : 1.0; }
  bool empty() const { return calls == 0; }
};

template <class E>
class TokenFilter final : public TokenGate<E> {
 public:
  /// `kv_width`, `n_kv_head`, `qk_dim`, `v_dim`: the attention shape (the same for every
  /// gated layer); `max_seqs`: sequences per call.
  TokenFilter(const TokenFilterOptions& opt, int n_layer, int n_kv_head, int qk_dim, int v_dim,
              int max_seqs);

  void begin_call(const E& exec, int n_seq, int T, int p0) override;
  bool active(int layer) const override {
    return layer >= 0 && layer < static_cast<int>(slot_.size()) &&
           slot_[static_cast<std::size_t>(layer)] >= 0;
  }
  bool pre_rope_keys() const override { return opt_.pre_rope; }
  bool drop_skipped() const override { return opt_.drop_skipped; }
  int decide(const E& exec, int layer, const CMat<E>& k, const CMat<E>& v, const IVec<E>& skip,
             PolicyCost& cost) override;
  void account_cache(const std::vector<KVOccupancy>& layers) override;
  /// The KV cache accounting (empty unless drop_skipped).
  const KVCacheRecord& kv_cache() const { return kv_; }

  const TokenFilterOptions& options() const { return opt_; }
  const std::vector<int>& layers() const { return layers_; }
  int n_layer() const { return n_layer_; }
  double layer_target() const { return target_; }

  /// Counts since construction (or reset_stats), over all sequences, warm-up excluded.
  std::uint64_t decided_tokens() const {
    pull();
    return decided_tokens_;
  }
  std::uint64_t skipped(int layer) const;
  /// Model-wide realised skip ratio: skipped (token, layer) pairs / (L · decided tokens).
  double realised() const;
  /// Per gated layer: realised skip ratio, mean S over decided tokens, mean final τ.
  double realised(int layer) const;
  double similarity_mean(int layer) const;
  double threshold_final_mean(int layer) const;
  /// Traces [traced sequence][gated layer index] (first trace_sequences sequences).
  const std::vector<std::vector<GateTrace>>& traces() const { return traces_; }
  void reset_stats();

  /// Writes the configuration, the per-layer table and the traces into `g`.
  void write(io::Group& g) const;

 private:
  TokenFilterOptions opt_;
  int n_layer_, nkv_, qk_, vd_, max_seqs_;
  double target_;
  std::vector<int> layers_;  // gated layers, ascending
  std::vector<int> slot_;    // layer → index into layers_ (−1: not gated)
  int n_seq_ = 0, T_ = 0, p0_ = 0;

  // Device state [gated layer][sequence]…
  Kokkos::View<double***, Layout, DeviceOf<E>> ak_, av_;  // anchor (sums for the mean)
  Kokkos::View<int**, Layout, DeviceOf<E>> count_, nwarm_, decided_, nskipped_;
  Kokkos::View<double**, Layout, DeviceOf<E>> tau_;
  Kokkos::View<double***, Layout, DeviceOf<E>> warm_;  // sorted warm-up S values
  Kokkos::View<double**, Layout, DeviceOf<E>> cos_;    // [seq][2·n_kv] scratch
  Kokkos::View<float**, Layout, DeviceOf<E>> out_;     // [row][S, τ, skip, has anchor]
  // The statistics as the calls' kernels leave them, so that no decision leaves the device
  // per layer: [gated layer][decided, skipped], Σ S, τ after the latest token per sequence,
  // and the latest call's skipped rows (the one number read back per gated layer).
  Kokkos::View<std::uint64_t**, Layout, DeviceOf<E>> tally_;
  Kokkos::View<double*, Layout, DeviceOf<E>> s_sum_d_;
  Kokkos::View<double**, Layout, DeviceOf<E>> tau_last_d_;
  Kokkos::View<int*, Layout, DeviceOf<E>> n_skip_d_;
  typename Kokkos::View<int*, Layout, DeviceOf<E>>::HostMirror n_skip_h_;

  // Host statistics: copies of the device ones, refreshed by pull() when a decision changed them
  void pull() const;
  mutable bool stale_ = false;
  mutable std::uint64_t decided_tokens_ = 0;
  mutable std::vector<std::uint64_t> skipped_, decided_l_;
  mutable std::vector<double> s_sum_;
  mutable std::vector<double> tau_last_;  // per gated layer × sequence: τ after the latest token
  std::vector<std::vector<GateTrace>> traces_;
  std::vector<int> trace_of_seq_;  // call sequence → trace index (−1: not traced)
  int sequences_started_ = 0;
  KVCacheRecord kv_;
};

}  // namespace sparsim::gating
