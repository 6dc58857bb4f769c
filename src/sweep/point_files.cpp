#include "sweep/point_files.hpp"

#include "core/error.hpp"
#include "io/run_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace sparsim::sweep {

namespace {
std::string parent_of(const std::string& p) {
  const std::size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}
}  // namespace

void write_atomically(const std::string& path, const std::string& contents, bool overwrite) {
  // io::write_file_atomically: "<path>.tmp.<pid>", fsync, rename (or link without overwrite),
  // fsync of the folder; the temporary is removed on any failure.
  io::write_file_atomically(path, contents, overwrite);
}

void sync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

void move_into_place(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    fail("cannot rename '{}' to '{}': {}", from, to, std::strerror(errno));
  sync_folder(parent_of(to));
}

void remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    fail("cannot remove '{}': {}", path, std::strerror(errno));
}

FileDigest digest(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot read '{}': {}", path, std::strerror(errno));
  std::uint64_t h = 1469598103934665603ULL, n = 0;
  std::vector<unsigned char> buf(1 << 20);
  while (true) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      fail("cannot read '{}': {}", path, std::strerror(e));
    }
    if (r == 0) break;
    for (ssize_t i = 0; i < r; ++i) {
      h ^= buf[static_cast<std::size_t>(i)];
      h *= 1099511628211ULL;
    }
    n += static_cast<std::uint64_t>(r);
  }
  ::close(fd);
  return {n, fmt::format("{:016x}", h)};
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read '{}': {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace sparsim::sweep
