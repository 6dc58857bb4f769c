#pragma once
/// Slurm front end of the sweep: the pending points are packed into chunks that fit the time
/// limit (by predicted seconds), written as a chunk list and an sbatch job-array script (one
/// array task per chunk), and submitted when sbatch is on PATH. Each array task runs
/// `sparsim sweep SPEC --chunk-file F --chunk $SLURM_ARRAY_TASK_ID`: the same resumable sweep,
/// on its chunk. Near the time limit the task stops its point cleanly and requeues itself;
/// a requeued, resubmitted or rerun task skips what is done.
#include "sweep/plan.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace sparsim::sweep {

struct SlurmOptions {
  std::string partition, account, qos, mem;
  std::string time = "01:00:00";  ///< per array task
  int gpus_per_task = 0;
  int cpus_per_task = 0;           ///< 0: not set (the cluster's default)
  std::vector<std::string> extra;  ///< more `#SBATCH` options, as given
  int chunks = 0;                  ///< 0: as many as the time limit needs
  int max_array = 1000;            ///< largest array (Slurm's MaxArraySize is 1001 by default)
  double fill = 0.8;               ///< fraction of the time limit a chunk's prediction may use
  int max_requeue = 3;             ///< times a task requeues itself at its time limit
  int signal_seconds = 120;        ///< warning before the limit (--signal=B:USR1@N)
};

/// Seconds of a Slurm time limit: "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S".
/// Throws sparsim::Error for anything else.
int parse_time_limit(const std::string& s);

/// Packs point indices into chunks of at most `budget_s` predicted seconds each (longest
/// first, each to the least-loaded chunk; a point longer than the budget gets a chunk of its
/// own). With `chunks` > 0 the count is fixed instead. Never more than `max_chunks`.
std::vector<std::vector<int>> make_chunks(const std::vector<double>& seconds,
                                          const std::vector<int>& points, double budget_s,
                                          int chunks, int max_chunks);

/// The sbatch script of an array over `n_chunks` chunks.
std::string sbatch_script(const Spec& spec, const SlurmOptions& o, const std::string& exe,
                          const std::string& chunk_file, const std::string& log_dir, int n_chunks);

/// Reads a chunk file and returns the point ids of chunk `index`.
std::vector<std::string> read_chunk(const std::string& chunk_file, int index);

}  // namespace sparsim::sweep
