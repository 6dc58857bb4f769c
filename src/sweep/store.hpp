#pragma once
/// The output folder of a sweep:
///
///   sweep.json                      which spec made the folder (its [sweep] name)
///   points/<id>/point.json          manifest of a finished point: its configuration, the
///                                   command, and size + hash of each file; written last
///   points/<id>/run.h5, summary.json   the command's run file and JSON summary
///   points/<id>/log.txt             the command's stdout and stderr (last attempt)
///   points/<id>/failed.json         the last failure (removed when the point succeeds)
///   points/<id>/lock                held while a worker runs the point
///   calibrations/<model>-<id>.h5    calibration files made by the sweep (+ .json manifest,
///                                   .lock, .log, .failed.json)
///   journal/<host>-<pid>-<t>.jsonl  what each worker did, one event per line
///   results.h5, results.csv         the collected table
///   slurm/<n>/                      job-array scripts, chunk lists, task logs
///
/// A point is done when its manifest parses, records the configuration the plan expects, and
/// every file it lists is there with the recorded size and hash: a truncated or replaced file,
/// or a manifest from another configuration, makes the point pending again.
#include "sweep/plan.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace sparsim::sweep {

enum class State { Pending, Running, Failed, Done };
const char* to_string(State s);

struct TaskStatus {
  State state = State::Pending;
  std::string message;  ///< failure message (Failed), holder note (Running), why not done
};

class Store {
 public:
  explicit Store(const Spec& spec);

  const std::string& root() const { return root_; }
  /// Throws sparsim::Error when the folder exists but was made by another spec (another
  /// [sweep] name) or is not a sweep's folder at all; writes nothing.
  void check_owner() const;
  /// check_owner(), then creates the folder and its stamp when missing.
  void create() const;
  bool exists() const;

  std::string point_dir(const std::string& id) const;
  std::string point_lock(const std::string& id) const { return point_dir(id) + "/lock"; }
  std::string point_manifest(const std::string& id) const { return point_dir(id) + "/point.json"; }
  std::string point_failure(const std::string& id) const { return point_dir(id) + "/failed.json"; }
  std::string point_log(const std::string& id) const { return point_dir(id) + "/log.txt"; }
  /// Files of a calibration made by the sweep: `<folder>/calibrations/<model>-<id>` + suffix.
  std::string calibration_base(const PlannedCalibration& c) const;

  /// The manifest of a finished point, when the point is done (see above); else nothing and,
  /// with `why`, the reason.
  std::optional<nlohmann::json> done_manifest(const PlannedPoint& p,
                                              std::string* why = nullptr) const;
  bool calibration_done(const PlannedCalibration& c, std::string* why = nullptr) const;

  TaskStatus status(const PlannedPoint& p) const;
  TaskStatus status(const PlannedCalibration& c) const;

  /// Checks a manifest written by this store against `config` and the files beside it.
  static bool verify_manifest(const nlohmann::json& m, const nlohmann::json& config,
                              const std::string& dir, std::string* why);

 private:
  const Spec& spec_;
  std::string root_;
};

}  // namespace sparsim::sweep
