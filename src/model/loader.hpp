#pragma once
/// Loads a Llama model file into device weights, dequantizing on load.
#include "core/types.hpp"
#include "model/config.hpp"
#include "model/gguf_config.hpp"
#include "model/weights.hpp"

#include <memory>
#include <string>
#include <vector>

namespace sparsim {

namespace gguf {
class File;
}

struct LoadOptions {
  DType storage = DType::F32;  ///< element type the weights are kept in
  bool strict = false;         ///< NaN / Inf in a weight is an error rather than a warning
  /// Multi-row (prefill) products of bf16 weights in bf16 arithmetic on the host (rows rounded
  /// to bf16, oneDNN's bf16 matmul); needs storage BF16 and host::bf16_gemm_available().
  bool bf16_compute = false;
};

/// Throws an OptionError (load.bf16_compute, a usage error) naming the problem when `o` asks for
/// bf16 compute that cannot run.
void check_load_options(const LoadOptions& o);

/// Facts about a loaded model file, for records.
struct ModelInfo {
  std::string path;
  std::string format;            ///< "gguf" or "safetensors"
  std::uint64_t file_bytes = 0;  ///< all shards together for a sharded checkpoint
  std::string fingerprint;       ///< 16 hex digits: hash of every tensor's name, shape, type, data
  std::vector<std::string> tensor_types;  ///< distinct file tensor types, e.g. {"Q4_1", "F32"}
  std::uint64_t nonfinite = 0;            ///< NaN / Inf values found in the weights
};

/// Loads a GGUF file. Throws sparsim::Error naming the key, tensor or offset at fault.
template <class E>
std::shared_ptr<Weights<E>> load_gguf(const std::string& path, const LoadOptions& opt,
                                      ModelInfo* info = nullptr);

/// Reads the Llama hyper-parameters of a Hugging Face `config.json` (model_type "llama" /
/// LlamaForCausalLM; rope_scaling absent, "default" or "llama3"). The result has
/// rope_layout = RopeLayout::Half. Throws sparsim::Error naming the file and the key at fault.
Config config_from_hf_json(const std::string& config_json_path);

/// Every contradiction between config.json and the tensors of a Hugging Face checkpoint (see
/// model/consistency.hpp); empty when there is none. `path` as for load_safetensors.
std::vector<std::string> check_hf_model(const std::string& path);

/// Loads a Hugging Face Llama checkpoint: `path` is the model directory (config.json with
/// model.safetensors or model.safetensors.index.json), a .safetensors file or an index file in
/// such a directory, or the config.json itself. Weights of dtype F32, F16 or BF16.
template <class E>
std::shared_ptr<Weights<E>> load_safetensors(const std::string& path, const LoadOptions& opt,
                                             ModelInfo* info = nullptr);

enum class ModelFormat { Gguf, HfDirectory };
/// Which loader `load_model` uses: a directory, a .safetensors or a .json path, or a file whose
/// first bytes look like a safetensors header → HfDirectory; the GGUF magic or a .gguf name →
/// Gguf. Throws for a missing path or an unrecognised file format (naming its first bytes).
ModelFormat detect_model_format(const std::string& path);

/// Loads any supported model (dispatching with detect_model_format).
template <class E>
std::shared_ptr<Weights<E>> load_model(const std::string& path, const LoadOptions& opt,
                                       ModelInfo* info = nullptr);

}  // namespace sparsim
