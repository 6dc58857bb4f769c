#include "model/quant.hpp"

#include "core/error.hpp"
#include "core/half.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

namespace sparsim::gguf {

namespace {

static_assert(sizeof(float) == 4, "fp32 is assumed to be 4 bytes");

struct TypeTraits {
  GGMLType type;
  const char* name;
  std::uint32_t block;  // elements per block
  std::uint32_t bytes;  // bytes per block
  bool supported;
};

constexpr std::uint32_t kQK = 32;    // elements per block of the legacy quants
constexpr std::uint32_t kQKK = 256;  // elements per super-block of the K-quants

// Block layouts (bytes): see the per-type comments in dequantize_* below.
constexpr TypeTraits kTypes[] = {
    {GGMLType::F32, "F32", 1, 4, true},
    {GGMLType::F16, "F16", 1, 2, true},
    {GGMLType::Q4_0, "Q4_0", kQK, 2 + kQK / 2, true},
    {GGMLType::Q4_1, "Q4_1", kQK, 2 + 2 + kQK / 2, true},
    {GGMLType::Q5_0, "Q5_0", kQK, 2 + 4 + kQK / 2, true},
    {GGMLType::Q5_1, "Q5_1", kQK, 2 + 2 + 4 + kQK / 2, true},
    {GGMLType::Q8_0, "Q8_0", kQK, 2 + kQK, true},
    {GGMLType::Q8_1, "Q8_1", kQK, 2 + 2 + kQK, false},
    {GGMLType::Q2_K, "Q2_K", kQKK, 2 + 2 + kQKK / 16 + kQKK / 4, false},
    {GGMLType::Q3_K, "Q3_K", kQKK, 2 + kQKK / 4 + kQKK / 8 + 12, false},
    {GGMLType::Q4_K, "Q4_K", kQKK, 2 + 2 + 12 + kQKK / 2, true},
    {GGMLType::Q5_K, "Q5_K", kQKK, 2 + 2 + 12 + kQKK / 8 + kQKK / 2, false},
    {GGMLType::Q6_K, "Q6_K", kQKK, kQKK / 2 + kQKK / 4 + kQKK / 16 + 2, true},
    {GGMLType::Q8_K, "Q8_K", kQKK, 4 + kQKK + kQKK / 8, false},
    {GGMLType::IQ2_XXS, "IQ2_XXS", kQKK, 2 + kQKK / 4, false},
    {GGMLType::IQ2_XS, "IQ2_XS", kQKK, 2 + kQKK / 4 + kQKK / 32, false},
    {GGMLType::IQ3_XXS, "IQ3_XXS", kQKK, 2 + kQKK / 4 + kQKK / 8, false},
    {GGMLType::IQ1_S, "IQ1_S", kQKK, 2 + kQKK / 8 + kQKK / 16, false},
    {GGMLType::IQ4_NL, "IQ4_NL", kQK, 2 + kQK / 2, false},
    {GGMLType::IQ3_S, "IQ3_S", kQKK, 2 + kQKK / 4 + kQKK / 8 + kQKK / 32 + 4, false},
    {GGMLType::IQ2_S, "IQ2_S", kQKK, 2 + kQKK / 4 + kQKK / 16, false},
    {GGMLType::IQ4_XS, "IQ4_XS", kQKK, 2 + 2 + kQKK / 2 + kQKK / 64, false},
    {GGMLType::I8, "I8", 1, 1, false},
    {GGMLType::I16, "I16", 1, 2, false},
    {GGMLType::I32, "I32", 1, 4, false},
    {GGMLType::I64, "I64", 1, 8, false},
    {GGMLType::F64, "F64", 1, 8, false},
    {GGMLType::IQ1_M, "IQ1_M", kQKK, kQKK / 8 + kQKK / 16 + kQKK / 32, false},
    {GGMLType::BF16, "BF16", 1, 2, true},
    {GGMLType::TQ1_0, "TQ1_0", kQKK, 2 + 4 * 13, false},
    {GGMLType::TQ2_0, "TQ2_0", kQKK, 2 + 64, false},
    {GGMLType::MXFP4, "MXFP4", kQK, 1 + kQK / 2, false},
    {GGMLType::NVFP4, "NVFP4", 64, 4 + 32, false},
    {GGMLType::Q1_0, "Q1_0", 128, 2 + 16, false},
};

const TypeTraits* find_traits(std::uint32_t id) {
  for (const auto& t : kTypes) {
    if (static_cast<std::uint32_t>(t.type) == id) return &t;
  }
  return nullptr;
}

const TypeTraits& traits(GGMLType t) {
  const TypeTraits* tr = find_traits(static_cast<std::uint32_t>(t));
  if (!tr) fail("unknown tensor type {}", static_cast<std::uint32_t>(t));
  return *tr;
}

// ---------------------------------------------------------------------------------------------
// Scalar helpers. Files are little-endian; so is every host sparsim targets.

/// fp16 -> fp32 for all 65536 bit patterns, built once (exact: the table is filled by f16_t).
const float* f16_table() {
  static const std::array<float, 65536>* table = [] {
    auto* t = new std::array<float, 65536>();
    for (std::uint32_t i = 0; i < 65536; ++i) {
      (*t)[i] = f16_t{static_cast<std::uint16_t>(i)}.to_float();
    }
    return t;
  }();
  return table->data();
}

inline std::uint16_t load_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
inline void store_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v & 0xff);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
inline float load_f16(const float* table, const std::uint8_t* p) {
  return table[load_u16(p)];
}
/// Stores `v` as fp16 and returns the value actually stored (what dequantize will see).
inline float store_f16(std::uint8_t* p, float v) {
  const f16_t h = f16_t::from_float(v);
  store_u16(p, h.bits);
  return h.to_float();
}

/// Rounds to the nearest integer (ties away from zero) and clamps to [lo, hi]; NaN gives lo.
inline int round_clamp(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v >= 0.0f ? v + 0.5f : v - 0.5f);
}

