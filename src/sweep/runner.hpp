#pragma once
/// The worker loops: one process with a few task slots, or every rank of an MPI job fed by
/// rank 0 (one task per rank at a time, longest predicted first, as ranks become free).
#include "sweep/execute.hpp"

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace sparsim::sweep {

struct SweepResult {
  int points = 0;       ///< points this run was responsible for
  int done_before = 0;  ///< found done (earlier runs, or another process meanwhile)
  int done = 0;         ///< finished by this run
  int failed = 0;
  int elsewhere = 0;  ///< still held by another process at the end
  int interrupted = 0;
  std::vector<std::pair<std::string, std::string>> failures;  ///< id, message
  bool ok() const { return failed == 0 && interrupted == 0; }
};

struct LoopOptions {
  WorkerOptions worker;
  int jobs = 1;             ///< task slots of this process (plain runs)
  std::vector<int> subset;  ///< point indices to run (empty: all)
  bool quiet = false;       ///< no progress lines
};

/// Runs the tasks with `jobs` child processes at a time until nothing is left to do here.
SweepResult run_local(const Plan& plan, const Store& store, const LoopOptions& opt);

/// Progress line printer shared by the loops ("[time] done  3/12  <label>  4.2 s").
class Reporter {
 public:
  Reporter(const Plan& plan, int total, bool quiet) : plan_(plan), total_(total), quiet_(quiet) {}
  void report(const TaskRef& t, const Outcome& o, int rank = -1);
  void note(const std::string& line);

 private:
  const Plan& plan_;
  int total_;
  bool quiet_;
  int finished_ = 0;
};

SweepResult result_of(const Scheduler& s);

}  // namespace sparsim::sweep
