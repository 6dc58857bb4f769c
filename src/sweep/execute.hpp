#pragma once
/// Running a sweep's tasks: each point (and each calibration the sweep makes) runs as the
/// sparsim subcommand the plan gives it, in a child process, under the task's lock; its outputs
/// are written into a private work folder and published atomically when the child succeeds.
/// A scheduler hands out the tasks a worker may run, calibrations first, then points longest
/// predicted first.
#include "sweep/plan.hpp"
#include "sweep/store.hpp"

#include <nlohmann/json.hpp>

#include <sys/types.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sparsim::sweep {

/// A task of the plan: a point or a calibration, by index.
struct TaskRef {
  bool calibration = false;
  int index = -1;
  bool operator==(const TaskRef& o) const {
    return calibration == o.calibration && index == o.index;
  }
};

struct Outcome {
  enum class Kind { Done, Failed, AlreadyDone, Elsewhere, Interrupted };
  Kind kind = Kind::Failed;
  std::string message;
  double seconds = 0;
};
const char* to_string(Outcome::Kind k);
nlohmann::json to_json(const TaskRef& t, const Outcome& o);
void from_json(const nlohmann::json& j, TaskRef& t, Outcome& o);

/// How this worker runs its tasks.
struct WorkerOptions {
  std::string exe;                 ///< the sparsim executable
  int threads = 1;                 ///< --threads of every task
  std::string log_level = "warn";  ///< --log-level of every task
  std::optional<std::string> gpu;  ///< CUDA_VISIBLE_DEVICES of every task (unset: inherited)
  int rank = -1;                   ///< MPI rank, -1 outside MPI
};

/// One line of JSON per event in <output>/journal/<host>-<pid>-<time>.jsonl (opened on the
/// first event): what this worker started, finished, found done or found locked. The file only
/// ever holds whole lines: a line the file system cannot take in full (a full disk) is cut back
/// off the file, so the journal of a worker that ran out of space stays readable.
class Journal {
 public:
  Journal(std::string folder, int rank);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  void event(const std::string& what, const TaskRef& t, const std::string& id,
             const nlohmann::json& extra = nlohmann::json::object());

 private:
  std::string folder_;
  int rank_;
  int fd_ = -1;
};

/// SIGINT / SIGTERM set a flag the loops check; running tasks are then stopped and cleaned up.
void install_signal_handlers();
bool interrupted();
int interrupt_signal();

/// One task run by this process.
class Job {
 public:
  Job(const Plan& plan, const Store& store, const WorkerOptions& opt, Journal& journal,
      TaskRef task);
  /// Stops a child that is still running (as interrupt() does).
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  /// Claims the task and starts its command. Returns the outcome at once when the task is
  /// done already, locked by another process, or cannot be started.
  std::optional<Outcome> start();
  /// The outcome once the command has exited (and its outputs are published or the failure
  /// recorded); nothing while it runs.
  std::optional<Outcome> poll();
  /// Waits for the command; returns Interrupted when a signal arrives meanwhile.
  Outcome wait();
  /// Stops the command (SIGTERM, then SIGKILL), discards its outputs, releases the task.
  Outcome interrupt();
  const TaskRef& task() const { return task_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  TaskRef task_;
};

/// Hands out the tasks of one worker (or, under MPI, of all ranks).
class Scheduler {
 public:
  /// `points`: indices of the points this worker may run (empty: all of them).
  Scheduler(const Plan& plan, const Store& store, const std::vector<int>& points);

  /// The next runnable task (calibrations first, then points by predicted seconds, longest
  /// first), marked running; nothing when no task is runnable now.
  std::optional<TaskRef> next();
  void finish(const TaskRef& t, const Outcome& o);
  /// Looks again at tasks another process held: done now, or free to run. True on a change.
  bool recheck();
  /// Nothing runs, nothing can run, and no point waits for a calibration held elsewhere.
  bool finished() const;
  /// Points waiting for a calibration another process is making.
  bool waiting() const;

  int points() const { return static_cast<int>(point_order_.size()); }
  int done_before() const { return done_before_; }
  int done() const { return done_; }
  int failed() const { return failed_; }
  int elsewhere() const;
  int interrupted() const { return interrupted_; }
  const std::vector<std::pair<std::string, std::string>>& failures() const { return failures_; }

 private:
  enum class TS { Pending, Running, Done, Failed, External, Skipped };
  void fail_point(int i, const std::string& msg);

  const Plan& plan_;
  const Store& store_;
  std::vector<TS> point_state_, cal_state_;
  std::vector<int> point_order_, cal_order_;
  int done_before_ = 0, done_ = 0, failed_ = 0, interrupted_ = 0;
  std::vector<std::pair<std::string, std::string>> failures_;
};

/// A task's label for progress lines: "<id>  model/corpus method key=value …".
std::string task_label(const Plan& plan, const TaskRef& t);

}  // namespace sparsim::sweep
