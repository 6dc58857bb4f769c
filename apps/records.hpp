#pragma once
// Groups every run file starts with: what ran, on what, with which model.
#include "io/hdf5.hpp"
#include "model/config.hpp"
#include "model/loader.hpp"

#include <string>

namespace sparsim::app {

/// The command line as one string (arguments joined by spaces).
std::string command_line(int argc, char** argv);

/// The machine's 1-minute load average (/proc/loadavg), -1 where it cannot be read.
double load_average();

/// Writes /run: command line, version, start time (UTC).
void write_run_group(io::Group root, int argc, char** argv);

/// Writes /run (command line, version, time), /backend (name, threads, Kokkos version, load
/// average at the time of writing) and
/// /model (path, fingerprint, hyper-parameters, storage type).
void write_run_header(io::Group root, int argc, char** argv, const std::string& backend,
                      int threads, const ModelInfo& mi, const Config& cfg, DType storage,
                      bool bf16_compute = false);

/// Writes /pruned for a pruned model: the method, the retain ratio and the per-layer widths,
/// kept channels and cost fractions (nothing for a dense model).
void write_prune_group(io::Group root, const Config& cfg);

}  // namespace sparsim::app
