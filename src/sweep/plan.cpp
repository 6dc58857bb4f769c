#include "sweep/plan.hpp"

#include "core/error.hpp"
#include "eval/corpus.hpp"

#include <filesystem>
#include <map>
#include <optional>
#include <set>

namespace sparsim::sweep {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string hash_hex(const std::string& text) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return fmt::format("{:016x}", h);
}

std::vector<std::string> owned_args(bool calibration, const std::string& work, int threads,
                                    const std::string& log_level) {
  std::vector<std::string> a;
  if (calibration)
    a = {"--out", work + "/calibration.h5"};
  else
    a = {"--out", work + "/run.h5", "--json", work + "/summary.json"};
  a.insert(a.end(),
           {"--threads", std::to_string(threads), "--progress", "never", "--log-level", log_level});
  return a;
}

namespace {

/// The command line the plan checks: the task's own, completed as the sweep will run it.
std::vector<std::string> with_owned(std::vector<std::string> args, bool calibration) {
  const auto o = owned_args(calibration, "/nonexistent-sweep-work", 1, "warn");
  args.insert(args.end(), o.begin(), o.end());
  return args;
}

/// A spec path: variables expanded, joined to the spec's folder when relative.
std::string spec_relative(const Spec& s, const std::string& p) {
  const fs::path fp(expand_vars(p));
  return (fp.is_absolute() ? fp : fs::path(s.dir) / fp).lexically_normal().string();
}

struct Inputs {
  std::map<std::string, std::string> model_path;  ///< model name -> resolved path
  std::map<std::string, ModelShape> shape;        ///< model name -> header facts
  std::map<std::string, std::string> corpus_path;
  std::map<std::string, std::uint64_t> corpus_bytes;
  std::set<std::string> bad;  ///< names (model:… / corpus:…) already reported
};

std::string describe(const std::string& model, const std::string& corpus, const std::string& method,
                     const json& opts) {
  std::string s = fmt::format("model={} corpus={} method={}", model, corpus, method);
  for (const auto& [k, v] : opts.items()) s += fmt::format(" {}={}", k, option_text(v));
  return s;
}

/// Appends `--key value` for every option (a true boolean is a bare switch, false is left out).
void append_options(std::vector<std::string>& args, const json& opts) {
  for (const auto& [k, v] : opts.items()) {
    if (v.is_boolean()) {
      if (v.get<bool>()) args.push_back("--" + k);
      continue;
    }
    args.push_back("--" + k);
    args.push_back(option_text(v));
  }
}

int storage_bytes(const json& resolved) {
  if (resolved.contains("storage") && resolved["storage"].is_string()) {
    const std::string s = resolved["storage"].get<std::string>();
    if (s == "bf16" || s == "f16") return 2;
  }
  return 4;
}

template <class T>
T get_or(const json& j, const char* key, T fallback) {
  if (!j.contains(key)) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    return fallback;
  }
}

/// Cartesian product of axes (key -> values), keys in map order; calls f(assignment).
template <class F>
void product(const std::map<std::string, std::vector<json>>& axes, F&& f) {
  std::vector<std::pair<std::string, const std::vector<json>*>> ax;
  for (const auto& [k, v] : axes) ax.emplace_back(k, &v);
  std::vector<std::size_t> idx(ax.size(), 0);
  while (true) {
    json a = json::object();
    for (std::size_t i = 0; i < ax.size(); ++i) a[ax[i].first] = (*ax[i].second)[idx[i]];
    f(a);
    std::size_t i = ax.size();
    while (i > 0) {
      --i;
      if (++idx[i] < ax[i].second->size()) break;
      idx[i] = 0;
      if (i == 0) return;
    }
    if (ax.empty()) return;
  }
}

}  // namespace

