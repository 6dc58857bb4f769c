// sparsim sweep --slurm on a real one-node Slurm cluster (Debian's slurmctld, slurmd and munge,
// configured in a temporary folder by tests/cluster/slurm_cluster.sh and always stopped): the
// sweep runs as a job array; an array task killed with SIGKILL halfway and a requeued task
// lose nothing, and a resubmission completes exactly the missing points, bitwise equal to the
// same points run one by one.
#include "sweep_helpers.hpp"

#include <cstdlib>

namespace sparsim::test {
namespace {

using sweep::State;

/// A running one-node cluster for the life of the object.
class SlurmCluster {
 public:
  explicit SlurmCluster(const std::string& dir) : dir_(dir) {
    fs::create_directories(dir);
    const RunResult r = run_cmd(script() + " start " + dir + " " + std::to_string(::getpid()));
    status_ = r.exit_code;
    output_ = r.output;
    if (r.exit_code == 0) {
      std::string conf = r.output;
      while (!conf.empty() && (conf.back() == '\n' || conf.back() == ' ')) conf.pop_back();
      const std::size_t nl = conf.rfind('\n');
      conf_ = nl == std::string::npos ? conf : conf.substr(nl + 1);
    }
  }
  ~SlurmCluster() {
    if (status_ == 0) run_cmd(script() + " stop " + dir_);
  }
  int status() const { return status_; }
  const std::string& output() const { return output_; }
  /// Environment prefix for commands that talk to this cluster.
  std::string env() const { return "SLURM_CONF=" + conf_ + " PATH=/usr/bin:/bin:/usr/sbin:/sbin "; }
  std::string logs() const {
    return read_file(dir_ + "/slurmctld.log").substr(0, 4000) + "\n" +
           read_file(dir_ + "/slurmd.log").substr(0, 4000);
  }
  /// Jobs of this cluster still queued or running.
  std::string queue() const {
    const RunResult r = run_cmd(env() + "squeue -h -o '%i %T'");
    return r.output;
  }

 private:
  static std::string script() {
    return std::string(SPARSIM_SOURCE_DIR) + "/tests/cluster/slurm_cluster.sh";
  }
  std::string dir_, conf_, output_;
  int status_ = -1;
};

const std::string kSpec = spec_head("slurm", {"a", "b"}) + R"(
[options]
context = 128
stride = 64
max-windows = 4

[run]
threads = 1

[grid]
model = ["a", "b"]
corpus = ["text"]
method = ["dense"]
score = [8, 16, 24, 32, 40]
)";

class SweepSlurm : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* p : {"slurmctld", "slurmd", "munged", "sbatch"})
      if (run_cmd(std::string("PATH=$PATH:/usr/sbin:/sbin command -v ") + p).exit_code != 0)
        GTEST_SKIP() << p
                     << " is not installed (Debian: slurmctld, slurmd, slurm-client, munge; "
                        "scripts/setup.sh installs them)";
  }
};

