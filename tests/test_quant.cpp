// Block formats of the supported ggml types: hand-built blocks decoded against values computed
// here from the format definitions, quantize -> dequantize error bounds, and the type tables.
#include "core/error.hpp"
#include "model/quant.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using sparsim::gguf::GGMLType;
namespace gg = sparsim::gguf;

namespace {

// fp16 bit patterns of a few exactly representable values.
constexpr std::uint16_t kHalfOne = 0x3C00;       // 1.0
constexpr std::uint16_t kHalfHalf = 0x3800;      // 0.5
constexpr std::uint16_t kHalfQuarter = 0x3400;   // 0.25
constexpr std::uint16_t kHalfTwo = 0x4000;       // 2.0
constexpr std::uint16_t kHalfMinusOne = 0xBC00;  // -1.0

void put16(std::vector<std::uint8_t>& b, std::size_t at, std::uint16_t v) {
  b[at] = static_cast<std::uint8_t>(v & 0xff);
  b[at + 1] = static_cast<std::uint8_t>(v >> 8);
}

std::vector<float> decode(GGMLType t, const std::vector<std::uint8_t>& b, std::size_t n) {
  std::vector<float> y(n, -12345.0f);
  gg::dequantize(t, b.data(), y.data(), n);
  return y;
}

/// Deterministic byte pattern that exercises every bit position.
std::uint8_t pattern(std::size_t k) {
  return static_cast<std::uint8_t>((k * 73 + 41) ^ (k >> 3));
}

}  // namespace

TEST(QuantTypes, GeometryMatchesTheFormat) {
  struct Row {
    GGMLType t;
    std::size_t block, bytes;
  };
  const Row rows[] = {
      {GGMLType::F32, 1, 4},        {GGMLType::F16, 1, 2},      {GGMLType::BF16, 1, 2},
      {GGMLType::Q4_0, 32, 18},     {GGMLType::Q4_1, 32, 20},   {GGMLType::Q5_0, 32, 22},
      {GGMLType::Q5_1, 32, 24},     {GGMLType::Q8_0, 32, 34},   {GGMLType::Q2_K, 256, 84},
      {GGMLType::Q3_K, 256, 110},   {GGMLType::Q4_K, 256, 144}, {GGMLType::Q5_K, 256, 176},
      {GGMLType::Q6_K, 256, 210},   {GGMLType::Q8_K, 256, 292}, {GGMLType::IQ4_XS, 256, 136},
      {GGMLType::IQ2_XXS, 256, 66}, {GGMLType::I32, 1, 4},      {GGMLType::F64, 1, 8},
  };
  for (const auto& r : rows) {
    EXPECT_EQ(gg::block_size(r.t), r.block) << gg::to_string(r.t);
    EXPECT_EQ(gg::type_size(r.t), r.bytes) << gg::to_string(r.t);
  }
  EXPECT_EQ(gg::row_bytes(GGMLType::Q4_0, 4096), 128u * 18u);
  EXPECT_EQ(gg::row_bytes(GGMLType::F16, 7), 14u);
  EXPECT_THROW(gg::row_bytes(GGMLType::Q4_K, 100), sparsim::Error);
  EXPECT_EQ(static_cast<std::uint32_t>(GGMLType::BF16), 30u);
  EXPECT_EQ(static_cast<std::uint32_t>(GGMLType::Q6_K), 14u);
}

