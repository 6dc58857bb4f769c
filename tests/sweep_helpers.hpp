#pragma once
// Shared by the sweep tests: a study folder (tiny synthetic models, a generated corpus, a spec),
// running sparsim in the foreground or background, reading the output folder, and comparing a
// sweep's points bit for bit with the same points run one by one by `sparsim eval`.
#include "core/error.hpp"
#include "helpers.hpp"
#include "io/hdf5.hpp"
#include "sweep/lock.hpp"
#include "sweep/plan.hpp"
#include "sweep/store.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace sparsim::test {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A model a little larger than tiny_config, so that a point takes long enough (a few tenths
/// of a second) to be caught while it runs.
inline SynthSpec small_spec(std::uint64_t seed) {
  SynthSpec s;
  s.cfg = tiny_config();
  s.cfg.n_layer = 4;
  s.cfg.d_model = 128;
  s.cfg.n_head = 4;
  s.cfg.n_kv_head = 2;
  s.cfg.head_dim = 32;
  s.cfg.d_ff = 384;
  s.cfg.context_length = 512;
  s.seed = seed;
  return s;
}

/// A background process (its own process group, killed with the test if the test dies).
class Background {
 public:
  explicit Background(const std::string& shell_cmd, const std::string& log) {
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(137);
      ::setpgid(0, 0);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execl("/bin/sh", "sh", "-c", shell_cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0 && !exited_) {
      ::kill(-pid_, SIGKILL);
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
  }
  pid_t pid() const { return pid_; }
  /// True once the process has exited (status in `code`: exit code, or 128 + signal).
  bool exited(int* code = nullptr) {
    if (!exited_) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    if (exited_ && code) *code = code_;
    return exited_;
  }
  /// Waits at most `seconds`; returns the exit code or -1 on a timeout.
  int wait(double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int code = -1;
    while (!exited(&code)) {
      if (std::chrono::steady_clock::now() > end) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return code;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
};

/// The tables a test spec starts with: [sweep] (its name and output folder), [models] (model
/// "x" is the study folder's x.gguf) and [corpora] (`corpora`: its lines, by default the
/// study's generated corpus as "text").
inline std::string spec_head(const std::string& name, const std::vector<std::string>& models,
                             const std::string& output = "out",
                             const std::string& corpora = "text = \"corpus.txt\"\n") {
  std::string s =
      fmt::format("\n[sweep]\nname = \"{}\"\noutput = \"{}\"\n\n[models]\n", name, output);
  for (const auto& m : models) s += fmt::format("{} = \"{}.gguf\"\n", m, m);
  return s + "\n[corpora]\n" + corpora;
}

/// A [calibration.<model>] table that calibrates in a moment: 2 windows of 64 tokens of the
/// corpus "text", one greedy sequence of 16 tokens, α 0.2, one probe at s = 0.5.
inline std::string quick_calibration(const std::string& model) {
  return fmt::format(
      "\n[calibration.{}]\ncorpus = \"text\"\ncontext = 64\nmax-windows = 2\ngreedy-seqs = 1\n"
      "greedy-tokens = 16\nalpha = 0.2\nprobes = \"0.5\"\n",
      model);
}

/// A spec whose TEAL points read the calibration file `file` of model a (one that does not
/// exist, for the checks that refuse it).
inline std::string missing_calibration_spec(const std::string& name, const std::string& file) {
  return spec_head(name, {"a"}) + fmt::format(R"(
[calibration.a]
file = "{}"
[grid]
model = ["a"]
corpus = ["text"]
method = ["teal"]
[methods.teal]
calibration = true
sparsity = [0.5]
)",
                                              file);
}

/// Polls `cond` every few milliseconds for at most `seconds`.
inline bool wait_for(const std::function<bool()>& cond, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

/// A study folder: models a.gguf, b.gguf (…), corpus.txt, and spec.toml written by write_spec.
class Study {
 public:
  Study() { write_word_corpus(dir_.file("corpus.txt"), 99, 3000); }
  const TempDir& dir() const { return dir_; }
  std::string file(const std::string& n) const { return dir_.file(n); }
  std::string spec() const { return dir_.file("spec.toml"); }
  std::string out() const { return dir_.file("out"); }

  void add_model(const std::string& name, std::uint64_t seed, bool small = true) {
    write_synth_gguf(small ? small_spec(seed) : tiny_spec(seed), dir_.file(name + ".gguf"));
  }
  void write_spec(const std::string& toml) { write_text(spec(), toml); }

  /// sparsim sweep SPEC <args>, in the foreground.
  RunResult sweep(const std::string& args = "") const {
    return run_cmd(sparsim_bin() + " sweep " + spec() + " " + args);
  }
  json status() const {
    const RunResult r = sweep("--status --json");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    try {
      return json::parse(r.output);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "status is not JSON: " << r.output;
      return json::object();
    }
  }
  json plan_json() const {
    const RunResult r = sweep("--plan --json");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return json::parse(r.output);
  }

  /// The library's view of the folder (plan without option checks), for fast polling.
  struct View {
    sweep::Spec spec;
    sweep::Plan plan;
    std::unique_ptr<sweep::Store> store;
    int count(sweep::State s) const {
      int n = 0;
      for (const auto& p : plan.points) n += store->status(p).state == s;
      return n;
    }
    /// Cheap counts for polling (no hashing): manifests present, locks held.
    int manifests() const {
      int n = 0;
      for (const auto& p : plan.points) n += fs::exists(store->point_manifest(p.id));
      return n;
    }
    int locked() const {
      int n = 0;
      for (const auto& p : plan.points) n += sweep::FileLock::held(store->point_lock(p.id));
      return n;
    }
  };
  std::unique_ptr<View> view() const {
    auto v = std::make_unique<View>();
    v->spec = sweep::load_spec(spec());
    v->plan = sweep::make_plan(v->spec, {});
    v->store = std::make_unique<sweep::Store>(v->spec);
    return v;
  }

 private:
  TempDir dir_;
};

/// Every journal event of an output folder.
inline std::vector<json> journal_events(const std::string& out) {
  std::vector<json> ev;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out + "/journal", ec)) {
    std::istringstream in(read_file(e.path().string()));
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) ev.push_back(json::parse(line));
  }
  return ev;
}

