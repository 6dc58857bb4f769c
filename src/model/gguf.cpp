#include "model/gguf.hpp"

#include "core/error.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

namespace sparsim::gguf {

namespace {

constexpr std::uint32_t kMagic = 0x46554747u;  // "GGUF" read as a little-endian uint32
constexpr std::uint32_t kMaxValueType = static_cast<std::uint32_t>(ValueType::FLOAT64);
constexpr std::uint64_t kMaxKeyLength = 65535;
constexpr std::uint64_t kMaxAlignment = std::uint64_t{1} << 30;
constexpr std::uint32_t kMaxDims = 4;
// Smallest encodings, used to bound counts by the bytes left before allocating anything.
constexpr std::uint64_t kMinKvBytes = 8 + 4 + 1;  // key length, type, 1-byte value
constexpr std::uint64_t kMinTensorInfoBytes =
    8 + 4 + 8 + 4 + 8;  // name len, n_dims, ne, type, offset

std::uint64_t load_le(const std::uint8_t* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

bool is_power_of_two(std::uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

/// Decodes one fixed-size scalar of type `t` from `p`.
Value decode_scalar(ValueType t, const std::uint8_t* p) {
  switch (t) {
    case ValueType::UINT8:
      return Value::u8(p[0]);
    case ValueType::INT8:
      return Value::i8(static_cast<std::int8_t>(p[0]));
    case ValueType::UINT16:
      return Value::u16(static_cast<std::uint16_t>(load_le(p, 2)));
    case ValueType::INT16:
      return Value::i16(static_cast<std::int16_t>(load_le(p, 2)));
    case ValueType::UINT32:
      return Value::u32(static_cast<std::uint32_t>(load_le(p, 4)));
    case ValueType::INT32:
      return Value::i32(static_cast<std::int32_t>(load_le(p, 4)));
    case ValueType::UINT64:
      return Value::u64(load_le(p, 8));
    case ValueType::INT64:
      return Value::i64(static_cast<std::int64_t>(load_le(p, 8)));
    case ValueType::FLOAT32: {
      const auto u = static_cast<std::uint32_t>(load_le(p, 4));
      float f;
      std::memcpy(&f, &u, 4);
      return Value::f32(f);
    }
    case ValueType::FLOAT64: {
      const std::uint64_t u = load_le(p, 8);
      double f;
      std::memcpy(&f, &u, 8);
      return Value::f64(f);
    }
    case ValueType::BOOL:
      return Value::boolean(p[0] != 0);
    default:
      break;
  }
  fail("decode_scalar: type {} is not a fixed-size scalar", to_string(t));
}

std::string type_name(const Value& v) {
  if (v.type() == ValueType::ARRAY) return "array[" + to_string(v.array_type()) + "]";
  return to_string(v.type());
}

template <class T>
std::vector<std::uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ValueType / Value

std::string to_string(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
      return "uint8";
    case ValueType::INT8:
      return "int8";
    case ValueType::UINT16:
      return "uint16";
    case ValueType::INT16:
      return "int16";
    case ValueType::UINT32:
      return "uint32";
    case ValueType::INT32:
      return "int32";
    case ValueType::FLOAT32:
      return "float32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::UINT64:
      return "uint64";
    case ValueType::INT64:
      return "int64";
    case ValueType::FLOAT64:
      return "float64";
  }
  return "unknown(" + std::to_string(static_cast<std::uint32_t>(t)) + ")";
}

bool is_integer(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::UINT16:
    case ValueType::INT16:
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::UINT64:
    case ValueType::INT64:
      return true;
    default:
      return false;
  }
}

bool is_float(ValueType t) {
  return t == ValueType::FLOAT32 || t == ValueType::FLOAT64;
}

std::size_t value_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
      return 8;
    default:
      return 0;
  }
}

