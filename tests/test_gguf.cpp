// GGUF writer -> reader round trips, accessors, and rejection of corrupted files: every
// malformed file must raise sparsim::Error naming the key, tensor or field at fault.
#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/quant.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace gg = sparsim::gguf;
using gg::GGMLType;
using gg::Value;
using gg::ValueType;

namespace {

using Bytes = std::vector<std::uint8_t>;

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("sparsim-test-" + std::to_string(::getpid())) /
           (std::string(info->test_suite_name()) + "." + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::remove(dir_.parent_path(), ec);  // only succeeds once empty
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

Bytes read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void put_le(Bytes& b, std::size_t at, std::uint64_t v, std::size_t n) {
  ASSERT_LE(at + n, b.size());
  for (std::size_t i = 0; i < n; ++i) b[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
}

/// Position just after the GGUF string `s` (its 8-byte length prefix included) in `b`.
std::size_t after_string(const Bytes& b, const std::string& s) {
  Bytes needle(8 + s.size());
  for (int i = 0; i < 8; ++i) needle[i] = static_cast<std::uint8_t>(s.size() >> (8 * i));
  std::memcpy(needle.data() + 8, s.data(), s.size());
  auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
  EXPECT_NE(it, b.end()) << "string '" << s << "' not found";
  return static_cast<std::size_t>(it - b.begin()) + needle.size();
}

std::vector<float> ramp(std::size_t n, float scale) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = scale * static_cast<float>(static_cast<int>((i * 37) % 101) - 50);
  }
  return x;
}

Bytes quantized(GGMLType t, const std::vector<float>& x) {
  Bytes q(gg::row_bytes(t, x.size()));
  gg::quantize(t, x.data(), q.data(), x.size());
  return q;
}

/// A small valid file: a few keys and three tensors (the last one ends exactly at the end of the
/// file, so that every truncation breaks something).
void write_sample(const std::string& p) {
  gg::Writer w;
  w.set("general.architecture", "llama");
  w.set("general.name", "sample model");
  w.set("test.u32", std::uint32_t{7});
  w.set("test.flag", true);
  w.set("test.tokens", std::vector<std::string>{"<s>", "</s>", "hello"});
  w.set("dup.a", 1.5f);
  w.set("dup.b", 2.5f);
  w.set_alignment(64);
  w.add_tensor("ta", {64, 2}, GGMLType::Q8_0, quantized(GGMLType::Q8_0, ramp(128, 0.01f)));
  w.add_tensor("tb", {8}, GGMLType::F32, quantized(GGMLType::F32, ramp(8, 1.0f)));
  w.add_tensor("norm", {16}, GGMLType::F32, quantized(GGMLType::F32, ramp(16, 0.5f)));
  w.write(p);
}

/// Expects File::open(p) to throw sparsim::Error whose message contains each of `words`.
void expect_open_error(const std::string& p, const std::vector<std::string>& words) {
  try {
    gg::File f = gg::File::open(p);
    ADD_FAILURE() << "opening the corrupted file succeeded; expected: " << words.front();
  } catch (const sparsim::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(p), std::string::npos) << "message does not name the file: " << m;
    for (const auto& w : words) {
      EXPECT_NE(m.find(w), std::string::npos) << "missing '" << w << "' in: " << m;
    }
  }
}

}  // namespace

