#include "sweep/execute.hpp"

#include "core/error.hpp"
#include "core/timer.hpp"
#include "io/hdf5.hpp"
#include "sweep/lock.hpp"
#include "sweep/point_files.hpp"
#include "sweep/util.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

extern char** environ;

namespace sparsim::sweep {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* to_string(Outcome::Kind k) {
  switch (k) {
    case Outcome::Kind::Done:
      return "done";
    case Outcome::Kind::Failed:
      return "failed";
    case Outcome::Kind::AlreadyDone:
      return "already-done";
    case Outcome::Kind::Elsewhere:
      return "elsewhere";
    case Outcome::Kind::Interrupted:
      return "interrupted";
  }
  return "?";
}

json to_json(const TaskRef& t, const Outcome& o) {
  return {{"calibration", t.calibration},
          {"index", t.index},
          {"kind", static_cast<int>(o.kind)},
          {"message", o.message},
          {"seconds", o.seconds}};
}

void from_json(const json& j, TaskRef& t, Outcome& o) {
  t.calibration = j.at("calibration").get<bool>();
  t.index = j.at("index").get<int>();
  o.kind = static_cast<Outcome::Kind>(j.at("kind").get<int>());
  o.message = j.at("message").get<std::string>();
  o.seconds = j.at("seconds").get<double>();
}

// ---------------------------------------------------------------------------------------------
// signals

namespace {
std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) {
  g_signal.store(sig);
}
}  // namespace

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking waitpid returns EINTR and sees the flag
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
}

bool interrupted() {
  return g_signal.load() != 0;
}

int interrupt_signal() {
  return g_signal.load();
}

// ---------------------------------------------------------------------------------------------
// journal

Journal::Journal(std::string folder, int rank) : folder_(std::move(folder)), rank_(rank) {}

Journal::~Journal() {
  if (fd_ >= 0) ::close(fd_);
}

void Journal::event(const std::string& what, const TaskRef& t, const std::string& id,
                    const json& extra) {
  if (fd_ < 0) {
    std::error_code ec;
    fs::create_directories(folder_, ec);
    const std::string p = fmt::format("{}/{}-{}-{}.jsonl", folder_, host_name(), ::getpid(),
                                      std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count());
    fd_ = ::open(p.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) return;  // the journal is a record, never a reason to stop
  }
  json e = {
      {"t", utc_now()}, {"event", what},       {"task", t.calibration ? "calibration" : "point"},
      {"id", id},       {"host", host_name()}, {"pid", ::getpid()}};
  if (rank_ >= 0) e["rank"] = rank_;
  for (const auto& [k, v] : extra.items()) e[k] = v;
  const std::string line = e.dump() + "\n";
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return;
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  // a line the disk could not take in full leaves no torn tail behind (this worker is the
  // file's only writer, so its length before the line is the length to go back to)
  if (done != line.size() && ::ftruncate(fd_, st.st_size) != 0) return;
}

// ---------------------------------------------------------------------------------------------
// job

namespace {

/// The last error line of a command's log (or its last line), for failure messages.
std::string log_complaint(const std::string& log) {
  std::string text;
  try {
    text = read_text(log);
  } catch (const Error&) {
    return {};
  }
  if (text.size() > 16384) text = text.substr(text.size() - 16384);
  std::vector<std::string> lines;
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t j = text.find('\n', i);
    if (j == std::string::npos) j = text.size();
    std::string l = text.substr(i, j - i);
    while (!l.empty() && (l.back() == '\r' || l.back() == ' ')) l.pop_back();
    if (!l.empty()) lines.push_back(l);
    i = j + 1;
  }
  for (auto it = lines.rbegin(); it != lines.rend(); ++it)
    if (it->find("error") != std::string::npos || it->find("Error") != std::string::npos)
      return *it;
  return lines.empty() ? std::string() : lines.back();
}