Plan make_plan(const Spec& spec, const PlanHooks& hooks) {
  Plan plan;
  std::vector<std::string> problems;
  Inputs in;

  auto model = [&](const std::string& name) -> const std::string* {
    if (auto it = in.model_path.find(name); it != in.model_path.end()) return &it->second;
    if (in.bad.count("model:" + name)) return nullptr;
    const std::string& written = spec.models.at(name);
    try {
      const std::string joined = spec_relative(spec, written);
      std::error_code ec;
      std::string path;
      if (fs::exists(joined, ec))
        path = joined;
      else if (hooks.resolve_model)
        path = hooks.resolve_model(expand_vars(written));
      else
        fail("model file '{}' does not exist", joined);
      in.shape[name] = read_model_shape(path);
      return &(in.model_path[name] = path);
    } catch (const Error& e) {
      problems.push_back(fmt::format("[models] {} = \"{}\": {}", name, written, e.what()));
      in.bad.insert("model:" + name);
      return nullptr;
    }
  };
  auto corpus = [&](const std::string& name) -> const std::string* {
    if (auto it = in.corpus_path.find(name); it != in.corpus_path.end()) return &it->second;
    if (in.bad.count("corpus:" + name)) return nullptr;
    const std::string& written = spec.corpora.at(name);
    std::string path;
    if (written == "default") {
      auto d = find_default_corpus();
      if (!d) {
        problems.push_back(
            fmt::format("[corpora] {} = \"default\": the default corpus is not installed (run "
                        "scripts/setup.sh or set SPARSIM_CORPUS)",
                        name));
        in.bad.insert("corpus:" + name);
        return nullptr;
      }
      path = *d;
    } else {
      try {
        path = spec_relative(spec, written);
      } catch (const Error& e) {
        problems.push_back(fmt::format("[corpora] {} = \"{}\": {}", name, written, e.what()));
        in.bad.insert("corpus:" + name);
        return nullptr;
      }
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        problems.push_back(
            fmt::format("[corpora] {} = \"{}\": '{}' does not exist", name, written, path));
        in.bad.insert("corpus:" + name);
        return nullptr;
      }
    }
    in.corpus_bytes[name] = corpus_bytes(path);
    return &(in.corpus_path[name] = path);
  };

  // ---- calibrations (planned when a point uses them)
  std::map<std::string, int> cal_index;  // model name -> index, -2: unusable
  auto calibration = [&](const std::string& m) -> int {
    if (auto it = cal_index.find(m); it != cal_index.end()) return it->second;
    const CalibrationSpec& c = spec.calibrations.at(m);
    PlannedCalibration pc;
    pc.model = m;
    int result = -2;
    if (!c.file.empty()) {
      pc.config = {{"file", c.file}};
      std::error_code ec;
      try {
        pc.file = spec_relative(spec, c.file);
      } catch (const Error& e) {
        problems.push_back(fmt::format("[calibration.{}] file: {}", m, e.what()));
        return cal_index[m] = -2;
      }
      if (!fs::is_regular_file(pc.file, ec))
        problems.push_back(
            fmt::format("[calibration.{}] file = \"{}\": '{}' does not exist", m, c.file, pc.file));
      else
        result = 0;
    } else {
      pc.computed = true;
      const std::string* mp = model(m);
      const std::string* cp = corpus(c.corpus);
      if (mp && cp) {
        pc.config = {{"command", "calibrate"},
                     {"model", spec.models.at(m)},
                     {"corpus", spec.corpora.at(c.corpus)},
                     {"options", c.options}};
        pc.args = {"calibrate", "--model", *mp, "--corpus", *cp};
        append_options(pc.args, c.options);
        json resolved = json::object();
        try {
          if (hooks.check_options) resolved = hooks.check_options(with_owned(pc.args, true));
          result = 0;
        } catch (const Error& e) {
          problems.push_back(fmt::format(
              "[calibration.{}]: sparsim calibrate rejects its options: {}", m, e.what()));
        }
        CalibrateWork w;
        w.context = get_or(resolved, "context", w.context);
        w.max_windows = get_or(resolved, "max-windows", w.max_windows);
        w.greedy_seqs = get_or(resolved, "greedy-seqs", w.greedy_seqs);
        w.greedy_tokens = get_or(resolved, "greedy-tokens", w.greedy_tokens);
        w.alpha = get_or(resolved, "alpha", w.alpha);
        w.cap = get_or(resolved, "cap", w.cap);
        w.storage_bytes = storage_bytes(resolved);
        const std::string variants = get_or<std::string>(resolved, "variants", "plain,rotated");
        w.variants = variants.find(',') != std::string::npos ? 2 : 1;
        w.corpus_bytes = in.corpus_bytes[c.corpus];
        pc.predicted = predict_calibrate(in.shape.at(m), w, spec.cost);
      }
    }
    if (result == 0) {
      pc.id = hash_hex(pc.config.dump());
      if (pc.computed)
        pc.file = (fs::path(spec.output) / "calibrations" / (m + "-" + pc.id + ".h5")).string();
      result = static_cast<int>(plan.calibrations.size());
      plan.calibrations.push_back(std::move(pc));
    }
    return cal_index[m] = result;
  };

  // ---- points
  std::set<std::string> seen;
  auto add_point = [&](const std::string& m, const std::string& c, const std::string& method,
                       json opts, bool use_cal, const std::string& origin) {
    const std::string label = describe(m, c, method, opts);
    const std::string* mp = model(m);
    const std::string* cp = corpus(c);
    if (!mp || !cp) return;  // reported once for the model / corpus
    PlannedPoint p;
    p.model = m;
    p.corpus = c;
    p.method = method;
    p.options = opts;
    p.origin = origin;
    p.config = {{"command", spec.command},
                {"model", spec.models.at(m)},
                {"corpus", spec.corpora.at(c)},
                {"method", method},
                {"options", opts}};
    if (use_cal) {
      if (spec.calibrations.count(m) == 0) {
        problems.push_back(fmt::format(
            "point {} ({}): method {} asks for a calibration, but [calibration.{}] is not "
            "defined",
            origin, label, method, m));
        return;
      }
      p.calibration = calibration(m);
      if (p.calibration < 0) return;  // reported for the calibration
      p.config["calibration"] = plan.calibrations[static_cast<std::size_t>(p.calibration)].id;
    }
    p.id = hash_hex(p.config.dump());
    if (!seen.insert(p.id).second) {
      ++plan.duplicates;
      return;
    }
    p.args = {spec.command, "--model", *mp, "--corpus", *cp, "--method", method};
    append_options(p.args, opts);
    if (p.calibration >= 0) {
      p.args.push_back("--calibration");
      p.args.push_back(plan.calibrations[static_cast<std::size_t>(p.calibration)].file);
    }
    json resolved = json::object();
    if (hooks.check_options) {
      try {
        resolved = hooks.check_options(with_owned(p.args, false));
      } catch (const Error& e) {
        problems.push_back(fmt::format("point {} {} ({}): sparsim {} rejects its options: {}", p.id,
                                       origin, label, spec.command, e.what()));
        return;
      }
    }
    EvalWork w;
    w.context = get_or(resolved, "context", w.context);
    w.stride = get_or(resolved, "stride", w.stride);
    const int score = get_or(resolved, "score", -1);
    w.score = score < 0 ? w.stride : score;
    w.max_windows = get_or(resolved, "max-windows", w.max_windows);
    w.bos = get_or<std::string>(resolved, "bos", "auto") != "no";
    w.storage_bytes = storage_bytes(resolved);
    // only the families the method names change the cost (the options of the others are
    // resolved to their defaults, e.g. --sparsity 0.5 for a token-filter point)
    const MethodFamilies fam = method_families(method);
    w.sparsity = fam.activation ? get_or(resolved, "sparsity", 0.0) : 0.0;
    w.tf_ratio = fam.token_filter ? get_or(resolved, "tf-ratio", 0.0) : 0.0;
    w.kv_prune = fam.kv_prune ? get_or(resolved, "kv-prune", 0.0) : 0.0;
    w.corpus_bytes = in.corpus_bytes[c];
    if (get_or(resolved, "no-perplexity", false)) w.max_windows = 1;
    p.predicted = predict_eval(in.shape.at(m), w, spec.cost);
    plan.points.push_back(std::move(p));
  };

  if (spec.has_grid) {
    for (const auto& m : spec.grid_models)
      for (const auto& c : spec.grid_corpora)
        for (const auto& method : spec.grid_methods) {
          std::map<std::string, std::vector<json>> axes = spec.grid_axes;
          json fixed = spec.options;
          if (auto it = spec.methods.find(method); it != spec.methods.end())
            for (const auto& [k, v] : it->second.items()) {
              axes.erase(k);
              if (v.is_array())
                axes[k] = v.get<std::vector<json>>();
              else
                fixed[k] = v;
            }
          for (const auto& [k, v] : axes) fixed.erase(k);
          const auto mc = spec.method_calibration.find(method);
          const bool use_cal = mc != spec.method_calibration.end() && mc->second;
          product(axes, [&](const json& a) {
            json opts = fixed;
            for (const auto& [k, v] : a.items()) opts[k] = v;
            add_point(m, c, method, opts, use_cal, "grid");
          });
        }
  }
  for (const auto& ep : spec.points) {
    const std::string origin = fmt::format("points[{}]", ep.index);
    json opts = spec.options;
    bool ok = true;
    if (auto it = spec.methods.find(ep.method); it != spec.methods.end())
      for (const auto& [k, v] : it->second.items()) {
        if (!v.is_array()) {
          opts[k] = v;
        } else if (!ep.options.contains(k)) {
          problems.push_back(fmt::format(
              "{}: [methods.{}] {} is a list (an axis); give {} = … in the point itself", origin,
              ep.method, k, k));
          ok = false;
        }
      }
    for (const auto& [k, v] : ep.options.items()) opts[k] = v;
    const auto mc = spec.method_calibration.find(ep.method);
    const bool use_cal =
        ep.calibration_set ? ep.calibration : (mc != spec.method_calibration.end() && mc->second);
    if (ok) add_point(ep.model, ep.corpus, ep.method, opts, use_cal, origin);
  }

  if (!problems.empty()) {
    std::string msg = fmt::format("{}: {} problem{} found before running anything:", spec.path,
                                  problems.size(), problems.size() == 1 ? "" : "s");
    for (const auto& p : problems) msg += "\n  " + p;
    throw Error(msg);
  }
  require(!plan.points.empty(), "{}: the spec expands to no points", spec.path);
  return plan;
}

