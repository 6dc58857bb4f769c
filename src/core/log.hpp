#pragma once
/// Logging to stderr through spdlog; stdout is reserved for results.
#include <spdlog/spdlog.h>

namespace sparsim {
/// The process-wide logger ("sparsim", stderr).
spdlog::logger& log();
/// Sets the level from a name: trace, debug, info, warn, error, off.
void set_log_level(const std::string& level);
}  // namespace sparsim
