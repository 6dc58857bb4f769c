#include "recovery/recovered_gguf.hpp"

#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/quant.hpp"

#include <cstring>
#include <map>

namespace sparsim::recovery {

void write_recovered_gguf(const std::string& student_path, const std::vector<Adapter>& adapters,
                          double scale, const RecoveryRecord& r, const std::string& out) {
  gguf::File f = gguf::File::open(student_path);
  std::map<std::string, const Adapter*> by_tensor;
  for (const Adapter& a : adapters) by_tensor[tensor_name(a.layer, a.proj)] = &a;
  gguf::Writer w;
  for (const gguf::KeyValue& kv : f.metadata()) {
    if (kv.key.rfind(recovery_keys::kPrefix, 0) == 0) continue;  // an earlier recovery's record
    if (kv.key == "general.alignment") {
      w.set_alignment(static_cast<std::uint32_t>(f.alignment()));
      continue;
    }
    w.set(kv.key, kv.value);
  }
  const std::string p = recovery_keys::kPrefix;
  w.set(recovery_keys::kTeacher, r.teacher_fingerprint);
  w.set(recovery_keys::kStudent, r.student_fingerprint);
  w.set(p + "corpus_fingerprint", r.corpus_fingerprint);
  w.set(recovery_keys::kSteps, static_cast<std::uint32_t>(r.steps));
  w.set(p + "sequence_length", static_cast<std::uint32_t>(r.seq_len));
  w.set(p + "batch", static_cast<std::uint32_t>(r.batch));
  w.set(p + "tokens", static_cast<std::uint64_t>(r.tokens));
  w.set(recovery_keys::kRank, static_cast<std::uint32_t>(r.rank));
  w.set(p + "lora_alpha", r.alpha);
  w.set(p + "lora_dropout", r.dropout);
  w.set(p + "lora_targets", r.targets);
  w.set(p + "kd_temperature", r.kd_temperature);
  w.set(p + "kd_weight", r.kd_weight);
  w.set(p + "kd_direction", r.kd_direction);
  w.set(p + "learning_rate", r.lr);
  w.set(p + "schedule", r.schedule);
  w.set(p + "warmup_steps", static_cast<std::uint32_t>(r.warmup_steps));
  w.set(p + "seed", static_cast<std::uint64_t>(r.seed));
  w.set(recovery_keys::kLoss, r.loss);
  w.set(p + "ce_curve", r.ce);
  w.set(p + "kl_curve", r.kl);
  std::size_t merged = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    auto it = by_tensor.find(t.name);
    if (it == by_tensor.end()) {
      w.add_tensor(t.name, t.ne, t.type, t.data, t.nbytes);
      continue;
    }
    const Adapter& a = *it->second;
    require(t.ne.size() == 2 && t.ne[0] == static_cast<std::uint64_t>(a.in) &&
                t.ne[1] == static_cast<std::uint64_t>(a.out),
            "{}: tensor '{}' is {}, the adapter {}×{} (out × in)", student_path, t.name,
            t.shape_string(), a.out, a.in);
    gguf::require_supported(t.type, student_path + ": tensor '" + t.name + "'");
    const std::uint64_t rb = gguf::row_bytes(t.type, t.ne[0]);
    std::vector<float> wv(static_cast<std::size_t>(a.out) * a.in);
    for (int o = 0; o < a.out; ++o)
      gguf::dequantize(t.type, t.data + static_cast<std::uint64_t>(o) * rb,
                       wv.data() + static_cast<std::size_t>(o) * a.in,
                       static_cast<std::size_t>(a.in));
    const std::vector<float> m = merged_weight(wv, a, scale);
    std::vector<std::uint8_t> bytes(m.size() * sizeof(float));
    std::memcpy(bytes.data(), m.data(), bytes.size());
    w.add_tensor(t.name, t.ne, gguf::GGMLType::F32, std::move(bytes));
    ++merged;
  }
  require(merged == adapters.size(), "{}: {} of the {} adapted projections were found as tensors",
          student_path, merged, adapters.size());
  w.write(out);
}

}  // namespace sparsim::recovery
