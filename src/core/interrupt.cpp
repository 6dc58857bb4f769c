#include "core/interrupt.hpp"

#include "core/error.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace sparsim {

namespace {

/// What the interruption line and the watchdog need. Allocated once and never destroyed: the
/// watchdog may still use it while the process runs its exit handlers.
struct Registry {
  std::timed_mutex mu;
  std::string program = "sparsim";
  std::vector<std::string> temps;
  struct Output {
    std::string path;
    bool existed = false;
    bool written = false;
  };
  std::vector<Output> outputs;
  std::string note;
};

Registry& reg() {
  static Registry* r = new Registry;
  return *r;
}

std::atomic<int> g_signal{0};
std::atomic<bool> g_acknowledged{false};
int g_pipe[2] = {-1, -1};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

extern "C" void sparsim_on_signal(int sig) {
  const int saved = errno;
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  const char c = 1;
  const ssize_t r = ::write(g_pipe[1], &c, 1);
  (void)r;
  errno = saved;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

std::string compose(Registry& r, int sig) {
  std::string m = r.program + ": interrupted by " + signal_name(sig);
  std::string missing;
  bool kept_earlier = false;
  for (const auto& o : r.outputs) {
    if (o.written) continue;
    missing += (missing.empty() ? "" : ", ") + o.path;
    kept_earlier = kept_earlier || o.existed;
  }
  if (!missing.empty()) {
    m += "; not written: " + missing;
    if (kept_earlier) m += " (files already there under these names are unchanged)";
  } else if (!r.outputs.empty()) {
    m += " after all outputs were written";
  }
  if (!r.note.empty()) m += "; " + r.note;
  return m;
}

/// The watchdog's way out: delete the temporaries, say so, end the process now.
[[noreturn]] void hard_exit() {
  const int sig = g_signal.load();
  Registry& r = reg();
  std::string m;
  if (r.mu.try_lock_for(std::chrono::milliseconds(500))) {
    for (const auto& t : r.temps) ::unlink(t.c_str());
    m = compose(r, sig) + "\n";
    r.mu.unlock();
  } else {
    m = std::string("sparsim: interrupted by ") + signal_name(sig) + "\n";
  }
  std::size_t off = 0;
  while (off < m.size()) {
    const ssize_t w = ::write(STDERR_FILENO, m.data() + off, m.size() - off);
    if (w <= 0) break;
    off += static_cast<std::size_t>(w);
  }
  ::_exit(128 + sig);
}

bool read_wakeup() {
  for (;;) {
    char c;
    const ssize_t n = ::read(g_pipe[0], &c, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

void watchdog() {
  if (!read_wakeup()) return;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kGraceSeconds);
  for (;;) {
    int timeout_ms = -1;
    if (!g_acknowledged.load()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) hard_exit();
      timeout_ms = static_cast<int>(left);
    }
    pollfd p{g_pipe[0], POLLIN, 0};
    const int rc = ::poll(&p, 1, timeout_ms);
    if (rc > 0 && read_wakeup()) hard_exit();  // a second signal: stop waiting
    if (rc < 0 && errno != EINTR) hard_exit();
  }
}

}  // namespace

Interrupted::Interrupted(int signal)
    : std::runtime_error(std::string("interrupted by ") + signal_name(signal)), signal_(signal) {}

void install_interrupt_handlers(const std::string& program) {
  {
    std::lock_guard<std::timed_mutex> lk(reg().mu);
    reg().program = program;
  }
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe(g_pipe) != 0) fail("cannot create the signal pipe: {}", std::strerror(errno));
    for (int fd : g_pipe) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    ::fcntl(g_pipe[1], F_SETFL, O_NONBLOCK);
    std::thread(watchdog).detach();
    struct sigaction sa {};
    sa.sa_handler = sparsim_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int s : {SIGINT, SIGTERM}) ::sigaction(s, &sa, nullptr);
  });
}

int interrupt_signal() noexcept {
  return g_signal.load(std::memory_order_relaxed);
}

void check_interrupt() {
  const int s = interrupt_signal();
  if (s == 0) return;
  g_acknowledged.store(true);
  throw Interrupted(s);
}

void interruption_point(const char* where) {
  static const std::string spec = [] {
    const char* e = std::getenv("SPARSIM_TEST_PAUSE");
    return std::string(e ? e : "");
  }();
  static std::atomic<bool> paused{false};
  if (!spec.empty() && !paused.load()) {
    const std::size_t colon = spec.find(':');
    const std::string at = spec.substr(0, colon);
    const bool hard = colon != std::string::npos && spec.substr(colon + 1) == "hard";
    if (at == where && !paused.exchange(true)) {
      std::fprintf(stderr, "sparsim: paused at %s\n", where);
      std::fflush(stderr);
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (std::chrono::steady_clock::now() < end && (hard || interrupt_signal() == 0))
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  check_interrupt();
}

namespace interrupt {

void add_temp(const std::string& path) {
  std::lock_guard<std::timed_mutex> lk(reg().mu);
  reg().temps.push_back(path);
}

void remove_temp(const std::string& path) {
  std::lock_guard<std::timed_mutex> lk(reg().mu);
  auto& t = reg().temps;
  t.erase(std::remove(t.begin(), t.end(), path), t.end());
}

void declare_output(const std::string& path) {
  std::lock_guard<std::timed_mutex> lk(reg().mu);
  Registry::Output o;
  o.path = path;
  o.existed = ::access(path.c_str(), F_OK) == 0;
  reg().outputs.push_back(o);
}

void output_written(const std::string& path) {
  std::lock_guard<std::timed_mutex> lk(reg().mu);
  for (auto& o : reg().outputs)
    if (o.path == path) o.written = true;
}

void set_note(const std::string& note) {
  std::lock_guard<std::timed_mutex> lk(reg().mu);
  reg().note = note;
}

std::string message(int signal) {
  std::lock_guard<std::timed_mutex> lk(reg().mu);
  return compose(reg(), signal);
}

}  // namespace interrupt

}  // namespace sparsim
