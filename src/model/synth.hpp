#pragma once
/// Seeded random Llama models written as GGUF files (for tests, benchmarks and comparisons).
#include "model/config.hpp"
#include "model/quant.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace sparsim {

struct SynthSpec {
  Config cfg;                                 ///< shape; name, rope and eps are written as given
  gguf::GGMLType type = gguf::GGMLType::F32;  ///< type of every 2-D tensor (norms stay F32)
  std::uint64_t seed = 1;
  bool with_tokenizer = true;  ///< write a SentencePiece-style vocabulary (needs vocab ≥ 259)
  bool rope_freqs = false;     ///< write Llama-3 rope_freqs.weight from cfg.rope_scaling
};

/// Writes the model to `path` atomically. The same spec always gives the same bytes.
void write_synth_gguf(const SynthSpec& spec, const std::string& path);

/// One tensor of a synthetic model: GGUF name, [rows][cols] (rows = 1 for the norm vectors),
/// and the normal distribution its values are drawn from.
struct SynthTensor {
  std::string name;
  int rows = 0, cols = 0;
  double stddev = 1.0, mean = 0.0;
  bool matrix = true;  ///< 2-D (written as spec.type) rather than a norm vector (always F32)
};

/// The tensors write_synth_gguf writes for `c`, in file order (rope_freqs.weight excluded).
std::vector<SynthTensor> synth_tensors(const Config& c);
/// The fp32 values of tensor `t` for `seed` (before conversion to the file type); they depend
/// only on the seed, the name and the shape.
std::vector<float> synth_values(std::uint64_t seed, const SynthTensor& t);

/// A counter-based generator: value i of stream s depends only on (seed, s, i).
struct SynthRng {
  std::uint64_t state;
  explicit SynthRng(std::uint64_t seed) : state(seed) {}
  std::uint64_t next();
  double uniform();  ///< [0, 1)
  double normal();   ///< standard normal (Box–Muller)
};

}  // namespace sparsim
