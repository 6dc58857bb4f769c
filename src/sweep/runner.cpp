#include "sweep/runner.hpp"

#include "core/error.hpp"
#include "sweep/util.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <thread>

namespace sparsim::sweep {

namespace {
std::string clock_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return buf;
}
}  // namespace

void Reporter::report(const TaskRef& t, const Outcome& o, int rank) {
  if (!t.calibration && (o.kind == Outcome::Kind::Done || o.kind == Outcome::Kind::Failed))
    ++finished_;
  if (quiet_ || o.kind == Outcome::Kind::AlreadyDone) return;
  std::string line = fmt::format("[{}] {:<11}", clock_now(), to_string(o.kind));
  if (!t.calibration)
    line += fmt::format(" {:>{}}/{}", finished_, std::to_string(total_).size(), total_);
  line += "  " + task_label(plan_, t);
  if (o.kind == Outcome::Kind::Done || o.kind == Outcome::Kind::Failed)
    line += fmt::format("  {:.1f} s", o.seconds);
  if (rank >= 0) line += fmt::format("  (rank {})", rank);
  if (!o.message.empty()) line += "\n      " + o.message;
  std::cout << line << std::endl;
}

void Reporter::note(const std::string& line) {
  if (!quiet_) std::cout << "[" << clock_now() << "] " << line << std::endl;
}

SweepResult result_of(const Scheduler& s) {
  SweepResult r;
  r.points = s.points();
  r.done_before = s.done_before();
  r.done = s.done();
  r.failed = s.failed();
  r.elsewhere = s.elsewhere();
  r.interrupted = s.interrupted();
  r.failures = s.failures();
  return r;
}

SweepResult run_local(const Plan& plan, const Store& store, const LoopOptions& opt) {
  Scheduler sched(plan, store, opt.subset);
  Journal journal(store.root() + "/journal", opt.worker.rank);
  Reporter rep(plan, sched.points(), opt.quiet);
  if (sched.done_before() > 0)
    rep.note(fmt::format("{} of {} points already done", sched.done_before(), sched.points()));
  std::vector<std::unique_ptr<Job>> slots(static_cast<std::size_t>(std::max(1, opt.jobs)));
  auto busy = [&] {
    for (const auto& s : slots)
      if (s) return true;
    return false;
  };
  auto last_recheck = std::chrono::steady_clock::now();
  while (true) {
    if (interrupted()) {
      for (auto& s : slots)
        if (s) {
          const Outcome o = s->interrupt();
          sched.finish(s->task(), o);
          rep.report(s->task(), o);
          s.reset();
        }
      break;
    }
    bool progressed = false;
    for (auto& s : slots) {
      if (s) {
        if (auto o = s->poll()) {
          sched.finish(s->task(), *o);
          rep.report(s->task(), *o);
          s.reset();
          progressed = true;
        }
      }
      while (!s) {
        auto t = sched.next();
        if (!t) break;
        auto job = std::make_unique<Job>(plan, store, opt.worker, journal, *t);
        if (auto o = job->start()) {
          sched.finish(*t, *o);
          rep.report(*t, *o);
          progressed = true;
          continue;
        }
        s = std::move(job);
        progressed = true;
      }
    }
    if (!busy()) {
      if (sched.finished()) {
        // Points another process held: finished there meanwhile, or free to run here now.
        if (!sched.recheck()) break;
        continue;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (sched.waiting() && now - last_recheck > std::chrono::milliseconds(500)) {
      sched.recheck();
      last_recheck = now;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(busy() ? 5 : 200));
  }
  return result_of(sched);
}

}  // namespace sparsim::sweep
