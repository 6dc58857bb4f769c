#pragma once
#include <sys/resource.h>

#include <chrono>

namespace sparsim {
/// Wall-clock stopwatch (steady clock).
class Stopwatch {
 public:
  Stopwatch() : t0_(std::chrono::steady_clock::now()) {}
  void reset() { t0_ = std::chrono::steady_clock::now(); }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::chrono::steady_clock::time_point t0_;
};

/// CPU seconds (user + system) spent by this process, all threads together.
inline double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/// Wall and CPU time since construction (or the last reset): on a shared machine the CPU time
/// says what a run costs when the wall time mostly says how busy the machine was.
class StageClock {
 public:
  StageClock() { reset(); }
  void reset() {
    wall_.reset();
    cpu0_ = process_cpu_seconds();
  }
  double wall() const { return wall_.seconds(); }
  double cpu() const { return process_cpu_seconds() - cpu0_; }

 private:
  Stopwatch wall_;
  double cpu0_ = 0;
};
}  // namespace sparsim
