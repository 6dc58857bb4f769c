#pragma once
/// bf16 and IEEE fp16 as raw 16-bit patterns with exact bit-level conversions to and from fp32.
///
/// This header does not need Kokkos: host-only code (the GGUF reader, the quantizers, the fuzz
/// targets) includes it directly. When Kokkos_Core.hpp has been included first (core/types.hpp
/// does that), the conversions are KOKKOS_INLINE_FUNCTION and thus callable inside kernels.
#include <cstdint>
#include <cstring>

#if defined(KOKKOS_INLINE_FUNCTION)
#define SPARSIM_HD_INLINE KOKKOS_INLINE_FUNCTION
#define SPARSIM_HALF_HAS_KOKKOS 1
#else
#define SPARSIM_HD_INLINE inline
#define SPARSIM_HALF_HAS_KOKKOS 0
#endif

namespace sparsim {

namespace detail {
SPARSIM_HD_INLINE std::uint32_t float_bits(float f) {
  std::uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
SPARSIM_HD_INLINE float bits_float(std::uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
}  // namespace detail

/// bfloat16: the upper 16 bits of an fp32, rounded to nearest even (NaN stays NaN).
struct bf16_t {
  std::uint16_t bits;
  SPARSIM_HD_INLINE static bf16_t from_float(float f) {
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
  SPARSIM_HD_INLINE float to_float() const {
    return detail::bits_float(static_cast<std::uint32_t>(bits) << 16);
  }
};

/// IEEE 754 binary16, converted exactly (subnormals, infinities, NaN; round to nearest even).
struct f16_t {
  std::uint16_t bits;
  SPARSIM_HD_INLINE float to_float() const {
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
  SPARSIM_HD_INLINE static f16_t from_float(float f) {
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

}  // namespace sparsim
