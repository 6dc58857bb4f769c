#pragma once
/// Output files that appear complete or not at all: everything is written to a temporary file
/// next to the final path (io/temp_file.hpp: "<path>.sparsim-<pid>-<host>.tmp") and renamed over
/// it only on commit. A run that fails (throws, returns early, is interrupted) destroys its
/// uncommitted writer, which deletes the temporary.
#include "io/hdf5.hpp"
#include "io/temp_file.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <string>

namespace sparsim::io {

/// Every run file says what it is on its /run group: attribute `format` = kRunFormat and
/// `schema_version` = the layout version it follows (docs/run-file-schema.md).
inline constexpr const char* kRunFormat = "sparsim-run";
/// Version 2: /run carries format and schema_version; /flops carries call and token counts.
inline constexpr std::int64_t kRunSchemaVersion = 2;

/// Checks that the open file `f` is a sparsim run file of a schema this build reads; returns
/// its schema version. Throws sparsim::Error saying what the file is instead (another
/// program's HDF5 file, a calibration file, a run file of an older or newer schema).
std::int64_t check_run_schema(const H5File& f);

/// The HDF5 run file of one simulation run.
class RunFile {
 public:
  /// Creates the temporary HDF5 file. With overwrite == false, fails if `path` already exists
  /// (checked here and again, atomically, at commit).
  explicit RunFile(std::string path, bool overwrite = true);
  /// Without commit(): closes and deletes the temporary file.
  ~RunFile();
  RunFile(const RunFile&) = delete;
  RunFile& operator=(const RunFile&) = delete;
  RunFile(RunFile&&) = delete;
  RunFile& operator=(RunFile&&) = delete;

  H5File& file();
  Group root();
  /// Flushes, closes (every Group/Dataset of the file becomes invalid), syncs to disk and
  /// renames the temporary onto the final path. Throws sparsim::Error on failure, in which case
  /// the temporary is deleted by the destructor.
  void commit();
  /// Discards the run now (what the destructor does when commit() was never called).
  void abort() noexcept;

  bool committed() const noexcept { return tmp_.committed(); }
  const std::string& path() const noexcept { return tmp_.final_path(); }
  const std::string& temp_path() const noexcept { return tmp_.path(); }

 private:
  TempFile tmp_;
  bool overwrite_;
  bool aborted_ = false;
  H5File file_;
};

/// The text of a JSON output: `j` with `indent` (-1: one line), newline-terminated. A byte of a
/// string that is not part of well-formed UTF-8 (text a model generated) is written as U+FFFD,
/// so a report never fails, after the run, on what the model produced. Any nlohmann type
/// (an ordered_json keeps its key order).
template <class Json>
std::string json_file_text(const Json& j, int indent = 2) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace) + "\n";
}

/// Writes `contents` to `path` through a temporary file and a rename (fsynced first).
/// With overwrite == false, fails if `path` exists.
void write_file_atomically(const std::string& path, const std::string& contents,
                           bool overwrite = true);

/// A text output built through a stream and published atomically on commit().
class AtomicTextFile {
 public:
  explicit AtomicTextFile(std::string path, bool overwrite = true);
  /// Without commit(): deletes the temporary file.
  ~AtomicTextFile();
  AtomicTextFile(const AtomicTextFile&) = delete;
  AtomicTextFile& operator=(const AtomicTextFile&) = delete;

  std::ostream& stream() { return out_; }
  template <class T>
  AtomicTextFile& operator<<(const T& v) {
    out_ << v;
    return *this;
  }
  /// Flushes, syncs and renames onto the final path; throws sparsim::Error on failure.
  void commit();
  bool committed() const noexcept { return tmp_.committed(); }
  const std::string& path() const noexcept { return tmp_.final_path(); }
  const std::string& temp_path() const noexcept { return tmp_.path(); }

 private:
  TempFile tmp_;
  bool overwrite_;
  std::ofstream out_;
};

}  // namespace sparsim::io