TEST_F(GgufTest, WriterReaderRoundTripOfEveryMetadataType) {
  std::vector<gg::KeyValue> kvs = {
      {"general.architecture", Value::string("llama")},
      {"t.u8", Value::u8(255)},
      {"t.i8", Value::i8(-128)},
      {"t.u16", Value::u16(65535)},
      {"t.i16", Value::i16(-32768)},
      {"t.u32", Value::u32(4294967295u)},
      {"t.i32", Value::i32(std::numeric_limits<std::int32_t>::min())},
      {"t.u64", Value::u64(std::numeric_limits<std::uint64_t>::max())},
      {"t.i64", Value::i64(std::numeric_limits<std::int64_t>::min())},
      {"t.f32", Value::f32(3.14159f)},
      {"t.f64", Value::f64(-2.718281828459045)},
      {"t.bool", Value::boolean(true)},
      {"t.bool_false", Value::boolean(false)},
      {"t.string", Value::string("h\xc3\xa9llo \xe2\x82\xac")},
      {"t.empty_string", Value::string("")},
      {"t.arr_u8", Value::array_u8({0, 1, 255})},
      {"t.arr_i8", Value::array_i8({-128, 0, 127})},
      {"t.arr_u16", Value::array_u16({1, 65535})},
      {"t.arr_i16", Value::array_i16({-1, 32767})},
      {"t.arr_u32", Value::array_u32({7, 4294967295u})},
      {"t.arr_i32", Value::array_i32({-5, 0, 2147483647})},
      {"t.arr_u64", Value::array_u64({5, std::uint64_t{1} << 63})},
      {"t.arr_i64", Value::array_i64({-5, std::int64_t{1} << 62})},
      {"t.arr_f32", Value::array_f32({1.0f, -0.5f, 1e-30f})},
      {"t.arr_f64", Value::array_f64({1e300, -0.0})},
      {"t.arr_bool", Value::array_bool({true, false, true})},
      {"t.arr_string", Value::string_array({"a", "", "\xe2\x96\x81the"})},
      {"t.arr_empty", Value::array_f32({})},
      {"t.nested", Value::array_of_arrays({Value::array_i32({1, 2}), Value::string_array({"x"}),
                                           Value::array_of_arrays({Value::array_u8({9})})})},
  };
  gg::Writer w;
  for (const auto& kv : kvs) w.set(kv.key, kv.value);
  const auto data = quantized(GGMLType::F16, ramp(32, 0.25f));
  w.add_tensor("weight", {16, 2}, GGMLType::F16, data.data(), data.size());
  const std::string p = path("all_types.gguf");
  w.write(p);
  EXPECT_FALSE(fs::exists(p + ".tmp." + std::to_string(::getpid())));

  const gg::File f = gg::File::open(p);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.file_size(), fs::file_size(p));
  EXPECT_EQ(f.path(), p);
  ASSERT_EQ(f.metadata().size(), kvs.size());
  for (std::size_t i = 0; i < kvs.size(); ++i) {
    EXPECT_EQ(f.metadata()[i].key, kvs[i].key);  // order preserved
    EXPECT_TRUE(f.metadata()[i].value == kvs[i].value) << kvs[i].key;
    ASSERT_NE(f.find(kvs[i].key), nullptr);
    EXPECT_TRUE(*f.find(kvs[i].key) == kvs[i].value) << kvs[i].key;
  }
  EXPECT_EQ(f.find("absent"), nullptr);
  const Value* nested = f.find("t.nested");
  ASSERT_EQ(nested->array_size(), 3u);
  EXPECT_EQ(nested->array_type(), ValueType::ARRAY);
  EXPECT_EQ(nested->array_element(1).strings().at(0), "x");
  EXPECT_EQ(nested->array_element(2).array_element(0).array_element(0).as_uint(), 9u);

  ASSERT_EQ(f.tensors().size(), 1u);
  const gg::TensorInfo& t = f.tensors()[0];
  EXPECT_EQ(t.name, "weight");
  EXPECT_EQ(t.ne, (std::vector<std::uint64_t>{16, 2}));
  EXPECT_EQ(t.type, GGMLType::F16);
  EXPECT_EQ(t.n_elements(), 32u);
  EXPECT_EQ(t.nbytes, 64u);
  EXPECT_EQ(t.offset, 0u);
  ASSERT_NE(t.data, nullptr);
  EXPECT_EQ(std::memcmp(t.data, data.data(), data.size()), 0);
  EXPECT_EQ(f.find_tensor("weight"), &t);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