TEST_F(SweepSlurm, JobArrayKilledTaskRequeueAndResubmission) {
  Study s;
  s.add_model("a", 101);
  s.add_model("b", 102);
  s.write_spec(kSpec);
  SlurmCluster cluster(s.file("cluster"));
  ASSERT_EQ(cluster.status(), 0) << cluster.output();
  const json plan = s.plan_json();
  std::vector<std::string> all;
  for (const auto& p : plan["points"]) all.push_back(p["id"]);
  ASSERT_EQ(all.size(), 10u);
  auto v = s.view();

  // 1. submit: two array tasks of five points each
  const RunResult sub = run_cmd(cluster.env() + sparsim_bin() + " sweep " + s.spec() +
                                " --slurm --time 00:10:00 --chunks 2 --cpus-per-task 1");
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  ASSERT_NE(sub.output.find("submitted: job"), std::string::npos) << sub.output;

  // 2. kill -9 an array task's sweep while it runs a point
  std::string note;
  ASSERT_TRUE(wait_for(
      [&] {
        if (v->manifests() < 2) return false;
        for (const auto& p : v->plan.points) {
          const std::string lock = v->store->point_lock(p.id);
          if (!sweep::FileLock::held(lock)) continue;
          note = sweep::FileLock::note(lock);
          if (note.find("slurm=") != std::string::npos) return true;
        }
        return false;
      },
      180))
      << cluster.queue() << cluster.logs();
  const std::size_t at = note.find("pid=");
  ASSERT_NE(at, std::string::npos) << note;
  ASSERT_EQ(::kill(static_cast<pid_t>(std::stol(note.substr(at + 4))), SIGKILL), 0) << note;
  // the other task finishes its chunk; the killed one fails
  ASSERT_TRUE(wait_for([&] { return cluster.queue().empty(); }, 180)) << cluster.queue();
  ASSERT_TRUE(wait_for([&] { return v->locked() == 0; }, 30));
  auto before = done_files(s.out(), all);
  EXPECT_GE(before.size(), 2u);
  ASSERT_LT(before.size(), all.size()) << "nothing was left for the resubmission";

  // 3. resubmit: only the missing points; requeue the task while it runs, it resumes
  const RunResult sub2 = run_cmd(cluster.env() + sparsim_bin() + " sweep " + s.spec() +
                                 " --slurm --time 00:10:00 --chunks 1 --cpus-per-task 1");
  ASSERT_EQ(sub2.exit_code, 0) << sub2.output;
  const json chunks = json::parse(read_file(s.out() + "/slurm/1/chunks.json"));
  ASSERT_EQ(chunks["chunks"].size(), 1u);
  EXPECT_EQ(chunks["chunks"][0].size(), all.size() - before.size());
  const std::string job = [&] {
    std::string j = read_file(s.out() + "/slurm/1/job_id");
    while (!j.empty() && j.back() == '\n') j.pop_back();
    return j;
  }();
  const std::size_t done_at_submit = before.size();
  bool requeued = false;
  if (wait_for(
          [&] {
            return static_cast<std::size_t>(v->manifests()) > done_at_submit && v->locked() >= 1;
          },
          120)) {
    const RunResult rq = run_cmd(cluster.env() + "scontrol requeue " + job + "_0");
    requeued = rq.exit_code == 0;
    EXPECT_TRUE(requeued) << rq.output;
    // Slurm holds a requeued job for two minutes (BeginTime); let it start again at once.
    const std::string state = cluster.env() + "squeue -h -o '%T %r' -j " + job + "_0";
    EXPECT_TRUE(
        wait_for([&] { return run_cmd(state).output.find("PENDING") != std::string::npos; }, 60))
        << cluster.queue();
    EXPECT_TRUE(wait_for(
        [&] {
          run_cmd(cluster.env() + "scontrol update JobId=" + job + "_0 StartTime=now");
          return run_cmd(state).output.find("BeginTime") == std::string::npos;
        },
        60))
        << cluster.queue();
  }
  ASSERT_TRUE(wait_for([&] { return v->manifests() == 10 && v->locked() == 0; }, 240))
      << cluster.queue() << read_file(s.out() + "/slurm/1/logs/task-" + job + "_0.out");
  ASSERT_TRUE(wait_for([&] { return cluster.queue().empty(); }, 60)) << cluster.queue();

  const auto after = done_files(s.out(), all);
  const auto n = starts(s.out());
  for (const auto& [id, files] : before) {
    EXPECT_TRUE(files == after.at(id)) << "finished point " << id << " was rewritten";
    EXPECT_EQ(n.at(id), 1) << "finished point " << id << " ran again";
  }
  for (const auto& id : all) EXPECT_LE(n.at(id), 3) << id;
  if (requeued) {
    // the requeued task restarted and skipped what it had finished
    const std::string log = read_file(s.out() + "/slurm/1/logs/task-" + job + "_0.out");
    EXPECT_NE(log.find("restart 1"), std::string::npos) << log;
  }
  expect_same_as_direct(s, plan, s.out());
  const RunResult col = run_cmd(sparsim_bin() + " collect " + s.spec());
  ASSERT_EQ(col.exit_code, 0) << col.output;
  EXPECT_EQ(read_csv(s.out() + "/results.csv").size(), 10u);
}

}  // namespace
}  // namespace sparsim::test
