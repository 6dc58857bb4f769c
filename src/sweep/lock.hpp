#pragma once
/// Exclusive locks on files that never outlive their holder: an open-file-description lock
/// (fcntl F_OFD_SETLK) on `<name>.lock`. The kernel drops it when the holder exits in any way,
/// kill -9 included; on NFS the server drops it when the client's lease runs out. A lock file
/// left behind by a dead holder is therefore not a lock: the next process simply takes it. The
/// file holds a one-line note about the holder (host, pid, time) for `sweep --status`.
///
/// The output folder must be on a file system with POSIX locks (local disks, NFS, Lustre
/// mounted with -o flock, GPFS, BeeGFS); where locks are refused the sweep stops with a message
/// saying so.
#include <optional>
#include <string>

namespace sparsim::sweep {

class FileLock {
 public:
  /// Takes the lock on `path` (creating the file) without waiting. Returns nothing when another
  /// process (or another FileLock of this process) holds it. On success writes `note` into the
  /// file. Throws sparsim::Error when the file cannot be created or the file system refuses locks.
  static std::optional<FileLock> try_acquire(const std::string& path, const std::string& note);
  /// True when some process holds a lock on `path` now; false also when the file is missing.
  static bool held(const std::string& path);
  /// The holder's note (empty when the file is missing or empty).
  static std::string note(const std::string& path);

  FileLock(FileLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  /// Releases the lock (the file stays: removing it could race with a process opening it).
  ~FileLock();
  void release() noexcept;
  const std::string& path() const noexcept { return path_; }

 private:
  FileLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace sparsim::sweep
