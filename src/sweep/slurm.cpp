#include "sweep/slurm.hpp"

#include "core/error.hpp"
#include "sweep/point_files.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace sparsim::sweep {

using json = nlohmann::json;

int parse_time_limit(const std::string& s) {
  auto bad = [&]() -> int {
    throw OptionError("slurm.time", "the Slurm time limit",
                      fmt::format("'{}' is not one of M, M:S, H:M:S, D-H, D-H:M or D-H:M:S", s));
  };
  auto number = [&](const std::string& t) {
    if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string::npos) bad();
    return std::stoi(t);
  };
  std::string rest = s;
  int days = -1;
  const std::size_t dash = s.find('-');
  if (dash != std::string::npos) {
    days = number(s.substr(0, dash));
    rest = s.substr(dash + 1);
  }
  std::vector<int> parts;
  std::stringstream ss(rest);
  std::string item;
  while (std::getline(ss, item, ':')) parts.push_back(number(item));
  if (!rest.empty() && rest.back() == ':') bad();
  long secs = 0;
  if (days >= 0) {
    // D-H, D-H:M, D-H:M:S
    if (parts.empty() || parts.size() > 3) bad();
    secs = days * 86400L + parts[0] * 3600L + (parts.size() > 1 ? parts[1] * 60L : 0) +
           (parts.size() > 2 ? parts[2] : 0);
  } else if (parts.size() == 1) {
    secs = parts[0] * 60L;
  } else if (parts.size() == 2) {
    secs = parts[0] * 60L + parts[1];
  } else if (parts.size() == 3) {
    secs = parts[0] * 3600L + parts[1] * 60L + parts[2];
  } else {
    bad();
  }
  require_setting(secs > 0 && secs < 366L * 86400L, "slurm.time", "the Slurm time limit",
                  "'{}' must be positive and under a year", s);
  return static_cast<int>(secs);
}

std::vector<std::vector<int>> make_chunks(const std::vector<double>& seconds,
                                          const std::vector<int>& points, double budget_s,
                                          int chunks, int max_chunks) {
  const int n = static_cast<int>(points.size());
  if (n == 0) return {};
  std::vector<int> order(points);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return seconds[static_cast<std::size_t>(a)] > seconds[static_cast<std::size_t>(b)];
  });
  auto pack = [&](int k) {
    std::vector<std::vector<int>> c(static_cast<std::size_t>(k));
    std::vector<double> load(static_cast<std::size_t>(k), 0.0);
    for (int p : order) {
      const std::size_t j =
          static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      c[j].push_back(p);
      load[j] += seconds[static_cast<std::size_t>(p)];
    }
    bool fits = true;
    for (std::size_t j = 0; j < c.size(); ++j)
      if (load[j] > budget_s && c[j].size() > 1) fits = false;
    return std::make_pair(c, fits);
  };
  const int cap = std::max(1, std::min(n, max_chunks));
  if (chunks > 0) return pack(std::min(chunks, cap)).first;
  double total = 0;
  for (int p : order) total += seconds[static_cast<std::size_t>(p)];
  int k = std::max(1, static_cast<int>(std::ceil(total / std::max(budget_s, 1e-9))));
  k = std::min(k, cap);
  while (true) {
    auto [c, fits] = pack(k);
    if (fits || k >= cap) {
      c.erase(std::remove_if(c.begin(), c.end(), [](const auto& v) { return v.empty(); }), c.end());
      return c;
    }
    ++k;
  }
}

namespace {
/// Single-quotes `s` for bash.
std::string shq(const std::string& s) {
  std::string q = "'";
  for (char ch : s) {
    if (ch == '\'')
      q += "'\\''";
    else
      q += ch;
  }
  return q + "'";
}
std::string job_name(const std::string& name) {
  std::string j = "sparsim-";
  for (char ch : name)
    j += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_') ? ch : '_';
  return j;
}
}  // namespace