TEST_F(GgufTest, TypedAccessors) {
  gg::Writer w;
  w.set("a.u8", std::uint8_t{200});
  w.set("a.i16", std::int16_t{-3});
  w.set("a.i32", std::int32_t{42});
  w.set("a.u64", std::uint64_t{1} << 63);
  w.set("a.f32", 0.5f);
  w.set("a.f64", 1e-3);
  w.set("a.bool", false);
  w.set("a.str", "text");
  w.set("a.strs", std::vector<std::string>{"p", "q"});
  w.set("a.floats", std::vector<float>{0.25f, -1.0f});
  w.set("a.doubles", std::vector<double>{0.5, 2.0});
  w.set("a.ints", std::vector<std::int32_t>{3, -4});
  w.set("a.u64s", std::vector<std::uint64_t>{std::uint64_t{1} << 63});
  const std::string p = path("acc.gguf");
  w.write(p);
  const gg::File f = gg::File::open(p);

  EXPECT_EQ(f.get_uint("a.u8"), 200u);
  EXPECT_EQ(f.get_uint("a.i32"), 42u);  // any integer type
  EXPECT_EQ(f.get_uint("a.u64"), std::uint64_t{1} << 63);
  EXPECT_EQ(f.get_int("a.i16"), -3);
  EXPECT_EQ(f.get_float("a.f32"), 0.5);
  EXPECT_EQ(f.get_float("a.f64"), 1e-3);
  EXPECT_EQ(f.get_float("a.i32"), 42.0);  // integers are numbers too
  EXPECT_EQ(f.get_bool("a.bool"), false);
  EXPECT_EQ(f.get_string("a.str"), "text");
  EXPECT_EQ(f.get_string_array("a.strs"), (std::vector<std::string>{"p", "q"}));
  EXPECT_EQ(f.get_float_array("a.floats"), (std::vector<float>{0.25f, -1.0f}));
  EXPECT_EQ(f.get_float_array("a.doubles"), (std::vector<float>{0.5f, 2.0f}));
  EXPECT_EQ(f.get_float_array("a.ints"), (std::vector<float>{3.0f, -4.0f}));
  EXPECT_EQ(f.get_int_array("a.ints"), (std::vector<std::int64_t>{3, -4}));
  EXPECT_FALSE(f.get_uint("missing").has_value());
  EXPECT_FALSE(f.get_string_array("missing").has_value());
  EXPECT_EQ(f.require_uint("a.u8"), 200u);
  EXPECT_EQ(f.require_string("a.str"), "text");

  auto expect_msg = [](const std::function<void()>& fn, const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << "expected an error containing: " << what;
    } catch (const sparsim::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { f.require_uint("nope"); }, "missing metadata key 'nope'");
  expect_msg([&] { f.require_string_array("nope"); }, "missing metadata key 'nope'");
  expect_msg([&] { f.get_uint("a.str"); }, "metadata key 'a.str' has type string, expected");
  expect_msg([&] { f.require_string("a.u8"); },
             "metadata key 'a.u8' has type uint8, expected string");
  expect_msg([&] { f.get_uint("a.i16"); }, "'a.i16' is negative");
  expect_msg([&] { f.get_int("a.u64"); }, "'a.u64'");
  expect_msg([&] { f.get_bool("a.i32"); }, "has type int32, expected bool");
  expect_msg([&] { f.get_float("a.str"); }, "'a.str' has type string");
  expect_msg([&] { f.get_string_array("a.ints"); },
             "has type array[int32], expected array[string]");
  expect_msg([&] { f.get_float_array("a.strs"); }, "'a.strs' has type array[string]");
  expect_msg([&] { f.get_int_array("a.floats"); }, "'a.floats' has type array[float32]");
  expect_msg([&] { f.get_int_array("a.u64s"); }, "'a.u64s'");
  expect_msg([&] { f.require_tensor("missing.weight"); }, "missing tensor 'missing.weight'");
}

