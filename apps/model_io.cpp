#include "model_io.hpp"

#include "model/gguf.hpp"

#include <filesystem>

namespace sparsim::app {

Tokenizer tokenizer_for(const std::string& model_path) {
  namespace fs = std::filesystem;
  fs::path p(model_path);
  if (fs::is_directory(p)) return Tokenizer::from_hf_json((p / "tokenizer.json").string());
  if (p.extension() == ".safetensors" || p.extension() == ".json")
    return Tokenizer::from_hf_json((p.parent_path() / "tokenizer.json").string());
  return Tokenizer::from_gguf(gguf::File::open(model_path));
}

}  // namespace sparsim::app