std::string exit_text(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    const char* name = ::strsignal(s);
    return fmt::format("killed by signal {} ({})", s, name ? name : "?");
  }
  return "ended abnormally";
}

void remove_tree(const std::string& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

}  // namespace

struct Job::Impl {
  const Plan& plan;
  const Store& store;
  const WorkerOptions& opt;
  Journal& journal;
  TaskRef task;
  std::optional<FileLock> lock;
  std::string id, dir, work, log, failure;
  nlohmann::json config;
  pid_t pid = -1;
  Stopwatch clock;
  std::string started_utc;
  std::vector<std::string> argv;

  Impl(const Plan& p, const Store& s, const WorkerOptions& o, Journal& j, TaskRef t)
      : plan(p), store(s), opt(o), journal(j), task(t) {
    const std::string host = host_name();
    if (t.calibration) {
      const auto& c = plan.calibrations.at(static_cast<std::size_t>(t.index));
      id = c.id;
      config = c.config;
      const std::string base = store.calibration_base(c);
      dir = store.root() + "/calibrations";
      work = fmt::format("{}/.work-{}-{}-{}-{}", dir, c.model, c.id, host, ::getpid());
      log = base + ".log";
      failure = base + ".failed.json";
    } else {
      const auto& pt = plan.points.at(static_cast<std::size_t>(t.index));
      id = pt.id;
      config = pt.config;
      dir = store.point_dir(pt.id);
      work = fmt::format("{}/.work-{}-{}", dir, host, ::getpid());
      log = store.point_log(pt.id);
      failure = store.point_failure(pt.id);
    }
  }

  std::string lock_path() const {
    if (task.calibration)
      return store.calibration_base(plan.calibrations[static_cast<std::size_t>(task.index)]) +
             ".lock";
    return store.point_lock(id);
  }

  bool done_now() const {
    if (task.calibration)
      return store.calibration_done(plan.calibrations[static_cast<std::size_t>(task.index)]);
    return store.done_manifest(plan.points[static_cast<std::size_t>(task.index)]).has_value();
  }

  std::string note() const {
    std::string n = fmt::format("host={} pid={}", host_name(), ::getpid());
    if (opt.rank >= 0) n += fmt::format(" rank={}", opt.rank);
    if (auto j = env("SLURM_ARRAY_JOB_ID"))
      n += fmt::format(" slurm={}_{}", *j, env("SLURM_ARRAY_TASK_ID").value_or("?"));
    else if (auto j2 = env("SLURM_JOB_ID"))
      n += fmt::format(" slurm={}", *j2);
    n += " since=" + utc_now();
    return n;
  }

