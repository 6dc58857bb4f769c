#pragma once
/// Temporary files that become outputs by a rename, and the clean-up of those a killed process
/// left behind. Host-only (no HDF5, no Kokkos).
///
/// A temporary sits next to its final path and is named "<final>.sparsim-<pid>-<host>.tmp":
/// recognisable, owned by one process of one host (so runs on several nodes of a cluster can
/// share a folder). remove_stale_temps() deletes, in a folder, those of this host whose process
/// no longer exists; every command that writes files calls it on its output folders at start.
#include <string>
#include <vector>

namespace sparsim::io {

/// The temporary name this process uses for `path`: "<path>.sparsim-<pid>-<host>.tmp".
std::string temp_path_for(const std::string& path);

/// Owner of a temporary file name `file_name` (no folder part); false for other names.
struct TempOwner {
  long pid = 0;
  std::string host;
  std::string final_name;  ///< the output it was going to become
};
bool parse_temp_name(const std::string& file_name, TempOwner& owner);

/// Deletes, in `dir`, the temporaries of this host whose process no longer runs; returns their
/// paths. Files of live processes, of other hosts and every other file are left alone.
std::vector<std::string> remove_stale_temps(const std::string& dir);

/// fsync of a written file; a failure means the data may not be on disk, so it is an error.
void sync_file(const std::string& path);

/// Moves the finished temporary `tmp` onto `path` and syncs the folder. Without `overwrite`,
/// fails (leaving `path` alone) when it exists: a hard link makes the check and the
/// publication one atomic step where the file system has them.
void publish(const std::string& tmp, const std::string& path, bool overwrite);

/// The temporary of one output for the lifetime of the object: registered so that an
/// interrupted run deletes it, deleted on destruction unless committed.
class TempFile {
 public:
  explicit TempFile(std::string final_path);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::string& path() const noexcept { return tmp_; }
  const std::string& final_path() const noexcept { return final_; }
  /// Syncs the (closed) temporary and renames it onto the final path.
  void commit(bool overwrite = true);
  /// Deletes the temporary now (what the destructor does without commit).
  void discard() noexcept;
  bool committed() const noexcept { return committed_; }

 private:
  std::string final_;
  std::string tmp_;
  bool committed_ = false;
  bool discarded_ = false;
};

}  // namespace sparsim::io
