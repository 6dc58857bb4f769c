#include "core/mapped_file.hpp"

#include "core/error.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace sparsim {

MappedFile MappedFile::open(const std::string& path, const std::string& kind,
                            std::uint64_t min_size, const std::string& too_small) {
  MappedFile f;
  f.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open {}: {}", path, kind, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  f.size_ = static_cast<std::uint64_t>(st.st_size);
  if (f.size_ < std::max<std::uint64_t>(min_size, 1)) {
    ::close(fd);
    fail("{}: file too small ({} bytes) {}", path, f.size_, too_small);
  }
  void* m = ::mmap(nullptr, static_cast<std::size_t>(f.size_), PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) fail("{}: cannot mmap {} bytes: {}", path, f.size_, std::strerror(e));
  f.map_ = m;
  return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  unmap();
}

void MappedFile::unmap() noexcept {
  if (map_) ::munmap(map_, static_cast<std::size_t>(size_));
  map_ = nullptr;
}

void MappedFile::release(const void* p, std::uint64_t n, const std::string& what) const {
  const auto base = reinterpret_cast<std::uintptr_t>(map_);
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  require(
      map_ != nullptr && p != nullptr && begin >= base && n <= size_ && begin - base <= size_ - n,
      "{}: release: {} does not belong to this file", path_, what);
  if (n == 0) return;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  // The mapping starts on a page boundary and covers whole pages up to size_ rounded up.
  const std::uintptr_t lo = begin & ~(page - 1);
  const std::uintptr_t map_end = (base + size_ + page - 1) & ~(page - 1);
  const std::uintptr_t hi = std::min(map_end, (begin + n + page - 1) & ~(page - 1));
  if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0)
    fail("{}: madvise(MADV_DONTNEED) for {} failed: {}", path_, what, std::strerror(errno));
}

}  // namespace sparsim
