#pragma once
/// Every write of the sweep's output folder goes through these few functions: files appear
/// complete or not at all (temporary name, fsync, rename, fsync of the folder), so that a kill
/// at any instant leaves either the old state or the new one.
#include <cstdint>
#include <string>

namespace sparsim::sweep {

/// Writes `contents` to `path` atomically (temporary file in the same folder, fsync, rename,
/// fsync of the folder). With overwrite == false, fails if `path` exists (atomically).
/// Throws sparsim::Error naming the path and the system's complaint (e.g. a full disk).
void write_atomically(const std::string& path, const std::string& contents, bool overwrite = true);

/// Renames `from` onto `to` (same file system) and syncs the destination folder.
void move_into_place(const std::string& from, const std::string& to);

/// fsync of a folder (best effort: not every file system lets a folder be synced).
void sync_folder(const std::string& dir);

/// Removes a file if it exists; a failure other than "missing" is an error.
void remove_file(const std::string& path);

/// Size and 16-hex-digit FNV-1a 64 hash of a file's bytes; throws when it cannot be read.
struct FileDigest {
  std::uint64_t bytes = 0;
  std::string hash;
};
FileDigest digest(const std::string& path);

/// Reads a whole (small) text file; throws when it cannot be read.
std::string read_text(const std::string& path);

}  // namespace sparsim::sweep
