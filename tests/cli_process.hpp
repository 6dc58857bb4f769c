#pragma once
// Running sparsim as a child process the test can signal, and fingerprints of folders, for the
// tests of bad paths and interruptions.
#include "helpers.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

extern char** environ;

namespace sparsim::test {

/// A sparsim process whose stdout and stderr go to `log`.
struct Child {
  pid_t pid = -1;
  std::string log;
};

/// Starts `args` (args[0] is the program) with `extra_env` ("NAME=value") added.
inline Child spawn(const std::vector<std::string>& args, const std::string& log,
                   const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  Child c;
  c.log = log;
  c.pid = ::fork();
  if (c.pid == 0) {  // only async-signal-safe calls until execve
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return c;
}

/// Waits for the child: its exit status, 128 + the signal that ended it, or -1 after
/// `timeout_s` (the child is then killed).
inline int wait_child(const Child& c, double timeout_s = 60) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(c.pid, &st, WNOHANG);
    if (r == c.pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() > end) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// Waits until `path` contains `needle` (true) or `timeout_s` passes (false).
inline bool wait_for_text(const std::string& path, const std::string& needle,
                          double timeout_s = 60) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (read_text(path).find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

/// Every file under `dir` (relative name) with a 64-bit FNV-1a hash of its bytes.
inline std::map<std::string, std::uint64_t> folder_state(const std::filesystem::path& dir) {
  std::map<std::string, std::uint64_t> m;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::uint64_t h = 1469598103934665603ULL;
    for (unsigned char ch : read_text(e.path().string())) h = (h ^ ch) * 1099511628211ULL;
    m[std::filesystem::relative(e.path(), dir).string()] = h;
  }
  return m;
}

/// Names in `dir` that look like sparsim temporaries.
inline std::vector<std::string> temp_files(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find(".sparsim-") != std::string::npos || n.find(".tmp") != std::string::npos)
      out.push_back(n);
  }
  return out;
}

}  // namespace sparsim::test