Value Value::from_uint(ValueType t, std::uint64_t v) {
  Value r;
  r.type_ = t;
  r.u_ = v;
  return r;
}
Value Value::from_int(ValueType t, std::int64_t v) {
  Value r;
  r.type_ = t;
  r.i_ = v;
  return r;
}
Value Value::f32(float v) {
  Value r;
  r.type_ = ValueType::FLOAT32;
  r.f_ = static_cast<double>(v);
  return r;
}
Value Value::f64(double v) {
  Value r;
  r.type_ = ValueType::FLOAT64;
  r.f_ = v;
  return r;
}
Value Value::boolean(bool v) {
  Value r;
  r.type_ = ValueType::BOOL;
  r.u_ = v ? 1 : 0;
  return r;
}
Value Value::string(std::string v) {
  Value r;
  r.type_ = ValueType::STRING;
  r.str_ = std::move(v);
  return r;
}
Value Value::packed_array(ValueType elem, std::vector<std::uint8_t> bytes) {
  const std::size_t sz = value_size(elem);
  require(sz != 0, "packed_array: element type {} is not a fixed-size scalar", to_string(elem));
  require(bytes.size() % sz == 0, "packed_array: {} bytes are not a whole number of {} elements",
          bytes.size(), to_string(elem));
  if (elem == ValueType::BOOL) {
    for (std::uint8_t b : bytes) require(b <= 1, "packed_array: invalid bool value {}", b);
  }
  Value r;
  r.type_ = ValueType::ARRAY;
  r.elem_ = elem;
  r.packed_ = std::move(bytes);
  return r;
}
Value Value::string_array(std::vector<std::string> v) {
  Value r;
  r.type_ = ValueType::ARRAY;
  r.elem_ = ValueType::STRING;
  r.strings_ = std::move(v);
  return r;
}
Value Value::array_of_arrays(std::vector<Value> v) {
  for (const auto& e : v) {
    require(e.type() == ValueType::ARRAY, "array_of_arrays: element of type {} is not an array",
            to_string(e.type()));
  }
  Value r;
  r.type_ = ValueType::ARRAY;
  r.elem_ = ValueType::ARRAY;
  r.arrays_ = std::move(v);
  return r;
}
Value Value::array_u8(const std::vector<std::uint8_t>& v) {
  return packed_array(ValueType::UINT8, v);
}
Value Value::array_i8(const std::vector<std::int8_t>& v) {
  return packed_array(ValueType::INT8, bytes_of(v));
}
Value Value::array_u16(const std::vector<std::uint16_t>& v) {
  return packed_array(ValueType::UINT16, bytes_of(v));
}
Value Value::array_i16(const std::vector<std::int16_t>& v) {
  return packed_array(ValueType::INT16, bytes_of(v));
}
Value Value::array_u32(const std::vector<std::uint32_t>& v) {
  return packed_array(ValueType::UINT32, bytes_of(v));
}
Value Value::array_i32(const std::vector<std::int32_t>& v) {
  return packed_array(ValueType::INT32, bytes_of(v));
}
Value Value::array_u64(const std::vector<std::uint64_t>& v) {
  return packed_array(ValueType::UINT64, bytes_of(v));
}
Value Value::array_i64(const std::vector<std::int64_t>& v) {
  return packed_array(ValueType::INT64, bytes_of(v));
}
Value Value::array_f32(const std::vector<float>& v) {
  return packed_array(ValueType::FLOAT32, bytes_of(v));
}
Value Value::array_f64(const std::vector<double>& v) {
  return packed_array(ValueType::FLOAT64, bytes_of(v));
}
Value Value::array_bool(const std::vector<bool>& v) {
  std::vector<std::uint8_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = v[i] ? 1 : 0;
  return packed_array(ValueType::BOOL, std::move(b));
}

std::optional<std::uint64_t> Value::as_uint() const {
  if (!is_integer(type_)) return std::nullopt;
  switch (type_) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64:
      return u_;
    default:
      break;
  }
  if (i_ < 0) return std::nullopt;
  return static_cast<std::uint64_t>(i_);
}

