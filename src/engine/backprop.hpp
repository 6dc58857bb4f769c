#pragma once
/// The backward pass of activation gradients through a Llama model, for Fisher scores
/// (METHODS.md §4). One sequence of n tokens at positions 0 … n−1:
///
///   forward:  the Llama forward pass of engine.hpp, keeping every activation the backward pass
///             needs, and the loss L = mean over t < n−1 of −log softmax(z_t)[tok[t+1]];
///   backward: dL/dz → LM head → final RMSNorm → for each block from the last: MLP (down, SwiGLU,
///             gate/up, RMSNorm) and attention (o, attention, RoPE, q/k/v, RMSNorm) → dL/dx₀,
///             the gradient at the embedding output (the embedding itself is not differentiated,
///             no weight gradients are formed).
///
/// Training (recovery/): a ProjectionHook adds trainable terms to chosen projections (LoRA) and
/// forms their weight gradients in backward(); a LossHook replaces the cross-entropy (with
/// distillation from a teacher). Neither is owned; without them the pass is the one above.
///
/// Along the way it forms the gate gradients of the K and V projection outputs (pre-RoPE):
///   G^K_ℓ[c] = Σ_t ∂L/∂k_{t,c}·k_{t,c},  G^V_ℓ[c] = Σ_t ∂L/∂v_{t,c}·v_{t,c},
/// the derivative of L with respect to a gate m_c multiplying channel c (at m = 1), from which
/// Fisher scores are summed over sequences (transforms/fisher.hpp).
///
/// T is the scalar type of every activation and gradient: float in production (matrix products
/// by BLAS, the weights read as stored when they are fp32), double for finite-difference checks
/// (the weights widened to double, matrix products by a plain kernel). Everything else is the
/// same code. Deterministic: every output element is owned by one thread with a fixed summation
/// order (BLAS in fixed single-threaded tiles), so results are bitwise identical for any thread
/// count. Pruned models (per-layer widths, RoPE units) are supported, and low-rank K/V models
/// (PaLU, SVD-LLM: keys and values rebuilt as B·(A·x), the cache's latent A·x the output of the
/// K and V projections, so a ProjectionHook on K or V acts on the down factor A).
#include "engine/backprop_hooks.hpp"
#include "kernels/backward.hpp"
#include "kernels/pointwise.hpp"
#include "model/weights.hpp"

#include <Kokkos_Core.hpp>

#include <memory>
#include <vector>

namespace sparsim {

/// Finite-difference hooks (tests): channel gates on the pre-RoPE K and V outputs of each
/// layer, and one entry of the embedding output moved by `x0_delta`.
struct BackpropProbe {
  std::vector<std::vector<double>> k_gate, v_gate;  ///< [layer][k_dim(l) | v_dim(l)]; empty: 1
  int x0_row = -1, x0_col = -1;
  double x0_delta = 0;
};

template <class E, class T = float>
class Backprop {
 public:
  /// Sequences of up to `max_tokens` tokens.
  Backprop(std::shared_ptr<const Weights<E>> w, int max_tokens, E exec = E());
  ~Backprop();
  Backprop(const Backprop&) = delete;
  Backprop& operator=(const Backprop&) = delete;

  /// Forward pass over `tokens` (2 … max_tokens of them), keeping the activations; returns the
  /// mean next-token cross-entropy (nats). `probe` (tests) gates channels or shifts an input.
  double forward(const std::vector<int>& tokens, const BackpropProbe* probe = nullptr);

  /// Backward pass of the last forward(): fills gate_grad_k / gate_grad_v and input_grad.
  void backward();

  /// G^K_ℓ (k_dim(ℓ) values) and G^V_ℓ (v_dim(ℓ) values) of the last backward().
  const std::vector<std::vector<double>>& gate_grad_k() const { return gk_; }
  const std::vector<std::vector<double>>& gate_grad_v() const { return gv_; }
  /// dL/dx₀ [n][d_model] (the embedding output) of the last backward(), row-major.
  std::vector<double> input_grad() const;

  /// Trainable projection terms and their weight gradients (nullptr: none).
  void set_projection_hook(ProjectionHook<E, T>* h) { hook_ = h; }
  /// The loss of forward() and its gradient at the logits (nullptr: next-token cross-entropy).
  void set_loss_hook(LossHook<E, T>* h) { loss_ = h; }

  int max_tokens() const { return max_n_; }
  const Config& config() const { return w_->cfg; }

 private:
  struct State;
  std::shared_ptr<const Weights<E>> w_;
  int max_n_;
  E exec_;
  std::unique_ptr<State> s_;
  ProjectionHook<E, T>* hook_ = nullptr;
  LossHook<E, T>* loss_ = nullptr;
  std::vector<std::vector<double>> gk_, gv_;
};

}  // namespace sparsim
