#pragma once
/// The FLOP / byte ledger of a run file, read back: what `sparsim flops` reports and what the
/// cost model (cost/roofline.hpp) predicts time from.
///
/// Generic over the ledger's contents: phases, ops and layers are taken from the name datasets
/// of /flops (docs/run-file-schema.md), so ops added to flops::Op later need no change here.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sparsim::flops {

/// One entry (or a sum of entries) of the ledger.
struct Cell {
  double flops_dense = 0;
  double flops_realised = 0;
  double bytes_dense = 0;
  double bytes_realised = 0;
  double launches = 0;  ///< launches the op took part in (a fused kernel counts for each op)
  double kernels = 0;   ///< distinct launches, counted on the op owning the kernel

  Cell& operator+=(const Cell& o) {
    flops_dense += o.flops_dense;
    flops_realised += o.flops_realised;
    bytes_dense += o.bytes_dense;
    bytes_realised += o.bytes_realised;
    launches += o.launches;
    kernels += o.kernels;
    return *this;
  }
  /// Anything recorded (an op computed inside another op's kernel has FLOPs but no launches).
  bool used() const {
    return launches > 0 || flops_dense > 0 || flops_realised > 0 || bytes_dense > 0 ||
           bytes_realised > 0;
  }
  /// An op a dense run does not have (mask selection, rotation, a gate's similarity test, …):
  /// its whole cost is what the method adds.
  bool method_overhead() const {
    return flops_dense == 0 && bytes_dense == 0 && (flops_realised > 0 || bytes_realised > 0);
  }
};

/// What ran: identity of the run and of its model (from /run, /backend, /model, /config).
struct RunInfo {
  std::string path;     ///< the run file
  std::string command;  ///< /run command
  std::string version;  ///< sparsim version that wrote it
  std::int64_t schema_version = 0;
  std::string backend;  ///< /backend name ("" when absent)
  std::int64_t threads = 0;
  double load_average = -1;                     ///< /backend load_average (-1: not recorded)
  std::string model_name, model_path, storage;  ///< /model name, path, storage (f32, bf16, f16)
  std::int64_t n_layer = 0, d_model = 0, n_params = 0;
  std::string method = "dense";  ///< /config method or /sparsity method, else "dense"
};

/// Per-op times measured by a profiled run (`sparsim bench --out`): /op_times.
struct MeasuredProfile {
  std::vector<std::string> phases, ops;
  std::vector<double> op_seconds;  ///< [phase][op], summed over the profiled calls
  /// For each op, the timer it was measured under (an op computed inside another op's kernel
  /// is timed with it, e.g. attn_softmax under attn_score).
  std::vector<std::string> timer;
  std::vector<std::int64_t> calls;   ///< [phase] profiled forward calls
  std::vector<std::int64_t> tokens;  ///< [phase] token rows of the profiled calls
  /// [phase] medians of unprofiled (no fences between kernels) timings of one call.
  std::vector<double> call_seconds_median;
  std::vector<std::int64_t> call_tokens;  ///< [phase] tokens of one timed call
  double op_seconds_at(std::size_t phase, std::size_t op) const {
    return op_seconds[phase * ops.size() + op];
  }
};

/// The /flops tables of a run file, indexed [phase][op][layer slot] like the file.
struct LedgerFile {
  RunInfo run;
  std::vector<std::string> phases;
  std::vector<std::string> ops;
  std::vector<std::string> layers;        ///< slot names ("non-layer", "0", "1", …)
  std::vector<std::int64_t> layer_index;  ///< transformer layer of each slot (-1: none)
  std::vector<Cell> cells;                ///< [phase][op][slot]
  std::vector<std::int64_t> calls;        ///< [phase] forward calls recorded
  std::vector<std::int64_t> tokens;       ///< [phase] token rows recorded
  std::optional<MeasuredProfile> measured;

  std::size_t num_phases() const { return phases.size(); }
  std::size_t num_ops() const { return ops.size(); }
  std::size_t num_slots() const { return layers.size(); }
  const Cell& at(std::size_t phase, std::size_t op, std::size_t slot) const {
    return cells[(phase * ops.size() + op) * layers.size() + slot];
  }
  Cell phase_total(std::size_t phase) const;
  Cell op_total(std::size_t phase, std::size_t op) const;
  Cell slot_total(std::size_t phase, std::size_t slot) const;
  /// Index of a phase / op by name, -1 when absent.
  int phase_index(const std::string& name) const;
  int op_index(const std::string& name) const;
};

/// Reads the ledger of run file `path`. Throws sparsim::Error with a message naming the file
/// and the problem: not HDF5, not a sparsim run file, an older or newer schema, no /flops group
/// (a run of a command that keeps no ledger), tables of inconsistent shapes, negative or
/// non-finite entries.
LedgerFile read_ledger_file(const std::string& path);

}  // namespace sparsim::flops
