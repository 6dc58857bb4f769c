#pragma once
/// Writes a pruned model (RAP, KVPruner) as a GGUF file that every sparsim command runs: the
/// source file's metadata (tokenizer included) and tensors, with the attention projections
/// reduced to the kept channels and the pruned layout in the metadata (model/pruned_layout.hpp).
///
/// Rows of W_q, W_k, W_v are whole rows of the source tensors, copied byte for byte in their
/// stored type (quantized blocks run along a row). W_o loses columns: it keeps its type, copied
/// exactly, when the source is element-wise (F32, F16, BF16) or when every kept run of columns is
/// made of whole quantization blocks on block boundaries. Otherwise the cut goes through blocks
/// and W_o is written in the type the CutType option chooses from the loader's dequantized
/// values: `auto` the smallest of F16, BF16, F32 that holds every value exactly (lossless),
/// `source` the source tensor's own type, or a named type (both requantize: lossy unless the
/// values round-trip). Every other tensor is copied unchanged. What changed type, and the file
/// sizes, come back in a WrittenModel (a tensor requantized in its own type counts as changed) and
/// the option and the changes are recorded in the metadata (sparsim.prune.tensor_type,
/// sparsim.prune.retyped_tensors).
#include "model/config.hpp"
#include "model/quant.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace sparsim::pruning {

/// The type of a tensor that cannot be cut in its source type (sparsim prune --type).
struct CutType {
  enum class Mode { Auto, Source, Fixed };
  Mode mode = Mode::Auto;
  gguf::GGMLType type = gguf::GGMLType::F32;  ///< the type of Mode::Fixed

  /// "auto", "source" or a supported type name (f32, q8_0, …, any case); throws sparsim::Error
  /// naming `s` and listing the accepted values otherwise.
  static CutType parse(const std::string& s);
  /// "auto", "source" or the lower-case type name.
  std::string name() const;
};

/// A tensor not copied as stored: written in another type, or requantized in its own.
struct TypeChange {
  std::string name;
  gguf::GGMLType from = gguf::GGMLType::F32, to = gguf::GGMLType::F32;
  bool exact = false;            ///< written values bitwise equal to the dequantized source values
  std::uint64_t row_length = 0;  ///< values per written row (the kept columns)
};

/// What write_pruned_gguf wrote.
struct WrittenModel {
  std::string type_option;          ///< CutType::name() of the option used
  std::vector<TypeChange> changed;  ///< in file order
  int kept = 0;                     ///< tensors copied in their source type (whole rows/blocks)
  std::uint64_t output_bytes = 0, source_bytes = 0;

  /// {"tensor_types": {"option", "changed": [{"name","from","to","exact"}], "kept"},
  ///  "file_bytes": {"output", "source"}}
  nlohmann::json json() const;
};

/// The output biases of a structurally pruned model: [layer][d_model] for W_o and W_down.
struct OutputBiases {
  std::vector<std::vector<float>> o, down;
};

/// New values of the kept columns of W_o and W_down of a structurally pruned model whose kept
/// columns were changed (SlimGPT's compensation): [layer][d_model × kept columns], row-major.
struct KeptColumnValues {
  std::vector<std::vector<float>> o, down;
};

/// Writes `out` (atomically: nothing is left at `out` on failure) from the GGUF model at
/// `source`, whose config with `attn` / `structure` cleared must equal `pruned`'s full shape.
/// A structurally pruned config (FLAP) also cuts W_gate, W_up (rows) and W_down (columns) and
/// needs `biases`, written as blk.N.attn_output.bias and blk.N.ffn_down.bias (F32). Throws
/// sparsim::Error, writing nothing, when a tensor's kept row length is not a multiple of the
/// block size of the type `cut` asks for. With `values`, W_o and W_down are written from those
/// values instead of the source's kept columns, in the type `cut` chooses (`auto`: the smallest
/// of F16, BF16, F32 that holds them exactly), and listed as changed.
WrittenModel write_pruned_gguf(const std::string& source, const Config& pruned,
                               const std::string& out, const CutType& cut = {},
                               const OutputBiases* biases = nullptr,
                               const KeptColumnValues* values = nullptr);

}  // namespace sparsim::pruning
