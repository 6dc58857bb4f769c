#pragma once
/// A read-only, private memory mapping of a whole file (model files are read through these).
#include <cstdint>
#include <string>

namespace sparsim {

class MappedFile {
 public:
  MappedFile() = default;
  /// Maps `path`; `kind` names the format in messages ("GGUF file"). Files shorter than
  /// `min_size` fail with "file too small (N bytes) <too_small>".
  static MappedFile open(const std::string& path, const std::string& kind, std::uint64_t min_size,
                         const std::string& too_small);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::uint8_t* data() const { return static_cast<const std::uint8_t*>(map_); }
  std::uint64_t size() const { return size_; }

  /// Drops the resident pages of [p, p + n), rounded outward to whole pages, so a consumed
  /// tensor stops counting towards the process' memory; reading it again re-reads the file.
  /// `what` names the range in messages ("tensor 'x'").
  void release(const void* p, std::uint64_t n, const std::string& what) const;

 private:
  void unmap() noexcept;
  std::string path_;
  void* map_ = nullptr;
  std::uint64_t size_ = 0;
};

}  // namespace sparsim
