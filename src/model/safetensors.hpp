#pragma once
/// Reader and writer of the Hugging Face safetensors format, and sharded checkpoints.
///
/// A safetensors file is
///
///   [8 bytes]  N, the header length, unsigned little-endian
///   [N bytes]  a JSON object: for every tensor  "name": {"dtype": "F32", "shape": [r, c],
///              "data_offsets": [begin, end]}, and optionally "__metadata__": {"k": "v", ...}
///   [rest]     the data section; a tensor's bytes are data[begin, end), row-major, little-endian
///
/// Everything is validated when a file is opened: the header length against the file size, the
/// JSON syntax and structure, duplicate names, dtypes, shapes, and that every tensor's byte range
/// lies inside the data section, matches shape × element size and overlaps no other tensor. Any
/// problem throws sparsim::Error naming the file and the tensor or key at fault.
///
/// A file is memory-mapped read-only; TensorInfo::data points into the mapping, which lives as
/// long as the File (moving a File keeps the pointers valid). Host-only code (no Kokkos).
#include "core/mapped_file.hpp"
#include "model/quant.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sparsim::safetensors {

/// Element types of the format. Only F32, F16 and BF16 can be converted to fp32 here; the others
/// are recognised (so that a file holding, say, an I64 buffer still opens) but not loadable.
enum class Dtype {
  F32,
  F16,
  BF16,
  F64,
  I64,
  I32,
  I16,
  I8,
  U64,
  U32,
  U16,
  U8,
  BOOL,
  F8_E4M3,
  F8_E5M2
};

/// "F32", "BF16", ... (the spelling used in headers).
std::string to_string(Dtype t);
/// Parses a header dtype string; throws sparsim::Error (naming it) for unknown ones.
Dtype parse_dtype(std::string_view s);
/// Bytes per element.
std::size_t dtype_size(Dtype t);
/// True for F32, F16 and BF16.
bool is_loadable(Dtype t);
/// The ggml type with the same byte encoding (F32, F16, BF16); throws for the others.
gguf::GGMLType to_ggml(Dtype t);

/// Upper bound on the header length (the reference implementation's limit).
inline constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::uint64_t> shape;  ///< outermost first: a [out][in] matrix is {out, in}
  std::uint64_t begin = 0;           ///< data_offsets, relative to the data section
  std::uint64_t end = 0;
  const std::uint8_t* data = nullptr;  ///< into the mapping
  std::uint64_t nbytes() const { return end - begin; }
  std::uint64_t n_elements() const;
  /// "[576, 49152]"
  std::string shape_string() const;
};

class File {
 public:
  /// Maps and validates `path`. Throws sparsim::Error naming the file on any problem.
  static File open(const std::string& path);

  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }
  std::uint64_t file_size() const { return size_; }
  std::uint64_t header_bytes() const { return header_len_; }
  /// Byte offset of the data section (8 + header length).
  std::uint64_t data_offset() const { return 8 + header_len_; }
  /// The "__metadata__" entries (string → string), empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Tensors in the order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

  /// Drops the tensor's pages from memory (madvise MADV_DONTNEED; see gguf::File::release).
  void release(const TensorInfo& t) const;

 private:
  File() = default;

  std::string path_;
  MappedFile map_;
  std::uint64_t size_ = 0;
  std::uint64_t header_len_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

/// One or several safetensors files seen as a single set of tensors: a single file, or the
/// shards listed in a `model.safetensors.index.json` ({"weight_map": {"tensor": "shard file"}}).
class Checkpoint {
 public:
  /// A single .safetensors file.
  static Checkpoint open_file(const std::string& path);
  /// A sharded checkpoint from its index file. Shard names must be plain file names in the
  /// index's directory; every tensor of the weight map must be in the shard it is mapped to,
  /// and a tensor name may not occur in two shards.
  static Checkpoint open_index(const std::string& index_path);

  struct Entry {
    const File* file;
    const TensorInfo* tensor;
  };
  /// nullptr fields when absent.
  Entry find(std::string_view name) const;
  const std::vector<std::unique_ptr<File>>& files() const { return files_; }
  /// Every tensor name (sorted).
  std::vector<std::string> names() const;
  std::uint64_t total_bytes() const;
  /// The index path for a sharded checkpoint, else the file path.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

/// A tensor to write: raw little-endian bytes (shape product × dtype_size(dtype)).
struct WriteTensor {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint8_t> bytes;
};

/// Writes a safetensors file atomically (through a temporary file and a rename). Tensors are
/// stored in the given order; the header is padded with spaces to a multiple of 8 bytes so that
/// the data section is 8-byte aligned. Throws on duplicate names or a size mismatch.
void write_file(const std::string& path, const std::vector<WriteTensor>& tensors,
                const std::map<std::string, std::string>& metadata = {});

/// Converts fp32 values to the byte encoding of `t` (F32, F16 or BF16).
std::vector<std::uint8_t> encode(Dtype t, const float* src, std::size_t n);

}  // namespace sparsim::safetensors