  /// Removes the work folders of earlier attempts (their processes are gone: we hold the lock).
  void clean_stale_work() const {
    std::error_code ec;
    const std::string prefix =
        task.calibration
            ? fmt::format(".work-{}-{}-",
                          plan.calibrations[static_cast<std::size_t>(task.index)].model, id)
            : std::string(".work-");
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) == 0) remove_tree(e.path().string());
    }
  }

  void build_argv() {
    argv.clear();
    argv.push_back(opt.exe);
    const std::vector<std::string>& args =
        task.calibration ? plan.calibrations[static_cast<std::size_t>(task.index)].args
                         : plan.points[static_cast<std::size_t>(task.index)].args;
    argv.insert(argv.end(), args.begin(), args.end());
    const auto own = owned_args(task.calibration, work, opt.threads, opt.log_level);
    argv.insert(argv.end(), own.begin(), own.end());
  }

  void spawn() {
    // Everything the child needs is prepared before fork: after it, only async-signal-safe
    // calls until exec.
    std::vector<char*> av;
    for (auto& a : argv) av.push_back(a.data());
    av.push_back(nullptr);
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      const std::string s(*e);
      if (opt.gpu && s.rfind("CUDA_VISIBLE_DEVICES=", 0) == 0) continue;
      envs.push_back(s);
    }
    if (opt.gpu) envs.push_back("CUDA_VISIBLE_DEVICES=" + *opt.gpu);
    std::vector<char*> ev;
    for (auto& e : envs) ev.push_back(e.data());
    ev.push_back(nullptr);
    const int logfd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (logfd < 0) fail("cannot create the log '{}': {}", log, std::strerror(errno));
    const int nullfd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t parent = ::getpid();
    const pid_t child = ::fork();
    if (child < 0) {
      const int e = errno;
      ::close(logfd);
      if (nullfd >= 0) ::close(nullfd);
      fail("cannot start a process: {}", std::strerror(e));
    }
    if (child == 0) {
      // The command dies with its worker (kill -9 of the sweep, a rank or an array task).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(137);
      struct sigaction sa {};
      sa.sa_handler = SIG_DFL;
      sigemptyset(&sa.sa_mask);
      for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &sa, nullptr);
      if (nullfd >= 0) ::dup2(nullfd, 0);
      ::dup2(logfd, 1);
      ::dup2(logfd, 2);
      ::execve(av[0], av.data(), ev.data());
      static const char msg[] = "sparsim sweep: error: cannot execute the task's command\n";
      (void)!::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    ::close(logfd);
    if (nullfd >= 0) ::close(nullfd);
    pid = child;
  }

  void publish_point() {
    const auto& p = plan.points[static_cast<std::size_t>(task.index)];
    const std::string run = work + "/run.h5", summary = work + "/summary.json";
    std::error_code ec;
    require(fs::is_regular_file(run, ec) && fs::is_regular_file(summary, ec),
            "the command succeeded but did not write run.h5 and summary.json");
    {
      io::H5File f = io::H5File::open_read(run);  // a complete HDF5 file
      f.close();
    }
    const json parsed = json::parse(read_text(summary));  // throws on a partial summary
    (void)parsed;
    remove_file(store.point_manifest(p.id));  // a stale manifest must not vouch for new files
    json files = json::object();
    for (const char* name : {"run.h5", "summary.json"}) {
      const std::string dst = dir + "/" + name;
      move_into_place(work + "/" + name, dst);
      const FileDigest d = digest(dst);
      files[name] = {{"bytes", d.bytes}, {"hash", d.hash}};
    }
    // The work folder goes before the manifest: a worker killed in between leaves a pending
    // point (run again), never a done point with an attempt's folder beside it.
    remove_tree(work);
    json m = {{"status", "done"},
              {"kind", "point"},
              {"id", p.id},
              {"config", p.config},
              {"files", files},
              {"command", argv},
              {"host", host_name()},
              {"pid", ::getpid()},
              {"threads", opt.threads},
              {"started_utc", started_utc},
              {"finished_utc", utc_now()},
              {"seconds", clock.seconds()},
              {"predicted_seconds", p.predicted.seconds},
              {"sparsim_version", SPARSIM_VERSION}};
    if (opt.rank >= 0) m["rank"] = opt.rank;
    write_atomically(store.point_manifest(p.id), m.dump(2) + "\n");
    remove_file(failure);
  }

  void publish_calibration() {
    const auto& c = plan.calibrations[static_cast<std::size_t>(task.index)];
    const std::string base = store.calibration_base(c);
    const std::string out = work + "/calibration.h5";
    std::error_code ec;
    require(fs::is_regular_file(out, ec), "the command succeeded but wrote no calibration file");
    {
      io::H5File f = io::H5File::open_read(out);
      f.close();
    }
    remove_file(base + ".json");
    move_into_place(out, base + ".h5");
    const FileDigest d = digest(base + ".h5");
    remove_tree(work);  // before the manifest, as for a point
    const std::string fname = fs::path(base + ".h5").filename().string();
    json m = {{"status", "done"},
              {"kind", "calibration"},
              {"id", c.id},
              {"config", c.config},
              {"files", {{fname, {{"bytes", d.bytes}, {"hash", d.hash}}}}},
              {"command", argv},
              {"host", host_name()},
              {"started_utc", started_utc},
              {"finished_utc", utc_now()},
              {"seconds", clock.seconds()},
              {"sparsim_version", SPARSIM_VERSION}};
    write_atomically(base + ".json", m.dump(2) + "\n");
    remove_file(failure);
  }

  void record_failure(const std::string& message) {
    json f = {{"id", id},          {"message", message},        {"host", host_name()},
              {"pid", ::getpid()}, {"finished_utc", utc_now()}, {"log", log}};
    try {
      write_atomically(failure, f.dump(2) + "\n");
    } catch (const Error&) {
      // Nowhere to record it (a full disk): the journal and the exit status still say so.
    }
  }

  Outcome finish(int status) {
    pid = -1;
    Outcome o;
    o.seconds = clock.seconds();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      try {
        if (task.calibration)
          publish_calibration();
        else
          publish_point();
        o.kind = Outcome::Kind::Done;
      } catch (const std::exception& e) {
        o.kind = Outcome::Kind::Failed;
        o.message = std::string("publishing the results failed: ") + e.what();
      }
    } else {
      o.kind = Outcome::Kind::Failed;
      const std::string why = log_complaint(log);
      o.message = why.empty() ? exit_text(status) : fmt::format("{} ({})", why, exit_text(status));
    }
    if (o.kind == Outcome::Kind::Failed) record_failure(o.message);
    remove_tree(work);
    journal.event(to_string(o.kind), task, id, {{"seconds", o.seconds}, {"message", o.message}});
    lock.reset();
    return o;
  }

  Outcome stop() {
    Outcome o{Outcome::Kind::Interrupted, "stopped by a signal", clock.seconds()};
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      int status = 0;
      bool gone = false;
      for (int i = 0; i < 100 && !gone; ++i) {
        const pid_t r = ::waitpid(pid, &status, WNOHANG);
        gone = r == pid || (r < 0 && errno == ECHILD);
        if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!gone) {
        ::kill(pid, SIGKILL);
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
      }
      pid = -1;
      remove_tree(work);
      journal.event("interrupted", task, id, {{"seconds", o.seconds}});
    }
    lock.reset();
    return o;
  }
};

