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
