#pragma once
/// Recovery after pruning: LoRA adapters on a pruned model (the student) trained with AdamW to
/// the next-token cross-entropy plus distillation from the model it was pruned from (the
/// teacher), as in RAP's §4.4. One optimizer step:
///
///   for each of the step's `batch` sequences (seq_len tokens from the training stream):
///     teacher logits  ← Engine forward of the teacher (fp32)
///     loss            ← Backprop forward of the student with the adapters (lora.hpp) and the
///                        distillation loss (distill.hpp)
///     adapter grads  += Backprop backward
///   grads /= batch; clip by global norm; AdamW update at the scheduled learning rate.
///
/// The whole state (step, adapters, moments, loss curve) is on the host in double; the data
/// order and the dropout masks are functions of (seed, step): so a run restored from its state
/// continues bitwise as the uninterrupted run, for any thread count.
#include "engine/backprop.hpp"
#include "engine/engine.hpp"
#include "recovery/adamw.hpp"
#include "recovery/distill.hpp"
#include "recovery/lora.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace sparsim::recovery {

struct RecoverOptions {
  LoraSpec lora;
  DistillOptions distill;
  AdamWOptions adam;
  int steps = 100;
  int seq_len = 256;       ///< tokens per training sequence
  int batch = 1;           ///< sequences per optimizer step
  std::uint64_t seed = 1;  ///< data order and dropout masks
  /// Throws sparsim::Error naming the first value out of range (model-independent checks).
  void validate() const;
};

struct StepRecord {
  int step = 0;                     ///< 1-based
  double loss = 0, ce = 0, kl = 0;  ///< means over the step's sequences (loss = ce + w·T²·kl)
  double lr = 0, grad_norm = 0;     ///< learning rate used, gradient norm before clipping
  double seconds = 0;               ///< wall time of the step
  double teacher_seconds = 0, forward_seconds = 0, backward_seconds = 0, update_seconds = 0;
};

/// What a run needs to continue: the steps done, the adapters, the optimizer's moments, the
/// loss curve so far.
struct RecoveryState {
  int step = 0;
  std::vector<Adapter> adapters;
  std::vector<double> m, v;
  std::vector<StepRecord> curve;
};

/// The training stream cut into consecutive sequences of seq_len tokens, drawn in a seeded
/// random order (Fisher–Yates), a fresh order for each pass over them.
class SequenceOrder {
 public:
  SequenceOrder(std::size_t n_tokens, int seq_len, std::uint64_t seed);
  std::size_t count() const { return count_; }
  /// First token of the k-th sequence drawn (k = 0, 1, …).
  std::size_t start(std::int64_t k);

 private:
  std::size_t count_;
  int seq_len_;
  std::uint64_t seed_;
  std::int64_t pass_ = -1;
  std::vector<std::size_t> perm_;
};

/// Throws sparsim::Error unless `teacher` can teach `student`: the same architecture and
/// vocabulary, full (unpruned) attention, and (when the student records one) the fingerprint of
/// the model the student was pruned from equal to `teacher_fingerprint`.
void check_teacher(const Config& student, const Config& teacher, const std::string& teacher_fp);

template <class E>
class Recoverer {
 public:
  /// `teacher` may be null when the distillation weight is 0.
  Recoverer(std::shared_ptr<const Weights<E>> student, std::shared_ptr<const Weights<E>> teacher,
            std::vector<int> stream, const RecoverOptions& o, E exec = E());
  ~Recoverer();

  /// Runs step state().step + 1. Throws sparsim::Error, leaving the state unchanged, when the
  /// loss or the gradient is not finite; Interrupted (core/interrupt.hpp) between kernels.
  const StepRecord& step();
  bool done() const { return st_.step >= o_.steps; }
  const RecoveryState& state() const { return st_; }
  /// Continues from a saved state (adapters of the same shapes, moments of the same size).
  void restore(RecoveryState s);
  const RecoverOptions& options() const { return o_; }
  std::size_t sequences() const { return order_.count(); }
  /// Tokens one step trains on.
  std::int64_t tokens_per_step() const { return static_cast<std::int64_t>(o_.batch) * o_.seq_len; }

  /// The last step's gradient (mean over its sequences, before clipping; flat in adapter order,
  /// ∂L/∂A then ∂L/∂B of each) and its sequences: for checks against another implementation.
  const std::vector<double>& last_gradient() const { return last_grad_; }
  const std::vector<std::vector<int>>& last_sequences() const { return last_seqs_; }

  /// Logits [n][vocab] of the student with the current adapters on `tokens` (Backprop forward,
  /// fp32), row-major: the unmerged model, for checking a merged one against.
  std::vector<float> student_logits(const std::vector<int>& tokens);

 private:
  struct Impl;
  RecoverOptions o_;
  RecoveryState st_;
  SequenceOrder order_;
  std::unique_ptr<Impl> impl_;
  std::vector<double> last_grad_;
  std::vector<std::vector<int>> last_seqs_;
};

}  // namespace sparsim::recovery
