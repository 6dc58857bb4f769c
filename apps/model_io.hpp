#pragma once
// Opening a model argument together with its tokenizer.
#include "common.hpp"
#include "eval/corpus.hpp"
#include "model/tokenizer.hpp"

#include <string>

namespace sparsim::app {

/// The tokenizer that belongs to a model path: the GGUF's own vocabulary, or tokenizer.json
/// beside a safetensors model.
Tokenizer tokenizer_for(const std::string& model_path);

/// The corpus as one token stream: documents joined by a blank line, no BOS.
std::vector<int> corpus_stream(const Corpus& corpus, const Tokenizer& tok);

}  // namespace sparsim::app
