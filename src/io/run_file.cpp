#include "io/run_file.hpp"

#include "core/error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace sparsim::io {

namespace {

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

std::string errno_text(int e) {
  return std::strerror(e);
}

std::string parent_dir(const std::string& p) {
  const std::size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

/// fsync of a written file; a failure means the data may not be on disk, so it is an error.
void sync_file(const std::string& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '{}' to sync it: {}", p, errno_text(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) fail("cannot sync '{}' to disk: {}", p, errno_text(e));
}

/// fsync of the directory so the rename itself is durable; best effort (not every file system
/// lets a directory be opened or synced).
void sync_dir_best_effort(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

void refuse_existing(const std::string& path) {
  fail("output file '{}' already exists and overwriting was not allowed", path);
}

/// Moves the finished temporary onto the final path. Without overwrite, a hard link makes the
/// "does not exist yet" check and the publication one atomic step; file systems without hard
/// links fall back to check-then-rename.
void publish(const std::string& tmp, const std::string& path, bool overwrite) {
  if (!overwrite) {
    if (::link(tmp.c_str(), path.c_str()) == 0) {
      ::unlink(tmp.c_str());
      sync_dir_best_effort(parent_dir(path));
      return;
    }
    if (errno == EEXIST) refuse_existing(path);
    if (path_exists(path)) refuse_existing(path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    fail("cannot rename '{}' to '{}': {}", tmp, path, errno_text(errno));
  sync_dir_best_effort(parent_dir(path));
}

}  // namespace

std::string temp_path_for(const std::string& path) {
  return path + ".tmp." + std::to_string(static_cast<long long>(::getpid()));
}

std::int64_t check_run_schema(const H5File& f) {
  const Group root = f.root();
  const std::string& path = f.path();
  if (root.has_attr("format") && !root.has_group("run")) {
    std::string fmt_name;
    try {
      fmt_name = root.get_attr<std::string>("format");
    } catch (const Error&) {
      fmt_name = "?";
    }
    fail("'{}' is not a run file but a '{}' file (no /run group)", path, fmt_name);
  }
  require(root.has_group("run"),
          "'{}' is not a sparsim run file: it has no /run group (is it another program's HDF5 "
          "file?)",
          path);
  const Group run = root.open_group("run");
  if (!run.has_attr("schema_version")) {
    require(run.has_attr("command") && run.has_attr("version"),
            "'{}' is not a sparsim run file: its /run group has no schema_version, command or "
            "version attribute",
            path);
    fail(
        "'{}' was written by sparsim {} with run-file schema 1 (before /run carried "
        "schema_version); this sparsim reads schema {}: run the command again to regenerate "
        "it",
        path, run.get_attr<std::string>("version"), kRunSchemaVersion);
  }
  std::int64_t v = 0;
  std::string fmt_name;
  try {
    v = run.get_attr<std::int64_t>("schema_version");
    fmt_name = run.get_attr<std::string>("format");
  } catch (const Error& e) {
    fail("'{}' is not a valid sparsim run file: {}", path, e.what());
  }
  require(fmt_name == kRunFormat, "'{}' is not a sparsim run file: /run format is '{}', not '{}'",
          path, fmt_name, kRunFormat);
  require(v >= 1 && v <= kRunSchemaVersion,
          "'{}' has run-file schema {}, newer than the {} this sparsim reads: use the sparsim "
          "that wrote it ({})",
          path, v, kRunSchemaVersion,
          run.has_attr("version") ? run.get_attr<std::string>("version") : "unknown");
  require(v == kRunSchemaVersion,
          "'{}' has run-file schema {}; this sparsim reads schema {}: run the command again to "
          "regenerate it",
          path, v, kRunSchemaVersion);
  return v;
}

// ---------------------------------------------------------------------------------------------
// RunFile

RunFile::RunFile(std::string path, bool overwrite)
    : path_(std::move(path)), tmp_(temp_path_for(path_)), overwrite_(overwrite) {
  require(!path_.empty(), "the run file path is empty");
  if (!overwrite_ && path_exists(path_)) refuse_existing(path_);
  try {
    file_ = H5File::create(tmp_);
  } catch (...) {
    std::remove(tmp_.c_str());
    throw;
  }
}

RunFile::~RunFile() {
  abort();
}

H5File& RunFile::file() {
  require(!committed_ && !aborted_, "run file '{}' was already {}", path_,
          committed_ ? "committed" : "discarded");
  return file_;
}

Group RunFile::root() {
  return file().root();
}

void RunFile::commit() {
  require(!committed_ && !aborted_, "run file '{}' was already {}", path_,
          committed_ ? "committed" : "discarded");
  file_.flush();
  file_.close();
  sync_file(tmp_);
  publish(tmp_, path_, overwrite_);
  committed_ = true;
}

void RunFile::abort() noexcept {
  if (committed_ || aborted_) return;
  aborted_ = true;
  try {
    file_.close();
  } catch (...) {
    // Closing a file that is about to be deleted: nothing useful to report.
  }
  std::remove(tmp_.c_str());
}

// ---------------------------------------------------------------------------------------------
// Text files

AtomicTextFile::AtomicTextFile(std::string path, bool overwrite)
    : path_(std::move(path)), tmp_(temp_path_for(path_)), overwrite_(overwrite) {
  require(!path_.empty(), "the output file path is empty");
  if (!overwrite_ && path_exists(path_)) refuse_existing(path_);
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  if (!out_) fail("cannot create '{}': {}", tmp_, errno_text(errno));
}

AtomicTextFile::~AtomicTextFile() {
  if (committed_) return;
  out_.close();
  std::remove(tmp_.c_str());
}

void AtomicTextFile::commit() {
  require(!committed_, "output file '{}' was already committed", path_);
  out_.flush();
  if (!out_) fail("cannot write '{}': {}", tmp_, errno_text(errno));
  out_.close();
  if (out_.fail()) fail("cannot close '{}': {}", tmp_, errno_text(errno));
  sync_file(tmp_);
  publish(tmp_, path_, overwrite_);
  committed_ = true;
}

void write_file_atomically(const std::string& path, const std::string& contents, bool overwrite) {
  AtomicTextFile f(path, overwrite);
  f.stream().write(contents.data(), static_cast<std::streamsize>(contents.size()));
  f.commit();
}

}  // namespace sparsim::io
