#include "io/run_file.hpp"

#include "core/error.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace sparsim::io {

namespace {

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

void refuse_existing(const std::string& path) {
  fail("output file '{}' already exists and overwriting was not allowed", path);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// RunFile

RunFile::RunFile(std::string path, bool overwrite) : tmp_(std::move(path)), overwrite_(overwrite) {
  require(!tmp_.final_path().empty(), "the run file path is empty");
  if (!overwrite_ && path_exists(tmp_.final_path())) refuse_existing(tmp_.final_path());
  file_ = H5File::create(tmp_.path());
}

RunFile::~RunFile() {
  abort();
}

H5File& RunFile::file() {
  require(!committed() && !aborted_, "run file '{}' was already {}", path(),
          committed() ? "committed" : "discarded");
  return file_;
}

Group RunFile::root() {
  return file().root();
}

void RunFile::commit() {
  require(!committed() && !aborted_, "run file '{}' was already {}", path(),
          committed() ? "committed" : "discarded");
  file_.flush();
  file_.close();
  tmp_.commit(overwrite_);
}

void RunFile::abort() noexcept {
  if (committed() || aborted_) return;
  aborted_ = true;
  try {
    file_.close();
  } catch (...) {
    // Closing a file that is about to be deleted: nothing useful to report.
  }
  tmp_.discard();
}

// ---------------------------------------------------------------------------------------------
// Text files

AtomicTextFile::AtomicTextFile(std::string path, bool overwrite)
    : tmp_(std::move(path)), overwrite_(overwrite) {
  if (!overwrite_ && path_exists(tmp_.final_path())) refuse_existing(tmp_.final_path());
  out_.open(tmp_.path(), std::ios::binary | std::ios::trunc);
  if (!out_) fail("cannot create '{}': {}", tmp_.path(), std::strerror(errno));
}

AtomicTextFile::~AtomicTextFile() {
  if (committed()) return;
  out_.close();
  tmp_.discard();
}

void AtomicTextFile::commit() {
  require(!committed(), "output file '{}' was already committed", path());
  out_.flush();
  if (!out_) fail("cannot write '{}': {}", tmp_.path(), std::strerror(errno));
  out_.close();
  if (out_.fail()) fail("cannot close '{}': {}", tmp_.path(), std::strerror(errno));
  tmp_.commit(overwrite_);
}

void write_file_atomically(const std::string& path, const std::string& contents, bool overwrite) {
  AtomicTextFile f(path, overwrite);
  f.stream().write(contents.data(), static_cast<std::streamsize>(contents.size()));
  f.commit();
}

}  // namespace sparsim::io