Job::Job(const Plan& plan, const Store& store, const WorkerOptions& opt, Journal& journal,
         TaskRef task)
    : impl_(std::make_unique<Impl>(plan, store, opt, journal, task)), task_(task) {}

Job::~Job() {
  if (impl_ && impl_->pid > 0) impl_->stop();
}

std::optional<Outcome> Job::start() {
  Impl& m = *impl_;
  try {
    std::error_code ec;
    fs::create_directories(m.dir, ec);
    if (ec) fail("cannot create '{}': {}", m.dir, ec.message());
    m.lock = FileLock::try_acquire(m.lock_path(), m.note());
    if (!m.lock) {
      m.journal.event("elsewhere", m.task, m.id, {{"holder", FileLock::note(m.lock_path())}});
      return Outcome{Outcome::Kind::Elsewhere, FileLock::note(m.lock_path()), 0};
    }
    if (m.done_now()) {
      m.lock.reset();
      return Outcome{Outcome::Kind::AlreadyDone, {}, 0};
    }
    m.clean_stale_work();
    fs::create_directories(m.work, ec);
    if (ec) fail("cannot create '{}': {}", m.work, ec.message());
    m.build_argv();
    m.clock.reset();
    m.started_utc = utc_now();
    m.spawn();
    m.journal.event("start", m.task, m.id, {{"child", m.pid}});
    return std::nullopt;
  } catch (const std::exception& e) {
    Outcome o{Outcome::Kind::Failed, e.what(), m.clock.seconds()};
    if (m.lock) m.record_failure(o.message);
    remove_tree(m.work);
    m.journal.event("failed", m.task, m.id, {{"message", o.message}});
    m.lock.reset();
    return o;
  }
}

