#include "io/run_guard.hpp"

#include "core/error.hpp"
#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "io/temp_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <optional>
#include <set>

namespace sparsim::io {

namespace {

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino; }
};

/// stat() following links; nullopt when the path does not exist.
std::optional<struct stat> stat_of(const std::string& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return std::nullopt;
  return st;
}

FileId id_of(const struct stat& st) {
  return {st.st_dev, st.st_ino};
}

std::string strip_trailing_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string parent_of(const std::string& p) {
  const std::size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string base_of(const std::string& p) {
  const std::size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

/// Absolute path with every symbolic link of an existing path resolved ("" on failure).
std::string real(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

bool inside(const std::string& path, const std::string& dir) {
  if (path.empty() || dir.empty()) return false;
  const std::string d = dir == "/" ? "/" : dir + "/";
  return path.size() > d.size() && path.compare(0, d.size(), d) == 0;
}

struct Resolved {
  const OutputPath* o = nullptr;
  std::string canonical;  ///< real(parent) + "/" + base
  std::string folder;     ///< the folder it goes into, as given
  std::optional<struct stat> st;
};

[[noreturn]] void usage(const std::string& m) {
  throw UsageError(m);
}

Resolved check_output(const OutputPath& o) {
  Resolved r;
  r.o = &o;
  const std::string& p = o.path;
  const std::string q = strip_trailing_slashes(p);
  if (!o.directory && q.size() < p.size() && q != "/")
    usage(fmt::format("{} '{}' names a folder; give a file name inside it", o.option, p));
  r.st = stat_of(q);
  if (r.st) {
    if (!o.directory && S_ISDIR(r.st->st_mode))
      usage(fmt::format("{} '{}' is a folder; give a file name inside it", o.option, p));
    if (!o.directory && !S_ISREG(r.st->st_mode))
      usage(fmt::format(
          "{} '{}' is not a regular file (a device, pipe or socket): outputs are written by "
          "renaming a finished temporary file onto their name",
          o.option, p));
    if (o.directory && !S_ISDIR(r.st->st_mode))
      usage(fmt::format("{} '{}' is an existing file, not a folder", o.option, p));
  }
  r.folder = parent_of(q);
  const auto fst = stat_of(r.folder);
  if (!fst) usage(fmt::format("{} '{}': the folder '{}' does not exist", o.option, p, r.folder));
  if (!S_ISDIR(fst->st_mode))
    usage(fmt::format("{} '{}': '{}' is not a folder", o.option, p, r.folder));
  if (::access(r.folder.c_str(), W_OK | X_OK) != 0)
    usage(fmt::format("{} '{}': the folder '{}' is not writable", o.option, p, r.folder));
  if (o.directory && r.st && ::access(q.c_str(), W_OK | X_OK) != 0)
    usage(fmt::format("{} '{}': the folder is not writable", o.option, p));
  const std::string rf = real(r.folder);
  r.canonical = rf.empty() ? q : (rf == "/" ? "/" : rf + "/") + base_of(q);
  return r;
}

}  // namespace

void check_run_paths(const std::vector<InputPath>& inputs, const std::vector<OutputPath>& outputs) {
  std::vector<Resolved> outs;
  for (const auto& o : outputs)
    if (!o.path.empty()) outs.push_back(check_output(o));

  for (const auto& in : inputs) {
    if (in.path.empty()) continue;
    const auto ist = stat_of(in.path);
    if (!ist) continue;
    const std::string ireal = real(in.path);
    for (const auto& r : outs) {
      const OutputPath& o = *r.o;
      if (r.st && id_of(*r.st) == id_of(*ist))
        usage(fmt::format("{} '{}' is the same {} as {} '{}': writing it would destroy an input",
                          o.option, o.path, S_ISDIR(ist->st_mode) ? "folder" : "file", in.option,
                          in.path));
      if (S_ISDIR(ist->st_mode) && (inside(r.canonical, ireal) || r.canonical == ireal))
        usage(fmt::format(
            "{} '{}' lies inside the {} folder '{}': it would change that input (write it "
            "elsewhere)",
            o.option, o.path, in.option, in.path));
      if (o.directory && inside(ireal, r.canonical))
        usage(fmt::format("{} folder '{}' holds the {} '{}': writing it could change that input",
                          o.option, o.path, in.option, in.path));
    }
  }

  for (std::size_t i = 0; i < outs.size(); ++i)
    for (std::size_t j = i + 1; j < outs.size(); ++j) {
      const Resolved &a = outs[i], &b = outs[j];
      const bool same =
          a.canonical == b.canonical || (a.st && b.st && id_of(*a.st) == id_of(*b.st));
      if (same)
        usage(fmt::format("{} '{}' and {} '{}' name the same file; give each output its own name",
                          a.o->option, a.o->path, b.o->option, b.o->path));
      if ((a.o->directory && inside(b.canonical, a.canonical)) ||
          (b.o->directory && inside(a.canonical, b.canonical))) {
        const Resolved& d = a.o->directory ? a : b;
        const Resolved& f = a.o->directory ? b : a;
        usage(fmt::format("{} '{}' lies inside the {} folder '{}'; give it its own place",
                          f.o->option, f.o->path, d.o->option, d.o->path));
      }
    }
}

void guard_run(const std::vector<InputPath>& inputs, const std::vector<OutputPath>& outputs) {
  check_run_paths(inputs, outputs);
  std::set<std::string> folders;
  for (const auto& o : outputs) {
    if (o.path.empty()) continue;
    const std::string q = strip_trailing_slashes(o.path);
    folders.insert(parent_of(q));
    if (o.directory && stat_of(q)) folders.insert(q);
  }
  for (const auto& f : folders)
    for (const auto& p : remove_stale_temps(f))
      log().info("removed '{}', a temporary file left by a run that no longer exists", p);
  for (const auto& o : outputs)
    if (!o.path.empty() && !o.side_file) interrupt::declare_output(o.path);
}

}  // namespace sparsim::io