/// The element of largest magnitude, with its sign (0 for an all-zero block).
inline float signed_absmax(const float* x, std::size_t n) {
  float best = 0.0f, amax = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax) {
      amax = a;
      best = x[i];
    }
  }
  return best;
}

inline float inverse(float d) {
  return d != 0.0f ? 1.0f / d : 0.0f;
}

// ---------------------------------------------------------------------------------------------
// Legacy 32-element blocks.
//
// Q8_0 (34 bytes): fp16 d | int8 q[32];                    x[i] = d * q[i]
// Q4_0 (18 bytes): fp16 d | u8 qs[16];                     x[i] = d * (nib[i] - 8)
// Q4_1 (20 bytes): fp16 d | fp16 m | u8 qs[16];            x[i] = d * nib[i] + m
// Q5_0 (22 bytes): fp16 d | u8 qh[4] | u8 qs[16];          x[i] = d * ((nib[i] | hb[i] << 4) - 16)
// Q5_1 (24 bytes): fp16 d | fp16 m | u8 qh[4] | u8 qs[16]; x[i] = d * (nib[i] | hb[i] << 4) + m
// where for i < 16: nib[i] = qs[i] & 15, nib[i + 16] = qs[i] >> 4, and hb[i] is bit i of qh read
// as a little-endian uint32.

void dequantize_q8_0(const std::uint8_t* b, float* y, std::size_t nb, const float* h) {
  for (std::size_t k = 0; k < nb; ++k, b += 34, y += kQK) {
    const float d = load_f16(h, b);
    const auto* q = reinterpret_cast<const std::int8_t*>(b + 2);
    for (std::uint32_t i = 0; i < kQK; ++i) y[i] = d * static_cast<float>(q[i]);
  }
}

void dequantize_q4_0(const std::uint8_t* b, float* y, std::size_t nb, const float* h) {
  for (std::size_t k = 0; k < nb; ++k, b += 18, y += kQK) {
    const float d = load_f16(h, b);
    const std::uint8_t* qs = b + 2;
    for (std::uint32_t i = 0; i < kQK / 2; ++i) {
      y[i] = d * static_cast<float>((qs[i] & 0x0f) - 8);
      y[i + kQK / 2] = d * static_cast<float>((qs[i] >> 4) - 8);
    }
  }
}

void dequantize_q4_1(const std::uint8_t* b, float* y, std::size_t nb, const float* h) {
  for (std::size_t k = 0; k < nb; ++k, b += 20, y += kQK) {
    const float d = load_f16(h, b);
    const float m = load_f16(h, b + 2);
    const std::uint8_t* qs = b + 4;
    for (std::uint32_t i = 0; i < kQK / 2; ++i) {
      y[i] = d * static_cast<float>(qs[i] & 0x0f) + m;
      y[i + kQK / 2] = d * static_cast<float>(qs[i] >> 4) + m;
    }
  }
}

inline std::uint32_t load_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