/// How many times each task id was started, over all journals.
inline std::map<std::string, int> starts(const std::string& out) {
  std::map<std::string, int> n;
  for (const auto& e : journal_events(out))
    if (e["event"] == "start") ++n[e["id"].get<std::string>()];
  return n;
}

/// Identity of a file's bytes on disk (inode, size, mtime) and its content hash.
struct FileId {
  std::uint64_t inode = 0, size = 0;
  std::int64_t mtime_ns = 0;
  std::string hash;
  bool operator==(const FileId& o) const {
    return inode == o.inode && size == o.size && mtime_ns == o.mtime_ns && hash == o.hash;
  }
};
inline FileId file_id(const std::string& p) {
  struct stat st {};
  FileId f;
  if (::stat(p.c_str(), &st) != 0) return f;
  f.inode = st.st_ino;
  f.size = static_cast<std::uint64_t>(st.st_size);
  f.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  f.hash = read_file(p);  // small files: the bytes themselves
  return f;
}

/// The files of every done point: id -> (run.h5, summary.json, point.json) identities.
inline std::map<std::string, std::vector<FileId>> done_files(const std::string& out,
                                                             const std::vector<std::string>& ids) {
  std::map<std::string, std::vector<FileId>> m;
  for (const auto& id : ids) {
    const std::string d = out + "/points/" + id;
    if (!fs::exists(d + "/point.json")) continue;
    m[id] = {file_id(d + "/run.h5"), file_id(d + "/summary.json"), file_id(d + "/point.json")};
  }
  return m;
}