std::string sbatch_script(const Spec& spec, const SlurmOptions& o, const std::string& exe,
                          const std::string& chunk_file, const std::string& log_dir, int n_chunks) {
  std::string s = "#!/bin/bash\n";
  s += fmt::format(
      "# sparsim sweep '{}': a job array over {} chunk{} of its pending points.\n"
      "# Written by `sparsim sweep {} --slurm`; every task runs the resumable sweep on its "
      "chunk.\n",
      spec.name, n_chunks, n_chunks == 1 ? "" : "s", spec.path);
  s += fmt::format("#SBATCH --job-name={}\n", job_name(spec.name));
  s += fmt::format("#SBATCH --array=0-{}\n", n_chunks - 1);
  s += fmt::format("#SBATCH --time={}\n", o.time);
  s += "#SBATCH --ntasks=1\n";
  if (o.cpus_per_task > 0) s += fmt::format("#SBATCH --cpus-per-task={}\n", o.cpus_per_task);
  if (o.gpus_per_task > 0) s += fmt::format("#SBATCH --gpus-per-task={}\n", o.gpus_per_task);
  if (!o.partition.empty()) s += fmt::format("#SBATCH --partition={}\n", o.partition);
  if (!o.account.empty()) s += fmt::format("#SBATCH --account={}\n", o.account);
  if (!o.qos.empty()) s += fmt::format("#SBATCH --qos={}\n", o.qos);
  if (!o.mem.empty()) s += fmt::format("#SBATCH --mem={}\n", o.mem);
  s += fmt::format("#SBATCH --output={}/task-%A_%a.out\n", log_dir);
  s += "#SBATCH --open-mode=append\n";
  s += "#SBATCH --requeue\n";
  s += fmt::format("#SBATCH --signal=B:USR1@{}\n", o.signal_seconds);
  for (const auto& e : o.extra) s += fmt::format("#SBATCH {}\n", e);
  s += fmt::format(
      "\n"
      "sparsim={}\n"
      "spec={}\n"
      "chunks={}\n"
      "max_requeue={}\n"
      "task=\"${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}\"\n"
      "\n"
      "# Near the time limit Slurm sends USR1 (--signal above): stop the running point cleanly\n"
      "# (it is discarded, never half-written) and requeue this task, which resumes its chunk.\n"
      "requeue() {{\n"
      "  echo \"sparsim sweep: time limit near; stopping task $task\"\n"
      "  kill -TERM \"$child\" 2>/dev/null\n"
      "  wait \"$child\"\n"
      "  if [ \"${{SLURM_RESTART_COUNT:-0}}\" -lt \"$max_requeue\" ]; then\n"
      "    echo \"sparsim sweep: requeueing $task\"\n"
      "    scontrol requeue \"$task\"\n"
      "  else\n"
      "    echo \"sparsim sweep: $task was requeued $max_requeue times; run sparsim sweep $spec "
      "--slurm again for what is left\"\n"
      "  fi\n"
      "  exit 0\n"
      "}}\n"
      "trap requeue USR1\n"
      "\n"
      "echo \"sparsim sweep: task $task (restart ${{SLURM_RESTART_COUNT:-0}}) on $(hostname)\"\n"
      "\"$sparsim\" sweep \"$spec\" --chunk-file \"$chunks\" --chunk \"$SLURM_ARRAY_TASK_ID\" &\n"
      "child=$!\n"
      "wait \"$child\"\n"
      "exit $?\n",
      shq(exe), shq(spec.path), shq(chunk_file), o.max_requeue);
  return s;
}

std::vector<std::string> read_chunk(const std::string& chunk_file, int index) {
  json j;
  try {
    j = json::parse(read_text(chunk_file));
  } catch (const json::exception& e) {
    fail("chunk file '{}' is damaged: {}", chunk_file, e.what());
  }
  require(j.contains("chunks") && j["chunks"].is_array(), "chunk file '{}' has no chunk list",
          chunk_file);
  const auto& c = j["chunks"];
  require_setting(index >= 0 && index < static_cast<int>(c.size()), "sweep.chunk",
                  "the chunk index", "{} is not in the chunk file '{}' (chunks 0 … {})", index,
                  chunk_file, static_cast<int>(c.size()) - 1);
  return c[static_cast<std::size_t>(index)].get<std::vector<std::string>>();
}

}  // namespace sparsim::sweep
