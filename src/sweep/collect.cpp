#include "sweep/collect.hpp"

#include "core/error.hpp"
#include "io/hdf5.hpp"
#include "io/run_file.hpp"
#include "io/summary_columns.hpp"
#include "sweep/point_files.hpp"
#include "sweep/util.hpp"

#include <cmath>
#include <limits>
#include <map>
#include <set>

namespace sparsim::sweep {

using json = nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// One row while it is being gathered: column name -> value (number or string).
using Row = std::map<std::string, json>;

double num(const json& j, const std::string& key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return kNaN;
  return j[key].get<double>();
}

std::string str(const json& j, const std::string& key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return {};
  return j[key].get<std::string>();
}

struct Fixed {
  const char* name;
  Column::Type type;
  const char* units;
  const char* meaning;
};

// The columns every table has, in order; option columns go after `method`.
const Fixed kHead[] = {
    {"id", Column::Type::String, "", "point id: 16 hex digits over its configuration"},
    {"model", Column::Type::String, "", "model name in the spec"},
    {"model_path", Column::Type::String, "", "model as written in the spec"},
    {"corpus", Column::Type::String, "", "corpus name in the spec"},
    {"corpus_path", Column::Type::String, "", "corpus as written in the spec"},
    {"method", Column::Type::String, "", "method"},
};
const Fixed kTail[] = {
    {"calibration", Column::Type::String, "", "calibration id (made by the sweep) or file"},
    {"perplexity", Column::Type::Float, "1", "perplexity over the scored tokens"},
    {"tokens_scored", Column::Type::Int, "token", "tokens scored for perplexity"},
    {"windows", Column::Type::Int, "1", "perplexity windows"},
    {"tasks_acc", Column::Type::Float, "1", "multiple-choice accuracy (NaN: no tasks)"},
    {"tasks_acc_norm", Column::Type::Float, "1",
     "multiple-choice accuracy, log-likelihood per byte (NaN: no tasks)"},
    {"task_items", Column::Type::Int, "1", "multiple-choice items scored"},
    {"sparsity_target", Column::Type::Float, "1", "target activation sparsity (dense: 0)"},
    {"sparsity_realised", Column::Type::Float, "1",
     "realised activation sparsity, mean over masked tokens (FLOP-weighted; dense: 0)"},
    {"sparsity_realised_min", Column::Type::Float, "1", "realised sparsity, minimum over tokens"},
    {"sparsity_realised_max", Column::Type::Float, "1", "realised sparsity, maximum over tokens"},
    {"flops_dense", Column::Type::Float, "FLOP", "FLOPs a dense run performs (ledger total)"},
    {"flops_realised", Column::Type::Float, "FLOP", "FLOPs the run performed (ledger total)"},
    {"bytes_dense", Column::Type::Float, "byte", "memory traffic of a dense run (ledger total)"},
    {"bytes_realised", Column::Type::Float, "byte", "memory traffic of the run (ledger total)"},
    {"wall_seconds", Column::Type::Float, "s", "the command's own wall time"},
    {"point_seconds", Column::Type::Float, "s",
     "wall time of the point as the sweep measured it (process start to exit)"},
    {"predicted_seconds", Column::Type::Float, "s", "the plan's predicted wall time"},
    {"model_fingerprint", Column::Type::String, "",
     "hash of every tensor's name, shape, type and bytes"},
    {"corpus_fingerprint", Column::Type::String, "", "FNV-1a over the corpus documents"},
    {"sparsim_version", Column::Type::String, "", "sparsim version that ran the point"},
    {"backend", Column::Type::String, "", "execution backend"},
    {"threads", Column::Type::Int, "1", "host threads"},
    {"host", Column::Type::String, "", "host that ran the point"},
    {"finished_utc", Column::Type::String, "", "when the point finished (ISO 8601 UTC)"},
};

/// A column a point's summary brings in its `columns` object (io/summary_columns.hpp), named by
/// the method family that made it; collect knows none of them.
struct MethodColumn {
  std::string name;  ///< in the table: the summary's name, or m_<name> where that is taken
  std::string units, meaning;
  std::string first;  ///< the point it was first seen in (for the units check)
};

std::string column_name(const std::string& option, const std::set<std::string>& taken) {
  std::string c = option;
  for (auto& ch : c)
    if (ch == '-') ch = '_';
  if (taken.count(c)) c = "option_" + c;
  return c;
}

}  // namespace

