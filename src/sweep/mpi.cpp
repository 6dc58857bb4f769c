#include "sweep/mpi.hpp"

#include "core/error.hpp"
#include "sweep/util.hpp"

#ifdef SPARSIM_HAVE_MPI
#include <mpi.h>
#endif

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <thread>

namespace sparsim::sweep {

bool built_with_mpi() {
#ifdef SPARSIM_HAVE_MPI
  return true;
#else
  return false;
#endif
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                        "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE", "I_MPI_HYDRA_TOPOLIB"})
    if (env(v)) return true;
  return false;
}

#ifdef SPARSIM_HAVE_MPI

namespace {
constexpr int kTagTask = 11;
constexpr int kTagResult = 12;
constexpr int kTagStop = 13;
}  // namespace

MpiWorld::MpiWorld(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
}

MpiWorld::~MpiWorld() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

bool MpiWorld::agree(bool ok_on_root) const {
  int v = ok_on_root ? 1 : 0;
  MPI_Bcast(&v, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return v != 0;
}

void MpiWorld::barrier() const {
  MPI_Barrier(MPI_COMM_WORLD);
}

void MpiWorld::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

namespace {

SweepResult worker_loop(const Plan& plan, const Store& store, const LoopOptions& opt) {
  Journal journal(store.root() + "/journal", opt.worker.rank);
  SweepResult mine;
  while (true) {
    // Waiting for work by polling with sleeps: a blocking receive would spin a core that the
    // other ranks' tasks (or a calibration being made) need.
    MPI_Status st;
    int buf[2] = {0, 0};
    MPI_Request req;
    MPI_Irecv(buf, 2, MPI_INT, 0, MPI_ANY_TAG, MPI_COMM_WORLD, &req);
    int arrived = 0;
    while (true) {
      MPI_Test(&req, &arrived, &st);
      if (arrived) break;
      if (interrupted()) {
        MPI_Cancel(&req);
        MPI_Request_free(&req);
        return mine;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (st.MPI_TAG == kTagStop) break;
    const TaskRef t{buf[0] != 0, buf[1]};
    Job job(plan, store, opt.worker, journal, t);
    Outcome o;
    if (auto now = job.start())
      o = *now;
    else
      o = job.wait();
    if (!t.calibration) {
      mine.done += o.kind == Outcome::Kind::Done;
      mine.failed += o.kind == Outcome::Kind::Failed;
      mine.interrupted += o.kind == Outcome::Kind::Interrupted;
    }
    const std::string msg = to_json(t, o).dump();
    MPI_Send(msg.data(), static_cast<int>(msg.size()), MPI_CHAR, 0, kTagResult, MPI_COMM_WORLD);
  }
  return mine;
}

}  // namespace

SweepResult run_mpi(const Plan& plan, const Store& store, const LoopOptions& opt,
                    const MpiWorld& world) {
  if (world.rank() != 0) return worker_loop(plan, store, opt);

  Scheduler sched(plan, store, opt.subset);
  Journal journal(store.root() + "/journal", 0);
  Reporter rep(plan, sched.points(), opt.quiet);
  rep.note(fmt::format("{} ranks; {} of {} points already done", world.size(), sched.done_before(),
                       sched.points()));
  std::vector<int> idle;
  for (int r = world.size() - 1; r >= 1; --r) idle.push_back(r);
  std::map<int, TaskRef> busy;
  std::unique_ptr<Job> local;
  auto last_recheck = std::chrono::steady_clock::now();
  while (true) {
    if (interrupted()) {
      if (local) {
        const Outcome o = local->interrupt();
        sched.finish(local->task(), o);
        local.reset();
      }
      break;
    }
    bool progressed = false;
    int flag = 0;
    MPI_Status st;
    while (MPI_Iprobe(MPI_ANY_SOURCE, kTagResult, MPI_COMM_WORLD, &flag, &st) == MPI_SUCCESS &&
           flag) {
      int n = 0;
      MPI_Get_count(&st, MPI_CHAR, &n);
      std::string msg(static_cast<std::size_t>(n), '\0');
      MPI_Recv(msg.data(), n, MPI_CHAR, st.MPI_SOURCE, kTagResult, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      TaskRef t;
      Outcome o;
      from_json(nlohmann::json::parse(msg), t, o);
      sched.finish(t, o);
      rep.report(t, o, st.MPI_SOURCE);
      busy.erase(st.MPI_SOURCE);
      idle.push_back(st.MPI_SOURCE);
      progressed = true;
    }
    if (local) {
      if (auto o = local->poll()) {
        sched.finish(local->task(), *o);
        rep.report(local->task(), *o, 0);
        local.reset();
        progressed = true;
      }
    }
    // Free ranks first (they do nothing else), then rank 0's own slot.
    while (!idle.empty()) {
      auto t = sched.next();
      if (!t) break;
      const int r = idle.back();
      idle.pop_back();
      int buf[2] = {t->calibration ? 1 : 0, t->index};
      MPI_Send(buf, 2, MPI_INT, r, kTagTask, MPI_COMM_WORLD);
      busy[r] = *t;
      progressed = true;
    }
    while (!local) {
      auto t = sched.next();
      if (!t) break;
      auto job = std::make_unique<Job>(plan, store, opt.worker, journal, *t);
      if (auto o = job->start()) {
        sched.finish(*t, *o);
        rep.report(*t, *o, 0);
        continue;
      }
      local = std::move(job);
      progressed = true;
    }
    if (busy.empty() && !local && sched.finished()) {
      if (!sched.recheck()) break;
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (sched.waiting() && now - last_recheck > std::chrono::milliseconds(500)) {
      sched.recheck();
      last_recheck = now;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!interrupted())
    for (int r = 1; r < world.size(); ++r)
      MPI_Send(nullptr, 0, MPI_INT, r, kTagStop, MPI_COMM_WORLD);
  return result_of(sched);
}

#else  // without MPI: a world of one

MpiWorld::MpiWorld(int*, char***) {}
MpiWorld::~MpiWorld() = default;
bool MpiWorld::agree(bool ok_on_root) const {
  return ok_on_root;
}
void MpiWorld::barrier() const {}
void MpiWorld::abort(int code) const {
  std::exit(code);
}

SweepResult run_mpi(const Plan& plan, const Store& store, const LoopOptions& opt, const MpiWorld&) {
  return run_local(plan, store, opt);
}

#endif

}  // namespace sparsim::sweep
