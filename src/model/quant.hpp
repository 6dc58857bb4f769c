#pragma once
/// ggml tensor element types as stored in GGUF files: ids, block geometry, and conversion of the
/// supported ones to and from fp32. Host-only code (no Kokkos).
///
/// A quantized type packs `block_size(t)` consecutive elements of a row into `type_size(t)`
/// bytes; rows (ne[0] elements) always hold a whole number of blocks.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sparsim::gguf {

/// The ggml type ids (stable numbering of the GGUF format; gaps are ids that were removed).
enum class GGMLType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

/// True when `id` is a type id this code knows the geometry of (supported or not).
bool is_known_type(std::uint32_t id);
/// True for the types sparsim can dequantize / quantize:
/// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K.
bool is_supported(GGMLType t);
/// "Q4_K", "F32", ...; "unknown(<id>)" for ids that are not known.
std::string to_string(GGMLType t);
/// Comma-separated list of the supported type names (for error messages).
std::string supported_types_list();
/// The supported type named `name` ("Q8_0" or "q8_0", any case); nullopt for any other name.
std::optional<GGMLType> supported_type_named(std::string_view name);
/// Throws sparsim::Error "<context>: unsupported tensor type IQ2_XXS (16) ..." unless supported.
void require_supported(GGMLType t, std::string_view context);

/// Elements per block (1 for plain float/int types). Throws for unknown ids.
std::size_t block_size(GGMLType t);
/// Bytes per block. Throws for unknown ids.
std::size_t type_size(GGMLType t);
/// Bytes of one row of `ne0` elements; throws unless ne0 is a multiple of block_size(t) or if
/// the result overflows.
std::uint64_t row_bytes(GGMLType t, std::uint64_t ne0);

/// Converts `n` elements (a multiple of block_size(t)) stored as `t` at `src` to fp32.
/// Throws sparsim::Error for unsupported types or a bad `n`.
void dequantize(GGMLType t, const void* src, float* dst, std::size_t n);
/// Converts `n` fp32 values (a multiple of block_size(t)) to type `t` at `dst`
/// (row_bytes(t, n) bytes). Round-to-nearest reference quantizers: meant for synthesising test
/// models, not for producing the best possible quantization.
void quantize(GGMLType t, const float* src, void* dst, std::size_t n);

}  // namespace sparsim::gguf
