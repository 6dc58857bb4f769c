#pragma once
/// Sweep specifications: a TOML file that names the models, corpora and calibrations of a study,
/// the grid of its points (one list per axis), explicit extra points, the options every point
/// shares and the output folder (docs/sweep.md documents every key).
///
/// The sweep knows nothing about individual methods: a point is a sparsim subcommand (`eval` by
/// default) and its options. Every key of [options], [methods.NAME] and [[points]] other than
/// the few the sweep owns is passed to the subcommand as `--key value`, so a method added to
/// `eval` later is swept without changing this code.
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace sparsim::sweep {

/// How a model's calibration file comes about: an existing file, or `sparsim calibrate` run by
/// the sweep (once, shared by every point that needs it).
struct CalibrationSpec {
  std::string model;   ///< name in [models]
  std::string file;    ///< existing file as written (empty: computed by the sweep)
  std::string corpus;  ///< name in [corpora] (computed calibrations)
  nlohmann::json options = nlohmann::json::object();  ///< `sparsim calibrate` options
};

/// A point given explicitly in [[points]].
struct ExtraPoint {
  int index = 0;  ///< position in the file (for messages: points[index])
  std::string model, corpus, method;
  nlohmann::json options = nlohmann::json::object();  ///< scalars only
  bool calibration = false;
  bool calibration_set = false;  ///< the point says `calibration = …` itself
};

/// Rates that turn predicted FLOPs and bytes into predicted seconds ([cost]).
struct CostRates {
  double flops_per_second = 50e9;      ///< sustained compute of one point's threads
  double bytes_per_second = 20e9;      ///< sustained memory bandwidth
  double load_bytes_per_second = 1e9;  ///< model file read + dequantization
  double bytes_per_token = 4.0;        ///< corpus bytes per token (to count windows unread)
  double startup_seconds = 0.5;        ///< process start, tokenization, writing
};

/// How points run on a worker ([run]); not part of a point's identity (results are bitwise
/// identical for every thread count).
struct RunSpec {
  int threads = 0;                 ///< per point; 0: the worker's share of the cores
  std::string log_level = "warn";  ///< of each point's command
};

struct Spec {
  std::string path;              ///< absolute path of the spec file
  std::string dir;               ///< its folder (relative paths in the spec are relative to it)
  std::string name;              ///< [sweep] name: identifies the output folder
  std::string output;            ///< absolute output folder
  std::string command = "eval";  ///< subcommand every point runs
  std::map<std::string, std::string> models;            ///< name -> model as written
  std::map<std::string, std::string> corpora;           ///< name -> corpus as written
  std::map<std::string, CalibrationSpec> calibrations;  ///< by model name
  nlohmann::json options = nlohmann::json::object();    ///< shared options (scalars)
  /// Grid axes: model, corpus, method (names), then the option axes in sorted key order.
  std::vector<std::string> grid_models, grid_corpora, grid_methods;
  std::map<std::string, std::vector<nlohmann::json>> grid_axes;
  /// Per-method options: a scalar is fixed, an array is an axis of that method's points.
  std::map<std::string, nlohmann::json> methods;
  /// Per method: `calibration = true` in [methods.NAME].
  std::map<std::string, bool> method_calibration;
  std::vector<ExtraPoint> points;
  RunSpec run;
  CostRates cost;
  bool has_grid = false;
};

/// Reads and checks a spec file. Throws sparsim::Error naming the file, line and key at fault
/// (unknown keys, wrong types, empty axes, undefined names, options the sweep owns).
Spec load_spec(const std::string& path);

/// Keys the sweep sets itself; they may not appear among a point's options.
const std::vector<std::string>& reserved_option_keys();

/// Replaces every `${NAME}` in a path written in the spec by the environment variable NAME
/// (a spec can then name files under $HOME or a scratch folder and stay the same for every
/// user). Throws sparsim::Error naming the variable when it is not set.
std::string expand_vars(const std::string& s);

/// `value` as a command-line argument: shortest round-trip decimal for numbers, the text of a
/// string, "true"/"false" for booleans.
std::string option_text(const nlohmann::json& value);

}  // namespace sparsim::sweep