TEST_F(GgufTest, TensorsAlignmentMoveAndRelease) {
  const std::string p = path("sample.gguf");
  write_sample(p);
  gg::File f = gg::File::open(p);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.get_uint("general.alignment"), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  ASSERT_EQ(f.tensors().size(), 3u);
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
    EXPECT_EQ(t.data - f.tensors()[0].data,
              static_cast<std::ptrdiff_t>(t.offset - f.tensors()[0].offset))
        << t.name;
  }
  const auto expect_ta = ramp(128, 0.01f);
  const gg::TensorInfo* ta = f.find_tensor("ta");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->nbytes, 4u * 34u);
  EXPECT_EQ(ta->n_rows(), 2u);
  EXPECT_EQ(ta->shape_string(), "[64, 2]");
  std::vector<float> y(128);
  gg::dequantize(ta->type, ta->data, y.data(), y.size());
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expect_ta[i], 0.002f) << i;

  // Moving keeps the mapping (and the tensor pointers) alive.
  const std::uint8_t* data_before = ta->data;
  gg::File g = std::move(f);
  const gg::TensorInfo* ta2 = g.find_tensor("ta");
  ASSERT_NE(ta2, nullptr);
  EXPECT_EQ(ta2->data, data_before);
  gg::File h = gg::File::open(p);
  h = std::move(g);
  EXPECT_EQ(h.find_tensor("ta")->data, data_before);

  // After release the pages are dropped; reading again refaults the same bytes from the file.
  const gg::TensorInfo& norm = h.require_tensor("norm");
  std::vector<float> before(16), after(16);
  gg::dequantize(norm.type, norm.data, before.data(), 16);
  for (const auto& t : h.tensors()) h.release(t);
  gg::dequantize(norm.type, norm.data, after.data(), 16);
  EXPECT_EQ(before, after);
  EXPECT_EQ(before, ramp(16, 0.5f));
  gg::TensorInfo foreign = norm;
  foreign.data = reinterpret_cast<const std::uint8_t*>(before.data());
  EXPECT_THROW(h.release(foreign), sparsim::Error);
}

TEST_F(GgufTest, UnsupportedTensorTypeOpensButIsReportedByName) {
  gg::Writer w;
  Bytes iq(66, 0);
  w.add_tensor("blk.0.ffn_up.weight", {256}, GGMLType::IQ2_XXS, iq.data(), iq.size());
  const std::string p = path("iq.gguf");
  w.write(p);
  const gg::File f = gg::File::open(p);
  const gg::TensorInfo& t = f.require_tensor("blk.0.ffn_up.weight");
  EXPECT_EQ(t.nbytes, 66u);
  try {
    gg::require_supported(t.type, "tensor '" + t.name + "'");
    FAIL();
  } catch (const sparsim::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported tensor type IQ2_XXS (16)"),
              std::string::npos);
  }
}

TEST_F(GgufTest, Version2IsAccepted) {
  const std::string p = path("v2.gguf");
  write_sample(p);
  Bytes b = read_all(p);
  put_le(b, 4, 2, 4);
  write_all(p, b);
  const gg::File f = gg::File::open(p);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.tensors().size(), 3u);
}

