#pragma once
#include <sys/resource.h>
#include <time.h>

#include <chrono>

namespace sparsim {

/// What a stopwatch measures: elapsed (wall) time, or the CPU time the whole process used (all
/// its threads; with one thread, what the work took even when the machine is shared and the
/// thread waits for a core).
enum class Clock { Wall, ProcessCpu };

/// Seconds on `clock` since an arbitrary origin.
inline double clock_seconds(Clock clock) {
  if (clock == Clock::ProcessCpu) {
    timespec ts{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Stopwatch on the wall clock (steady clock) or the process's CPU time.
class Stopwatch {
 public:
  explicit Stopwatch(Clock clock = Clock::Wall) : clock_(clock), t0_(clock_seconds(clock)) {}
  void reset() { t0_ = clock_seconds(clock_); }
  double seconds() const { return clock_seconds(clock_) - t0_; }

 private:
  Clock clock_;
  double t0_;
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
