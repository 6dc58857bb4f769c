#pragma once
/// Plug points of the backward pass (engine/backprop.hpp) for training: a projection hook adds
/// a trainable term to projection outputs and forms the gradients of its own parameters, a loss
/// hook replaces the next-token cross-entropy. recovery/lora.hpp and recovery/distill.hpp
/// implement them (LoRA adapters, cross-entropy plus distillation from a teacher's logits).
///
/// Shapes as in kernels/backward.hpp: activations [token][feature] of one sequence of n tokens.
#include "kernels/backward.hpp"
#include "model/weights.hpp"

namespace sparsim {

template <class E, class T>
class ProjectionHook {
 public:
  virtual ~ProjectionHook() = default;
  /// Whether projection `p` of layer `layer` carries a term.
  virtual bool active(int layer, Proj p) const = 0;
  /// Forward: y (= x·Wᵀ already) += f(x). x [n][in], y [n][out].
  virtual void forward(const E& exec, int layer, Proj p, const CMatT<E, T>& x,
                       const MatT<E, T>& y) = 0;
  /// Backward, with x the input of the last forward() and dy = ∂L/∂y: dx (already dy·W) +=
  /// (∂f/∂x)ᵀ·dy, and the gradients of the term's parameters accumulated (deterministically:
  /// every element owned by one thread, a fixed summation order).
  virtual void backward(const E& exec, int layer, Proj p, const CMatT<E, T>& x,
                        const CMatT<E, T>& dy, const MatT<E, T>& dx) = 0;
};

template <class E, class T>
class LossHook {
 public:
  virtual ~LossHook() = default;
  /// z: the logits [n][vocab] of the sequence `tokens`. Replaces z by ∂loss/∂z in place and
  /// returns the loss (what Backprop::forward returns).
  virtual double loss_and_gradient(const E& exec, const MatT<E, T>& z, const IVec<E>& tokens) = 0;
};

}  // namespace sparsim
