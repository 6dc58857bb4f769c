#include "sweep/spec.hpp"

#include "core/error.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

namespace sparsim::sweep {

namespace fs = std::filesystem;

namespace {

/// "file:line: " for a node (or the file alone when the node has no position).
std::string at(const std::string& file, const toml::node& n) {
  const auto& s = n.source();
  if (s.begin.line == 0) return file + ": ";
  return fmt::format("{}:{}: ", file, s.begin.line);
}

std::string at_key(const std::string& file, const toml::key& k) {
  const auto& s = k.source();
  if (s.begin.line == 0) return file + ": ";
  return fmt::format("{}:{}: ", file, s.begin.line);
}

const char* kind_of(const toml::node& n) {
  if (n.is_table()) return "a table";
  if (n.is_array()) return "a list";
  if (n.is_string()) return "a string";
  if (n.is_integer()) return "an integer";
  if (n.is_floating_point()) return "a number";
  if (n.is_boolean()) return "a boolean";
  return "a date or time";
}

/// A scalar option value (integer, number, string, boolean) as JSON; dates, tables and lists
/// are errors naming the key.
nlohmann::json scalar(const std::string& file, const std::string& where, const toml::node& n) {
  if (auto v = n.as_integer()) return v->get();
  if (auto v = n.as_floating_point()) {
    const double d = v->get();
    require(std::isfinite(d), "{}{}: {} is not a finite number", at(file, n), where, d);
    return d;
  }
  if (auto v = n.as_string()) return v->get();
  if (auto v = n.as_boolean()) return v->get();
  fail("{}{}: expected a number, string or boolean, got {}", at(file, n), where, kind_of(n));
}

const toml::table& table_of(const std::string& file, const std::string& where,
                            const toml::node& n) {
  const toml::table* t = n.as_table();
  require(t != nullptr, "{}{}: expected a table, got {}", at(file, n), where, kind_of(n));
  return *t;
}

std::string string_of(const std::string& file, const std::string& where, const toml::node& n) {
  const auto* s = n.as_string();
  require(s != nullptr, "{}{}: expected a string, got {}", at(file, n), where, kind_of(n));
  require(!s->get().empty(), "{}{}: empty string", at(file, n), where);
  return s->get();
}

/// A list of strings (or one string, read as a list of one) that must not be empty.
std::vector<std::string> names_of(const std::string& file, const std::string& where,
                                  const toml::node& n) {
  std::vector<std::string> out;
  if (n.is_string()) return {string_of(file, where, n)};
  const toml::array* a = n.as_array();
  require(a != nullptr, "{}{}: expected a list of names, got {}", at(file, n), where, kind_of(n));
  require(!a->empty(), "{}{}: empty list (an axis needs at least one value)", at(file, n), where);
  for (const toml::node& e : *a) {
    const std::string s = string_of(file, where, e);
    require(std::find(out.begin(), out.end(), s) == out.end(), "{}{}: '{}' is listed twice",
            at(file, e), where, s);
    out.push_back(s);
  }
  return out;
}

/// An option value: a scalar, or (when `allow_axis`) a non-empty list of scalars.
nlohmann::json option_value(const std::string& file, const std::string& where, const toml::node& n,
                            bool allow_axis) {
  if (const toml::array* a = n.as_array()) {
    require(allow_axis, "{}{}: a list is an axis and belongs in [grid] or [methods.NAME]",
            at(file, n), where);
    require(!a->empty(), "{}{}: empty list (an axis needs at least one value)", at(file, n), where);
    nlohmann::json arr = nlohmann::json::array();
    for (const toml::node& e : *a) {
      nlohmann::json v = scalar(file, where, e);
      for (const auto& prev : arr)
        require(prev != v, "{}{}: the value {} is listed twice", at(file, e), where, v.dump());
      arr.push_back(std::move(v));
    }
    return arr;
  }
  return scalar(file, where, n);
}

void check_option_key(const std::string& file, const std::string& where, const toml::key& k) {
  const std::string s(k.str());
  const auto& r = reserved_option_keys();
  if (std::find(r.begin(), r.end(), s) != r.end())
    fail("{}{}: '{}' is set by the sweep and cannot be an option here{}", at_key(file, k), where, s,
         s == "threads" || s == "log-level"               ? fmt::format(" (use [run] {} = …)", s)
         : s == "model" || s == "corpus" || s == "method" ? " (use [grid] or [[points]])"
                                                          : "");
  require(!s.empty() && s.find_first_of(" \t=") == std::string::npos && s[0] != '-',
          "{}{}: '{}' is not an option name", at_key(file, k), where, s);
}

double positive(const std::string& file, const std::string& where, const toml::node& n) {
  double v = 0;
  if (auto i = n.as_integer())
    v = static_cast<double>(i->get());
  else if (auto d = n.as_floating_point())
    v = d->get();
  else
    fail("{}{}: expected a number, got {}", at(file, n), where, kind_of(n));
  require(std::isfinite(v) && v > 0, "{}{}: must be positive, got {}", at(file, n), where, v);
  return v;
}

void unknown_key(const std::string& file, const std::string& section, const toml::key& k,
                 const char* known) {
  fail("{}unknown key '{}' in {} (known: {})", at_key(file, k), k.str(), section, known);
}

}  // namespace

const std::vector<std::string>& reserved_option_keys() {
  static const std::vector<std::string> keys = {
      "model", "corpus",   "method",    "out",           "json",       "threads",
      "help",  "progress", "log-level", "check-options", "calibration"};
  return keys;
}

std::string expand_vars(const std::string& s) {
  std::string out;
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t a = s.find("${", i);
    if (a == std::string::npos) {
      out += s.substr(i);
      break;
    }
    const std::size_t b = s.find('}', a + 2);
    require(b != std::string::npos, "'{}': unterminated ${{…}}", s);
    const std::string name = s.substr(a + 2, b - a - 2);
    const char* v = std::getenv(name.c_str());
    require(v != nullptr && *v != '\0', "'{}': the environment variable {} is not set", s, name);
    out += s.substr(i, a - i) + v;
    i = b + 1;
  }
  return out;
}

