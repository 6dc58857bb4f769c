#pragma once
/// GGUF reader (format versions 2 and 3): metadata and tensor directory of a memory-mapped file.
///
/// Everything in the file is validated when it is opened; any inconsistency throws
/// sparsim::Error with the file name and the metadata key, tensor name or byte offset at fault.
/// Tensor data is not copied: TensorInfo::data points into the read-only private mapping, which
/// lives as long as the File object (moving a File keeps the pointers valid).
#include "core/mapped_file.hpp"
#include "model/quant.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sparsim::gguf {

/// Metadata value types (numbering of the GGUF format).
enum class ValueType : std::uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

/// "uint32", "string", "array", ...; "unknown(<id>)" for other ids.
std::string to_string(ValueType t);
bool is_integer(ValueType t);
bool is_float(ValueType t);
/// Bytes of one value of a fixed-size type (0 for STRING and ARRAY).
std::size_t value_size(ValueType t);

/// One metadata value. Arrays of numbers and bools keep their elements packed (little-endian,
/// value_size(array_type()) bytes each); arrays of strings and of arrays keep them as objects.
class Value {
 public:
  Value() = default;
  static Value u8(std::uint8_t v) { return from_uint(ValueType::UINT8, v); }
  static Value i8(std::int8_t v) { return from_int(ValueType::INT8, v); }
  static Value u16(std::uint16_t v) { return from_uint(ValueType::UINT16, v); }
  static Value i16(std::int16_t v) { return from_int(ValueType::INT16, v); }
  static Value u32(std::uint32_t v) { return from_uint(ValueType::UINT32, v); }
  static Value i32(std::int32_t v) { return from_int(ValueType::INT32, v); }
  static Value u64(std::uint64_t v) { return from_uint(ValueType::UINT64, v); }
  static Value i64(std::int64_t v) { return from_int(ValueType::INT64, v); }
  static Value f32(float v);
  static Value f64(double v);
  static Value boolean(bool v);
  static Value string(std::string v);
  /// Array of fixed-size elements given as raw little-endian bytes (count = bytes / size).
  static Value packed_array(ValueType elem, std::vector<std::uint8_t> bytes);
  static Value string_array(std::vector<std::string> v);
  /// Array of arrays (each element must be an ARRAY value).
  static Value array_of_arrays(std::vector<Value> v);
  /// Typed array helpers.
  static Value array_u8(const std::vector<std::uint8_t>& v);
  static Value array_i8(const std::vector<std::int8_t>& v);
  static Value array_u16(const std::vector<std::uint16_t>& v);
  static Value array_i16(const std::vector<std::int16_t>& v);
  static Value array_u32(const std::vector<std::uint32_t>& v);
  static Value array_i32(const std::vector<std::int32_t>& v);
  static Value array_u64(const std::vector<std::uint64_t>& v);
  static Value array_i64(const std::vector<std::int64_t>& v);
  static Value array_f32(const std::vector<float>& v);
  static Value array_f64(const std::vector<double>& v);
  static Value array_bool(const std::vector<bool>& v);

  ValueType type() const { return type_; }
  /// Integers of any width and sign; nullopt for other types or negative values.
  std::optional<std::uint64_t> as_uint() const;
  /// Integers of any width and sign; nullopt for other types or values above INT64_MAX.
  std::optional<std::int64_t> as_int() const;
  /// Floats and integers.
  std::optional<double> as_float() const;
  std::optional<bool> as_bool() const;
  const std::string* as_string() const { return type_ == ValueType::STRING ? &str_ : nullptr; }

  /// Arrays only (element type and count; UINT8 / 0 for non-arrays).
  ValueType array_type() const { return elem_; }
  std::size_t array_size() const;
  /// Element `i` of an array as a scalar Value (for fixed-size elements and strings) or the
  /// nested array. Throws when out of range or not an array.
  Value array_element(std::size_t i) const;
  const std::vector<std::string>& strings() const { return strings_; }
  const std::vector<Value>& arrays() const { return arrays_; }
  const std::vector<std::uint8_t>& packed() const { return packed_; }

