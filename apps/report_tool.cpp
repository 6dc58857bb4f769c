#include "report_tool.hpp"

#include "core/error.hpp"

#include <sys/wait.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace sparsim::app {

namespace {

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Runs a shell command line; returns (exit status, stdout and stderr together).
std::pair<int, std::string> run(const std::string& cmd) {
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "cannot start: " + cmd};
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

}  // namespace

std::string report_python() {
  if (const char* e = std::getenv("SPARSIM_PYTHON"); e && *e) return e;
#ifdef SPARSIM_PYTHON_DEFAULT
  std::error_code ec;
  if (std::filesystem::exists(SPARSIM_PYTHON_DEFAULT, ec)) return SPARSIM_PYTHON_DEFAULT;
#endif
  return "python3";
}

std::string report_script() {
  if (const char* e = std::getenv("SPARSIM_SCRIPTS_DIR"); e && *e)
    return std::string(e) + "/report.py";
#ifdef SPARSIM_SCRIPTS_DIR_DEFAULT
  return std::string(SPARSIM_SCRIPTS_DIR_DEFAULT) + "/report.py";
#else
  return "scripts/report.py";
#endif
}

void check_report_tool() {
  const std::string py = report_python(), script = report_script();
  std::error_code ec;
  require(std::filesystem::exists(script, ec),
          "the report generator {} is not there (set SPARSIM_SCRIPTS_DIR to sparsim's scripts/)",
          script);
  const auto [rc, out] = run(quote(py) + " -c 'import h5py, jinja2, matplotlib, numpy, pandas'");
  require(rc == 0,
          "the report generator needs Python with h5py, jinja2, matplotlib, numpy and pandas; "
          "'{}' cannot import them ({}): run scripts/setup.sh, or point SPARSIM_PYTHON at such "
          "an interpreter",
          py, out.empty() ? "no output" : out.substr(0, out.find('\n')));
}

void run_report_tool(const std::vector<std::string>& args) {
  std::string cmd = quote(report_python()) + " " + quote(report_script());
  for (const std::string& a : args) cmd += " " + quote(a);
  const auto [rc, out] = run(cmd);
  require(rc == 0, "the report generator failed (exit {}): {}\n{}", rc, cmd, out);
}

}  // namespace sparsim::app