void dequantize_q5_0(const std::uint8_t* b, float* y, std::size_t nb, const float* h) {
  for (std::size_t k = 0; k < nb; ++k, b += 22, y += kQK) {
    const float d = load_f16(h, b);
    const std::uint32_t qh = load_u32(b + 2);
    const std::uint8_t* qs = b + 6;
    for (std::uint32_t i = 0; i < kQK / 2; ++i) {
      const int lo = static_cast<int>((qs[i] & 0x0f) | (((qh >> i) & 1u) << 4));
      const int hi = static_cast<int>((qs[i] >> 4) | (((qh >> (i + 16)) & 1u) << 4));
      y[i] = d * static_cast<float>(lo - 16);
      y[i + kQK / 2] = d * static_cast<float>(hi - 16);
    }
  }
}

void dequantize_q5_1(const std::uint8_t* b, float* y, std::size_t nb, const float* h) {
  for (std::size_t k = 0; k < nb; ++k, b += 24, y += kQK) {
    const float d = load_f16(h, b);
    const float m = load_f16(h, b + 2);
    const std::uint32_t qh = load_u32(b + 4);
    const std::uint8_t* qs = b + 8;
    for (std::uint32_t i = 0; i < kQK / 2; ++i) {
      const std::uint32_t lo = (qs[i] & 0x0fu) | (((qh >> i) & 1u) << 4);
      const std::uint32_t hi = (qs[i] >> 4) | (((qh >> (i + 16)) & 1u) << 4);
      y[i] = d * static_cast<float>(lo) + m;
      y[i + kQK / 2] = d * static_cast<float>(hi) + m;
    }
  }
}

void quantize_q8_0(const float* x, std::uint8_t* b, std::size_t nb) {
  for (std::size_t k = 0; k < nb; ++k, b += 34, x += kQK) {
    const float amax = std::fabs(signed_absmax(x, kQK));
    const float id = inverse(store_f16(b, amax / 127.0f));
    for (std::uint32_t i = 0; i < kQK; ++i) {
      b[2 + i] =
          static_cast<std::uint8_t>(static_cast<std::int8_t>(round_clamp(x[i] * id, -127, 127)));
    }
  }
}

/// Q4_0 / Q5_0: symmetric; the element of largest magnitude maps to the most negative level.
void quantize_sym(const float* x, std::uint8_t* b, std::size_t nb, int bits) {
  const int half = 1 << (bits - 1);  // 8 or 16
  const std::size_t bytes = bits == 4 ? 18 : 22;
  for (std::size_t k = 0; k < nb; ++k, b += bytes, x += kQK) {
    const float id = inverse(store_f16(b, signed_absmax(x, kQK) / static_cast<float>(-half)));
    int q[kQK];
    for (std::uint32_t i = 0; i < kQK; ++i) q[i] = round_clamp(x[i] * id, -half, half - 1) + half;
    std::uint8_t* qs = b + (bits == 4 ? 2 : 6);
    std::uint32_t qh = 0;
    for (std::uint32_t i = 0; i < kQK / 2; ++i) {
      qs[i] = static_cast<std::uint8_t>((q[i] & 0x0f) | ((q[i + kQK / 2] & 0x0f) << 4));
      qh |= static_cast<std::uint32_t>((q[i] >> 4) & 1) << i;
      qh |= static_cast<std::uint32_t>((q[i + kQK / 2] >> 4) & 1) << (i + 16);
    }
    if (bits == 5) {
      for (int i = 0; i < 4; ++i) b[2 + i] = static_cast<std::uint8_t>(qh >> (8 * i));
    }
  }
}