TEST_F(GgufTest, WriterRejectsBadInput) {
  gg::Writer w;
  w.set("k", std::uint32_t{1});
  EXPECT_THROW(w.set("k", std::uint32_t{2}), sparsim::Error);
  EXPECT_THROW(w.set("", "x"), sparsim::Error);
  EXPECT_THROW(w.set_alignment(0), sparsim::Error);
  EXPECT_THROW(w.set_alignment(48), sparsim::Error);
  EXPECT_THROW(w.set("general.alignment", std::uint64_t{64}), sparsim::Error);  // must be uint32
  w.set_alignment(128);
  w.set_alignment(256);  // updates the existing entry
  EXPECT_EQ(w.alignment(), 256u);
  ASSERT_EQ(w.metadata().size(), 2u);
  EXPECT_EQ(w.metadata()[1].value.as_uint(), 256u);
  const Bytes q(34);
  EXPECT_THROW(w.add_tensor("t", {32}, GGMLType::Q8_0, q.data(), 33), sparsim::Error);
  EXPECT_THROW(w.add_tensor("t", {16}, GGMLType::Q8_0, q.data(), 34), sparsim::Error);
  EXPECT_THROW(w.add_tensor("t", {32, 0}, GGMLType::Q8_0, q.data(), 34), sparsim::Error);
  EXPECT_THROW(w.add_tensor("t", {32, 1, 1, 1, 1}, GGMLType::Q8_0, q.data(), 34), sparsim::Error);
  EXPECT_THROW(w.add_tensor("t", {32}, static_cast<GGMLType>(999), q.data(), 34), sparsim::Error);
  w.add_tensor("t", {32}, GGMLType::Q8_0, q.data(), 34);
  EXPECT_THROW(w.add_tensor("t", {32}, GGMLType::Q8_0, q.data(), 34), sparsim::Error);

  // A failed write leaves neither the target nor a temporary file behind.
  const std::string bad = path("no/such/dir/x.gguf");
  EXPECT_THROW(w.write(bad), sparsim::Error);
  EXPECT_FALSE(fs::exists(bad));
  const std::string ok = path("ok.gguf");
  w.write(ok);
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
  const gg::File f = gg::File::open(ok);
  EXPECT_EQ(f.alignment(), 256u);
  EXPECT_EQ(f.data_offset() % 256, 0u);
}

TEST_F(GgufTest, MissingOrTinyFiles) {
  expect_open_error(path("does-not-exist.gguf"), {"cannot open"});
  const std::string p = path("tiny.gguf");
  write_all(p, {});
  expect_open_error(p, {"too small"});
  write_all(p, {'G', 'G', 'U'});
  expect_open_error(p, {"too small"});
  write_all(p, {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0});
  expect_open_error(p, {"too small"});
}

