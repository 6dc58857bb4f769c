#pragma once
/// Branch-free elementary functions whose loops vectorise on the host and that compile for every
/// backend: the same arithmetic on CPU and GPU, no libm call.
#include "core/compat.hpp"

#include <Kokkos_Core.hpp>

namespace sparsim::detail {

/// e^x for x ≤ 0 (a softmax argument), branch-free so that a loop of it vectorises: Cody–Waite
/// reduction x = n·ln2 + r, a degree-6 polynomial for e^r, and 2^n from the exponent bits. Within
/// 2 ulp of the exact value; 0 below −87 (where e^x leaves the normal range).
KOKKOS_INLINE_FUNCTION float exp_nonpos(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  const float z = xc * 1.44269504088896341f;
  // Round to nearest with the 1.5·2^23 trick (|z| < 2^22), no libm call.
  const float n = (z + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int bits = (static_cast<int>(n) + 127) << 23;
  float two_n;
  __builtin_memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.0f ? 0.0f : p * two_n;
}

/// silu(g) = g · sigmoid(g), from e^{−|g|} (never overflows): g / (1 + e) for g ≥ 0 and
/// g · e / (1 + e) below. Within 4 ulp of the exact value; 0 below g = −87, where the exact
/// value is under 1e-35 (exp_nonpos flushes there).
KOKKOS_INLINE_FUNCTION float silu(float g) {
  const float e = exp_nonpos(g < 0.0f ? g : -g);
  return g * ((g < 0.0f ? e : 1.0f) / (1.0f + e));
}

}  // namespace sparsim::detail
