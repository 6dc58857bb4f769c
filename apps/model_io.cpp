#include "model_io.hpp"

#include "core/interrupt.hpp"
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

namespace sparsim::app {

std::vector<int> corpus_stream(const Corpus& corpus, const Tokenizer& tok) {
  std::string text;
  for (std::size_t i = 0; i < corpus.documents.size(); ++i) {
    if (i) text += "\n\n";
    text += corpus.documents[i];
  }
  interruption_point("tokenize");
  std::vector<int> ids = tok.encode(text, false);
  check_interrupt();
  return ids;
}

}  // namespace sparsim::app
