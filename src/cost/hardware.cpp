#include "cost/hardware.hpp"

#include "core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace sparsim::cost {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "sparsim-hardware";
constexpr int kVersion = 1;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// A positive finite number at j[key], or an error naming the field and what it measures.
double positive(const nlohmann::json& j, const std::string& key, const std::string& field,
                const char* unit, const std::string& origin) {
  require(j.contains(key), "hardware profile '{}': missing field '{}' ({})", origin, field, unit);
  const nlohmann::json& v = j.at(key);
  require(v.is_number(), "hardware profile '{}': field '{}' must be a number ({}), got {}", origin,
          field, unit, v.dump());
  const double x = v.get<double>();
  require(std::isfinite(x) && x > 0, "hardware profile '{}': field '{}' must be positive, got {}",
          origin, field, x);
  return x;
}

std::string text(const nlohmann::json& j, const std::string& key, const std::string& origin) {
  require(j.contains(key), "hardware profile '{}': missing field '{}'", origin, key);
  require(j.at(key).is_string() && !j.at(key).get<std::string>().empty(),
          "hardware profile '{}': field '{}' must be a non-empty string", origin, key);
  return j.at(key).get<std::string>();
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  require(static_cast<bool>(f), "cannot open hardware profile '{}'", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

double HardwareProfile::peak(const std::string& precision) const {
  const auto it = peak_flops.find(precision);
  if (it == peak_flops.end()) {
    std::string have;
    for (const auto& [k, v] : peak_flops) have += (have.empty() ? "" : ", ") + k;
    fail("hardware profile '{}' has no peak FLOP/s for precision '{}' (it has: {})", name,
         precision, have);
  }
  return it->second;
}

HardwareProfile HardwareProfile::at_threads(int threads, std::string* note) const {
  if (thread_rates.empty()) {
    if (note) *note = "";
    return *this;
  }
  for (const ThreadRates& r : thread_rates) {
    if (r.threads != threads) continue;
    HardwareProfile p = *this;
    p.peak_flops["fp32"] = r.sgemm_flops;
    p.memory_bandwidth = r.memory_bandwidth();
    p.launch_overhead_s = r.launch_overhead_s;
    if (note)
      *note = fmt::format("rates measured at {} thread{}", threads, threads == 1 ? "" : "s");
    return p;
  }
  if (note) {
    std::string have;
    for (const ThreadRates& r : thread_rates)
      have += (have.empty() ? "" : ", ") + std::to_string(r.threads);
    *note = fmt::format(
        "no rates measured at {} threads (probed: {}); the profile's headline figures are used",
        threads, have);
  }
  return *this;
}

nlohmann::ordered_json HardwareProfile::summary() const {
  nlohmann::ordered_json j = {{"name", name},
                              {"description", description},
                              {"kind", kind},
                              {"file", file},
                              {"peak_flops", peak_flops},
                              {"memory_bandwidth", memory_bandwidth},
                              {"l2_bytes", l2_bytes},
                              {"launch_overhead_s", launch_overhead_s}};
  if (memory_bytes > 0) j["memory_bytes"] = memory_bytes;
  return j;
}

HardwareProfile parse_hardware_profile(const std::string& json_text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail("hardware profile '{}' is not valid JSON: {}", origin, e.what());
  }
  require(j.is_object(), "hardware profile '{}' must be a JSON object", origin);
  require(j.contains("format") && j["format"] == kFormat,
          "'{}' is not a sparsim hardware profile (\"format\": \"{}\" is missing)", origin,
          kFormat);
  require(j.contains("version") && j["version"].is_number_integer() && j["version"] == kVersion,
          "hardware profile '{}': version {} is not the supported {}", origin,
          j.contains("version") ? j["version"].dump() : "(missing)", kVersion);
  HardwareProfile p;
  p.raw = j;
  p.file = origin;
  p.name = text(j, "name", origin);
  p.description = text(j, "description", origin);
  p.kind = text(j, "kind", origin);
  require(p.kind == "vendor" || p.kind == "measured",
          "hardware profile '{}': kind must be \"vendor\" or \"measured\", got \"{}\"", origin,
          p.kind);
  if (j.contains("aliases")) {
    require(j["aliases"].is_array(), "hardware profile '{}': aliases must be a list of names",
            origin);
    for (const auto& a : j["aliases"]) {
      require(a.is_string(), "hardware profile '{}': aliases must be strings", origin);
      p.aliases.push_back(a.get<std::string>());
    }
  }
  require(j.contains("peak_flops") && j["peak_flops"].is_object() && !j["peak_flops"].empty(),
          "hardware profile '{}': missing field 'peak_flops' (FLOP/s per precision, at least "
          "fp32)",
          origin);
  for (const auto& [k, v] : j["peak_flops"].items())
    p.peak_flops[k] = positive(j["peak_flops"], k, "peak_flops." + k, "FLOP/s", origin);
  require(p.peak_flops.count("fp32") == 1,
          "hardware profile '{}': missing field 'peak_flops.fp32' (FLOP/s): sparsim computes in "
          "fp32",
          origin);
  p.memory_bandwidth = positive(j, "memory_bandwidth", "memory_bandwidth", "bytes/s", origin);
  p.l2_bytes = positive(j, "l2_bytes", "l2_bytes", "bytes", origin);
  p.launch_overhead_s = positive(j, "launch_overhead_s", "launch_overhead_s", "s", origin);
  if (j.contains("memory_bytes"))
    p.memory_bytes = positive(j, "memory_bytes", "memory_bytes", "bytes", origin);

  require(j.contains("sources") && j["sources"].is_object(),
          "hardware profile '{}': missing field 'sources' (the document each number comes from)",
          origin);
  for (const auto& [k, v] : j["sources"].items()) {
    require(v.is_string() && !v.get<std::string>().empty(),
            "hardware profile '{}': sources.{} must name a document", origin, k);
    p.sources[k] = v.get<std::string>();
  }
  std::vector<std::string> cited = {"memory_bandwidth", "l2_bytes", "launch_overhead_s"};
  for (const auto& [k, v] : p.peak_flops) cited.push_back("peak_flops." + k);
  if (p.memory_bytes > 0) cited.emplace_back("memory_bytes");
  for (const std::string& f : cited)
    require(p.sources.count(f) == 1,
            "hardware profile '{}': no entry sources.\"{}\" naming the document the number comes "
            "from",
            origin, f);

  if (j.contains("threads")) {
    require(j["threads"].is_array(), "hardware profile '{}': threads must be a list", origin);
    for (std::size_t i = 0; i < j["threads"].size(); ++i) {
      const nlohmann::json& r = j["threads"][i];
      const std::string at = fmt::format("threads[{}].", i);
      require(r.is_object(), "hardware profile '{}': threads[{}] must be an object", origin, i);
      ThreadRates t;
      t.threads = static_cast<int>(positive(r, "threads", at + "threads", "count", origin));
      t.copy_bandwidth = positive(r, "copy_bandwidth", at + "copy_bandwidth", "bytes/s", origin);
      t.read_bandwidth = positive(r, "read_bandwidth", at + "read_bandwidth", "bytes/s", origin);
      t.sgemm_flops = positive(r, "sgemm_flops", at + "sgemm_flops", "FLOP/s", origin);
      t.gemv_bandwidth = positive(r, "gemv_bandwidth", at + "gemv_bandwidth", "bytes/s", origin);
      t.launch_overhead_s = positive(r, "launch_overhead_s", at + "launch_overhead_s", "s", origin);
      p.thread_rates.push_back(t);
    }
  }
  return p;
}

std::vector<std::string> hardware_profile_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("SPARSIM_HARDWARE_DIR")) {
    std::string s = env;
    std::size_t start = 0;
    while (start <= s.size()) {
      const std::size_t end = s.find(':', start);
      const std::string d =
          s.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!d.empty()) dirs.push_back(d);
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
#ifdef SPARSIM_HARDWARE_DIR_DEFAULT
  dirs.emplace_back(SPARSIM_HARDWARE_DIR_DEFAULT);
#endif
  return dirs;
}

