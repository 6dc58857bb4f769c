#pragma once
/// A sweep's plan: the spec expanded into points (each with a stable id, the command line it
/// runs and its predicted cost) and the calibrations they share.
#include "sweep/cost.hpp"
#include "sweep/spec.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace sparsim::sweep {

/// A calibration file the points of a model use: given (`computed` false) or made by the sweep.
struct PlannedCalibration {
  std::string id;     ///< 16 hex digits over `config`
  std::string model;  ///< model name
  bool computed = false;
  std::string file;               ///< absolute path (inside the output folder when computed)
  nlohmann::json config;          ///< identity: model, corpus and calibrate options as written
  std::vector<std::string> args;  ///< "calibrate" and its options, without --out (computed)
  Cost predicted;
};

struct PlannedPoint {
  std::string id;  ///< 16 hex digits over `config`
  /// Identity: command, model and corpus as written in the spec, method, options as written
  /// (shared, per method, per axis), and the calibration's id.
  nlohmann::json config;
  std::string model, corpus, method;  ///< names in the spec
  nlohmann::json options;  ///< every option passed to the command except model/corpus/method
  int calibration = -1;    ///< index into Plan::calibrations, or -1
  /// The command and its arguments, without the sweep-owned --out, --json, --threads,
  /// --progress and --log-level: {"eval", "--model", PATH, …}.
  std::vector<std::string> args;
  Cost predicted;
  std::string origin;  ///< "grid" or "points[i]"
};

struct Plan {
  std::vector<PlannedCalibration> calibrations;
  std::vector<PlannedPoint> points;  ///< in spec order (grid first, then [[points]])
  int duplicates = 0;                ///< explicit points equal to a grid point (dropped)
};

/// What planning needs from the command line program.
struct PlanHooks {
  /// A model as written in the spec (already joined to the spec folder when relative and
  /// existing) to a file or directory path; throws sparsim::Error when it does not exist.
  std::function<std::string(const std::string&)> resolve_model;
  /// Runs `args` (a subcommand and its options) in option-checking mode: returns the resolved
  /// options, throws sparsim::Error with the command's own complaint. Null: no checking.
  std::function<nlohmann::json(const std::vector<std::string>&)> check_options;
};

/// Expands the spec. Every problem found (missing model, corpus or calibration file, an option
/// the command rejects or a value out of range for its method) is collected; if there is any,
/// throws one sparsim::Error listing them all, each naming its point or key. Reads model
/// headers (for the cost) but no weights.
Plan make_plan(const Spec& spec, const PlanHooks& hooks);

/// The plan as JSON (for --plan --json): points with id, labels, options, command and cost.
nlohmann::json plan_json(const Spec& spec, const Plan& plan);

/// The options the sweep itself adds to a task's command: where the outputs go (inside the
/// task's work folder `work`), the thread count, no progress bar, the log level.
std::vector<std::string> owned_args(bool calibration, const std::string& work, int threads,
                                    const std::string& log_level);

/// 16 hex digits: FNV-1a 64 of `text`.
std::string hash_hex(const std::string& text);

}  // namespace sparsim::sweep