Table build_table(const Spec& spec, const Plan& plan, const Store& store) {
  std::set<std::string> fixed_names;
  for (const auto& f : kHead) fixed_names.insert(f.name);
  for (const auto& f : kTail) fixed_names.insert(f.name);
  // Option columns: the union of the points' option keys, sorted.
  std::map<std::string, std::string> option_col;  // option -> column
  for (const auto& p : plan.points)
    for (const auto& [k, v] : p.options.items())
      if (!option_col.count(k)) option_col[k] = column_name(k, fixed_names);

  std::set<std::string> taken = fixed_names;
  for (const auto& [opt, col] : option_col) taken.insert(col);
  // Method columns: the union of the points' summary columns, in order of first appearance.
  std::vector<MethodColumn> method_cols;
  std::map<std::string, std::size_t> method_col;  // summary name -> index in method_cols

  Table t;
  std::vector<Row> rows;
  for (const auto& p : plan.points) {
    std::string why;
    auto manifest = store.done_manifest(p, &why);
    if (!manifest) {
      t.skipped.push_back(p.id + ": " + why);
      continue;
    }
    const std::string dir = store.point_dir(p.id);
    json s;
    try {
      s = json::parse(read_text(dir + "/summary.json"));
    } catch (const std::exception& e) {
      t.skipped.push_back(p.id + ": summary.json unreadable: " + e.what());
      continue;
    }
    Row r;
    r["id"] = p.id;
    r["model"] = p.model;
    r["model_path"] = spec.models.at(p.model);
    r["corpus"] = p.corpus;
    r["corpus_path"] = spec.corpora.at(p.corpus);
    r["method"] = p.method;
    for (const auto& [k, v] : p.options.items()) r[option_col[k]] = v;
    if (p.calibration >= 0) {
      const auto& c = plan.calibrations[static_cast<std::size_t>(p.calibration)];
      r["calibration"] = c.computed ? c.id : spec.calibrations.at(c.model).file;
    }
    if (s.contains("perplexity") && s["perplexity"].is_number()) r["perplexity"] = s["perplexity"];
    r["tokens_scored"] = s.value("tokens_scored", 0);
    r["windows"] = s.value("windows", 0);
    if (s.contains("tasks")) {
      r["tasks_acc"] = num(s["tasks"], "acc");
      r["tasks_acc_norm"] = num(s["tasks"], "acc_norm");
      r["task_items"] = s["tasks"].value("items", 0);
    } else {
      r["task_items"] = 0;
    }
    if (s.contains("sparsity")) {
      r["sparsity_target"] = num(s["sparsity"], "target");
      r["sparsity_realised"] = num(s["sparsity"], "realised_mean");
      r["sparsity_realised_min"] = num(s["sparsity"], "realised_min");
      r["sparsity_realised_max"] = num(s["sparsity"], "realised_max");
    } else if (str(s, "method") == "dense") {
      for (const char* k : {"sparsity_target", "sparsity_realised", "sparsity_realised_min",
                            "sparsity_realised_max"})
        r[k] = 0.0;
    }
    r["wall_seconds"] = num(s, "wall_seconds");
    r["point_seconds"] = num(*manifest, "seconds");
    r["predicted_seconds"] = p.predicted.seconds;
    if (s.contains("model")) r["model_fingerprint"] = str(s["model"], "fingerprint");
    if (s.contains("corpus")) r["corpus_fingerprint"] = str(s["corpus"], "fingerprint");
    r["backend"] = str(s, "backend");
    r["threads"] = s.value("threads", 0);
    r["host"] = str(*manifest, "host");
    r["finished_utc"] = str(*manifest, "finished_utc");
    r["sparsim_version"] = str(*manifest, "sparsim_version");
    // Totals of the FLOP / byte ledger and the version that wrote the run file.
    try {
      io::H5File f = io::H5File::open_read(dir + "/run.h5");
      const io::Group root = f.root();
      if (root.has_group("flops")) {
        const io::Group fl = root.open_group("flops");
        for (const char* k : {"flops_dense", "flops_realised", "bytes_dense", "bytes_realised"})
          r[k] = fl.get_attr<double>(std::string("total_") + k);
      }
      if (root.has_group("run"))
        r["sparsim_version"] = root.open_group("run").get_attr<std::string>("version");
    } catch (const Error& e) {
      t.skipped.push_back(p.id + ": run.h5 unreadable: " + e.what());
      continue;
    }
    if (s.contains("columns")) {
      io::SummaryColumns cols;
      try {
        cols = io::SummaryColumns::from_json(s["columns"]);
      } catch (const Error& e) {
        throw Error(fmt::format("collect: point {}: summary.json: {}", p.id, e.what()));
      }
      for (const auto& c : cols.list()) {
        auto [it, fresh] = method_col.emplace(c.name, method_cols.size());
        if (fresh)
          method_cols.push_back(
              {taken.count(c.name) ? "m_" + c.name : c.name, c.units, c.meaning, p.id});
        const MethodColumn& m = method_cols[it->second];
        require(m.units == c.units,
                "collect: column '{}' has units '{}' in point {} but '{}' in point {}: the "
                "table would mix them",
                c.name, m.units, m.first, c.units, p.id);
        r[m.name] = c.value;
      }
    }
    rows.push_back(std::move(r));
  }

  auto add_fixed = [&](const Fixed& f) {
    Column c;
    c.name = f.name;
    c.type = f.type;
    c.units = f.units;
    c.meaning = f.meaning;
    t.columns.push_back(std::move(c));
  };
  for (const auto& f : kHead) add_fixed(f);
  for (const auto& [opt, col] : option_col) {
    Column c;
    c.name = col;
    c.meaning = "option --" + opt + " of the point's command (as in the spec)";
    bool any_string = false, all_int = true, all_present = true;
    for (const auto& r : rows) {
      auto it = r.find(col);
      if (it == r.end()) {
        all_present = false;
        continue;
      }
      if (it->second.is_string() || it->second.is_boolean()) any_string = true;
      if (!it->second.is_number_integer()) all_int = false;
    }
    c.type = any_string                 ? Column::Type::String
             : (all_int && all_present) ? Column::Type::Int
                                        : Column::Type::Float;
    c.units = c.type == Column::Type::String ? "" : "1";
    t.columns.push_back(std::move(c));
  }
  for (const auto& f : kTail) add_fixed(f);
  for (const auto& m : method_cols) {
    Column c;
    c.name = m.name;
    c.units = m.units;
    c.meaning = m.meaning;
    c.type = Column::Type::Float;
    for (const auto& r : rows) {
      auto it = r.find(m.name);
      if (it != r.end() && it->second.is_string()) c.type = Column::Type::String;
    }
    t.columns.push_back(std::move(c));
  }

  t.rows = rows.size();
  for (auto& c : t.columns) {
    for (const auto& r : rows) {
      auto it = r.find(c.name);
      const bool has = it != r.end() && !it->second.is_null();
      switch (c.type) {
        case Column::Type::String:
          c.s.push_back(has ? (it->second.is_string() ? it->second.get<std::string>()
                                                      : option_text(it->second))
                            : std::string());
          break;
        case Column::Type::Int:
          c.i.push_back(has && it->second.is_number() ? it->second.get<std::int64_t>() : 0);
          break;
        case Column::Type::Float:
          c.f.push_back(has && it->second.is_number() ? it->second.get<double>() : kNaN);
          break;
      }
    }
  }
  return t;
}