namespace {
struct Found {
  std::string path;
  HardwareProfile profile;
};
std::vector<Found> scan() {
  std::vector<Found> out;
  for (const std::string& d : hardware_profile_dirs()) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".json") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      try {
        out.push_back({f, parse_hardware_profile(read_text(f), f)});
      } catch (const Error&) {
        // A broken file in a search directory is reported when it is asked for by path.
      }
    }
  }
  return out;
}
}  // namespace

std::vector<std::string> available_hardware_profiles() {
  std::vector<std::string> names;
  for (const Found& f : scan())
    if (std::find(names.begin(), names.end(), f.profile.name) == names.end())
      names.push_back(f.profile.name);
  std::sort(names.begin(), names.end());
  return names;
}

HardwareProfile load_hardware_profile(const std::string& name_or_path) {
  require(!name_or_path.empty(), "no hardware profile given");
  const bool is_path =
      name_or_path.find('/') != std::string::npos ||
      (name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".json") == 0);
  if (is_path) {
    std::error_code ec;
    require(fs::is_regular_file(name_or_path, ec), "hardware profile file '{}' does not exist",
            name_or_path);
    return parse_hardware_profile(read_text(name_or_path), name_or_path);
  }
  const std::string want = lower(name_or_path);
  for (const Found& f : scan()) {
    bool match = lower(f.profile.name) == want;
    for (const std::string& a : f.profile.aliases) match = match || lower(a) == want;
    if (match) return f.profile;
  }
  std::string dirs;
  for (const std::string& d : hardware_profile_dirs()) dirs += (dirs.empty() ? "" : ", ") + d;
  fail(
      "unknown hardware profile '{}'; known: {} (searched {}); or give a profile file's path, "
      "e.g. one written by sparsim probe",
      name_or_path, fmt::format("{}", fmt::join(available_hardware_profiles(), ", ")),
      dirs.empty() ? "no directories" : dirs);
}

}  // namespace sparsim::cost
