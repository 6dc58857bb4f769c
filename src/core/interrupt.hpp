#pragma once
/// SIGINT and SIGTERM: a run stops at the next safe point, removes its temporary files, says in
/// one line which outputs were not written and exits with 128 + the signal (130, 143).
///
/// - The signal handler only records the signal and wakes a watchdog thread (async-signal-safe).
/// - The computation calls interruption_point() between kernels (engine layers, windows, tensors
///   being loaded, documents being tokenized). It throws Interrupted; unwinding destroys every
///   uncommitted output writer, which deletes its temporary file, and main() prints the line.
/// - When no interruption point is reached within kGraceSeconds, or a second signal arrives,
///   the watchdog removes every registered temporary file itself, prints the same line and ends
///   the process with _exit. Final-named files are only ever produced by a rename of a complete
///   temporary, so neither path (nor kill -9) can leave a partial file under a final name.
///
/// Output writers register their temporaries (add_temp / remove_temp) and the command declares
/// its final outputs (declare_output / output_written) so that the line can name them.
#include <stdexcept>
#include <string>

namespace sparsim {

/// Thrown at an interruption point after SIGINT or SIGTERM. Not a sparsim::Error, so that code
/// which catches errors to add context lets it pass unchanged.
class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(int signal);
  int signal() const noexcept { return signal_; }
  /// 128 + signal: 130 for SIGINT, 143 for SIGTERM.
  int exit_code() const noexcept { return 128 + signal_; }

 private:
  int signal_;
};

/// Seconds the watchdog waits for an interruption point before it ends the process itself.
inline constexpr double kGraceSeconds = 3.0;

/// Installs the SIGINT / SIGTERM handlers and starts the watchdog; `program` names the process
/// in the line it prints ("sparsim eval"). Later calls only change the name.
void install_interrupt_handlers(const std::string& program);

/// The signal received so far (0: none).
int interrupt_signal() noexcept;

/// Throws Interrupted when a signal was received: one atomic load otherwise.
void check_interrupt();

/// check_interrupt() at a named place of a run. For tests of the interruption paths,
/// SPARSIM_TEST_PAUSE=<where>[:hard] makes the first call at `where` print
/// "sparsim: paused at <where>" on stderr and wait (up to 60 s) for a signal: polling for it
/// (the normal path), or with ":hard" without polling, as a kernel that never returns would.
void interruption_point(const char* where);

namespace interrupt {

/// A temporary file the watchdog deletes when it has to end the process itself.
void add_temp(const std::string& path);
void remove_temp(const std::string& path);

/// A final output of the run; the interruption line lists those not yet written.
void declare_output(const std::string& path);
void output_written(const std::string& path);

/// A sentence appended to the interruption line (e.g. where completed work is kept); "" clears.
void set_note(const std::string& note);

/// "sparsim eval: interrupted by SIGINT; not written: run.h5, s.json (<note>)".
std::string message(int signal);

}  // namespace interrupt

}  // namespace sparsim