namespace {
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) {
    if (ch == '"') q += '"';
    q += ch;
  }
  return q + "\"";
}
}  // namespace

std::string table_csv(const Table& t) {
  std::string out;
  for (std::size_t c = 0; c < t.columns.size(); ++c)
    out += (c ? "," : "") + csv_field(t.columns[c].name);
  out += "\n";
  for (std::size_t r = 0; r < t.rows; ++r) {
    for (std::size_t c = 0; c < t.columns.size(); ++c) {
      const Column& col = t.columns[c];
      if (c) out += ",";
      switch (col.type) {
        case Column::Type::String:
          out += csv_field(col.s[r]);
          break;
        case Column::Type::Int:
          out += std::to_string(col.i[r]);
          break;
        case Column::Type::Float:
          if (!std::isnan(col.f[r])) out += fmt::format("{}", col.f[r]);
          break;
      }
    }
    out += "\n";
  }
  return out;
}

void write_table(const Spec& spec, const Table& t, const std::string& h5_path,
                 const std::string& csv_path) {
  {
    io::RunFile rf(h5_path);
    io::Group root = rf.root();
    std::vector<std::string> names;
    for (const auto& c : t.columns) names.push_back(c.name);
    root.write_strings("columns", names, {"", "the columns of /results, in table order"});
    io::Group g = root.create_group("results");
    g.set_attr("rows", static_cast<std::int64_t>(t.rows));
    g.set_attr("sweep", spec.name);
    g.set_attr("spec", spec.path);
    g.set_attr("created_utc", utc_now());
    g.set_attr("sparsim_version", std::string(SPARSIM_VERSION));
    for (const auto& c : t.columns) {
      const io::Attrs a{c.units, c.meaning};
      switch (c.type) {
        case Column::Type::String:
          g.write_strings(c.name, c.s, {"", c.meaning});
          break;
        case Column::Type::Int:
          g.write<std::int64_t>(c.name, c.i, a);
          break;
        case Column::Type::Float:
          g.write<double>(c.name, c.f, a);
          break;
      }
    }
    rf.commit();
  }
  write_atomically(csv_path, table_csv(t));
}

}  // namespace sparsim::sweep
