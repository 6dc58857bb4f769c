#pragma once
/// Storage types usable inside kernels: bf16 and IEEE fp16 held as raw 16-bit patterns,
/// converted to and from fp32 by bit manipulation (identical on every backend, no reliance on
/// Kokkos' own half types, whose names and availability differ between Kokkos 3.4 and 4.x).
/// bf16_t / f16_t themselves live in core/half.hpp so that host-only code can use them without
/// Kokkos; including them here after Kokkos_Core.hpp makes them callable inside kernels.
#include <Kokkos_Core.hpp>

#include "core/half.hpp"
#if !SPARSIM_HALF_HAS_KOKKOS
#error "core/half.hpp was included before Kokkos_Core.hpp: include core/types.hpp first"
#endif

#include <cstdint>
#include <cstring>
#include <string>

namespace sparsim {

/// Element type a model's weights are stored in on the device.
enum class DType { F32, BF16, F16 };

std::string to_string(DType t);
/// Parses "f32", "bf16" or "f16"; throws sparsim::Error otherwise.
DType parse_dtype(const std::string& s);
/// Bytes per element.
inline std::size_t dtype_size(DType t) {
  return t == DType::F32 ? 4 : 2;
}

/// Uniform fp32 read of any storage type inside kernels.
KOKKOS_INLINE_FUNCTION float to_f32(float x) {
  return x;
}
KOKKOS_INLINE_FUNCTION float to_f32(bf16_t x) {
  return x.to_float();
}
KOKKOS_INLINE_FUNCTION float to_f32(f16_t x) {
  return x.to_float();
}

template <class T>
KOKKOS_INLINE_FUNCTION T from_f32(float x);
template <>
KOKKOS_INLINE_FUNCTION float from_f32<float>(float x) {
  return x;
}
template <>
KOKKOS_INLINE_FUNCTION bf16_t from_f32<bf16_t>(float x) {
  return bf16_t::from_float(x);
}
template <>
KOKKOS_INLINE_FUNCTION f16_t from_f32<f16_t>(float x) {
  return f16_t::from_float(x);
}

}  // namespace sparsim