std::optional<std::int64_t> Value::as_int() const {
  if (!is_integer(type_)) return std::nullopt;
  switch (type_) {
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64:
      return i_;
    default:
      break;
  }
  if (u_ > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return std::nullopt;
  }
  return static_cast<std::int64_t>(u_);
}

std::optional<double> Value::as_float() const {
  if (is_float(type_)) return f_;
  if (auto i = as_int()) return static_cast<double>(*i);
  if (auto u = as_uint()) return static_cast<double>(*u);
  return std::nullopt;
}

std::optional<bool> Value::as_bool() const {
  if (type_ != ValueType::BOOL) return std::nullopt;
  return u_ != 0;
}

std::size_t Value::array_size() const {
  if (type_ != ValueType::ARRAY) return 0;
  if (elem_ == ValueType::STRING) return strings_.size();
  if (elem_ == ValueType::ARRAY) return arrays_.size();
  return packed_.size() / value_size(elem_);
}

Value Value::array_element(std::size_t i) const {
  require(type_ == ValueType::ARRAY, "array_element: value of type {} is not an array",
          to_string(type_));
  require(i < array_size(), "array_element: index {} out of range (size {})", i, array_size());
  if (elem_ == ValueType::STRING) return Value::string(strings_[i]);
  if (elem_ == ValueType::ARRAY) return arrays_[i];
  return decode_scalar(elem_, packed_.data() + i * value_size(elem_));
}

std::string Value::describe() const {
  switch (type_) {
    case ValueType::STRING: {
      std::string s = str_.size() > 60 ? str_.substr(0, 57) + "..." : str_;
      return "string '" + s + "'";
    }
    case ValueType::ARRAY:
      return "array[" + to_string(elem_) + "; " + std::to_string(array_size()) + "]";
    case ValueType::BOOL:
      return u_ ? "bool true" : "bool false";
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
      return to_string(type_) + " " + fmt::format("{}", f_);
    default:
      break;
  }
  if (auto i = as_int()) return to_string(type_) + " " + std::to_string(*i);
  return to_string(type_) + " " + std::to_string(u_);
}

bool Value::operator==(const Value& o) const {
  if (type_ != o.type_) return false;
  switch (type_) {
    case ValueType::STRING:
      return str_ == o.str_;
    case ValueType::ARRAY:
      return elem_ == o.elem_ && packed_ == o.packed_ && strings_ == o.strings_ &&
             arrays_ == o.arrays_;
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
      return std::memcmp(&f_, &o.f_, sizeof f_) == 0;
    default:
      return u_ == o.u_ && i_ == o.i_;
  }
}

std::uint64_t TensorInfo::n_elements() const {
  std::uint64_t n = 1;
  for (std::uint64_t d : ne) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < ne.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "]";
}

// ---------------------------------------------------------------------------------------------
// Parser

class Parser {
 public:
  Parser(File& f, const std::uint8_t* base) : f_(f), base_(base), size_(f.size_) {}

  void parse();

 private:
  template <class... Args>
  [[noreturn]] void error_at(std::uint64_t at, fmt::format_string<Args...> fm, Args&&... args) {
    throw Error(fmt::format("{}: at byte {}: {}", f_.path_, at,
                            fmt::format(fm, std::forward<Args>(args)...)));
  }
  std::uint64_t left() const { return size_ - pos_; }
  void need(std::uint64_t n, const std::string& what) {
    if (n > left()) {
      error_at(pos_, "unexpected end of file reading {} (needs {} bytes, {} left)", what, n,
               left());
    }
  }
  std::uint64_t read_le(std::size_t n, const std::string& what) {
    need(n, what);
    const std::uint64_t v = load_le(base_ + pos_, n);
    pos_ += n;
    return v;
  }
  std::uint32_t u32(const std::string& what) {
    return static_cast<std::uint32_t>(read_le(4, what));
  }
  std::uint64_t u64(const std::string& what) { return read_le(8, what); }
  std::string read_string(const std::string& what) {
    const std::uint64_t at = pos_;
    const std::uint64_t len = u64("length of " + what);
    if (len > left()) {
      error_at(at, "{} has length {}, which runs past the end of the file ({} bytes left)", what,
               len, left());
    }
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<std::size_t>(len));
    pos_ += len;
    return s;
  }
  Value read_value(ValueType t, const std::string& what, int depth);
  void parse_alignment();
  void check_tensors();

  File& f_;
  const std::uint8_t* base_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
  std::vector<std::uint64_t> tensor_info_pos_;
};

