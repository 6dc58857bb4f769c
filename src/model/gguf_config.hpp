#pragma once
/// Llama hyper-parameters from GGUF metadata, checked against the tensors. Host-only.
#include "model/config.hpp"

#include <string>
#include <vector>

namespace sparsim {

namespace gguf {
class File;
}

/// Every contradiction between the metadata of a GGUF Llama file and its tensors (see
/// model/consistency.hpp); empty when there is none. Throws sparsim::Error for an architecture
/// other than "llama" or a missing required key.
std::vector<std::string> check_gguf_model(const gguf::File& f);

/// Reads the Llama hyper-parameters of a GGUF file (architecture must be "llama"). Throws
/// sparsim::Error listing every contradiction check_gguf_model finds, or naming the key at fault.
Config config_from_gguf(const gguf::File& f);

}  // namespace sparsim
