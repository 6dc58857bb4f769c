#pragma once
/// Storage types usable inside kernels: bf16 and IEEE fp16 held as raw 16-bit patterns,
/// converted to and from fp32 by bit manipulation (identical on every backend, no reliance on
/// Kokkos' own half types, whose names and availability differ between Kokkos 3.4 and 4.x).
#include <Kokkos_Core.hpp>

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
inline std::size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

namespace detail {
KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float f) {
  std::uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
KOKKOS_INLINE_FUNCTION float bits_float(std::uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
}  // namespace detail

/// bfloat16: the upper 16 bits of an fp32, rounded to nearest even (NaN stays NaN).
struct bf16_t {
  std::uint16_t bits;
  KOKKOS_INLINE_FUNCTION static bf16_t from_float(float f) {
    std::uint32_t u = detail::float_bits(f);
    bf16_t r{};
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      r.bits = static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      r.bits = static_cast<std::uint16_t>(u >> 16);
    }
    return r;
  }
  KOKKOS_INLINE_FUNCTION float to_float() const {
    return detail::bits_float(static_cast<std::uint32_t>(bits) << 16);
  }
};

/// IEEE 754 binary16, converted exactly (subnormals, infinities, NaN; round to nearest even).
struct f16_t {
  std::uint16_t bits;
  KOKKOS_INLINE_FUNCTION float to_float() const {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t exp = (bits >> 10) & 0x1fu;
    std::uint32_t mant = bits & 0x3ffu;
    if (exp == 0) {
      if (mant == 0) return detail::bits_float(sign);
      // subnormal: value = mant * 2^-24
      float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
      return sign ? -v : v;
    }
    if (exp == 31) return detail::bits_float(sign | 0x7f800000u | (mant << 13));
    return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
  KOKKOS_INLINE_FUNCTION static f16_t from_float(float f) {
    const std::uint32_t u = detail::float_bits(f);
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7fffffffu;
    f16_t r{};
    if (a > 0x7f800000u) {  // NaN
      r.bits = static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
      return r;
    }
    if (a >= 0x477ff000u) {  // rounds to >= 65520 -> inf
      r.bits = static_cast<std::uint16_t>(sign | 0x7c00u);
      return r;
    }
    if (a < 0x38800000u) {  // below the smallest normal: subnormal or zero
      // value / 2^-24, rounded to nearest even
      const float v = detail::bits_float(a) * 16777216.0f;
      float fl = static_cast<float>(static_cast<std::uint32_t>(v));
      float rem = v - fl;
      std::uint32_t m = static_cast<std::uint32_t>(fl);
      if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
      r.bits = static_cast<std::uint16_t>(sign | m);
      return r;
    }
    std::uint32_t e = (a >> 23) - 112u;
    std::uint32_t m = a & 0x7fffffu;
    std::uint32_t h = (e << 10) | (m >> 13);
    const std::uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    r.bits = static_cast<std::uint16_t>(sign | h);
    return r;
  }
};

/// Uniform fp32 read of any storage type inside kernels.
KOKKOS_INLINE_FUNCTION float to_f32(float x) { return x; }
KOKKOS_INLINE_FUNCTION float to_f32(bf16_t x) { return x.to_float(); }
KOKKOS_INLINE_FUNCTION float to_f32(f16_t x) { return x.to_float(); }

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