Value Parser::read_value(ValueType t, const std::string& what, int depth) {
  const std::uint64_t at = pos_;
  if (t == ValueType::STRING) return Value::string(read_string(what));
  if (t == ValueType::BOOL) {
    const auto b = static_cast<std::uint8_t>(read_le(1, what));
    if (b > 1) error_at(at, "{}: invalid bool value {} (must be 0 or 1)", what, b);
    return Value::boolean(b != 0);
  }
  if (t != ValueType::ARRAY) {
    const std::size_t sz = value_size(t);
    need(sz, what);
    Value v = decode_scalar(t, base_ + pos_);
    pos_ += sz;
    return v;
  }
  if (depth >= kMaxArrayDepth) {
    error_at(at, "{}: arrays nested deeper than {} levels", what, kMaxArrayDepth);
  }
  const std::uint32_t et = u32("element type of " + what);
  if (et > kMaxValueType) error_at(at, "{}: unknown array element type {}", what, et);
  const auto elem = static_cast<ValueType>(et);
  const std::uint64_t len_at = pos_;
  const std::uint64_t len = u64("length of " + what);
  const std::uint64_t min_elem = elem == ValueType::STRING  ? 8
                                 : elem == ValueType::ARRAY ? 12
                                                            : value_size(elem);
  if (len > left() / min_elem) {
    error_at(len_at, "{}: array of {} {} elements runs past the end of the file ({} bytes left)",
             what, len, to_string(elem), left());
  }
  const auto n = static_cast<std::size_t>(len);
  if (elem == ValueType::STRING) {
    std::vector<std::string> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      v.push_back(read_string(fmt::format("{} element {}", what, i)));
    }
    return Value::string_array(std::move(v));
  }
  if (elem == ValueType::ARRAY) {
    std::vector<Value> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      v.push_back(read_value(ValueType::ARRAY, fmt::format("{} element {}", what, i), depth + 1));
    }
    return Value::array_of_arrays(std::move(v));
  }
  const std::uint64_t nbytes = len * min_elem;  // bounded by left() above
  std::vector<std::uint8_t> bytes(base_ + pos_, base_ + pos_ + nbytes);
  if (elem == ValueType::BOOL) {
    for (std::size_t i = 0; i < n; ++i) {
      if (bytes[i] > 1) {
        error_at(pos_ + i, "{} element {}: invalid bool value {} (must be 0 or 1)", what, i,
                 bytes[i]);
      }
    }
  }
  pos_ += nbytes;
  return Value::packed_array(elem, std::move(bytes));
}

void Parser::parse_alignment() {
  const Value* v = f_.find("general.alignment");
  if (!v) return;
  const auto a = v->as_uint();
  if (!a) {
    fail(
        "{}: metadata key 'general.alignment' has type {} (value {}), expected an unsigned "
        "integer",
        f_.path_, type_name(*v), v->describe());
  }
  if (!is_power_of_two(*a) || *a > kMaxAlignment) {
    fail(
        "{}: metadata key 'general.alignment' is {}; it must be a nonzero power of two no "
        "larger than {}",
        f_.path_, *a, kMaxAlignment);
  }
  f_.alignment_ = *a;
}

