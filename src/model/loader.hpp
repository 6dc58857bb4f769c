#pragma once
/// Loads a Llama model file into device weights, dequantizing on load.
#include "core/types.hpp"
#include "model/config.hpp"
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
};

/// Facts about a loaded model file, for records.
struct ModelInfo {
  std::string path;
  std::string format;                  ///< "gguf"
  std::uint64_t file_bytes = 0;
  std::string fingerprint;             ///< 16 hex digits: hash of every tensor's name, shape, type, data
  std::vector<std::string> tensor_types;  ///< distinct file tensor types, e.g. {"Q4_1", "F32"}
  std::uint64_t nonfinite = 0;         ///< NaN / Inf values found in the weights
};

/// Reads the Llama hyper-parameters of a GGUF file (architecture must be "llama").
Config config_from_gguf(const gguf::File& f);

/// Loads a GGUF file. Throws sparsim::Error naming the key, tensor or offset at fault.
template <class E>
std::shared_ptr<Weights<E>> load_gguf(const std::string& path, const LoadOptions& opt,
                                      ModelInfo* info = nullptr);

/// Loads any supported model file (dispatching on its content).
template <class E>
std::shared_ptr<Weights<E>> load_model(const std::string& path, const LoadOptions& opt,
                                       ModelInfo* info = nullptr);

}  // namespace sparsim
