#pragma once
/// The recovery loss: next-token cross-entropy plus knowledge distillation (Hinton et al. 2015)
/// from a teacher's logits, as a LossHook of the backward pass (engine/backprop_hooks.hpp).
///
/// For each row t < n − 1 of a sequence (the rows that have a next token), with student logits
/// z, teacher logits ẑ, temperature T, p = softmax(z / T), p̂ = softmax(ẑ / T):
///   CE_t = −log softmax(z_t)[tok[t+1]]
///   KL_t = Σ_v p_v (log p_v − log p̂_v)      (reverse, KL(student ‖ teacher): RAP's §4.4)
///        = Σ_v p̂_v (log p̂_v − log p_v)      (forward, KL(teacher ‖ student): Hinton's)
///   L = mean_t [ CE_t + w·T²·KL_t ]
/// The T² keeps the distillation gradient's size independent of T (Hinton et al.). Gradient at
/// the student logits, per row and divided by n − 1:
///   ∂CE/∂z_v = softmax(z)_v − [v = tok[t+1]],
///   ∂(T²·KL)/∂z_v = T·p_v (log p_v − log p̂_v − KL_t)   (reverse)  or  T·(p_v − p̂_v) (forward).
/// One thread per row sums over the vocabulary in order (double accumulators): deterministic.
#include "engine/backprop_hooks.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <string>

namespace sparsim::recovery {

enum class KdDirection { Reverse, Forward };
const char* kd_direction_name(KdDirection d);  ///< "reverse" / "forward"
KdDirection parse_kd_direction(const std::string& s);

struct DistillOptions {
  double temperature = 2.0;  ///< T
  double weight = 1.0;       ///< w (0: cross-entropy only, no teacher needed)
  KdDirection direction = KdDirection::Reverse;
  /// Throws sparsim::Error naming a value out of range.
  void validate() const;
};

template <class E, class T>
class DistillLoss : public LossHook<E, T> {
 public:
  DistillLoss(const DistillOptions& o, int max_tokens, int vocab, E exec = E());

  /// The teacher's logits [n][vocab] of the sequence of the next forward() (fp32, as the
  /// engine produces them); not needed when the weight is 0.
  void set_teacher(const CMat<E>& logits) { teacher_ = logits; }

  double loss_and_gradient(const E& exec, const MatT<E, T>& z, const IVec<E>& tokens) override;

  /// Parts of the last loss (means over the rows): cross-entropy, KL (without w·T²).
  double last_ce() const { return ce_; }
  double last_kl() const { return kl_; }

 private:
  DistillOptions o_;
  CMat<E> teacher_;
  Kokkos::View<double**, Layout, DeviceOf<E>> rows_;  // [max_tokens][2]: CE_t, KL_t
  double ce_ = 0, kl_ = 0;
  E exec_;
};

}  // namespace sparsim::recovery
