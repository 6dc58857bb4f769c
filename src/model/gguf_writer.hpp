#pragma once
/// Builds GGUF version 3 files (used to synthesise test models and fixtures).
///
/// Metadata keeps insertion order and keys must be unique; tensors are laid out in the order
/// they were added, each at a multiple of the alignment. write() goes through a temporary file
/// that is renamed over `path` only once everything has been written.
#include "model/gguf.hpp"
#include "model/quant.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsim::gguf {

class Writer {
 public:
  Writer() = default;

  /// Adds a metadata entry; throws sparsim::Error if `key` is already set or empty.
  /// Setting "general.alignment" is the same as set_alignment().
  void set(const std::string& key, Value v);
  void set(const std::string& key, std::uint8_t v) { set(key, Value::u8(v)); }
  void set(const std::string& key, std::int8_t v) { set(key, Value::i8(v)); }
  void set(const std::string& key, std::uint16_t v) { set(key, Value::u16(v)); }
  void set(const std::string& key, std::int16_t v) { set(key, Value::i16(v)); }
  void set(const std::string& key, std::uint32_t v) { set(key, Value::u32(v)); }
  void set(const std::string& key, std::int32_t v) { set(key, Value::i32(v)); }
  void set(const std::string& key, std::uint64_t v) { set(key, Value::u64(v)); }
  void set(const std::string& key, std::int64_t v) { set(key, Value::i64(v)); }
  void set(const std::string& key, float v) { set(key, Value::f32(v)); }
  void set(const std::string& key, double v) { set(key, Value::f64(v)); }
  void set(const std::string& key, bool v) { set(key, Value::boolean(v)); }
  void set(const std::string& key, const std::string& v) { set(key, Value::string(v)); }
  void set(const std::string& key, const char* v) { set(key, Value::string(v)); }
  void set(const std::string& key, const std::vector<std::string>& v) {
    set(key, Value::string_array(v));
  }
  void set(const std::string& key, const std::vector<float>& v) { set(key, Value::array_f32(v)); }
  void set(const std::string& key, const std::vector<double>& v) { set(key, Value::array_f64(v)); }
  void set(const std::string& key, const std::vector<std::int32_t>& v) {
    set(key, Value::array_i32(v));
  }
  void set(const std::string& key, const std::vector<std::uint32_t>& v) {
    set(key, Value::array_u32(v));
  }
  void set(const std::string& key, const std::vector<std::int64_t>& v) {
    set(key, Value::array_i64(v));
  }
  void set(const std::string& key, const std::vector<std::uint64_t>& v) {
    set(key, Value::array_u64(v));
  }
  void set(const std::string& key, const std::vector<bool>& v) { set(key, Value::array_bool(v)); }

  /// Sets general.alignment (uint32; a nonzero power of two, at most 2^30). Default 32. May be
  /// called before or after the key was set; the entry keeps its original position.
  void set_alignment(std::uint32_t alignment);
  std::uint64_t alignment() const { return alignment_; }

  /// Adds a tensor whose data (nbytes, which must equal what `type` and `ne` require) is copied.
  /// `ne` has 1 to 4 nonzero entries, ne[0] a multiple of the type's block size.
  void add_tensor(const std::string& name, const std::vector<std::uint64_t>& ne, GGMLType type,
                  const void* data, std::size_t nbytes);
  /// Same, taking ownership of the bytes.
  void add_tensor(const std::string& name, const std::vector<std::uint64_t>& ne, GGMLType type,
                  std::vector<std::uint8_t>&& data);

  /// Writes the file (to path + ".tmp.<pid>", then renamed over `path`). Throws sparsim::Error
  /// on any I/O failure, leaving no temporary file behind.
  void write(const std::string& path) const;

  const std::vector<KeyValue>& metadata() const { return metadata_; }

 private:
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> ne;
    GGMLType type;
    std::vector<std::uint8_t> data;
  };
  void check_tensor(const std::string& name, const std::vector<std::uint64_t>& ne, GGMLType type,
                    std::size_t nbytes) const;

  std::vector<KeyValue> metadata_;
  std::vector<Tensor> tensors_;
  std::uint64_t alignment_ = kDefaultAlignment;
};

}  // namespace sparsim::gguf