TEST_F(GgufTest, EveryTruncationIsRejected) {
  const std::string good = path("good.gguf");
  write_sample(good);
  const Bytes b = read_all(good);
  std::uint64_t end = 0;
  {
    const gg::File f = gg::File::open(good);
    for (const auto& t : f.tensors()) end = std::max(end, f.data_offset() + t.offset + t.nbytes);
  }
  ASSERT_EQ(end, b.size());
  const std::string p = path("cut.gguf");
  for (std::size_t len = 0; len < b.size(); ++len) {
    write_all(p, Bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(len)));
    try {
      gg::File f = gg::File::open(p);
      ADD_FAILURE() << "truncation to " << len << " bytes was accepted";
    } catch (const sparsim::Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
}

TEST_F(GgufTest, CorruptionsAreReportedPrecisely) {
  const std::string good = path("good.gguf");
  write_sample(good);
  const Bytes base = read_all(good);
  const std::string p = path("bad.gguf");
  auto corrupt = [&](const std::function<void(Bytes&)>& edit,
                     const std::vector<std::string>& words) {
    Bytes b = base;
    edit(b);
    write_all(p, b);
    expect_open_error(p, words);
  };
  const std::size_t tb_info = after_string(base, "tb");      // n_dims of tensor "tb"
  const std::size_t ta_info = after_string(base, "ta");      // n_dims of tensor "ta"
  const std::size_t norm_info = after_string(base, "norm");  // n_dims of tensor "norm"
  // Layout after a 1-D tensor name: n_dims u32, ne[0] u64, type u32, offset u64.
  const std::size_t tb_type = tb_info + 4 + 8, tb_offset = tb_type + 4;
  const std::size_t norm_type = norm_info + 4 + 8, norm_offset = norm_type + 4;

  corrupt([](Bytes& b) { b[0] = 'X'; }, {"magic"});
  corrupt([](Bytes& b) { put_le(b, 4, 1, 4); }, {"version 1"});
  corrupt([](Bytes& b) { put_le(b, 4, 99, 4); }, {"version 99"});
  corrupt([](Bytes& b) { put_le(b, 16, std::uint64_t{1} << 60, 8); }, {"kv count"});
  corrupt([](Bytes& b) { put_le(b, 8, ~std::uint64_t{0}, 8); }, {"tensor count"});
  // Value string of general.name: type u32, then its length.
  corrupt([&](Bytes& b) { put_le(b, after_string(base, "general.name") + 4, b.size() * 2, 8); },
          {"general.name", "length", "past the end"});
  corrupt(
      [&](Bytes& b) { put_le(b, after_string(base, "general.name") + 4, ~std::uint64_t{0}, 8); },
      {"general.name"});
  // Length of the key string itself.
  corrupt([&](Bytes& b) { put_le(b, after_string(base, "test.u32") - 8 - 8, 1ull << 40, 8); },
          {"key of metadata entry #2"});
  corrupt([&](Bytes& b) { put_le(b, after_string(base, "test.u32"), 13, 4); },
          {"test.u32", "unknown value type 13"});
  corrupt([&](Bytes& b) { b[after_string(base, "test.flag") + 4] = 2; },
          {"test.flag", "invalid bool"});
  // Array of strings: element type u32, length u64.
  corrupt([&](Bytes& b) { put_le(b, after_string(base, "test.tokens") + 4 + 4, 1ull << 50, 8); },
          {"test.tokens", "past the end"});
  corrupt([&](Bytes& b) { put_le(b, after_string(base, "test.tokens") + 4, 77, 4); },
          {"test.tokens", "unknown array element type 77"});
  corrupt([&](Bytes& b) { b[after_string(base, "dup.b") - 1] = 'a'; },
          {"duplicate metadata key 'dup.a'"});
  corrupt([&](Bytes& b) { put_le(b, after_string(base, "general.alignment") + 4, 48, 4); },
          {"general.alignment", "power of two"});
  corrupt([&](Bytes& b) { put_le(b, after_string(base, "general.alignment") + 4, 0, 4); },
          {"general.alignment", "power of two"});
  corrupt([&](Bytes& b) { put_le(b, after_string(base, "general.alignment"), 6, 4); },
          {"general.alignment", "float32", "expected an unsigned integer"});
  corrupt([&](Bytes& b) { put_le(b, norm_type, 999, 4); }, {"norm", "unknown tensor type 999"});
  corrupt([&](Bytes& b) { put_le(b, norm_offset, 0, 8); }, {"overlap"});
  corrupt([&](Bytes& b) { b[tb_info - 1] = 'a'; }, {"duplicate tensor name 'ta'"});
  corrupt(
      [&](Bytes& b) {
        std::uint64_t off = 0;
        for (int i = 0; i < 8; ++i) off |= static_cast<std::uint64_t>(b[tb_offset + i]) << (8 * i);
        put_le(b, tb_offset, off + 4, 8);
      },
      {"tb", "offset", "not a multiple of the alignment 64"});
  corrupt([&](Bytes& b) { put_le(b, norm_offset, std::uint64_t{1} << 20, 8); },
          {"norm", "past the end"});
  corrupt([&](Bytes& b) { put_le(b, norm_offset, ~std::uint64_t{63}, 8); },
          {"norm", "past the end"});
  corrupt([&](Bytes& b) { put_le(b, tb_info + 4, 0, 8); }, {"tb", "zero"});
  corrupt([&](Bytes& b) { put_le(b, tb_info, 0, 4); }, {"tb", "dimensions"});
  corrupt([&](Bytes& b) { put_le(b, ta_info, 5, 4); }, {"ta", "dimensions"});
  corrupt([&](Bytes& b) { put_le(b, ta_info + 4, 48, 8); }, {"ta", "block size 32"});
  corrupt([&](Bytes& b) { put_le(b, ta_info + 4 + 8, std::uint64_t{1} << 62, 8); },
          {"ta", "elements"});
  corrupt([&](Bytes& b) { put_le(b, ta_info + 4 + 8, std::uint64_t{1} << 40, 8); },
          {"ta", "past the end"});
}
