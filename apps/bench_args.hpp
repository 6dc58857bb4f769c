#pragma once
// The options of sparsim bench and what its modes share: the throughput benchmark
// (bench_throughput.hpp), --baseline (bench_attention_module.hpp), --method token-filter
// (bench_token_filter.hpp), think / grace (bench_kv_prune.hpp) and --evict (bench_evict.hpp).
#include "common.hpp"
#include "core/timer.hpp"
#include "method_setup.hpp"
#include "model/loader.hpp"

#include <string>

namespace sparsim::app {

/// The parsed options of sparsim bench.
struct BenchArgs {
  CommonOptions co;
  std::string model, storage, json_out, run_out, skipping = "on", decode_path = "fused",
                                                 clock_name = "wall", baseline;
  int prompt = 512, decode = 128, reps = 3, batch = 1;
  bool profile = false, bf16_compute = false, graph = false, decode_only = false,
       kv_synthetic = false;
  MethodArgs ma;
  Clock clock = Clock::Wall;  ///< from clock_name, set by check()

  /// Adds the options to `d` (in the order --help lists them).
  void add_options(po::options_description& d);
  /// After parsing: checks the values and their combinations (and reads the calibration file);
  /// throws sparsim::Error naming the option.
  void check(const po::variables_map& vm);
};

/// What the bench modes share once the options are checked.
struct BenchRun {
  ResolvedModel model;
  LoadOptions load;
  std::string backend;
  int threads = 0;
  double load_start = -1;  ///< the machine's load average when the command started
  int argc = 0;
  char** argv = nullptr;
};

}  // namespace sparsim::app
