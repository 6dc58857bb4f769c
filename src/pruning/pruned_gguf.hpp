#pragma once
/// Writes a pruned model (RAP, KVPruner) as a GGUF file that every sparsim command runs: the
/// source file's metadata (tokenizer included) and tensors, with the attention projections
/// reduced to the kept channels and the pruned layout in the metadata (model/pruned_layout.hpp).
///
/// Rows of W_q, W_k, W_v are whole rows of the source tensors, copied byte for byte in their
/// stored type (quantized blocks run along a row). Columns of W_o cut through quantization
/// blocks, so a quantized W_o is written dequantized as F32 (the values the loader would
/// produce); F32, F16 and BF16 keep their type. Every other tensor is copied unchanged.
#include "model/config.hpp"

#include <string>

namespace sparsim::pruning {

/// Writes `out` (atomically: nothing is left at `out` on failure) from the GGUF model at
/// `source`, whose config with `attn` cleared must equal `pruned`'s full shape.
void write_pruned_gguf(const std::string& source, const Config& pruned, const std::string& out);

}  // namespace sparsim::pruning
