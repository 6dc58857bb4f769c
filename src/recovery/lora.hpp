#pragma once
/// LoRA adapters (Hu et al. 2022) on the projections of a Llama model, trained through the
/// backward pass (engine/backprop.hpp) as its ProjectionHook.
///
/// An adapted projection W [out][in] computes
///   y = x·Wᵀ + s·(drop(x)·Aᵀ)·Bᵀ,   s = α / r,   A [r][in],  B [out][r],
/// drop(x) = x ⊙ keep / (1 − p) with keep a Bernoulli(1 − p) mask (inverted dropout, p the
/// adapter dropout). With u = drop(x)·Aᵀ [n][r] and g = dy·B [n][r] the backward pass forms
///   ∂L/∂B = s·dyᵀ·u,   ∂L/∂A = s·gᵀ·drop(x),   ∂L/∂x += s·(g·A) ⊙ keep / (1 − p).
/// Initialisation as PEFT's (the reference LoRA implementation): A ~ U(−1/√in, 1/√in) (Kaiming
/// uniform with a = √5), B = 0, so the adapted model starts as the model itself.
///
/// The dropout mask of entry (t, i) of adapter a is a hash of (key, a, t, i): the key is set
/// per sequence (step and position in the batch), so a run is reproducible and a resumed run
/// draws the same masks. Every kernel gives each output element to one thread that sums in a
/// fixed order (no atomics): the gradients are bitwise the same for any thread count.
#include "engine/backprop_hooks.hpp"
#include "model/weights.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sparsim::recovery {

/// The short name of a projection as a LoRA target: q, k, v, o, gate, up, down.
const char* target_name(Proj p);
/// The GGUF tensor of projection p of layer l ("blk.3.attn_q.weight").
std::string tensor_name(int layer, Proj p);
/// "q,k,v,o" → {Q, K, V, O}. Throws sparsim::Error naming an unknown or repeated target.
std::vector<Proj> parse_targets(const std::string& list);
/// {Q, K, V, O} → "q,k,v,o".
std::string targets_string(const std::vector<Proj>& t);

struct LoraSpec {
  int rank = 8;        ///< r
  double alpha = 16;   ///< α; the update is scaled by α / r
  double dropout = 0;  ///< p, dropout on the adapter input
  std::vector<Proj> targets = {Proj::Q, Proj::K, Proj::V, Proj::O};
  /// Standard deviation of B's initial entries: 0 is LoRA's start (B = 0, the model unchanged);
  /// nonzero makes ∂L/∂A nonzero at the first step (gradient checks).
  double init_b_std = 0;
  std::uint64_t seed = 1;  ///< initialisation of A (and B)

  double scale() const { return alpha / rank; }
  /// Throws sparsim::Error naming the first value out of range (model-independent checks).
  void validate() const;
};

/// One adapter's parameters on the host (double: the master copy the optimizer updates).
struct Adapter {
  int layer = 0;
  Proj proj = Proj::Q;
  int in = 0, out = 0, rank = 0;
  std::vector<double> a;     ///< A [rank][in], row-major
  std::vector<double> b;     ///< B [out][rank], row-major
  std::string name() const;  ///< "blk.3.attn_q"
};

/// The adapters of every target of every layer of `w`, in layer order and, within a layer, in
/// the order of `spec.targets`, with shapes from the weights themselves (so any per-layer widths
/// are followed). Throws when the rank exceeds min(in, out) of an adapted matrix, or when a
/// target is missing from the model.
template <class E>
std::vector<Adapter> init_adapters(const Weights<E>& w, const LoraSpec& spec);

/// W + s·B·A of one adapter, row-major [out][in] in fp32 (computed in double, rounded once).
std::vector<float> merged_weight(const std::vector<float>& w, const Adapter& a, double scale);

/// The adapters of `w` merged into a copy of its weights (fp32; other tensors shared).
template <class E>
std::shared_ptr<Weights<E>> merge_adapters(const Weights<E>& w, const std::vector<Adapter>& ad,
                                           double scale);

/// The LoRA terms as a ProjectionHook of Backprop<E, T>: device copies of A and B in T,
/// gradients in double.
template <class E, class T>
class LoraHook : public ProjectionHook<E, T> {
 public:
  /// Device storage for `adapters` (n_layer layers) and sequences of up to `max_tokens`.
  LoraHook(const std::vector<Adapter>& adapters, int n_layer, double scale, double dropout,
           int max_tokens, E exec = E());
  ~LoraHook() override;

  /// Copies the host parameters (same adapters, same order as at construction) to the device.
  void upload(const std::vector<Adapter>& adapters);
  /// Sets every gradient to zero.
  void zero_grad();
  /// The gradients accumulated since zero_grad(): per adapter ∂L/∂A then ∂L/∂B, flattened in
  /// adapter order.
  std::vector<double> gradients() const;
  /// Dropout masks of the following forward/backward pair (one per sequence).
  void set_dropout_key(std::uint64_t key) { key_ = key; }
  /// Dropout on (training, the default) or off (evaluating the adapted model).
  void set_training(bool on) { training_ = on; }

  bool active(int layer, Proj p) const override;
  void forward(const E& exec, int layer, Proj p, const CMatT<E, T>& x,
               const MatT<E, T>& y) override;
  void backward(const E& exec, int layer, Proj p, const CMatT<E, T>& x, const CMatT<E, T>& dy,
                const MatT<E, T>& dx) override;

  /// drop(x) of adapter `ix` under the current key, in scratch memory (an [n][in] view of it;
  /// valid until the next call); x itself when dropout is off. Public for nvcc, whose device
  /// lambdas may not sit in private member functions.
  CMatT<E, T> dropped_input(const E& exec, int ix, const CMatT<E, T>& x) const;

 private:
  struct Slot;
  int slot(int layer, Proj p) const;
  std::vector<int> index_;  // [layer][proj] → slot or −1
  std::vector<Slot> slots_;
  MatT<E, T> g_;   // scratch [max_tokens][rank]
  MatT<E, T> xd_;  // scratch [max_tokens][widest input]: drop(x)
  Kokkos::View<double*, DeviceOf<E>> acc_;  // scratch: the weight-gradient sums of one adapter
  double scale_, dropout_;
  std::uint64_t key_ = 0;
  bool training_ = true;
  E exec_;
};

}  // namespace sparsim::recovery