std::string option_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
  if (v.is_number_unsigned()) return std::to_string(v.get<std::uint64_t>());
  if (v.is_number_float()) return fmt::format("{}", v.get<double>());
  return v.dump();
}

Spec load_spec(const std::string& path) {
  std::error_code ec;
  require(fs::is_regular_file(path, ec), "sweep spec '{}' does not exist or is not a file", path);
  Spec s;
  s.path = fs::absolute(path).lexically_normal().string();
  s.dir = fs::path(s.path).parent_path().string();
  const std::string& f = path;
  toml::table doc;
  try {
    doc = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    fail("{}:{}:{}: not valid TOML: {}", path, e.source().begin.line, e.source().begin.column,
         e.description());
  }

  const toml::node* grid_node = nullptr;
  const toml::node* methods_node = nullptr;
  const toml::node* cal_node = nullptr;
  const toml::node* points_node = nullptr;
  bool have_sweep = false;
  for (auto&& [k, v] : doc) {
    const std::string key(k.str());
    if (key == "sweep") {
      have_sweep = true;
      for (auto&& [k2, v2] : table_of(f, "[sweep]", v)) {
        const std::string kk(k2.str());
        if (kk == "name")
          s.name = string_of(f, "[sweep] name", v2);
        else if (kk == "output")
          s.output = string_of(f, "[sweep] output", v2);
        else if (kk == "command")
          s.command = string_of(f, "[sweep] command", v2);
        else
          unknown_key(f, "[sweep]", k2, "name, output, command");
      }
    } else if (key == "models" || key == "corpora") {
      auto& dst = key == "models" ? s.models : s.corpora;
      for (auto&& [k2, v2] : table_of(f, "[" + key + "]", v))
        dst[std::string(k2.str())] = string_of(f, fmt::format("[{}] {}", key, k2.str()), v2);
    } else if (key == "options") {
      for (auto&& [k2, v2] : table_of(f, "[options]", v)) {
        check_option_key(f, "[options]", k2);
        s.options[std::string(k2.str())] =
            option_value(f, fmt::format("[options] {}", k2.str()), v2, false);
      }
    } else if (key == "grid") {
      grid_node = &v;
    } else if (key == "methods") {
      methods_node = &v;
    } else if (key == "calibration") {
      cal_node = &v;
    } else if (key == "points") {
      points_node = &v;
    } else if (key == "run") {
      for (auto&& [k2, v2] : table_of(f, "[run]", v)) {
        const std::string kk(k2.str());
        if (kk == "threads") {
          const auto* i = v2.as_integer();
          require(i && i->get() >= 0 && i->get() <= 4096,
                  "{}[run] threads: expected an integer in 0 … 4096", at(f, v2));
          s.run.threads = static_cast<int>(i->get());
        } else if (kk == "log-level") {
          s.run.log_level = string_of(f, "[run] log-level", v2);
          static const std::set<std::string> levels = {"trace", "debug", "info",
                                                       "warn",  "error", "off"};
          require(levels.count(s.run.log_level) == 1,
                  "{}[run] log-level: '{}' is not trace, debug, info, warn, error or off",
                  at(f, v2), s.run.log_level);
        } else {
          unknown_key(f, "[run]", k2, "threads, log-level");
        }
      }
    } else if (key == "cost") {
      for (auto&& [k2, v2] : table_of(f, "[cost]", v)) {
        const std::string kk(k2.str());
        const std::string w = "[cost] " + kk;
        if (kk == "gflops")
          s.cost.flops_per_second = positive(f, w, v2) * 1e9;
        else if (kk == "gbytes-per-second")
          s.cost.bytes_per_second = positive(f, w, v2) * 1e9;
        else if (kk == "load-gbytes-per-second")
          s.cost.load_bytes_per_second = positive(f, w, v2) * 1e9;
        else if (kk == "bytes-per-token")
          s.cost.bytes_per_token = positive(f, w, v2);
        else if (kk == "startup-seconds")
          s.cost.startup_seconds = positive(f, w, v2);
        else
          unknown_key(f, "[cost]", k2,
                      "gflops, gbytes-per-second, load-gbytes-per-second, bytes-per-token, "
                      "startup-seconds");
      }
    } else {
      unknown_key(f, "the spec", k,
                  "sweep, models, corpora, calibration, options, grid, methods, points, run, "
                  "cost");
    }
  }
  require(have_sweep, "{}: no [sweep] table (it needs at least name and output)", f);
  require(!s.name.empty(), "{}: [sweep] name is required (it identifies the output folder)", f);
  require(!s.output.empty(), "{}: [sweep] output is required (the folder for the results)", f);
  try {
    s.output = expand_vars(s.output);
  } catch (const Error& e) {
    fail("{}: [sweep] output {}", f, e.what());
  }
  s.output = (fs::path(s.output).is_absolute() ? fs::path(s.output) : fs::path(s.dir) / s.output)
                 .lexically_normal()
                 .string();
  while (s.output.size() > 1 && s.output.back() == '/') s.output.pop_back();
  require(s.command.find_first_of(" /") == std::string::npos && s.command != "sweep" &&
              s.command != "collect",
          "{}: [sweep] command '{}' is not a subcommand a point can run", f, s.command);
  require(!s.models.empty(), "{}: [models] is empty or missing: name at least one model", f);

  if (cal_node) {
    for (auto&& [k, v] : table_of(f, "[calibration]", *cal_node)) {
      const std::string model(k.str());
      const std::string w = "[calibration." + model + "]";
      require(s.models.count(model) == 1, "{}{}: '{}' is not a model defined in [models]",
              at_key(f, k), w, model);
      CalibrationSpec c;
      c.model = model;
      for (auto&& [k2, v2] : table_of(f, w, v)) {
        const std::string kk(k2.str());
        if (kk == "file") {
          c.file = string_of(f, w + " file", v2);
        } else if (kk == "corpus") {
          c.corpus = string_of(f, w + " corpus", v2);
          require(s.corpora.count(c.corpus) == 1,
                  "{}{} corpus: '{}' is not a corpus defined in [corpora]", at(f, v2), w, c.corpus);
        } else {
          require(kk != "model" && kk != "out" && kk != "threads" && kk != "progress" &&
                      kk != "log-level" && kk != "help" && kk != "check-options",
                  "{}{}: '{}' is set by the sweep and cannot be an option here", at_key(f, k2), w,
                  kk);
          c.options[kk] = option_value(f, w + " " + kk, v2, false);
        }
      }
      require(c.file.empty() || (c.corpus.empty() && c.options.empty()),
              "{}{}: give either file (an existing calibration) or corpus and options (computed "
              "by the sweep), not both",
              at(f, v), w);
      require(!c.file.empty() || !c.corpus.empty(),
              "{}{}: needs file (an existing calibration file) or corpus (to compute one)",
              at(f, v), w);
      s.calibrations[model] = std::move(c);
    }
  }

  if (methods_node) {
    for (auto&& [k, v] : table_of(f, "[methods]", *methods_node)) {
      const std::string m(k.str());
      const std::string w = "[methods." + m + "]";
      nlohmann::json opts = nlohmann::json::object();
      for (auto&& [k2, v2] : table_of(f, w, v)) {
        const std::string kk(k2.str());
        if (kk == "calibration") {
          const auto* b = v2.as_boolean();
          require(b != nullptr,
                  "{}{} calibration: expected true or false (true: pass the model's calibration "
                  "file from [calibration.MODEL])",
                  at(f, v2), w);
          s.method_calibration[m] = b->get();
          continue;
        }
        check_option_key(f, w, k2);
        opts[kk] = option_value(f, w + " " + kk, v2, true);
      }
      s.methods[m] = std::move(opts);
    }
  }

  if (grid_node) {
    s.has_grid = true;
    bool have_model = false, have_corpus = false, have_method = false;
    for (auto&& [k, v] : table_of(f, "[grid]", *grid_node)) {
      const std::string kk(k.str());
      if (kk == "model") {
        s.grid_models = names_of(f, "[grid] model", v);
        for (const auto& m : s.grid_models)
          require(s.models.count(m) == 1, "{}[grid] model: '{}' is not defined in [models]",
                  at(f, v), m);
        have_model = true;
      } else if (kk == "corpus") {
        s.grid_corpora = names_of(f, "[grid] corpus", v);
        for (const auto& c : s.grid_corpora)
          require(s.corpora.count(c) == 1, "{}[grid] corpus: '{}' is not defined in [corpora]",
                  at(f, v), c);
        have_corpus = true;
      } else if (kk == "method") {
        s.grid_methods = names_of(f, "[grid] method", v);
        have_method = true;
      } else {
        check_option_key(f, "[grid]", k);
        nlohmann::json a = option_value(f, "[grid] " + kk, v, true);
        if (!a.is_array()) a = nlohmann::json::array({a});
        s.grid_axes[kk] = a.get<std::vector<nlohmann::json>>();
      }
    }
    require(have_model, "{}: [grid] needs a model axis (model = [\"name\", …])", f);
    require(have_corpus, "{}: [grid] needs a corpus axis (corpus = [\"name\", …])", f);
    require(have_method, "{}: [grid] needs a method axis (method = [\"dense\", …])", f);
  }

  if (points_node) {
    const toml::array* arr = points_node->as_array();
    require(arr != nullptr, "{}points: expected [[points]] tables", at(f, *points_node));
    int i = 0;
    for (const toml::node& pn : *arr) {
      const std::string w = fmt::format("points[{}]", i);
      ExtraPoint p;
      p.index = i;
      for (auto&& [k, v] : table_of(f, w, pn)) {
        const std::string kk(k.str());
        if (kk == "model") {
          p.model = string_of(f, w + " model", v);
          require(s.models.count(p.model) == 1, "{}{} model: '{}' is not defined in [models]",
                  at(f, v), w, p.model);
        } else if (kk == "corpus") {
          p.corpus = string_of(f, w + " corpus", v);
          require(s.corpora.count(p.corpus) == 1, "{}{} corpus: '{}' is not defined in [corpora]",
                  at(f, v), w, p.corpus);
        } else if (kk == "method") {
          p.method = string_of(f, w + " method", v);
        } else if (kk == "calibration") {
          const auto* b = v.as_boolean();
          require(b != nullptr, "{}{} calibration: expected true or false", at(f, v), w);
          p.calibration = b->get();
          p.calibration_set = true;
        } else {
          check_option_key(f, w, k);
          p.options[kk] = option_value(f, w + " " + kk, v, false);
        }
      }
      require(!p.model.empty(), "{}{}: needs model", at(f, pn), w);
      require(!p.corpus.empty(), "{}{}: needs corpus", at(f, pn), w);
      require(!p.method.empty(), "{}{}: needs method", at(f, pn), w);
      s.points.push_back(std::move(p));
      ++i;
    }
  }
  require(s.has_grid || !s.points.empty(),
          "{}: no points: give a [grid] (model, corpus, method axes) or [[points]]", f);
  for (const auto& [m, opts] : s.methods) {
    bool used = std::find(s.grid_methods.begin(), s.grid_methods.end(), m) != s.grid_methods.end();
    for (const auto& p : s.points) used = used || p.method == m;
    require(used, "{}: [methods.{}] is not used by any point (not in [grid] method or [[points]])",
            f, m);
  }
  return s;
}

}  // namespace sparsim::sweep
