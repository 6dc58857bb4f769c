#pragma once
/// The one call every subcommand that writes files makes at its start, after parsing its options
/// and before any work:
///
///     io::guard_run({{"--model", model_path}, {"--corpus", corpus_path}},
///                   {{"--out", out}, {"--json", json_out}});
///
/// 1. It checks every output path (io::check_run_paths below) and throws UsageError (exit 2)
///    naming the options at fault: nothing has been computed or written yet.
/// 2. It deletes, in each output folder, the temporaries that killed runs of this host left
///    behind (io/temp_file.hpp), and says so on stderr.
/// 3. It declares the outputs for the interruption line (core/interrupt.hpp): on SIGINT/SIGTERM
///    the run says which of them were not written and exits with 130/143.
///
/// Paths left empty (options not given) are skipped. Outputs are then written through
/// io::RunFile, io::AtomicTextFile or io::TempFile, which publish by rename only when complete.
#include <string>
#include <vector>

namespace sparsim::io {

/// A path a command reads, with the option that named it ("--model").
struct InputPath {
  std::string option;
  std::string path;
};

/// A path a command writes, with the option that named it ("--out"). A `directory` output is a
/// folder the command fills (created if missing). A `side_file` (a checkpoint) is checked like
/// any output but not listed as "not written" when the run is interrupted.
struct OutputPath {
  std::string option;
  std::string path;
  bool directory = false;
  bool side_file = false;
};

/// Throws UsageError, naming the options, unless:
/// - no output is an input: the same file (device and inode, so hard links, symbolic links and
///   other spellings of a path are caught), or a path inside a folder given as an input;
/// - no two outputs are the same file, or the same name in the same folder;
/// - a file output is not an existing folder, a folder output not an existing file;
/// - the folder each output goes into exists and is writable.
/// Inputs that do not exist are skipped (their readers report them).
void check_run_paths(const std::vector<InputPath>& inputs, const std::vector<OutputPath>& outputs);

/// check_run_paths, removal of stale temporaries in the output folders, and the declaration of
/// the outputs for the interruption line.
void guard_run(const std::vector<InputPath>& inputs, const std::vector<OutputPath>& outputs);

}  // namespace sparsim::io
