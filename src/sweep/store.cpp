#include "sweep/store.hpp"

#include "core/error.hpp"
#include "sweep/lock.hpp"
#include "sweep/point_files.hpp"
#include "sweep/util.hpp"

#include <filesystem>

namespace sparsim::sweep {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* to_string(State s) {
  switch (s) {
    case State::Pending:
      return "pending";
    case State::Running:
      return "running";
    case State::Failed:
      return "failed";
    case State::Done:
      return "done";
  }
  return "?";
}

Store::Store(const Spec& spec) : spec_(spec), root_(spec.output) {}

bool Store::exists() const {
  std::error_code ec;
  return fs::is_directory(root_, ec);
}

void Store::check_owner() const {
  std::error_code ec;
  if (!fs::exists(root_, ec)) return;
  require(fs::is_directory(root_, ec), "output '{}' exists and is not a folder", root_);
  const std::string stamp = root_ + "/sweep.json";
  if (!fs::exists(stamp, ec)) {
    // Empty, or holding only the stamp another sweep is writing right now: free to take.
    bool foreign = false;
    for (const auto& e : fs::directory_iterator(root_, ec))
      if (e.path().filename().string().rfind("sweep.json.", 0) != 0) foreign = true;  // temp
    require(!foreign,
            "output folder '{}' exists, is not empty and was not made by sparsim sweep (no "
            "sweep.json): choose another [sweep] output",
            root_);
    return;
  }
  json j;
  try {
    j = json::parse(read_text(stamp));
  } catch (const json::exception& e) {
    fail("output folder '{}': its sweep.json is damaged ({}); refusing to write into it", root_,
         e.what());
  }
  const std::string name = j.value("name", std::string());
  require(name == spec_.name,
          "output folder '{}' belongs to the sweep '{}' (spec {}), not to '{}' ({}): choose "
          "another [sweep] output, or the same [sweep] name to continue that sweep",
          root_, name, j.value("spec", std::string("?")), spec_.name, spec_.path);
}

void Store::create() const {
  check_owner();
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) fail("cannot create the output folder '{}': {}", root_, ec.message());
  // The stamp first (published with a hard link, so two sweeps starting together agree on
  // one), the subfolders after it: a folder without a stamp is never half-populated.
  if (!fs::exists(root_ + "/sweep.json", ec)) {
    const json j = {{"name", spec_.name},
                    {"spec", spec_.path},
                    {"created_utc", utc_now()},
                    {"host", host_name()},
                    {"sparsim_version", SPARSIM_VERSION}};
    try {
      write_atomically(root_ + "/sweep.json", j.dump(2) + "\n", /*overwrite=*/false);
    } catch (const Error&) {
      if (!fs::exists(root_ + "/sweep.json", ec)) throw;  // not a concurrent creation
    }
  }
  check_owner();
  for (const char* sub : {"/points", "/calibrations", "/journal"}) {
    fs::create_directories(root_ + sub, ec);
    if (ec) fail("cannot create '{}': {}", root_ + sub, ec.message());
  }
}

std::string Store::point_dir(const std::string& id) const {
  return root_ + "/points/" + id;
}

std::string Store::calibration_base(const PlannedCalibration& c) const {
  return root_ + "/calibrations/" + c.model + "-" + c.id;
}

bool Store::verify_manifest(const json& m, const json& config, const std::string& dir,
                            std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (!m.is_object() || m.value("status", std::string()) != "done")
    return no("manifest incomplete");
  if (!m.contains("config") || m["config"] != config)
    return no("manifest records another configuration");
  if (!m.contains("files") || !m["files"].is_object() || m["files"].empty())
    return no("manifest lists no files");
  for (const auto& [name, f] : m["files"].items()) {
    const std::string p = dir + "/" + name;
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) return no(name + " is missing");
    const std::uint64_t want = f.value("bytes", std::uint64_t{0});
    if (fs::file_size(p, ec) != want)
      return no(
          fmt::format("{} has {} bytes, the manifest says {}", name, fs::file_size(p, ec), want));
    try {
      if (digest(p).hash != f.value("hash", std::string()))
        return no(name + " differs from the manifest (hash)");
    } catch (const Error& e) {
      return no(e.what());
    }
  }
  return true;
}

std::optional<json> Store::done_manifest(const PlannedPoint& p, std::string* why) const {
  const std::string mp = point_manifest(p.id);
  std::error_code ec;
  if (!fs::exists(mp, ec)) {
    if (why) *why = "not run";
    return std::nullopt;
  }
  json m;
  try {
    m = json::parse(read_text(mp));
  } catch (const std::exception& e) {
    if (why) *why = std::string("damaged manifest: ") + e.what();
    return std::nullopt;
  }
  if (!verify_manifest(m, p.config, point_dir(p.id), why)) return std::nullopt;
  return m;
}

bool Store::calibration_done(const PlannedCalibration& c, std::string* why) const {
  std::error_code ec;
  if (!c.computed) {
    if (fs::is_regular_file(c.file, ec)) return true;
    if (why) *why = c.file + " is missing";
    return false;
  }
  const std::string mp = calibration_base(c) + ".json";
  if (!fs::exists(mp, ec)) {
    if (why) *why = "not run";
    return false;
  }
  json m;
  try {
    m = json::parse(read_text(mp));
  } catch (const std::exception& e) {
    if (why) *why = std::string("damaged manifest: ") + e.what();
    return false;
  }
  return verify_manifest(m, c.config, root_ + "/calibrations", why);
}

namespace {
TaskStatus failure_or_pending(const std::string& failed_json, const std::string& why) {
  std::error_code ec;
  if (fs::exists(failed_json, ec)) {
    try {
      const json f = json::parse(read_text(failed_json));
      return {State::Failed, f.value("message", std::string("failed"))};
    } catch (const std::exception&) {
      return {State::Failed, "failed (damaged failure record)"};
    }
  }
  return {State::Pending, why};
}
}  // namespace

TaskStatus Store::status(const PlannedPoint& p) const {
  std::string why;
  if (done_manifest(p, &why)) return {State::Done, {}};
  if (FileLock::held(point_lock(p.id))) return {State::Running, FileLock::note(point_lock(p.id))};
  return failure_or_pending(point_failure(p.id), why);
}

TaskStatus Store::status(const PlannedCalibration& c) const {
  std::string why;
  if (calibration_done(c, &why)) return {State::Done, {}};
  if (!c.computed) return {State::Failed, why};
  const std::string base = calibration_base(c);
  if (FileLock::held(base + ".lock")) return {State::Running, FileLock::note(base + ".lock")};
  return failure_or_pending(base + ".failed.json", why);
}

}  // namespace sparsim::sweep
