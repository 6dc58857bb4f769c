#pragma once
/// Small facts about the process the sweep runs in.
#include <optional>
#include <string>

namespace sparsim::sweep {

/// The current time, ISO 8601 UTC with seconds ("2025-01-31T12:00:00Z").
std::string utc_now();
/// The short host name.
std::string host_name();
/// Absolute path of the running executable.
std::string self_exe();
/// An environment variable, when set and not empty.
std::optional<std::string> env(const char* name);
/// An environment variable as a positive integer, when set to one.
std::optional<int> env_int(const char* name);
/// Logical cores this process may run on (its CPU affinity).
int usable_cores();

}  // namespace sparsim::sweep