TEST(QuantTypes, NamesAndSupport) {
  EXPECT_EQ(gg::to_string(GGMLType::Q4_K), "Q4_K");
  EXPECT_EQ(gg::to_string(static_cast<GGMLType>(999)), "unknown(999)");
  EXPECT_TRUE(gg::is_known_type(16));
  EXPECT_FALSE(gg::is_known_type(4));  // Q4_2, removed from the format
  EXPECT_FALSE(gg::is_known_type(999));
  for (GGMLType t :
       {GGMLType::F32, GGMLType::F16, GGMLType::BF16, GGMLType::Q8_0, GGMLType::Q4_0,
        GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::Q4_K, GGMLType::Q6_K}) {
    EXPECT_TRUE(gg::is_supported(t)) << gg::to_string(t);
    EXPECT_EQ(gg::supported_type_named(gg::to_string(t)), t);
  }
  EXPECT_EQ(gg::supported_type_named("q8_0"), GGMLType::Q8_0);
  EXPECT_EQ(gg::supported_type_named("bF16"), GGMLType::BF16);
  for (const char* bad : {"Q5_K", "IQ2_XXS", "q8", "q8_00", "", "auto"})
    EXPECT_FALSE(gg::supported_type_named(bad).has_value()) << bad;
  EXPECT_FALSE(gg::is_supported(GGMLType::Q5_K));
  EXPECT_FALSE(gg::is_supported(GGMLType::IQ2_XXS));
  try {
    gg::require_supported(GGMLType::IQ2_XXS, "tensor 'blk.0.ffn_up.weight'");
    FAIL() << "expected an error";
  } catch (const sparsim::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unsupported tensor type IQ2_XXS (16)"), std::string::npos) << m;
    EXPECT_NE(m.find("blk.0.ffn_up.weight"), std::string::npos) << m;
  }
  try {
    gg::require_supported(static_cast<GGMLType>(999), "x");
    FAIL() << "expected an error";
  } catch (const sparsim::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tensor type 999"), std::string::npos);
  }
  std::vector<float> y(32);
  std::vector<std::uint8_t> b(66 * 4);
  EXPECT_THROW(gg::dequantize(GGMLType::IQ2_XXS, b.data(), y.data(), 256), sparsim::Error);
  EXPECT_THROW(gg::dequantize(GGMLType::Q4_0, b.data(), y.data(), 33), sparsim::Error);
}

TEST(QuantDequant, F16AndBF16) {
  const std::uint16_t h[] = {kHalfOne, 0x0001, 0x7C00, 0xC000, 0x7BFF, 0x8000};
  std::vector<std::uint8_t> b(sizeof h);
  std::memcpy(b.data(), h, sizeof h);
  const auto y = decode(GGMLType::F16, b, 6);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(y[2]) && y[2] > 0);
  EXPECT_EQ(y[3], -2.0f);
  EXPECT_EQ(y[4], 65504.0f);
  EXPECT_TRUE(y[5] == 0.0f && std::signbit(y[5]));

  const std::uint16_t bf[] = {0x3F80, 0x4049, 0xC2F6};
  std::vector<std::uint8_t> bb(sizeof bf);
  std::memcpy(bb.data(), bf, sizeof bf);
  const auto z = decode(GGMLType::BF16, bb, 3);
  EXPECT_EQ(z[0], 1.0f);
  EXPECT_EQ(z[1], 3.140625f);
  EXPECT_EQ(z[2], -123.0f);
}

TEST(QuantDequant, Q8_0HandBuilt) {
  std::vector<std::uint8_t> b(2 * 34);
  put16(b, 0, kHalfHalf);
  put16(b, 34, kHalfMinusOne);
  for (int i = 0; i < 32; ++i) {
    b[2 + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(i * 8 - 128));
    b[36 + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(127 - i));
  }
  const auto y = decode(GGMLType::Q8_0, b, 64);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(y[i], 0.5f * static_cast<float>(i * 8 - 128)) << i;
    EXPECT_EQ(y[32 + i], -1.0f * static_cast<float>(127 - i)) << i;
  }
}

TEST(QuantDequant, Q4_0HandBuilt) {
  // d = 2; byte j holds element j (low nibble) and element j + 16 (high nibble); x = d (q - 8).
  std::vector<std::uint8_t> b(18);
  put16(b, 0, kHalfTwo);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const auto y = decode(GGMLType::Q4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(y[j + 16], 2.0f * static_cast<float>(15 - j - 8)) << j;
  }
}

TEST(QuantDequant, Q4_1HandBuilt) {
  // d = 0.5, m = -1; x = d q + m.
  std::vector<std::uint8_t> b(20);
  put16(b, 0, kHalfHalf);
  put16(b, 2, kHalfMinusOne);
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<std::uint8_t>(((j * 5) & 15) | (j << 4));
  const auto y = decode(GGMLType::Q4_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * static_cast<float>((j * 5) & 15) - 1.0f) << j;
    EXPECT_EQ(y[j + 16], 0.5f * static_cast<float>(j) - 1.0f) << j;
  }
}