  /// Short human-readable rendering ("uint32 42", "array[string; 3]", ...).
  std::string describe() const;
  /// Structural equality (type and content; floats compared bitwise).
  bool operator==(const Value& o) const;
  bool operator!=(const Value& o) const { return !(*this == o); }

 private:
  static Value from_uint(ValueType t, std::uint64_t v);
  static Value from_int(ValueType t, std::int64_t v);

  ValueType type_ = ValueType::UINT8;
  ValueType elem_ = ValueType::UINT8;  // arrays
  std::uint64_t u_ = 0;                // unsigned ints, bools
  std::int64_t i_ = 0;                 // signed ints
  double f_ = 0.0;                     // floats (a FLOAT32 is held exactly as double)
  std::string str_;
  std::vector<std::uint8_t> packed_;  // arrays of fixed-size elements
  std::vector<std::string> strings_;  // arrays of strings
  std::vector<Value> arrays_;         // arrays of arrays
  friend class Parser;
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  std::vector<std::uint64_t> ne;  // ne[0] is the contiguous (row) dimension; 1..4 entries
  GGMLType type = GGMLType::F32;
  std::uint64_t offset = 0;  // relative to the data section (File::data_offset())
  std::uint64_t nbytes = 0;
  const std::uint8_t* data = nullptr;  // into the mapping
  std::uint64_t n_elements() const;
  /// Rows of ne[0] elements (product of ne[1..]).
  std::uint64_t n_rows() const { return ne.empty() ? 0 : n_elements() / ne[0]; }
  /// "[896, 151936]"
  std::string shape_string() const;
};

class File {
 public:
  /// Maps and parses `path`. Throws sparsim::Error naming the file on any problem.
  static File open(const std::string& path);

  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }
  std::uint64_t file_size() const { return size_; }
  const std::string& path() const { return path_; }

  // ---- metadata
  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // The get_* accessors return nullopt when the key is absent and throw sparsim::Error
  // ("metadata key 'X' has type T, expected U") when it is present with an incompatible type.
  /// Any integer type (a negative value is an error).
  std::optional<std::uint64_t> get_uint(std::string_view key) const;
  /// Any integer type (a value above INT64_MAX is an error).
  std::optional<std::int64_t> get_int(std::string_view key) const;
  /// float32, float64 or any integer type.
  std::optional<double> get_float(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const;
  /// Arrays of float32, float64 or integers.
  std::optional<std::vector<float>> get_float_array(std::string_view key) const;
  /// Arrays of integers.
  std::optional<std::vector<std::int64_t>> get_int_array(std::string_view key) const;
  // The require_* variants throw "missing metadata key 'X'" when it is absent.
  std::uint64_t require_uint(std::string_view key) const;
  std::int64_t require_int(std::string_view key) const;
  double require_float(std::string_view key) const;
  std::string require_string(std::string_view key) const;
  bool require_bool(std::string_view key) const;
  std::vector<std::string> require_string_array(std::string_view key) const;
  std::vector<float> require_float_array(std::string_view key) const;
  std::vector<std::int64_t> require_int_array(std::string_view key) const;

  // ---- tensors
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  /// Like find_tensor, but throws "<file>: missing tensor 'X'".
  const TensorInfo& require_tensor(std::string_view name) const;

  /// Tells the kernel the tensor's pages are no longer needed (madvise MADV_DONTNEED), so that
  /// loading a model one tensor at a time keeps the resident set small. The mapping is private
  /// and never written, so the pages are just dropped; reading the tensor again later refaults
  /// them from the file. The range is widened to whole pages (a neighbour sharing a boundary
  /// page may be refaulted too, which is harmless).
  void release(const TensorInfo& t) const;

 private:
  File() = default;

  std::string path_;
  MappedFile map_;
  std::uint64_t size_ = 0;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<KeyValue> metadata_;
  std::map<std::string, std::size_t, std::less<>> key_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
  friend class Parser;
};

/// Default value of general.alignment.
inline constexpr std::uint64_t kDefaultAlignment = 32;
/// Nested arrays deeper than this are rejected (keeps parsing of hostile files bounded).
inline constexpr int kMaxArrayDepth = 8;

}  // namespace sparsim::gguf