/// Q4_1 / Q5_1: affine with the block minimum as offset.
void quantize_affine(const float* x, std::uint8_t* b, std::size_t nb, int bits) {
  const int levels = (1 << bits) - 1;  // 15 or 31
  const std::size_t bytes = bits == 4 ? 20 : 24;
  for (std::size_t k = 0; k < nb; ++k, b += bytes, x += kQK) {
    float mn = x[0], mx = x[0];
    for (std::uint32_t i = 1; i < kQK; ++i) {
      mn = std::min(mn, x[i]);
      mx = std::max(mx, x[i]);
    }
    const float id = inverse(store_f16(b, (mx - mn) / static_cast<float>(levels)));
    const float m = store_f16(b + 2, mn);
    int q[kQK];
    for (std::uint32_t i = 0; i < kQK; ++i) q[i] = round_clamp((x[i] - m) * id, 0, levels);
    std::uint8_t* qs = b + (bits == 4 ? 4 : 8);
    std::uint32_t qh = 0;
    for (std::uint32_t i = 0; i < kQK / 2; ++i) {
      qs[i] = static_cast<std::uint8_t>((q[i] & 0x0f) | ((q[i + kQK / 2] & 0x0f) << 4));
      qh |= static_cast<std::uint32_t>((q[i] >> 4) & 1) << i;
      qh |= static_cast<std::uint32_t>((q[i + kQK / 2] >> 4) & 1) << (i + 16);
    }
    if (bits == 5) {
      for (int i = 0; i < 4; ++i) b[4 + i] = static_cast<std::uint8_t>(qh >> (8 * i));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Q4_K (144 bytes per 256 elements): fp16 d | fp16 dmin | u8 scales[12] | u8 qs[128].
// Eight sub-blocks of 32 elements, each with a 6-bit scale sc[j] and a 6-bit min m[j]:
//   x = d * sc[j] * q - dmin * m[j],  q a 4-bit value.
// The 12 scale bytes S hold them as: for j < 4, sc[j] = S[j] & 63 and m[j] = S[j + 4] & 63;
// for j >= 4, sc[j] = (S[j + 4] & 15) | (S[j - 4] >> 6) << 4 and
// m[j] = (S[j + 4] >> 4) | (S[j] >> 6) << 4.
// The 4-bit values of sub-blocks 2c and 2c+1 share bytes qs[32c .. 32c+31]: sub-block 2c in the
// low nibbles, 2c+1 in the high nibbles.

inline void q4k_scale_min(const std::uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void dequantize_q4_k(const std::uint8_t* b, float* y, std::size_t nb, const float* h) {
  for (std::size_t k = 0; k < nb; ++k, b += 144, y += kQKK) {
    const float d = load_f16(h, b);
    const float dmin = load_f16(h, b + 2);
    const std::uint8_t* s = b + 4;
    const std::uint8_t* qs = b + 16;
    for (int c = 0; c < 4; ++c) {
      int sc0, m0, sc1, m1;
      q4k_scale_min(s, 2 * c, sc0, m0);
      q4k_scale_min(s, 2 * c + 1, sc1, m1);
      const float d0 = d * static_cast<float>(sc0), o0 = dmin * static_cast<float>(m0);
      const float d1 = d * static_cast<float>(sc1), o1 = dmin * static_cast<float>(m1);
      const std::uint8_t* q = qs + 32 * c;
      float* yc = y + 64 * c;
      for (int l = 0; l < 32; ++l) {
        yc[l] = d0 * static_cast<float>(q[l] & 0x0f) - o0;
        yc[l + 32] = d1 * static_cast<float>(q[l] >> 4) - o1;
      }
    }
  }
}

void quantize_q4_k(const float* x, std::uint8_t* b, std::size_t nb) {
  for (std::size_t k = 0; k < nb; ++k, b += 144, x += kQKK) {
    float scale[8], negmin[8];
    float max_scale = 0.0f, max_negmin = 0.0f;
    for (int j = 0; j < 8; ++j) {
      const float* xs = x + 32 * j;
      float mn = 0.0f, mx = xs[0];  // the offset can only be subtracted: min is clipped to <= 0
      for (int i = 0; i < 32; ++i) {
        mn = std::min(mn, xs[i]);
        mx = std::max(mx, xs[i]);
      }
      scale[j] = std::max(0.0f, (mx - mn) / 15.0f);
      negmin[j] = -mn;
      max_scale = std::max(max_scale, scale[j]);
      max_negmin = std::max(max_negmin, negmin[j]);
    }
    const float d = store_f16(b, max_scale / 63.0f);
    const float dmin = store_f16(b + 2, max_negmin / 63.0f);
    const float id = inverse(d), idmin = inverse(dmin);
    int sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      // Round the scale up so that the sub-block's range stays representable.
      sc[j] = std::min(63, std::max(0, static_cast<int>(std::ceil(scale[j] * id))));
      m[j] = round_clamp(negmin[j] * idmin, 0, 63);
    }
    std::uint8_t* s = b + 4;
    std::memset(s, 0, 12);
    for (int j = 0; j < 4; ++j) {
      s[j] = static_cast<std::uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      s[j + 4] = static_cast<std::uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
      s[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
    std::uint8_t* qs = b + 16;
    for (int c = 0; c < 4; ++c) {
      int q[2][32];
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * c + half;
        const float es = d * static_cast<float>(sc[j]);
        const float eo = dmin * static_cast<float>(m[j]);
        const float ies = inverse(es);
        for (int l = 0; l < 32; ++l) q[half][l] = round_clamp((x[32 * j + l] + eo) * ies, 0, 15);
      }
      for (int l = 0; l < 32; ++l) {
        qs[32 * c + l] = static_cast<std::uint8_t>(q[0][l] | (q[1][l] << 4));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Q6_K (210 bytes per 256 elements): u8 ql[128] | u8 qh[64] | int8 scales[16] | fp16 d.
// Sixteen sub-blocks of 16 elements with a signed 8-bit scale each: x[i] = d * scales[i / 16] * (q
// - 32), q a 6-bit value. Each half of the block (128 elements, index n = 0/1) uses ql[64n ..
// 64n+63] and qh[32n .. 32n+31]; for l < 32 the four values at offsets l, l+32, l+64, l+96 of the
// half are
//   q(l)      = (ql[l]      & 15) | ((qh[l] >> 0) & 3) << 4
//   q(l + 32) = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4
//   q(l + 64) = (ql[l]      >> 4) | ((qh[l] >> 4) & 3) << 4
//   q(l + 96) = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4

void dequantize_q6_k(const std::uint8_t* b, float* y, std::size_t nb, const float* h) {
  for (std::size_t k = 0; k < nb; ++k, b += 210, y += kQKK) {
    const float d = load_f16(h, b + 208);
    const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
    for (int n = 0; n < 2; ++n) {
      const std::uint8_t* ql = b + 64 * n;
      const std::uint8_t* qh = b + 128 + 32 * n;
      float* yh = y + 128 * n;
      const std::int8_t* s = sc + 8 * n;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        yh[l] = d * static_cast<float>(s[is + 0]) * static_cast<float>(q1);
        yh[l + 32] = d * static_cast<float>(s[is + 2]) * static_cast<float>(q2);
        yh[l + 64] = d * static_cast<float>(s[is + 4]) * static_cast<float>(q3);
        yh[l + 96] = d * static_cast<float>(s[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void quantize_q6_k(const float* x, std::uint8_t* b, std::size_t nb) {
  for (std::size_t k = 0; k < nb; ++k, b += 210, x += kQKK) {
    float scale[16];
    float max_abs_scale = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scale[j] = signed_absmax(x + 16 * j, 16) / -32.0f;
      max_abs_scale = std::max(max_abs_scale, std::fabs(scale[j]));
    }
    const float d = store_f16(b + 208, max_abs_scale / 127.0f);
    const float id = inverse(d);
    auto* sc = reinterpret_cast<std::int8_t*>(b + 192);
    int q[256];
    for (int j = 0; j < 16; ++j) {
      sc[j] = static_cast<std::int8_t>(round_clamp(scale[j] * id, -127, 127));
      const float ies = inverse(d * static_cast<float>(sc[j]));
      for (int i = 0; i < 16; ++i) q[16 * j + i] = round_clamp(x[16 * j + i] * ies, -32, 31) + 32;
    }
    for (int n = 0; n < 2; ++n) {
      std::uint8_t* ql = b + 64 * n;
      std::uint8_t* qh = b + 128 + 32 * n;
      const int* qn = q + 128 * n;
      for (int l = 0; l < 32; ++l) {
        const int q1 = qn[l], q2 = qn[l + 32], q3 = qn[l + 64], q4 = qn[l + 96];
        ql[l] = static_cast<std::uint8_t>((q1 & 0x0f) | ((q3 & 0x0f) << 4));
        ql[l + 32] = static_cast<std::uint8_t>((q2 & 0x0f) | ((q4 & 0x0f) << 4));
        qh[l] = static_cast<std::uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) |
                                          ((q4 >> 4) << 6));
      }
    }
  }
}

std::size_t checked_blocks(GGMLType t, std::size_t n, const char* what) {
  const TypeTraits& tr = traits(t);
  require_supported(t, what);
  require(n % tr.block == 0, "{}: {} elements of type {} are not a multiple of its block size {}",
          what, n, tr.name, tr.block);
  return n / tr.block;
}

}  // namespace

bool is_known_type(std::uint32_t id) {
  return find_traits(id) != nullptr;
}

bool is_supported(GGMLType t) {
  const TypeTraits* tr = find_traits(static_cast<std::uint32_t>(t));
  return tr != nullptr && tr->supported;
}

std::string to_string(GGMLType t) {
  const TypeTraits* tr = find_traits(static_cast<std::uint32_t>(t));
  if (!tr) return "unknown(" + std::to_string(static_cast<std::uint32_t>(t)) + ")";
  return tr->name;
}

std::string supported_types_list() {
  std::string s;
  for (const auto& t : kTypes) {
    if (!t.supported) continue;
    if (!s.empty()) s += ", ";
    s += t.name;
  }
  return s;
}

std::optional<GGMLType> supported_type_named(std::string_view name) {
  auto upper = [](char c) {
    return static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  };
  for (const auto& t : kTypes) {
    const std::string_view n = t.name;
    if (!t.supported || n.size() != name.size()) continue;
    if (std::equal(n.begin(), n.end(), name.begin(), [&](char a, char b) { return a == upper(b); }))
      return t.type;
  }
  return std::nullopt;
}

void require_supported(GGMLType t, std::string_view context) {
  const auto id = static_cast<std::uint32_t>(t);
  const TypeTraits* tr = find_traits(id);
  if (!tr) fail("{}: unknown tensor type {}", context, id);
  if (!tr->supported) {
    fail("{}: unsupported tensor type {} ({}); supported types: {}", context, tr->name, id,
         supported_types_list());
  }
}

std::size_t block_size(GGMLType t) {
  return traits(t).block;
}
std::size_t type_size(GGMLType t) {
  return traits(t).bytes;
}

std::uint64_t row_bytes(GGMLType t, std::uint64_t ne0) {
  const TypeTraits& tr = traits(t);
  require(ne0 % tr.block == 0, "row of {} elements is not a multiple of the {} block size {}", ne0,
          tr.name, tr.block);
  const std::uint64_t blocks = ne0 / tr.block;
  require(blocks <= std::numeric_limits<std::uint64_t>::max() / tr.bytes,
          "row of {} elements of type {} overflows a 64-bit byte count", ne0, tr.name);
  return blocks * tr.bytes;
}

void dequantize(GGMLType t, const void* src, float* dst, std::size_t n) {
  const std::size_t nb = checked_blocks(t, n, "dequantize");
  const auto* b = static_cast<const std::uint8_t*>(src);
  const float* h = f16_table();
  switch (t) {
    case GGMLType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GGMLType::F16:
      for (std::size_t i = 0; i < n; ++i) dst[i] = load_f16(h, b + 2 * i);
      return;
    case GGMLType::BF16:
      for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_t{load_u16(b + 2 * i)}.to_float();
      return;
    case GGMLType::Q8_0:
      dequantize_q8_0(b, dst, nb, h);
      return;
    case GGMLType::Q4_0:
      dequantize_q4_0(b, dst, nb, h);
      return;
    case GGMLType::Q4_1:
      dequantize_q4_1(b, dst, nb, h);
      return;
    case GGMLType::Q5_0:
      dequantize_q5_0(b, dst, nb, h);
      return;
    case GGMLType::Q5_1:
      dequantize_q5_1(b, dst, nb, h);
      return;
    case GGMLType::Q4_K:
      dequantize_q4_k(b, dst, nb, h);
      return;
    case GGMLType::Q6_K:
      dequantize_q6_k(b, dst, nb, h);
      return;
    default:
      break;
  }
  fail("dequantize: no converter for type {}", to_string(t));
}

void quantize(GGMLType t, const float* src, void* dst, std::size_t n) {
  const std::size_t nb = checked_blocks(t, n, "quantize");
  auto* b = static_cast<std::uint8_t*>(dst);
  switch (t) {
    case GGMLType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GGMLType::F16:
      for (std::size_t i = 0; i < n; ++i) store_u16(b + 2 * i, f16_t::from_float(src[i]).bits);
      return;
    case GGMLType::BF16:
      for (std::size_t i = 0; i < n; ++i) store_u16(b + 2 * i, bf16_t::from_float(src[i]).bits);
      return;
    case GGMLType::Q8_0:
      quantize_q8_0(src, b, nb);
      return;
    case GGMLType::Q4_0:
      quantize_sym(src, b, nb, 4);
      return;
    case GGMLType::Q4_1:
      quantize_affine(src, b, nb, 4);
      return;
    case GGMLType::Q5_0:
      quantize_sym(src, b, nb, 5);
      return;
    case GGMLType::Q5_1:
      quantize_affine(src, b, nb, 5);
      return;
    case GGMLType::Q4_K:
      quantize_q4_k(src, b, nb);
      return;
    case GGMLType::Q6_K:
      quantize_q6_k(src, b, nb);
      return;
    default:
      break;
  }
  fail("quantize: no converter for type {}", to_string(t));
}

}  // namespace sparsim::gguf