void Parser::parse() {
  const std::string& path = f_.path_;
  if (size_ < 4) fail("{}: file too small ({} bytes) to be a GGUF file", path, size_);
  const std::uint32_t magic = u32("magic");
  if (magic != kMagic) {
    fail("{}: bad magic 0x{:08x} at byte 0: not a GGUF file (expected the bytes 'GGUF')", path,
         magic);
  }
  if (size_ < 8) fail("{}: file too small ({} bytes) to hold the GGUF version", path, size_);
  f_.version_ = u32("version");
  if (f_.version_ == 1) {
    fail(
        "{}: GGUF version 1 is not supported (it uses 32-bit counts); convert the file to "
        "version 3",
        path);
  }
  if (f_.version_ == 0x02000000u || f_.version_ == 0x03000000u) {
    fail(
        "{}: big-endian GGUF file (version field reads {}); only little-endian files are "
        "supported",
        path, f_.version_);
  }
  if (f_.version_ != 2 && f_.version_ != 3) {
    fail("{}: unsupported GGUF version {} (supported: 2, 3)", path, f_.version_);
  }
  if (size_ < 24) fail("{}: file too small ({} bytes) to hold the GGUF header", path, size_);
  const std::uint64_t n_tensors = u64("tensor count");
  const std::uint64_t n_kv = u64("metadata kv count");
  if (n_kv > left() / kMinKvBytes) {
    error_at(16,
             "metadata kv count {} is impossible: the remaining {} bytes cannot hold that many "
             "entries (truncated or corrupt file)",
             n_kv, left());
  }
  if (n_tensors > left() / kMinTensorInfoBytes) {
    error_at(8,
             "tensor count {} is impossible: the remaining {} bytes cannot hold that many "
             "tensor infos (truncated or corrupt file)",
             n_tensors, left());
  }

  f_.metadata_.reserve(static_cast<std::size_t>(n_kv));
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::uint64_t at = pos_;
    std::string key = read_string(fmt::format("key of metadata entry #{}", i));
    if (key.size() > kMaxKeyLength) {
      error_at(at, "key of metadata entry #{} is {} bytes long (at most {} allowed)", i, key.size(),
               kMaxKeyLength);
    }
    if (f_.key_index_.count(key)) error_at(at, "duplicate metadata key '{}'", key);
    const std::string what = fmt::format("metadata key '{}'", key);
    const std::uint64_t type_at = pos_;
    const std::uint32_t t = u32("value type of " + what);
    if (t > kMaxValueType) error_at(type_at, "{}: unknown value type {}", what, t);
    Value v = read_value(static_cast<ValueType>(t), what, 0);
    f_.key_index_.emplace(key, f_.metadata_.size());
    f_.metadata_.push_back(KeyValue{std::move(key), std::move(v)});
  }
  parse_alignment();

  f_.tensors_.reserve(static_cast<std::size_t>(n_tensors));
  tensor_info_pos_.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    const std::uint64_t at = pos_;
    TensorInfo t;
    t.name = read_string(fmt::format("name of tensor #{}", i));
    if (f_.tensor_index_.count(t.name)) error_at(at, "duplicate tensor name '{}'", t.name);
    const std::string what = fmt::format("tensor '{}'", t.name);
    const std::uint64_t dims_at = pos_;
    const std::uint32_t n_dims = u32("dimension count of " + what);
    if (n_dims == 0 || n_dims > kMaxDims) {
      error_at(dims_at, "{}: {} dimensions (must be 1 to {})", what, n_dims, kMaxDims);
    }
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t ne_at = pos_;
      const std::uint64_t ne = u64(fmt::format("ne[{}] of {}", d, what));
      if (ne == 0) error_at(ne_at, "{}: dimension ne[{}] is zero", what, d);
      t.ne.push_back(ne);
    }
    const std::uint64_t type_at = pos_;
    const std::uint32_t type = u32("type of " + what);
    if (!is_known_type(type)) error_at(type_at, "{}: unknown tensor type {}", what, type);
    t.type = static_cast<GGMLType>(type);
    t.offset = u64("data offset of " + what);
    f_.tensor_index_.emplace(t.name, f_.tensors_.size());
    f_.tensors_.push_back(std::move(t));
    tensor_info_pos_.push_back(at);
  }

  // The data section starts at the next multiple of the alignment.
  const std::uint64_t a = f_.alignment_;
  f_.data_offset_ = pos_ + (a - pos_ % a) % a;  // pos_ <= size_, a <= 2^30: no overflow
  check_tensors();
}