std::optional<Outcome> Job::poll() {
  Impl& m = *impl_;
  if (m.pid <= 0) return std::nullopt;
  int status = 0;
  const pid_t r = ::waitpid(m.pid, &status, WNOHANG);
  if (r == 0) return std::nullopt;
  if (r < 0) {
    if (errno == EINTR) return std::nullopt;
    status = 0x7f00;  // lost track of the child: report as failed
  }
  return m.finish(status);
}

Outcome Job::wait() {
  Impl& m = *impl_;
  while (true) {
    if (sweep::interrupted()) return m.stop();
    int status = 0;
    const pid_t r = ::waitpid(m.pid, &status, 0);
    if (r == m.pid) return m.finish(status);
    if (r < 0 && errno != EINTR) return m.finish(0x7f00);
  }
}

Outcome Job::interrupt() {
  return impl_->stop();
}

// ---------------------------------------------------------------------------------------------
// scheduler

Scheduler::Scheduler(const Plan& plan, const Store& store, const std::vector<int>& points)
    : plan_(plan), store_(store) {
  point_state_.assign(plan.points.size(), TS::Skipped);
  cal_state_.assign(plan.calibrations.size(), TS::Skipped);
  std::vector<int> mine = points;
  if (mine.empty())
    for (int i = 0; i < static_cast<int>(plan.points.size()); ++i) mine.push_back(i);
  for (int i : mine) {
    const auto& p = plan.points.at(static_cast<std::size_t>(i));
    if (store.done_manifest(p)) {
      point_state_[static_cast<std::size_t>(i)] = TS::Done;
      ++done_before_;
    } else {
      point_state_[static_cast<std::size_t>(i)] = TS::Pending;
      if (p.calibration >= 0) cal_state_[static_cast<std::size_t>(p.calibration)] = TS::Pending;
    }
    point_order_.push_back(i);
  }
  for (int c = 0; c < static_cast<int>(plan.calibrations.size()); ++c) {
    auto& st = cal_state_[static_cast<std::size_t>(c)];
    if (st != TS::Pending) continue;
    const auto& pc = plan.calibrations[static_cast<std::size_t>(c)];
    if (store.calibration_done(pc))
      st = TS::Done;
    else if (!pc.computed)
      st = TS::Failed;  // a given file that is missing (checked at planning; gone since)
    else
      cal_order_.push_back(c);
  }
  auto by_cost = [](const Cost& a, const Cost& b) { return a.seconds > b.seconds; };
  std::stable_sort(point_order_.begin(), point_order_.end(), [&](int a, int b) {
    return by_cost(plan.points[static_cast<std::size_t>(a)].predicted,
                   plan.points[static_cast<std::size_t>(b)].predicted);
  });
  std::stable_sort(cal_order_.begin(), cal_order_.end(), [&](int a, int b) {
    return by_cost(plan.calibrations[static_cast<std::size_t>(a)].predicted,
                   plan.calibrations[static_cast<std::size_t>(b)].predicted);
  });
}

void Scheduler::fail_point(int i, const std::string& msg) {
  point_state_[static_cast<std::size_t>(i)] = TS::Failed;
  ++failed_;
  const auto& p = plan_.points[static_cast<std::size_t>(i)];
  failures_.emplace_back(p.id, msg);
}

std::optional<TaskRef> Scheduler::next() {
  for (int c : cal_order_) {
    auto& st = cal_state_[static_cast<std::size_t>(c)];
    if (st == TS::Pending) {
      st = TS::Running;
      return TaskRef{true, c};
    }
  }
  for (int i : point_order_) {
    auto& st = point_state_[static_cast<std::size_t>(i)];
    if (st != TS::Pending) continue;
    const int c = plan_.points[static_cast<std::size_t>(i)].calibration;
    if (c >= 0) {
      const TS cs = cal_state_[static_cast<std::size_t>(c)];
      if (cs == TS::Failed) {
        const auto& pc = plan_.calibrations[static_cast<std::size_t>(c)];
        fail_point(i, fmt::format("its calibration {} ({}) failed", pc.id, pc.file));
        continue;
      }
      if (cs != TS::Done) continue;
    }
    st = TS::Running;
    return TaskRef{false, i};
  }
  return std::nullopt;
}