json plan_json(const Spec& spec, const Plan& plan) {
  json j;
  j["name"] = spec.name;
  j["spec"] = spec.path;
  j["output"] = spec.output;
  json cals = json::array();
  for (const auto& c : plan.calibrations)
    cals.push_back({{"id", c.id},
                    {"model", c.model},
                    {"computed", c.computed},
                    {"file", c.file},
                    {"config", c.config},
                    {"args", c.args},
                    {"predicted_seconds", c.predicted.seconds}});
  j["calibrations"] = cals;
  json pts = json::array();
  for (const auto& p : plan.points) {
    json e = {{"id", p.id},
              {"model", p.model},
              {"corpus", p.corpus},
              {"method", p.method},
              {"options", p.options},
              {"origin", p.origin},
              {"config", p.config},
              {"args", p.args},
              {"predicted",
               {{"flops_dense", p.predicted.flops_dense},
                {"flops_realised", p.predicted.flops_realised},
                {"bytes_dense", p.predicted.bytes_dense},
                {"bytes_realised", p.predicted.bytes_realised},
                {"seconds", p.predicted.seconds}}}};
    e["calibration"] = p.calibration >= 0
                           ? json(plan.calibrations[static_cast<std::size_t>(p.calibration)].id)
                           : json(nullptr);
    pts.push_back(std::move(e));
  }
  j["points"] = pts;
  j["duplicates"] = plan.duplicates;
  return j;
}

}  // namespace sparsim::sweep