TEST(QuantDequant, Q5_0HandBuilt) {
  // d = 1; the fifth bit of element i is bit i of the little-endian uint32 qh; x = d (q - 16).
  std::vector<std::uint8_t> b(22);
  put16(b, 0, kHalfOne);
  const std::uint32_t qh = 0xA5C3'0F96u;
  for (int k = 0; k < 4; ++k) b[2 + k] = static_cast<std::uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<std::uint8_t>(j | ((15 - j) << 4));
  const auto y = decode(GGMLType::Q5_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    const int lo = j | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (15 - j) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    EXPECT_EQ(y[j], static_cast<float>(lo - 16)) << j;
    EXPECT_EQ(y[j + 16], static_cast<float>(hi - 16)) << j;
  }
}

TEST(QuantDequant, Q5_1HandBuilt) {
  // d = 0.25, m = 0.5; x = d q + m, q = nibble | fifth bit << 4.
  std::vector<std::uint8_t> b(24);
  put16(b, 0, kHalfQuarter);
  put16(b, 2, kHalfHalf);
  const std::uint32_t qh = 0x1234'F0E1u;
  for (int k = 0; k < 4; ++k) b[4 + k] = static_cast<std::uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) b[8 + j] = pattern(static_cast<std::size_t>(j));
  const auto y = decode(GGMLType::Q5_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    const int lo = (pattern(j) & 15) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (pattern(j) >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    EXPECT_EQ(y[j], 0.25f * static_cast<float>(lo) + 0.5f) << j;
    EXPECT_EQ(y[j + 16], 0.25f * static_cast<float>(hi) + 0.5f) << j;
  }
}

TEST(QuantDequant, Q4_KHandBuilt) {
  // Super-block of 256: fp16 d, fp16 dmin, 12 bytes of packed 6-bit scales/mins, 128 bytes of
  // nibbles. Sub-block j (32 elements): x = d sc[j] q - dmin m[j].
  const int sc[8] = {1, 63, 17, 32, 45, 5, 60, 33};
  const int mn[8] = {0, 2, 63, 40, 17, 48, 9, 31};
  std::vector<std::uint8_t> b(144);
  put16(b, 0, kHalfHalf);     // d = 0.5
  put16(b, 2, kHalfQuarter);  // dmin = 0.25
  // Scale bytes S[0..11]: S[j] low 6 bits = sc[j], S[j+4] low 6 bits = m[j] (j < 4); for j >= 4
  // the low 4 bits of sc[j] / m[j] sit in the low / high nibble of S[j+4] and their top 2 bits in
  // the top 2 bits of S[j-4] / S[j].
  std::uint8_t* s = b.data() + 4;
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<std::uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<std::uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  for (int k = 0; k < 128; ++k) b[16 + k] = pattern(static_cast<std::size_t>(k));
  const auto y = decode(GGMLType::Q4_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    // Element e: 64-element chunk c uses bytes 32c..32c+31; its first 32 elements are the low
    // nibbles (sub-block 2c), the next 32 the high nibbles (sub-block 2c+1).
    const int c = e / 64, w = e % 64, l = w % 32;
    const int j = 2 * c + (w >= 32 ? 1 : 0);
    const std::uint8_t byte = pattern(static_cast<std::size_t>(32 * c + l));
    const int q = w < 32 ? (byte & 15) : (byte >> 4);
    const float expect = 0.5f * static_cast<float>(sc[j]) * static_cast<float>(q) -
                         0.25f * static_cast<float>(mn[j]);
    EXPECT_EQ(y[e], expect) << "element " << e;
  }
}