void Scheduler::finish(const TaskRef& t, const Outcome& o) {
  auto& st = t.calibration ? cal_state_[static_cast<std::size_t>(t.index)]
                           : point_state_[static_cast<std::size_t>(t.index)];
  switch (o.kind) {
    case Outcome::Kind::Done:
      st = TS::Done;
      if (!t.calibration) ++done_;
      break;
    case Outcome::Kind::AlreadyDone:
      st = TS::Done;
      if (!t.calibration) ++done_before_;
      break;
    case Outcome::Kind::Elsewhere:
      st = TS::External;
      break;
    case Outcome::Kind::Interrupted:
      st = TS::Skipped;
      if (!t.calibration) ++interrupted_;
      break;
    case Outcome::Kind::Failed:
      if (t.calibration) {
        st = TS::Failed;
        const auto& pc = plan_.calibrations[static_cast<std::size_t>(t.index)];
        failures_.emplace_back("calibration " + pc.id, o.message);
      } else {
        fail_point(t.index, o.message);
      }
      break;
  }
}

bool Scheduler::recheck() {
  bool changed = false;
  for (std::size_t c = 0; c < cal_state_.size(); ++c) {
    if (cal_state_[c] != TS::External) continue;
    const auto& pc = plan_.calibrations[c];
    if (store_.calibration_done(pc)) {
      cal_state_[c] = TS::Done;
      changed = true;
    } else if (!FileLock::held(store_.calibration_base(pc) + ".lock")) {
      cal_state_[c] = TS::Pending;  // its maker is gone: make it here
      changed = true;
    }
  }
  for (std::size_t i = 0; i < point_state_.size(); ++i) {
    if (point_state_[i] != TS::External) continue;
    const auto& p = plan_.points[i];
    if (store_.done_manifest(p)) {
      point_state_[i] = TS::Done;  // finished by the process that held it
      ++done_before_;
      changed = true;
    } else if (!FileLock::held(store_.point_lock(p.id))) {
      point_state_[i] = TS::Pending;  // its runner is gone: run it here
      changed = true;
    }
  }
  return changed;
}

bool Scheduler::waiting() const {
  for (std::size_t i = 0; i < point_state_.size(); ++i) {
    if (point_state_[i] != TS::Pending) continue;
    const int c = plan_.points[i].calibration;
    if (c >= 0) {
      const TS cs = cal_state_[static_cast<std::size_t>(c)];
      if (cs == TS::External || cs == TS::Running || cs == TS::Pending) return true;
    }
  }
  return false;
}

bool Scheduler::finished() const {
  for (TS s : cal_state_)
    if (s == TS::Running) return false;
  for (TS s : point_state_)
    if (s == TS::Running || s == TS::Pending) return false;
  return true;
}

int Scheduler::elsewhere() const {
  return static_cast<int>(std::count(point_state_.begin(), point_state_.end(), TS::External));
}

std::string task_label(const Plan& plan, const TaskRef& t) {
  if (t.calibration) {
    const auto& c = plan.calibrations.at(static_cast<std::size_t>(t.index));
    return fmt::format("{}  calibration of {}", c.id, c.model);
  }
  const auto& p = plan.points.at(static_cast<std::size_t>(t.index));
  std::string s = fmt::format("{}  {}/{} {}", p.id, p.model, p.corpus, p.method);
  for (const auto& [k, v] : p.options.items()) s += fmt::format(" {}={}", k, option_text(v));
  return s;
}

}  // namespace sparsim::sweep
