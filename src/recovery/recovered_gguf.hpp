#pragma once
/// Writes a recovered model: the student's GGUF file (metadata, tokenizer, pruned layout and
/// tensors) with the LoRA adapters merged into the adapted projections, W' = W + (α/r)·B·A,
/// and the recovery recorded in the metadata (keys sparsim.recovery.*). A merged projection is
/// written as F32 (its values dequantized, the update added in double, rounded once), whatever
/// its stored type: re-quantizing would lose the update. Every other tensor is copied byte for
/// byte. The loss curve is stored without wall times, so a resumed run writes the same bytes
/// as an uninterrupted one.
#include "recovery/lora.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace sparsim::recovery {

struct RecoveryRecord {
  std::string teacher_fingerprint, student_fingerprint, corpus_fingerprint;
  int steps = 0, seq_len = 0, batch = 0;
  std::int64_t tokens = 0;  ///< training tokens seen (steps · batch · seq_len)
  int rank = 0;
  double alpha = 0, dropout = 0;
  std::string targets;
  double kd_temperature = 0, kd_weight = 0;
  std::string kd_direction;
  double lr = 0;
  std::string schedule;
  int warmup_steps = 0;
  std::uint64_t seed = 0;
  std::vector<double> loss, ce, kl;  ///< per step
};

namespace recovery_keys {
inline constexpr const char* kPrefix = "sparsim.recovery.";
inline constexpr const char* kTeacher = "sparsim.recovery.teacher_fingerprint";
inline constexpr const char* kStudent = "sparsim.recovery.student_fingerprint";
inline constexpr const char* kSteps = "sparsim.recovery.steps";
inline constexpr const char* kRank = "sparsim.recovery.lora_rank";
inline constexpr const char* kLoss = "sparsim.recovery.loss_curve";
}  // namespace recovery_keys

/// Writes `out` atomically from the GGUF model at `student_path` (no file at `out` on failure).
void write_recovered_gguf(const std::string& student_path, const std::vector<Adapter>& adapters,
                          double scale, const RecoveryRecord& rec, const std::string& out);

}  // namespace sparsim::recovery