void Parser::check_tensors() {
  const std::string& path = f_.path_;
  const std::uint64_t max_elems =
      static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (std::size_t i = 0; i < f_.tensors_.size(); ++i) {
    TensorInfo& t = f_.tensors_[i];
    const std::uint64_t at = tensor_info_pos_[i];
    std::uint64_t n = 1;
    for (std::uint64_t d : t.ne) {
      if (n > max_elems / d) {
        error_at(at, "tensor '{}': shape {} has more than 2^63-1 elements", t.name,
                 t.shape_string());
      }
      n *= d;
    }
    const std::size_t bs = block_size(t.type);
    if (t.ne[0] % bs != 0) {
      error_at(at, "tensor '{}': ne[0]={} is not a multiple of the {} block size {}", t.name,
               t.ne[0], to_string(t.type), bs);
    }
    const std::uint64_t rb = row_bytes(t.type, t.ne[0]);
    const std::uint64_t rows = n / t.ne[0];
    if (rows != 0 && rb > std::numeric_limits<std::uint64_t>::max() / rows) {
      error_at(at, "tensor '{}': byte size of shape {} overflows", t.name, t.shape_string());
    }
    t.nbytes = rb * rows;
    if (t.offset % f_.alignment_ != 0) {
      error_at(at, "tensor '{}': data offset {} is not a multiple of the alignment {}", t.name,
               t.offset, f_.alignment_);
    }
    const std::uint64_t data_size = f_.data_offset_ <= f_.size_ ? f_.size_ - f_.data_offset_ : 0;
    if (f_.data_offset_ > f_.size_ || t.offset > data_size || t.nbytes > data_size - t.offset) {
      fail(
          "{}: tensor '{}' ({} {}, {} bytes at data offset {}, file offset {}) extends past the "
          "end of the file ({} bytes)",
          path, t.name, to_string(t.type), t.shape_string(), t.nbytes, t.offset,
          f_.data_offset_ + t.offset, f_.size_);
    }
    t.data = base_ + f_.data_offset_ + t.offset;
  }
  // No two tensors may share bytes.
  std::vector<const TensorInfo*> order;
  order.reserve(f_.tensors_.size());
  for (const auto& t : f_.tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* x, const TensorInfo* y) { return x->offset < y->offset; });
  for (std::size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& p = *order[i - 1];
    const TensorInfo& q = *order[i];
    if (q.offset < p.offset + p.nbytes) {
      fail("{}: tensors '{}' (data offset {}, {} bytes) and '{}' (data offset {}) overlap", path,
           p.name, p.offset, p.nbytes, q.name, q.offset);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// File

File File::open(const std::string& path) {
  File f;
  f.path_ = path;
  f.map_ = MappedFile::open(path, "GGUF file", 4, "to be a GGUF file");
  f.size_ = f.map_.size();
  Parser(f, f.map_.data()).parse();
  return f;
}

File::File(File&& o) noexcept = default;
File& File::operator=(File&& o) noexcept = default;
File::~File() = default;

const Value* File::find(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

namespace {
[[noreturn]] void type_error(const std::string& path, std::string_view key, const Value& v,
                             const char* expected) {
  fail("{}: metadata key '{}' has type {}, expected {}", path, key, type_name(v), expected);
}
[[noreturn]] void missing(const std::string& path, std::string_view key) {
  fail("{}: missing metadata key '{}'", path, key);
}
template <class T>
T must(const std::optional<T>& v, const std::string& path, std::string_view key) {
  if (!v) missing(path, key);
  return *v;
}
}  // namespace

std::optional<std::uint64_t> File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (!is_integer(v->type())) type_error(path_, key, *v, "an unsigned integer");
  auto u = v->as_uint();
  if (!u)
    fail("{}: metadata key '{}' is negative ({}), expected an unsigned integer", path_, key,
         v->describe());
  return u;
}

std::optional<std::int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (!is_integer(v->type())) type_error(path_, key, *v, "an integer");
  auto i = v->as_int();
  if (!i)
    fail("{}: metadata key '{}' ({}) does not fit a signed 64-bit integer", path_, key,
         v->describe());
  return i;
}

std::optional<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  auto f = v->as_float();
  if (!f) type_error(path_, key, *v, "a number");
  return f;
}

