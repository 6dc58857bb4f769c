#pragma once
/// Model weights on the device. Shapes follow the model file: a projection W is [out][in]
/// row-major, so the weights feeding one output are contiguous.
#include "core/compat.hpp"
#include "core/matrix.hpp"
#include "core/types.hpp"
#include "model/config.hpp"

#include <Kokkos_Core.hpp>

#include <vector>

namespace sparsim {

/// The projections of one block, in a fixed order used by ledgers and records.
enum class Proj { Q, K, V, O, Gate, Up, Down };
inline constexpr int kNumProj = 7;
const char* proj_name(Proj p);

template <class ExecSpace>
struct LayerWeights {
  using Dev = DeviceOf<ExecSpace>;
  Kokkos::View<float*, Dev> attn_norm;  ///< [d_model]
  Kokkos::View<float*, Dev> ffn_norm;   ///< [d_model]
  Matrix<ExecSpace> wq;                 ///< [q_dim][d_model]
  Matrix<ExecSpace> wk;                 ///< [kv_dim][d_model]
  Matrix<ExecSpace> wv;                 ///< [kv_dim][d_model]
  Matrix<ExecSpace> wo;                 ///< [d_model][q_dim]
  Matrix<ExecSpace> w_gate;             ///< [d_ff][d_model]
  Matrix<ExecSpace> w_up;               ///< [d_ff][d_model]
  Matrix<ExecSpace> w_down;             ///< [d_model][d_ff]
  /// A low-rank K/V layer (Config::low_rank): wk / wv hold the down factors A ([rank][d_model]),
  /// these the up factors B ([n_kv·head_dim][rank]); empty otherwise.
  Matrix<ExecSpace> k_up, v_up;
  /// A structurally pruned layer (Config::structure): biases added to the outputs of W_o and
  /// W_down ([d_model] each), standing in for what the removed heads and channels gave on
  /// average; empty otherwise.
  Kokkos::View<float*, Dev> o_bias, down_bias;

  const Matrix<ExecSpace>& proj(Proj p) const {
    switch (p) {
      case Proj::Q:
        return wq;
      case Proj::K:
        return wk;
      case Proj::V:
        return wv;
      case Proj::O:
        return wo;
      case Proj::Gate:
        return w_gate;
      case Proj::Up:
        return w_up;
      case Proj::Down:
        break;
    }
    return w_down;
  }
  Matrix<ExecSpace>& proj(Proj p) {
    return const_cast<Matrix<ExecSpace>&>(static_cast<const LayerWeights&>(*this).proj(p));
  }
};

template <class ExecSpace>
struct Weights {
  using Dev = DeviceOf<ExecSpace>;
  Config cfg;
  DType storage = DType::F32;
  /// Prefill products of bf16 weights in bf16 arithmetic (LoadOptions::bf16_compute).
  bool bf16_compute = false;
  Matrix<ExecSpace> tok_embd;          ///< [vocab][d_model]
  Kokkos::View<float*, Dev> out_norm;  ///< [d_model]
  Matrix<ExecSpace> output;            ///< [vocab][d_model]; shares tok_embd's view when tied
  std::vector<LayerWeights<ExecSpace>> layers;
  std::vector<float> rope_freq_factors;  ///< GGUF rope_freqs.weight, empty when absent

  /// Online residual re-rotation of a rotated model (WINA tensor rotation), empty otherwise:
  /// after the attention sublayer of block l the residual stream becomes x·rot_attn_mlp[l]ᵀ,
  /// after the MLP sublayer x·rot_mlp_next[l]ᵀ (both D×D, stored [out][in] like projections).
  std::vector<Matrix<ExecSpace>> rot_attn_mlp;
  std::vector<Matrix<ExecSpace>> rot_mlp_next;
  bool rotated() const { return !rot_attn_mlp.empty(); }

  /// Bytes of weight storage (the tied head counted once).
  std::size_t bytes() const;
};

/// Where an activation that feeds projections is read: the block input (residual stream), the
/// attention input (RMSNorm output feeding q/k/v), the attention output (feeding o), the MLP
/// input (feeding gate/up) and the MLP hidden state silu(gate)·up (feeding down).
enum class Site { BlockIn, Attn, O, Mlp, Down };
inline constexpr int kNumSites = 5;
const char* site_name(Site s);
/// The site a projection reads.
constexpr Site site_of(Proj p) {
  switch (p) {
    case Proj::Q:
    case Proj::K:
    case Proj::V:
      return Site::Attn;
    case Proj::O:
      return Site::O;
    case Proj::Gate:
    case Proj::Up:
      return Site::Mlp;
    case Proj::Down:
      return Site::Down;
  }
  return Site::Attn;
}

}  // namespace sparsim
