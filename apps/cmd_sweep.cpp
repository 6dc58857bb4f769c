// sparsim sweep: a grid of evaluations from a spec file, run resumably by one process, by the
// ranks of an MPI job, or by a Slurm job array; sparsim collect: the results table.
#include "common.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "io/run_file.hpp"
#include "sweep/collect.hpp"
#include "sweep/mpi.hpp"
#include "sweep/plan.hpp"
#include "sweep/point_files.hpp"
#include "sweep/slurm.hpp"
#include "sweep/spec.hpp"
#include "sweep/store.hpp"
#include "sweep/util.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

namespace sparsim::app {

int (*command_function(const std::string& name))(int, char**);

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace sparsim::sweep;

const char* kUsage =
    "usage: sparsim sweep SPEC [--plan | --status | --collect | --slurm] [options]\n"
    "       mpirun -n N sparsim sweep SPEC          (one task per rank at a time)\n"
    "       sparsim collect SPEC                     (same as sweep SPEC --collect)\n\n"
    "Runs every point of the spec that is not done yet; a rerun after any failure completes\n"
    "only what is missing. The spec format is described in docs/sweep.md.";

/// Runs `args` (a subcommand and its options) with --check-options in this process and
/// returns the options it printed.
json check_in_process(const std::vector<std::string>& args) {
  auto fn = command_function(args.at(0));
  require(fn != nullptr, "'{}' is not a sparsim command", args[0]);
  std::vector<std::string> a = args;
  a.push_back("--check-options");
  std::vector<char*> av;
  for (auto& s : a) av.push_back(s.data());
  av.push_back(nullptr);
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  int rc = 0;
  try {
    rc = fn(static_cast<int>(a.size()), av.data());
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
  require(rc == 0, "exit code {}", rc);
  try {
    return json::parse(captured.str());
  } catch (const json::exception&) {
    return json::object();  // a command that checked but printed nothing to read
  }
}

PlanHooks hooks(bool check) {
  PlanHooks h;
  h.resolve_model = [](const std::string& m) { return resolve_model(m).path; };
  if (check)
    h.check_options = [](const std::vector<std::string>& args) {
      try {
        return check_in_process(args);
      } catch (const Error& e) {
        const std::string what = e.what();
        // A command without --check-options: its options are checked when it runs.
        if (what.find("check-options") != std::string::npos) return json::object();
        throw;
      }
    };
  return h;
}

std::string human_seconds(double s) {
  if (s < 120) return fmt::format("{:.1f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}

void print_plan(const Spec& spec, const Plan& plan, const Store& store) {
  double total = 0;
  for (const auto& p : plan.points) total += p.predicted.seconds;
  std::cout << fmt::format("sweep {}  ({} points, {} calibration{}; output {})\n", spec.name,
                           plan.points.size(), plan.calibrations.size(),
                           plan.calibrations.size() == 1 ? "" : "s", spec.output);
  if (plan.duplicates)
    std::cout << fmt::format("  {} explicit point(s) repeat grid points and are run once\n",
                             plan.duplicates);
  for (const auto& c : plan.calibrations)
    std::cout << fmt::format("  calibration {} of {}: {}{}\n", c.id, c.model,
                             c.computed ? "made by the sweep, " : "given, ", c.file);
  std::cout << fmt::format("\n  {:<16} {:<8} {:>10} {:>10} {:>9} {:>10}  {}\n", "id", "state",
                           "GFLOP", "GFLOP real", "GB", "predicted", "point");
  for (const auto& p : plan.points) {
    const TaskStatus st = store.exists() ? store.status(p) : TaskStatus{};
    std::string label = fmt::format("{}/{} {}", p.model, p.corpus, p.method);
    for (const auto& [k, v] : p.options.items()) label += fmt::format(" {}={}", k, option_text(v));
    std::cout << fmt::format("  {:<16} {:<8} {:>10.2f} {:>10.2f} {:>9.2f} {:>10}  {}\n", p.id,
                             to_string(st.state), p.predicted.flops_dense / 1e9,
                             p.predicted.flops_realised / 1e9, p.predicted.bytes_realised / 1e9,
                             human_seconds(p.predicted.seconds), label);
  }
  std::cout << fmt::format(
      "\n  predicted total {} (rates from [cost]: {:.0f} GFLOP/s, {:.0f} GB/s, model load "
      "{:.1f} GB/s)\n",
      human_seconds(total), spec.cost.flops_per_second / 1e9, spec.cost.bytes_per_second / 1e9,
      spec.cost.load_bytes_per_second / 1e9);
}

json status_json(const Plan& plan, const Store& store) {
  json j;
  int counts[4] = {0, 0, 0, 0};
  json failures = json::array(), running = json::array(), pending = json::array();
  for (const auto& p : plan.points) {
    const TaskStatus st = store.exists() ? store.status(p) : TaskStatus{State::Pending, "not run"};
    ++counts[static_cast<int>(st.state)];
    if (st.state == State::Failed) failures.push_back({{"id", p.id}, {"message", st.message}});
    if (st.state == State::Running) running.push_back({{"id", p.id}, {"holder", st.message}});
    if (st.state == State::Pending) pending.push_back({{"id", p.id}, {"why", st.message}});
  }
  j["points"] = plan.points.size();
  j["done"] = counts[static_cast<int>(State::Done)];
  j["running"] = counts[static_cast<int>(State::Running)];
  j["failed"] = counts[static_cast<int>(State::Failed)];
  j["pending"] = counts[static_cast<int>(State::Pending)];
  j["failures"] = failures;
  j["running_points"] = running;
  j["pending_points"] = pending;
  json cals = json::array();
  for (const auto& c : plan.calibrations) {
    const TaskStatus st =
        store.exists() || !c.computed ? store.status(c) : TaskStatus{State::Pending, "not run"};
    cals.push_back({{"id", c.id},
                    {"model", c.model},
                    {"file", c.file},
                    {"state", to_string(st.state)},
                    {"message", st.message}});
  }
  j["calibrations"] = cals;
  return j;
}

void print_status(const Spec& spec, const json& s) {
  std::cout << fmt::format("sweep {} ({})\n", spec.name, spec.output);
  std::cout << fmt::format("  points {}: done {}, running {}, failed {}, pending {}\n",
                           s["points"].get<int>(), s["done"].get<int>(), s["running"].get<int>(),
                           s["failed"].get<int>(), s["pending"].get<int>());
  for (const auto& c : s["calibrations"])
    std::cout << fmt::format("  calibration {} of {}: {}{}\n", c["id"].get<std::string>(),
                             c["model"].get<std::string>(), c["state"].get<std::string>(),
                             c["state"] == "failed" || c["state"] == "running"
                                 ? "  " + c["message"].get<std::string>()
                                 : "");
  for (const auto& r : s["running_points"])
    std::cout << fmt::format("  running {}  {}\n", r["id"].get<std::string>(),
                             r["holder"].get<std::string>());
  for (const auto& f : s["failures"])
    std::cout << fmt::format("  failed  {}  {}\n", f["id"].get<std::string>(),
                             f["message"].get<std::string>());
}

int do_collect(const Spec& spec, const Plan& plan, const Store& store) {
  require(store.exists(), "nothing to collect: the output folder '{}' does not exist yet",
          spec.output);
  store.check_owner();
  const Table t = build_table(spec, plan, store);
  const std::string h5 = spec.output + "/results.h5", csv = spec.output + "/results.csv";
  write_table(spec, t, h5, csv);
  std::cout << fmt::format("collected {} of {} points into {} and {}\n", t.rows, plan.points.size(),
                           h5, csv);
  for (const auto& s : t.skipped) std::cout << "  not done: " << s << "\n";
  return 0;
}

/// Threads for each task of this worker.
int task_threads(int cli, const Spec& spec, int local_size, int jobs) {
  if (cli > 0) return cli;
  if (spec.run.threads > 0) return spec.run.threads;
  if (auto c = env_int("SLURM_CPUS_PER_TASK")) return *c;
  return std::max(1, usable_cores() / std::max(1, local_size * jobs));
}

/// The GPU each task of this rank sees: one per rank on a node, by local rank.
std::optional<std::string> task_gpu(int local_rank, int local_size) {
  if (local_size <= 1) return std::nullopt;
  if (auto v = env("CUDA_VISIBLE_DEVICES")) {
    std::vector<std::string> ids;
    std::stringstream ss(*v);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) ids.push_back(item);
    if (ids.size() <= 1) return std::nullopt;  // the launcher already gave this rank its GPU
    return ids[static_cast<std::size_t>(local_rank) % ids.size()];
  }
#ifdef KOKKOS_ENABLE_CUDA
  return std::to_string(local_rank);
#else
  return std::nullopt;
#endif
}

int summarize(const SweepResult& r, double seconds, bool quiet) {
  if (!quiet) {
    std::cout << fmt::format(
        "\nsweep: {} points: {} done now, {} done before, {} failed{}{} ({})\n", r.points, r.done,
        r.done_before, r.failed,
        r.elsewhere ? fmt::format(", {} running elsewhere", r.elsewhere) : std::string(),
        r.interrupted ? fmt::format(", {} interrupted", r.interrupted) : std::string(),
        human_seconds(seconds));
    for (const auto& [id, msg] : r.failures) std::cout << "  failed " << id << ": " << msg << "\n";
  }
  if (interrupted()) return 128 + interrupt_signal();
  return r.ok() ? 0 : 1;
}

std::vector<int> chunk_subset(const Plan& plan, const std::string& chunk_file, int chunk) {
  std::vector<std::string> ids;
  check_as_options([&] { ids = read_chunk(chunk_file, chunk); });
  std::map<std::string, int> index;
  for (int i = 0; i < static_cast<int>(plan.points.size()); ++i)
    index[plan.points[static_cast<std::size_t>(i)].id] = i;
  std::vector<int> subset;
  for (const auto& id : ids) {
    auto it = index.find(id);
    if (it == index.end()) {
      log().warn("chunk {}: point {} is no longer in the spec; skipped", chunk, id);
      continue;
    }
    subset.push_back(it->second);
  }
  return subset;
}

bool on_path(const std::string& prog) {
  const auto path = env("PATH");
  if (!path) return false;
  std::stringstream ss(*path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    if (::access((dir + "/" + prog).c_str(), X_OK) == 0) return true;
  }
  return false;
}

/// Runs a command and returns (exit status, stdout+stderr).
std::pair<int, std::string> run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  require(p != nullptr, "cannot run '{}'", cmd);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

int do_slurm(const Spec& spec, const Plan& plan, const Store& store, const SlurmOptions& so,
             bool submit) {
  int limit = 0;
  check_as_options([&] { limit = parse_time_limit(so.time); });
  std::vector<int> pending;
  int done = 0, running = 0;
  for (int i = 0; i < static_cast<int>(plan.points.size()); ++i) {
    const TaskStatus st =
        store.exists() ? store.status(plan.points[static_cast<std::size_t>(i)]) : TaskStatus{};
    if (st.state == State::Done)
      ++done;
    else if (st.state == State::Running)
      ++running;
    else
      pending.push_back(i);
  }
  if (pending.empty()) {
    std::cout << fmt::format("sweep {}: nothing to submit ({} done, {} running)\n", spec.name, done,
                             running);
    return 0;
  }
  std::vector<double> secs;
  for (const auto& p : plan.points) secs.push_back(p.predicted.seconds);
  // A chunk waits for a calibration another chunk makes, at most once: leave it room.
  double cal_max = 0;
  for (const auto& c : plan.calibrations)
    if (c.computed && !store.calibration_done(c)) cal_max = std::max(cal_max, c.predicted.seconds);
  const double budget = std::max(1.0, limit * so.fill - cal_max);
  const auto chunks = make_chunks(secs, pending, budget, so.chunks, so.max_array);
  store.create();
  // slurm/<n>: the next free number.
  int n = 0;
  std::error_code ec;
  while (fs::exists(fmt::format("{}/slurm/{}", spec.output, n), ec)) ++n;
  const std::string dir = fmt::format("{}/slurm/{}", spec.output, n);
  fs::create_directories(dir + "/logs", ec);
  require(!ec, "cannot create '{}': {}", dir, ec.message());
  json cj = {{"spec", spec.path}, {"name", spec.name}, {"created_utc", utc_now()}};
  json arr = json::array();
  double longest = 0;
  for (const auto& c : chunks) {
    json ids = json::array();
    double s = 0;
    for (int i : c) {
      ids.push_back(plan.points[static_cast<std::size_t>(i)].id);
      s += secs[static_cast<std::size_t>(i)];
    }
    longest = std::max(longest, s);
    arr.push_back(ids);
  }
  cj["chunks"] = arr;
  const std::string chunk_file = dir + "/chunks.json";
  write_atomically(chunk_file, io::json_file_text(cj, 1), false);
  const std::string script = dir + "/job.sbatch";
  write_atomically(script,
                   sbatch_script(spec, so, self_exe(), chunk_file, dir + "/logs",
                                 static_cast<int>(chunks.size())),
                   false);
  fs::permissions(script, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add, ec);
  std::cout << fmt::format(
      "sweep {}: {} pending point{} in {} array task{} (longest chunk predicted {} of the {} "
      "limit)\n  script {}\n",
      spec.name, pending.size(), pending.size() == 1 ? "" : "s", chunks.size(),
      chunks.size() == 1 ? "" : "s", human_seconds(longest), so.time, script);
  if (longest > limit)
    std::cout << "  warning: a point is predicted to take longer than the time limit; its task "
                 "will requeue itself at the limit and may never finish: raise --time\n";
  if (!submit) {
    std::cout << "  not submitted (--no-submit): sbatch " << script << "\n";
    return 0;
  }
  if (!on_path("sbatch")) {
    std::cout << "  sbatch is not on PATH here: submit it on the cluster with  sbatch " << script
              << "\n";
    return 0;
  }
  const auto [rc, out] = run_capture("sbatch --parsable " + shell_quote(script));
  require(rc == 0, "sbatch failed (exit code {}): {}", rc, out);
  std::string id = out;
  while (!id.empty() && (id.back() == '\n' || id.back() == '\r')) id.pop_back();
  write_atomically(dir + "/job_id", id + "\n");
  std::cout << "  submitted: job " << id << "\n";
  return 0;
}

/// sweep's options, checked before the spec is read.
struct SweepArgs {
  std::string spec_path, chunk_file, log_level;
  bool plan_only = false, status = false, collect = false, slurm = false, as_json = false,
       no_submit = false, quiet = false;
  int jobs = 1, threads = 0, chunk = -1;
  SlurmOptions so;

  void add_options(po::options_description& d) {
    d.add_options()("spec", po::value(&spec_path), "the sweep specification (TOML)")(
        "plan", po::bool_switch(&plan_only),
        "print the points with their ids, state and predicted cost; run nothing")(
        "status", po::bool_switch(&status),
        "print done / running / failed / pending, with the failure messages")(
        "collect", po::bool_switch(&collect),
        "merge the finished points into results.h5 and results.csv in the output folder")(
        "json", po::bool_switch(&as_json), "--plan and --status print JSON")(
        "jobs,j", po::value(&jobs)->default_value(1), "points this process runs at once")(
        "threads", po::value(&threads)->default_value(0),
        "threads per point (0: [run] threads, else SLURM_CPUS_PER_TASK, else the cores shared "
        "among the ranks and jobs of this node)")("quiet,q", po::bool_switch(&quiet),
                                                  "no progress lines")(
        "log-level", po::value(&log_level)->default_value("info"),
        "sweep's own log level (points use [run] log-level)")(
        "slurm", po::bool_switch(&slurm),
        "write an sbatch job-array script for the pending points and submit it if sbatch exists")(
        "time", po::value(&so.time)->default_value("01:00:00"), "--slurm: time limit per task")(
        "partition", po::value(&so.partition), "--slurm: partition")(
        "account", po::value(&so.account), "--slurm: account")("qos", po::value(&so.qos),
                                                               "--slurm: quality of service")(
        "mem", po::value(&so.mem), "--slurm: memory per node, e.g. 32G")(
        "gpus-per-task", po::value(&so.gpus_per_task)->default_value(0), "--slurm: GPUs per task")(
        "cpus-per-task", po::value(&so.cpus_per_task)->default_value(0),
        "--slurm: CPUs per task (0: the cluster's default)")(
        "sbatch-option", po::value(&so.extra)->composing(),
        "--slurm: one more #SBATCH line, e.g. --sbatch-option=--constraint=a100 (repeatable)")(
        "chunks", po::value(&so.chunks)->default_value(0),
        "--slurm: number of array tasks (0: as the time limit needs)")(
        "max-requeue", po::value(&so.max_requeue)->default_value(3),
        "--slurm: times a task requeues itself when its time runs out")(
        "no-submit", po::bool_switch(&no_submit), "--slurm: write the script, do not submit it")(
        "chunk-file", po::value(&chunk_file),
        "run only one chunk of this chunk list (array tasks)")(
        "chunk", po::value(&chunk)->default_value(-1), "the chunk of --chunk-file to run");
  }

  void check() {
    require(!spec_path.empty(), "sweep: give the spec file (sparsim sweep SPEC)");
    require((plan_only ? 1 : 0) + (status ? 1 : 0) + (collect ? 1 : 0) + (slurm ? 1 : 0) <= 1,
            "--plan, --status, --collect and --slurm exclude each other");
    require(!as_json || plan_only || status, "--json goes with --plan or --status");
    require(jobs >= 1 && jobs <= 1024, "--jobs {} is out of range (1 … 1024)", jobs);
    require(threads >= 0 && threads <= 4096, "--threads {} is out of range", threads);
    require(chunk_file.empty() == (chunk < 0), "--chunk-file and --chunk go together");
    require(so.gpus_per_task >= 0 && so.cpus_per_task >= 0 && so.chunks >= 0 && so.max_requeue >= 0,
            "--gpus-per-task, --cpus-per-task, --chunks and --max-requeue must not be negative");
    set_log_level(log_level);
    if (slurm) check_as_options([&] { parse_time_limit(so.time); });
  }
};

/// One process: --plan, --status, --collect, --slurm, or the points run here (--jobs at once).
int sweep_here(const SweepArgs& a) {
  const Spec spec = load_spec(a.spec_path);
  const Store store(spec);
  // Planning reads headers and checks options: nothing is written before it succeeds.
  const Plan plan = make_plan(spec, hooks(!a.status && !a.collect));
  if (a.plan_only) {
    if (a.as_json) {
      json j = plan_json(spec, plan);
      if (store.exists()) {
        store.check_owner();
        for (std::size_t i = 0; i < plan.points.size(); ++i)
          j["points"][i]["state"] = to_string(store.status(plan.points[i]).state);
      }
      std::cout << io::json_file_text(j);
    } else {
      if (store.exists()) store.check_owner();
      print_plan(spec, plan, store);
    }
    return 0;
  }
  if (a.status) {
    if (store.exists()) store.check_owner();
    const json s = status_json(plan, store);
    if (a.as_json)
      std::cout << io::json_file_text(s);
    else
      print_status(spec, s);
    return 0;
  }
  if (a.collect) return do_collect(spec, plan, store);
  if (a.slurm) {
    store.check_owner();
    return do_slurm(spec, plan, store, a.so, !a.no_submit);
  }
  if (launched_by_mpi())
    log().warn(
        "started by an MPI launcher, but this sparsim was built without MPI (SPARSIM_MPI=OFF): "
        "each rank runs as a sweep of its own (the points' locks still keep any point from "
        "running twice)");
  store.create();
  LoopOptions lo;
  lo.jobs = a.jobs;
  lo.quiet = a.quiet;
  lo.worker.exe = self_exe();
  lo.worker.threads = task_threads(a.threads, spec, 1, a.jobs);
  lo.worker.log_level = spec.run.log_level;
  if (!a.chunk_file.empty()) {
    lo.subset = chunk_subset(plan, a.chunk_file, a.chunk);
    if (lo.subset.empty()) {
      std::cout << "sweep: chunk " << a.chunk << " holds no point of this spec\n";
      return 0;
    }
  }
  install_signal_handlers();
  Stopwatch wall;
  const SweepResult r = run_local(plan, store, lo);
  return summarize(r, wall.seconds(), a.quiet);
}

/// Under an MPI launcher: rank 0 checks everything and prepares the folder; every rank plans
/// the same way and the points are handed out over the ranks.
int sweep_mpi(const SweepArgs& a) {
  MpiWorld world(nullptr, nullptr);
  std::unique_ptr<Spec> spec;
  std::unique_ptr<Plan> plan;
  std::unique_ptr<Store> store;
  bool ok = true;
  try {
    spec = std::make_unique<Spec>(load_spec(a.spec_path));
    store = std::make_unique<Store>(*spec);
    plan = std::make_unique<Plan>(make_plan(*spec, hooks(world.rank() == 0)));
    if (world.rank() == 0) store->create();
  } catch (const Error& e) {
    if (world.rank() == 0) std::cerr << "sparsim sweep: error: " << e.what() << "\n";
    ok = false;
  }
  if (!world.agree(ok)) return 1;
  if (!ok) {
    std::cerr << "sparsim sweep: error: rank " << world.rank()
              << " could not plan what rank 0 planned\n";
    world.abort(1);
  }
  LoopOptions lo;
  lo.quiet = a.quiet || world.rank() != 0;
  lo.worker.exe = self_exe();
  lo.worker.rank = world.rank();
  lo.worker.threads = task_threads(a.threads, *spec, world.local_size(), 1);
  lo.worker.gpu = task_gpu(world.local_rank(), world.local_size());
  lo.worker.log_level = spec->run.log_level;
  if (!a.chunk_file.empty()) lo.subset = chunk_subset(*plan, a.chunk_file, a.chunk);
  install_signal_handlers();
  Stopwatch wall;
  const SweepResult r = run_mpi(*plan, *store, lo, world);
  if (interrupted()) {
    if (world.rank() == 0) summarize(r, wall.seconds(), a.quiet);
    world.abort(128 + interrupt_signal());
  }
  // Rank 0 speaks for the job (mpirun exits non-zero when any rank does).
  return world.rank() == 0 ? summarize(r, wall.seconds(), a.quiet) : 0;
}

}  // namespace

int cmd_sweep(int argc, char** argv) {
  SweepArgs a;
  po::options_description d("sparsim sweep options");
  a.add_options(d);
  po::positional_options_description pos;
  pos.add("spec", 1);
  po::variables_map vm;
  if (!parse(argc, argv, kUsage, d, vm, &pos)) return 0;
  a.check();
  const bool mpi =
      launched_by_mpi() && built_with_mpi() && !a.plan_only && !a.status && !a.collect && !a.slurm;
  return mpi ? sweep_mpi(a) : sweep_here(a);
}

int cmd_collect(int argc, char** argv) {
  std::vector<std::string> a;
  for (int i = 0; i < argc; ++i) a.emplace_back(argv[i]);
  bool help = false;
  for (const auto& s : a) help = help || s == "--help" || s == "-h";
  if (help) {
    std::cout << "usage: sparsim collect SPEC\n\nMerges every finished point of the sweep into "
                 "results.h5 (one dataset per column under /results) and results.csv in its "
                 "output folder (the same as sparsim sweep SPEC --collect).\n";
    return 0;
  }
  a.push_back("--collect");
  std::vector<char*> av;
  for (auto& s : a) av.push_back(s.data());
  av.push_back(nullptr);
  return cmd_sweep(static_cast<int>(a.size()), av.data());
}

}  // namespace sparsim::app