std::optional<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (!v->as_string()) type_error(path_, key, *v, "string");
  return *v->as_string();
}

std::optional<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  auto b = v->as_bool();
  if (!b) type_error(path_, key, *v, "bool");
  return b;
}

std::optional<std::vector<std::string>> File::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type() != ValueType::ARRAY || v->array_type() != ValueType::STRING) {
    type_error(path_, key, *v, "array[string]");
  }
  return v->strings();
}

std::optional<std::vector<float>> File::get_float_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  const ValueType et = v->array_type();
  if (v->type() != ValueType::ARRAY || !(is_float(et) || is_integer(et))) {
    type_error(path_, key, *v, "an array of numbers");
  }
  const std::size_t n = v->array_size();
  const std::size_t sz = value_size(et);
  const std::uint8_t* p = v->packed().data();
  std::vector<float> out(n);
  if (et == ValueType::FLOAT32) {
    if (n) std::memcpy(out.data(), p, n * 4);
    return out;
  }
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(*decode_scalar(et, p + i * sz).as_float());
  }
  return out;
}

std::optional<std::vector<std::int64_t>> File::get_int_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  const ValueType et = v->array_type();
  if (v->type() != ValueType::ARRAY || !is_integer(et)) {
    type_error(path_, key, *v, "an array of integers");
  }
  const std::size_t n = v->array_size();
  const std::size_t sz = value_size(et);
  const std::uint8_t* p = v->packed().data();
  std::vector<std::int64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto x = decode_scalar(et, p + i * sz).as_int();
    if (!x)
      fail("{}: metadata key '{}' element {} does not fit a signed 64-bit integer", path_, key, i);
    out[i] = *x;
  }
  return out;
}

std::uint64_t File::require_uint(std::string_view key) const {
  return must(get_uint(key), path_, key);
}
std::int64_t File::require_int(std::string_view key) const {
  return must(get_int(key), path_, key);
}
double File::require_float(std::string_view key) const {
  return must(get_float(key), path_, key);
}
std::string File::require_string(std::string_view key) const {
  return must(get_string(key), path_, key);
}
bool File::require_bool(std::string_view key) const {
  return must(get_bool(key), path_, key);
}
std::vector<std::string> File::require_string_array(std::string_view key) const {
  return must(get_string_array(key), path_, key);
}
std::vector<float> File::require_float_array(std::string_view key) const {
  return must(get_float_array(key), path_, key);
}
std::vector<std::int64_t> File::require_int_array(std::string_view key) const {
  return must(get_int_array(key), path_, key);
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::require_tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) fail("{}: missing tensor '{}'", path_, name);
  return *t;
}

void File::release(const TensorInfo& t) const {
  map_.release(t.data, t.nbytes, "tensor '" + t.name + "'");
}

}  // namespace sparsim::gguf