/// Datasets of two HDF5 groups are bitwise equal (recursively); returns the first difference.
inline std::string compare_groups(const io::Group& a, const io::Group& b) {
  const auto na = a.list(), nb = b.list();
  if (na != nb) return "members of " + a.path() + " differ";
  for (const auto& n : na) {
    if (a.has_group(n)) {
      const std::string d = compare_groups(a.open_group(n), b.open_group(n));
      if (!d.empty()) return d;
      continue;
    }
    const io::Dataset da = a.dataset(n), db = b.dataset(n);
    const std::string t = da.type_name();
    if (t != db.type_name() || da.dims() != db.dims()) return a.path() + "/" + n + ": shape/type";
    auto same = [&](auto tag) {
      using T = decltype(tag);
      const auto x = a.read<T>(n), y = b.read<T>(n);
      return x.size() == y.size() &&
             (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0);
    };
    bool eq = true;
    if (t == "float64")
      eq = same(double{});
    else if (t == "float32")
      eq = same(float{});
    else if (t == "int32")
      eq = same(std::int32_t{});
    else if (t == "int64")
      eq = same(std::int64_t{});
    else if (t == "uint64")
      eq = same(std::uint64_t{});
    else if (t == "uint8")
      eq = same(std::uint8_t{});
    else if (t == "string")
      eq = a.read_strings(n) == b.read_strings(n);
    if (!eq) return a.path() + "/" + n + " differs";
  }
  // numeric attributes too (perplexity, totals, realised sparsity)
  for (const auto& an : a.attr_names()) {
    if (!b.has_attr(an)) return a.path() + " attribute " + an + " missing";
    try {
      if (a.get_attr<double>(an) != b.get_attr<double>(an)) return a.path() + "@" + an;
    } catch (const Error&) {
      try {
        if (a.get_attr<std::int64_t>(an) != b.get_attr<std::int64_t>(an))
          return a.path() + "@" + an;
      } catch (const Error&) {
        // strings (paths, names) may legitimately differ
      }
    }
  }
  return {};
}

/// Runs each point of the plan directly (`sparsim eval` with the point's own arguments, one
/// thread) and checks that the sweep's run file holds bitwise the same results, FLOP ledger
/// and sparsity records, and the summary the same perplexity.
inline void expect_same_as_direct(const Study& s, const json& plan, const std::string& out,
                                  const std::string& extra_threads = "1") {
  const std::string direct = s.file("direct");
  fs::create_directories(direct);
  for (const auto& p : plan["points"]) {
    const std::string id = p["id"];
    std::string cmd = sparsim_bin();
    for (const auto& a : p["args"]) cmd += " '" + a.get<std::string>() + "'";
    const std::string run = direct + "/" + id + ".h5", js = direct + "/" + id + ".json";
    cmd += " --out " + run + " --json " + js + " --threads " + extra_threads +
           " --progress never --log-level warn";
    const RunResult r = run_cmd(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    const std::string mine = out + "/points/" + id + "/run.h5";
    ASSERT_TRUE(fs::exists(mine)) << id;
    auto fa = io::H5File::open_read(mine), fb = io::H5File::open_read(run);
    for (const char* g : {"results", "flops", "sparsity", "model", "corpus", "config"}) {
      ASSERT_EQ(fa.root().has_group(g), fb.root().has_group(g)) << id << " /" << g;
      if (!fa.root().has_group(g)) continue;
      EXPECT_EQ(compare_groups(fa.root().open_group(g), fb.root().open_group(g)), "")
          << "point " << id << " differs from the direct run in /" << g;
    }
    const json a = json::parse(read_file(out + "/points/" + id + "/summary.json"));
    const json b = json::parse(read_file(js));
    EXPECT_EQ(a["perplexity"].get<double>(), b["perplexity"].get<double>()) << id;
    EXPECT_EQ(a["flops"], b["flops"]) << id;
    if (b.contains("sparsity")) {
      EXPECT_EQ(a["sparsity"]["realised_mean"].get<double>(),
                b["sparsity"]["realised_mean"].get<double>())
          << id;
    }
  }
}

/// results.csv as rows of column -> text.
inline std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::vector<std::map<std::string, std::string>> rows;
  std::istringstream in(read_file(path));
  std::string line;
  std::vector<std::string> header;
  auto split = [](const std::string& l) {
    std::vector<std::string> f;
    std::string cur;
    bool q = false;
    for (std::size_t i = 0; i < l.size(); ++i) {
      const char c = l[i];
      if (q) {
        if (c == '"' && i + 1 < l.size() && l[i + 1] == '"') {
          cur += '"';
          ++i;
        } else if (c == '"') {
          q = false;
        } else {
          cur += c;
        }
      } else if (c == '"') {
        q = true;
      } else if (c == ',') {
        f.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    f.push_back(cur);
    return f;
  };
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto f = split(line);
    if (header.empty()) {
      header = f;
      continue;
    }
    std::map<std::string, std::string> r;
    for (std::size_t i = 0; i < header.size() && i < f.size(); ++i) r[header[i]] = f[i];
    rows.push_back(r);
  }
  return rows;
}

}  // namespace sparsim::test
