#include "sweep/lock.hpp"

#include "core/error.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace sparsim::sweep {

namespace {
struct flock whole_file(short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;  // to the end of the file, however long it grows
  fl.l_pid = 0;  // required for open-file-description locks
  return fl;
}

[[noreturn]] void no_locks(const std::string& path, int e) {
  fail(
      "cannot lock '{}': {} (the sweep's output folder must be on a file system with POSIX "
      "locks: a local disk, NFS, Lustre mounted with -o flock, GPFS or BeeGFS)",
      path, std::strerror(e));
}
}  // namespace

std::optional<FileLock> FileLock::try_acquire(const std::string& path, const std::string& note) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create lock file '{}': {}", path, std::strerror(errno));
  struct flock fl = whole_file(F_WRLCK);
  if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    const int e = errno;
    ::close(fd);
    if (e == EAGAIN || e == EACCES) return std::nullopt;
    no_locks(path, e);
  }
  FileLock lock(fd, path);
  // The note is informational: a failure to write it (a full disk) does not void the lock.
  if (::ftruncate(fd, 0) == 0) {
    const std::string line = note + "\n";
    ssize_t off = 0;
    while (off < static_cast<ssize_t>(line.size())) {
      const ssize_t n =
          ::pwrite(fd, line.data() + off, line.size() - static_cast<std::size_t>(off), off);
      if (n <= 0) break;
      off += n;
    }
  }
  return lock;
}

bool FileLock::held(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct flock fl = whole_file(F_WRLCK);
  const int rc = ::fcntl(fd, F_OFD_GETLK, &fl);
  const int e = errno;
  ::close(fd);
  if (rc != 0) no_locks(path, e);
  return fl.l_type != F_UNLCK;
}

std::string FileLock::note(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n <= 0) return {};
  std::string s(buf, static_cast<std::size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() {
  release();
}

void FileLock::release() noexcept {
  if (fd_ < 0) return;
  struct flock fl = whole_file(F_UNLCK);
  (void)::fcntl(fd_, F_OFD_SETLK, &fl);
  ::close(fd_);
  fd_ = -1;
}

}  // namespace sparsim::sweep
