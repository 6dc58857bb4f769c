#include "model/gguf_writer.hpp"

#include "core/error.hpp"
#include "core/interrupt.hpp"
#include "io/temp_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

namespace sparsim::gguf {

namespace {

constexpr std::uint32_t kVersion = 3;
constexpr const char* kAlignmentKey = "general.alignment";

class Buffer {
 public:
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  void le(std::uint64_t v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) bytes_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void u32(std::uint32_t v) { le(v, 4); }
  void u64(std::uint64_t v) { le(v, 8); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void pad_to(std::uint64_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
  }
  void value(const Value& v) {
    switch (v.type()) {
      case ValueType::UINT8:
      case ValueType::UINT16:
      case ValueType::UINT32:
      case ValueType::UINT64:
        le(*v.as_uint(), value_size(v.type()));
        return;
      case ValueType::INT8:
      case ValueType::INT16:
      case ValueType::INT32:
      case ValueType::INT64:
        le(static_cast<std::uint64_t>(*v.as_int()), value_size(v.type()));
        return;
      case ValueType::FLOAT32: {
        const float f = static_cast<float>(*v.as_float());
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        u32(u);
        return;
      }
      case ValueType::FLOAT64: {
        const double f = *v.as_float();
        std::uint64_t u;
        std::memcpy(&u, &f, 8);
        u64(u);
        return;
      }
      case ValueType::BOOL:
        le(*v.as_bool() ? 1 : 0, 1);
        return;
      case ValueType::STRING:
        str(*v.as_string());
        return;
      case ValueType::ARRAY:
        u32(static_cast<std::uint32_t>(v.array_type()));
        u64(v.array_size());
        if (v.array_type() == ValueType::STRING) {
          for (const auto& s : v.strings()) str(s);
        } else if (v.array_type() == ValueType::ARRAY) {
          for (const auto& a : v.arrays()) value(a);
        } else {
          raw(v.packed().data(), v.packed().size());
        }
        return;
    }
    fail("gguf writer: cannot encode value type {}", to_string(v.type()));
  }
  const std::vector<std::uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
};

bool is_power_of_two(std::uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

/// The output stream of a GGUF file being written: a registered temporary (io::TempFile),
/// renamed onto the final path by commit().
class OutFile {
 public:
  explicit OutFile(const std::string& final_path) : tmp_(final_path) {
    f_ = std::fopen(tmp_.path().c_str(), "wb");
    if (!f_) fail("{}: cannot create: {}", tmp_.path(), std::strerror(errno));
  }
  ~OutFile() {
    if (f_) std::fclose(f_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* p, std::size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, f_) != n) {
      fail("{}: write failed: {}", tmp_.path(), std::strerror(errno));
    }
  }
  void zeros(std::size_t n) {
    static const std::uint8_t z[256] = {};
    while (n > 0) {
      const std::size_t k = n < sizeof z ? n : sizeof z;
      write(z, k);
      n -= k;
    }
  }
  void commit() {
    std::FILE* f = f_;
    f_ = nullptr;
    if (std::fflush(f) != 0 || std::ferror(f)) {
      const int e = errno;
      std::fclose(f);
      fail("{}: write failed: {}", tmp_.path(), std::strerror(e));
    }
    if (std::fclose(f) != 0) fail("{}: close failed: {}", tmp_.path(), std::strerror(errno));
    tmp_.commit();
  }

 private:
  io::TempFile tmp_;
  std::FILE* f_ = nullptr;
};

}  // namespace

void Writer::set(const std::string& key, Value v) {
  require(!key.empty(), "gguf writer: empty metadata key");
  require(key.size() <= 65535, "gguf writer: metadata key of {} bytes is too long", key.size());
  for (const auto& kv : metadata_) {
    require(kv.key != key, "gguf writer: duplicate metadata key '{}'", key);
  }
  if (key == kAlignmentKey) {
    const auto a = v.as_uint();
    require(v.type() == ValueType::UINT32 && a.has_value(),
            "gguf writer: metadata key '{}' must be a uint32, got {}", key, to_string(v.type()));
    set_alignment(static_cast<std::uint32_t>(*a));
    return;
  }
  metadata_.push_back(KeyValue{key, std::move(v)});
}

void Writer::set_alignment(std::uint32_t alignment) {
  require(is_power_of_two(alignment) && alignment <= (1u << 30),
          "gguf writer: alignment {} is not a nonzero power of two no larger than 2^30", alignment);
  alignment_ = alignment;
  for (auto& kv : metadata_) {
    if (kv.key == kAlignmentKey) {
      kv.value = Value::u32(alignment);
      return;
    }
  }
  metadata_.push_back(KeyValue{kAlignmentKey, Value::u32(alignment)});
}

void Writer::check_tensor(const std::string& name, const std::vector<std::uint64_t>& ne,
                          GGMLType type, std::size_t nbytes) const {
  require(!name.empty(), "gguf writer: empty tensor name");
  for (const auto& t : tensors_) {
    require(t.name != name, "gguf writer: duplicate tensor name '{}'", name);
  }
  require(!ne.empty() && ne.size() <= 4, "gguf writer: tensor '{}' has {} dimensions (1 to 4)",
          name, ne.size());
  require(is_known_type(static_cast<std::uint32_t>(type)),
          "gguf writer: tensor '{}' has unknown type {}", name, static_cast<std::uint32_t>(type));
  std::uint64_t rows = 1;
  for (std::size_t i = 0; i < ne.size(); ++i) {
    require(ne[i] > 0, "gguf writer: tensor '{}' has ne[{}] = 0", name, i);
    if (i > 0) {
      require(rows <= std::numeric_limits<std::uint64_t>::max() / ne[i],
              "gguf writer: tensor '{}' is too large", name);
      rows *= ne[i];
    }
  }
  require(ne[0] % block_size(type) == 0,
          "gguf writer: tensor '{}': ne[0]={} is not a multiple of the {} block size {}", name,
          ne[0], to_string(type), block_size(type));
  const std::uint64_t rb = row_bytes(type, ne[0]);
  require(rb <= std::numeric_limits<std::uint64_t>::max() / rows,
          "gguf writer: tensor '{}' is too large", name);
  require(rb * rows == nbytes, "gguf writer: tensor '{}' ({} of shape {}) needs {} bytes, got {}",
          name, to_string(type), ne.size(), rb * rows, nbytes);
}

void Writer::add_tensor(const std::string& name, const std::vector<std::uint64_t>& ne,
                        GGMLType type, const void* data, std::size_t nbytes) {
  check_tensor(name, ne, type, nbytes);
  const auto* b = static_cast<const std::uint8_t*>(data);
  tensors_.push_back(Tensor{name, ne, type, std::vector<std::uint8_t>(b, b + nbytes)});
}

void Writer::add_tensor(const std::string& name, const std::vector<std::uint64_t>& ne,
                        GGMLType type, std::vector<std::uint8_t>&& data) {
  check_tensor(name, ne, type, data.size());
  tensors_.push_back(Tensor{name, ne, type, std::move(data)});
}

void Writer::write(const std::string& path) const {
  Buffer h;
  h.raw("GGUF", 4);
  h.u32(kVersion);
  h.u64(tensors_.size());
  h.u64(metadata_.size());
  for (const auto& kv : metadata_) {
    h.str(kv.key);
    h.u32(static_cast<std::uint32_t>(kv.value.type()));
    h.value(kv.value);
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors_) {
    h.str(t.name);
    h.u32(static_cast<std::uint32_t>(t.ne.size()));
    for (std::uint64_t d : t.ne) h.u64(d);
    h.u32(static_cast<std::uint32_t>(t.type));
    h.u64(offset);
    offset += t.data.size();
    offset += (alignment_ - offset % alignment_) % alignment_;
  }
  h.pad_to(alignment_);

  OutFile out(path);
  out.write(h.bytes().data(), h.bytes().size());
  for (const auto& t : tensors_) {
    interruption_point("write");  // SIGINT / SIGTERM: the temporary is removed, nothing published
    out.write(t.data.data(), t.data.size());
    out.zeros((alignment_ - t.data.size() % alignment_) % alignment_);
  }
  out.commit();
}

}  // namespace sparsim::gguf
