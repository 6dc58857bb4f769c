// sparsim sweep under Open MPI (mpirun -n 2 --oversubscribe): points handed to both ranks,
// results bitwise equal to the same points run one by one, and a rank killed with SIGKILL
// halfway costs only the points in flight.
#include "sweep_helpers.hpp"

#include <cstdlib>

namespace sparsim::test {
namespace {

using sweep::State;

std::string which(const std::string& prog) {
  const RunResult r = run_cmd("command -v " + prog);
  if (r.exit_code != 0) return {};
  std::string p = r.output;
  while (!p.empty() && (p.back() == '\n' || p.back() == ' ')) p.pop_back();
  return p;
}

/// mpirun with 2 ranks on this machine (root needs Open MPI's explicit consent). Under the
/// asan preset the ranks keep every AddressSanitizer check but not the exit-time leak report:
/// Open MPI's components, loaded with dlopen and unloaded at MPI_Finalize, leave allocations
/// whose frames LeakSanitizer can no longer name (so no suppression can match them).
std::string mpirun(const Study& s) {
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string asan_env =
      asan ? "ASAN_OPTIONS='" + std::string(asan) + ":detect_leaks=0' " : std::string();
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 " +
         asan_env + "exec timeout -s KILL 300 mpirun -n 2 --oversubscribe " + sparsim_bin() +
         " sweep " + s.spec() + " --threads 1";
}

class SweepMpi : public ::testing::Test {
 protected:
  void SetUp() override {
#if !SPARSIM_TEST_MPI
    GTEST_SKIP() << "sparsim was built with SPARSIM_MPI=OFF (the openmp preset turns it on)";
#endif
    if (which("mpirun").empty())
      GTEST_SKIP() << "mpirun is not installed (Debian: openmpi-bin; scripts/setup.sh installs it)";
  }
};

const std::string kSpec = spec_head("mpi", {"a", "b"}) + quick_calibration("a") + R"(
[options]
context = 128
stride = 64
max-windows = 4

[grid]
model = ["a", "b"]
corpus = ["text"]
method = ["dense"]
score = [8, 16, 24, 32]

[[points]]
model = "a"
corpus = "text"
method = "teal"
sparsity = 0.5
calibration = true
)";

TEST_F(SweepMpi, TwoRanksShareThePointsAndMatchDirectRunsBitwise) {
  Study s;
  s.add_model("a", 81);
  s.add_model("b", 82);
  s.write_spec(kSpec);
  const json plan = s.plan_json();
  ASSERT_EQ(plan["points"].size(), 9u);
  const RunResult r = run_cmd(mpirun(s));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 ranks"), std::string::npos) << r.output;
  EXPECT_EQ(s.status()["done"], 9);
  std::set<int> ranks;
  std::map<std::string, int> n;
  for (const auto& e : journal_events(s.out()))
    if (e["event"] == "start") {
      ranks.insert(e.value("rank", -1));
      ++n[e["id"].get<std::string>()];
    }
  EXPECT_EQ(ranks, (std::set<int>{0, 1})) << "both ranks should have run tasks";
  for (const auto& p : plan["points"]) EXPECT_EQ(n[p["id"].get<std::string>()], 1);
  expect_same_as_direct(s, plan, s.out());
}

TEST_F(SweepMpi, AKilledRankCostsOnlyThePointsInFlight) {
  Study s;
  s.add_model("a", 91);
  s.add_model("b", 92);
  s.write_spec(kSpec);
  const json plan = s.plan_json();
  std::vector<std::string> all;
  for (const auto& p : plan["points"]) all.push_back(p["id"]);
  auto v = s.view();
  std::string victim_note;
  {
    Background bg(mpirun(s), s.file("mpi1.log"));
    ASSERT_TRUE(wait_for(
        [&] {
          if (bg.exited()) return true;
          if (v->manifests() < 2) return false;
          for (const auto& p : v->plan.points) {
            const std::string lock = v->store->point_lock(p.id);
            if (!sweep::FileLock::held(lock)) continue;
            const std::string note = sweep::FileLock::note(lock);
            if (note.find("rank=1") != std::string::npos) {
              victim_note = note;
              return true;
            }
          }
          return false;
        },
        180))
        << read_file(s.file("mpi1.log"));
    ASSERT_FALSE(bg.exited()) << "the sweep finished before a rank could be killed\n"
                              << read_file(s.file("mpi1.log"));
    const std::size_t at = victim_note.find("pid=");
    ASSERT_NE(at, std::string::npos) << victim_note;
    const pid_t rank_pid = static_cast<pid_t>(std::stol(victim_note.substr(at + 4)));
    ASSERT_EQ(::kill(rank_pid, SIGKILL), 0) << victim_note;
    const int code = bg.wait(60);
    EXPECT_NE(code, 0) << "mpirun should report the killed rank\n" << read_file(s.file("mpi1.log"));
    EXPECT_NE(code, -1) << "mpirun did not end after a rank was killed";
  }
  ASSERT_TRUE(wait_for([&] { return v->locked() == 0; }, 30));
  const auto before = done_files(s.out(), all);
  EXPECT_GE(before.size(), 2u);
  EXPECT_LT(before.size(), all.size());

  const RunResult r = run_cmd(mpirun(s));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(s.status()["done"], 9);
  const auto after = done_files(s.out(), all);
  const auto n = starts(s.out());
  for (const auto& [id, files] : before) {
    EXPECT_TRUE(files == after.at(id)) << "finished point " << id << " was rewritten";
    EXPECT_EQ(n.at(id), 1) << "finished point " << id << " ran again";
  }
  expect_same_as_direct(s, plan, s.out());
}

}  // namespace
}  // namespace sparsim::test
