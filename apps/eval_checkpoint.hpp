#pragma once
// sparsim eval --checkpoint: the completed perplexity windows of a run, kept in a side file so
// that rerunning the same command continues where an interrupted run stopped and gives the
// bitwise-identical result of an uninterrupted one.
#include "common.hpp"
#include "eval/perplexity.hpp"
#include "flops/ledger.hpp"
#include "sparsity/masker.hpp"

#include <optional>
#include <set>
#include <string>

namespace sparsim::app {

/// What a run has accumulated after some windows: their results, the FLOP ledger of the
/// forward passes that computed them and, for a sparse method, the masker's statistics.
struct EvalProgress {
  PplResult ppl;
  flops::Ledger ledger;
  std::optional<sparsity::MaskerStats> masker;
};

/// "name = value" lines, sorted, of every parsed option except those in `ignore` (options that
/// cannot change a window's result: --batch, --threads, output paths, ...). Throws
/// sparsim::Error for an option whose value type it does not know.
std::string option_settings(const po::variables_map& vm, const std::set<std::string>& ignore);

/// The settings lines that differ between two settings texts, as "name: X there, Y here".
std::string settings_differences(const std::string& there, const std::string& here);

/// Size and modification time of a file ("absent" when it does not exist), for settings that
/// name input files whose content has no fingerprint of its own.
std::string file_stamp(const std::string& path);

class EvalCheckpoint {
 public:
  /// `settings`: everything the window results depend on, one "name = value" per line.
  EvalCheckpoint(std::string path, std::string settings);

  const std::string& path() const { return path_; }
  /// Reads the side file when it exists (true: `into` is filled). Throws UsageError, naming the
  /// settings that differ, when it was written by a run with other settings.
  bool read(EvalProgress& into, int n_layer) const;
  /// Replaces the side file atomically.
  void write(const EvalProgress& p) const;
  /// Deletes the side file (the run it belonged to is complete).
  void remove() const;

 private:
  std::string path_;
  std::string settings_;
};

}  // namespace sparsim::app