TEST(QuantDequant, Q6_KHandBuilt) {
  // Super-block of 256: ql[128], qh[64], int8 scales[16], fp16 d. Element e = 128 n + 32 k + l:
  // low 4 bits from ql[64 n + l + 32 (k & 1)] (low nibble for k < 2, high for k >= 2), high 2
  // bits from bits 2k..2k+1 of qh[32 n + l]; x = d scales[e / 16] (q - 32).
  std::vector<std::uint8_t> b(210);
  for (int k = 0; k < 192; ++k) b[k] = pattern(static_cast<std::size_t>(k) * 3 + 1);
  const std::int8_t scales[16] = {-128, 127, -1, 1,   0,    64, -64, 33,
                                  -33,  2,   -2, 100, -100, 7,  -7,  5};
  std::memcpy(b.data() + 192, scales, 16);
  put16(b, 208, kHalfHalf);  // d = 0.5
  const auto y = decode(GGMLType::Q6_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
    const std::uint8_t lo_byte = b[64 * n + l + 32 * (k & 1)];
    const int lo = k < 2 ? (lo_byte & 15) : (lo_byte >> 4);
    const int hi = (b[128 + 32 * n + l] >> (2 * k)) & 3;
    const int q = lo | (hi << 4);
    const float expect = 0.5f * static_cast<float>(scales[e / 16]) * static_cast<float>(q - 32);
    EXPECT_EQ(y[e], expect) << "element " << e;
  }
}

namespace {

struct Bound {
  GGMLType t;
  double max_rel;  // max |error| / (largest |x| of the block)
  double rms_rel;  // rms error / rms x
};

}  // namespace

TEST(QuantRoundTrip, ErrorWithinTheTypesResolution) {
  // Per-block error bounds derived from each format's step size (with the clamping of the
  // symmetric formats, whose most positive level is one step short).
  const Bound bounds[] = {
      {GGMLType::F32, 0.0, 0.0},
      {GGMLType::F16, 1.0 / 2048, 1.0 / 2048},
      {GGMLType::BF16, 1.0 / 256, 1.0 / 256},
      {GGMLType::Q8_0, 0.5 / 127 + 0.001, 0.01},
      {GGMLType::Q4_0, 1.0 / 8 + 0.001, 0.12},
      {GGMLType::Q5_0, 1.0 / 16 + 0.001, 0.06},
      {GGMLType::Q4_1, 2.0 / 15 * 0.5 + 0.002, 0.1},
      {GGMLType::Q5_1, 2.0 / 31 * 0.5 + 0.002, 0.05},
      {GGMLType::Q4_K, 0.08, 0.1},
      {GGMLType::Q6_K, 0.04, 0.03},
  };
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(-3.0f, 5.0f);
  const std::size_t n = 256 * 16;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    // Mix of distributions and scales across blocks, including an all-zero and a one-hot block.
    const std::size_t blk = i / 256;
    x[i] = blk % 3 == 0 ? normal(rng) : blk % 3 == 1 ? uni(rng) * 0.01f : normal(rng) * 50.0f;
    if (blk == 5) x[i] = 0.0f;
    if (blk == 6) x[i] = (i % 256 == 17) ? -7.0f : 0.0f;
  }
  for (const auto& bd : bounds) {
    const std::string name = gg::to_string(bd.t);
    std::vector<std::uint8_t> q(gg::row_bytes(bd.t, n));
    gg::quantize(bd.t, x.data(), q.data(), n);
    std::vector<float> y(n);
    gg::dequantize(bd.t, q.data(), y.data(), n);
    const std::size_t bs = std::max<std::size_t>(gg::block_size(bd.t), 32);
    double err2 = 0.0, x2 = 0.0;
    for (std::size_t b0 = 0; b0 < n; b0 += bs) {
      double amax = 0.0, emax = 0.0;
      for (std::size_t i = b0; i < b0 + bs; ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << name << " element " << i;
        amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
        const double e = std::fabs(static_cast<double>(y[i]) - x[i]);
        emax = std::max(emax, e);
        err2 += e * e;
        x2 += static_cast<double>(x[i]) * x[i];
      }
      EXPECT_LE(emax, bd.max_rel * amax + 1e-30) << name << " block at " << b0;
    }
    EXPECT_LE(std::sqrt(err2 / x2), bd.rms_rel + 1e-12) << name;
  }
}

TEST(QuantRoundTrip, ExactlyRepresentableValuesSurvive) {
  // Q8_0 with d = 1 and integer inputs in [-127, 127] is lossless.
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i * 8 - 127);
  x[31] = 127.0f;
  std::vector<std::uint8_t> q(34);
  gg::quantize(GGMLType::Q8_0, x.data(), q.data(), 32);
  std::vector<float> y(32);
  gg::dequantize(GGMLType::Q8_0, q.data(), y.data(), 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], x[i]) << i;
}
