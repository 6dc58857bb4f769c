#include "io/temp_file.hpp"

#include "core/error.hpp"
#include "core/interrupt.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

namespace sparsim::io {

namespace {

constexpr const char* kTag = ".sparsim-";
constexpr const char* kSuffix = ".tmp";

/// The short host name with every character outside [A-Za-z0-9-] replaced by '-'.
const std::string& host_tag() {
  static const std::string h = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("localhost");
    std::string s(buf);
    s = s.substr(0, s.find('.'));
    for (char& c : s)
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'))
        c = '-';
    return s.empty() ? std::string("localhost") : s;
  }();
  return h;
}

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

std::string parent_dir(const std::string& p) {
  const std::size_t slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

/// fsync of the folder so that a rename is durable; best effort (not every file system lets a
/// folder be opened or synced).
void sync_dir_best_effort(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

[[noreturn]] void refuse_existing(const std::string& path) {
  fail("output file '{}' already exists and overwriting was not allowed", path);
}

bool process_gone(long pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

std::string temp_path_for(const std::string& path) {
  return path + kTag + std::to_string(static_cast<long long>(::getpid())) + "-" + host_tag() +
         kSuffix;
}

bool parse_temp_name(const std::string& name, TempOwner& owner) {
  const std::size_t ls = std::strlen(kSuffix);
  if (name.size() <= ls || name.compare(name.size() - ls, ls, kSuffix) != 0) return false;
  const std::size_t tag = name.rfind(kTag, name.size() - ls);
  if (tag == std::string::npos || tag == 0) return false;
  const std::string mid =
      name.substr(tag + std::strlen(kTag), name.size() - ls - tag - std::strlen(kTag));  // pid-host
  const std::size_t dash = mid.find('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 >= mid.size()) return false;
  long pid = 0;
  for (std::size_t i = 0; i < dash; ++i) {
    if (mid[i] < '0' || mid[i] > '9' || pid > 100000000L) return false;
    pid = pid * 10 + (mid[i] - '0');
  }
  const std::string host = mid.substr(dash + 1);
  for (char c : host)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'))
      return false;
  owner.pid = pid;
  owner.host = host;
  owner.final_name = name.substr(0, tag);
  return true;
}

std::vector<std::string> remove_stale_temps(const std::string& dir) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return removed;
  const std::string prefix = dir == "/" ? "/" : dir + "/";
  while (const dirent* e = ::readdir(d)) {
    TempOwner o;
    if (!parse_temp_name(e->d_name, o)) continue;
    if (o.host != host_tag() || !process_gone(o.pid)) continue;
    const std::string p = prefix + e->d_name;
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(p.c_str()) == 0) removed.push_back(p);
  }
  ::closedir(d);
  return removed;
}

void sync_file(const std::string& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '{}' to sync it: {}", p, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) fail("cannot sync '{}' to disk: {}", p, std::strerror(e));
}

void publish(const std::string& tmp, const std::string& path, bool overwrite) {
  if (!overwrite) {
    if (::link(tmp.c_str(), path.c_str()) == 0) {
      ::unlink(tmp.c_str());
      sync_dir_best_effort(parent_dir(path));
      return;
    }
    if (errno == EEXIST) refuse_existing(path);
    if (path_exists(path)) refuse_existing(path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    fail("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno));
  sync_dir_best_effort(parent_dir(path));
}

TempFile::TempFile(std::string final_path)
    : final_(std::move(final_path)), tmp_(temp_path_for(final_)) {
  require(!final_.empty(), "the output file path is empty");
  interrupt::add_temp(tmp_);
}

TempFile::~TempFile() {
  discard();
}

void TempFile::commit(bool overwrite) {
  require(!committed_ && !discarded_, "output file '{}' was already {}", final_,
          committed_ ? "committed" : "discarded");
  sync_file(tmp_);
  publish(tmp_, final_, overwrite);
  committed_ = true;
  interrupt::remove_temp(tmp_);
  interrupt::output_written(final_);
}

void TempFile::discard() noexcept {
  if (committed_ || discarded_) return;
  discarded_ = true;
  std::remove(tmp_.c_str());
  try {
    interrupt::remove_temp(tmp_);
  } catch (...) {
    // Only a failing mutex can throw here; the name stays registered, which is harmless.
  }
}

}  // namespace sparsim::io
