#include "flops/report.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace sparsim::flops {

namespace {

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

nlohmann::ordered_json cell_json(const Cell& c) {
  nlohmann::ordered_json j = {{"launches", c.launches},
                              {"dense_flops", c.flops_dense},
                              {"realised_flops", c.flops_realised},
                              {"dense_bytes", c.bytes_dense},
                              {"realised_bytes", c.bytes_realised},
                              {"dense_intensity", ratio(c.flops_dense, c.bytes_dense)},
                              {"realised_intensity", ratio(c.flops_realised, c.bytes_realised)}};
  if (c.flops_dense > 0) j["flops_saved_fraction"] = 1.0 - c.flops_realised / c.flops_dense;
  if (c.bytes_dense > 0) j["bytes_saved_fraction"] = 1.0 - c.bytes_realised / c.bytes_dense;
  j["method_overhead"] = c.method_overhead();
  return j;
}

/// Method overhead of a phase: the ops a dense run does not have.
Cell overhead(const LedgerFile& lf, std::size_t p) {
  Cell t;
  for (std::size_t o = 0; o < lf.num_ops(); ++o) {
    const Cell c = lf.op_total(p, o);
    if (c.method_overhead()) t += c;
  }
  return t;
}

std::string run_label(std::size_t i) {
  std::string s;
  std::size_t n = i;
  do {
    s.insert(s.begin(), static_cast<char>('A' + n % 26));
    n = n / 26;
  } while (n-- > 0);
  return s;
}

std::string describe(const LedgerFile& lf) {
  const RunInfo& r = lf.run;
  std::string s = fmt::format("model {}", r.model_name.empty() ? "?" : r.model_name);
  if (!r.storage.empty()) s += fmt::format(", {} weights", r.storage);
  s += fmt::format(", method {}", r.method);
  if (!r.backend.empty())
    s += fmt::format("; {}, {} thread{}", r.backend, r.threads, r.threads == 1 ? "" : "s");
  return s;
}

std::string saved_text(const Cell& c) {
  if (c.method_overhead()) return "added";
  if (c.flops_dense <= 0) return "-";
  return fmt::format("{:.1f}%", 100.0 * (1.0 - c.flops_realised / c.flops_dense));
}

std::string phase_heading(const LedgerFile& lf, std::size_t p) {
  return fmt::format("{}: {} call{}, {} token{}", lf.phases[p], lf.calls[p],
                     lf.calls[p] == 1 ? "" : "s", lf.tokens[p], lf.tokens[p] == 1 ? "" : "s");
}

bool phase_used(const LedgerFile& lf, std::size_t p) {
  return lf.phase_total(p).used();
}

/// A table as rows of cells, rendered either aligned for the terminal or as Markdown.
struct Table {
  std::vector<std::string> head;
  std::vector<bool> right;  ///< right-align column
  std::vector<std::vector<std::string>> rows;

  std::string text(const std::string& indent) const {
    std::vector<std::size_t> w(head.size());
    for (std::size_t c = 0; c < head.size(); ++c) w[c] = head[c].size();
    for (const auto& r : rows)
      for (std::size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
    auto line = [&](const std::vector<std::string>& r) {
      std::string s = indent;
      for (std::size_t c = 0; c < r.size(); ++c) {
        const std::size_t pad = w[c] - r[c].size();
        if (c) s += "  ";
        s += right[c] ? std::string(pad, ' ') + r[c] : r[c] + std::string(pad, ' ');
      }
      while (!s.empty() && s.back() == ' ') s.pop_back();
      return s + "\n";
    };
    std::string s = line(head);
    for (const auto& r : rows) s += line(r);
    return s;
  }
  std::string markdown() const {
    std::string s = "|";
    for (const auto& h : head) s += " " + h + " |";
    s += "\n|";
    for (std::size_t c = 0; c < head.size(); ++c) s += right[c] ? "---:|" : "---|";
    s += "\n";
    for (const auto& r : rows) {
      s += "|";
      for (const auto& x : r) s += " " + x + " |";
      s += "\n";
    }
    return s;
  }
};

std::string g(double v) {
  return fmt::format("{:.4g}", v);
}

Table op_table(const LedgerFile& lf, std::size_t p) {
  Table t;
  t.head = {"op",       "launches",    "GFLOP dense", "GFLOP realised", "FLOPs saved",
            "MB dense", "MB realised", "FLOP/byte",   "share"};
  t.right = {false, true, true, true, true, true, true, true, true};
  const Cell all = lf.phase_total(p);
  auto row = [&](const std::string& name, const Cell& c) {
    t.rows.push_back({name, fmt::format("{:.0f}", c.launches), g(c.flops_dense * 1e-9),
                      g(c.flops_realised * 1e-9), saved_text(c), g(c.bytes_dense * 1e-6),
                      g(c.bytes_realised * 1e-6),
                      fmt::format("{:.2f}", ratio(c.flops_realised, c.bytes_realised)),
                      fmt::format("{:.1f}%", 100.0 * ratio(c.flops_realised, all.flops_realised))});
  };
  for (std::size_t o = 0; o < lf.num_ops(); ++o) {
    const Cell c = lf.op_total(p, o);
    if (!c.used()) continue;
    row(lf.ops[o] + (c.method_overhead() ? " +" : ""), c);
  }
  row("(all)", all);
  return t;
}

Table layer_table(const LedgerFile& lf, std::size_t p) {
  Table t;
  t.head = {"layer",       "launches", "GFLOP dense", "GFLOP realised",
            "FLOPs saved", "MB dense", "MB realised", "overhead GFLOP"};
  t.right = {false, true, true, true, true, true, true, true};
  for (std::size_t s = 0; s < lf.num_slots(); ++s) {
    const Cell c = lf.slot_total(p, s);
    if (!c.used()) continue;
    Cell ov;
    for (std::size_t o = 0; o < lf.num_ops(); ++o) {
      const Cell& e = lf.at(p, o, s);
      if (e.method_overhead()) ov += e;
    }
    t.rows.push_back({lf.layers[s], fmt::format("{:.0f}", c.launches), g(c.flops_dense * 1e-9),
                      g(c.flops_realised * 1e-9), saved_text(c), g(c.bytes_dense * 1e-6),
                      g(c.bytes_realised * 1e-6), g(ov.flops_realised * 1e-9)});
  }
  return t;
}

std::string overhead_line(const LedgerFile& lf, std::size_t p) {
  const Cell ov = overhead(lf, p), all = lf.phase_total(p);
  if (!ov.used()) return "";
  return fmt::format(
      "method overhead (ops marked +, absent from a dense run): {} GFLOP, {} MB = {:.2f}% of "
      "the realised FLOPs, {:.2f}% of the realised bytes\n",
      g(ov.flops_realised * 1e-9), g(ov.bytes_realised * 1e-6),
      100.0 * ratio(ov.flops_realised, all.flops_realised),
      100.0 * ratio(ov.bytes_realised, all.bytes_realised));
}

/// Ops used by any run in phase `name`, in order of first appearance.
std::vector<std::string> union_ops(const std::vector<LedgerFile>& runs, const std::string& phase) {
  std::vector<std::string> out;
  for (const LedgerFile& lf : runs) {
    const int p = lf.phase_index(phase);
    if (p < 0) continue;
    for (std::size_t o = 0; o < lf.num_ops(); ++o)
      if (lf.op_total(static_cast<std::size_t>(p), o).used() &&
          std::find(out.begin(), out.end(), lf.ops[o]) == out.end())
        out.push_back(lf.ops[o]);
  }
  return out;
}

std::vector<std::string> union_phases(const std::vector<LedgerFile>& runs) {
  std::vector<std::string> out;
  for (const LedgerFile& lf : runs)
    for (std::size_t p = 0; p < lf.num_phases(); ++p)
      if (phase_used(lf, p) && std::find(out.begin(), out.end(), lf.phases[p]) == out.end())
        out.push_back(lf.phases[p]);
  return out;
}

Table side_by_side(const std::vector<LedgerFile>& runs, const std::string& phase, bool bytes) {
  Table t;
  t.head = {"op"};
  t.right = {false};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    t.head.push_back(run_label(i) + (bytes ? " MB realised" : " GFLOP realised"));
    t.right.push_back(true);
    t.head.push_back(run_label(i) + " % of dense");
    t.right.push_back(true);
  }
  auto add = [&](const std::string& name, auto&& cell_of) {
    std::vector<std::string> r = {name};
    for (const LedgerFile& lf : runs) {
      const int p = lf.phase_index(phase);
      const Cell c = p < 0 ? Cell{} : cell_of(lf, static_cast<std::size_t>(p));
      const double real = bytes ? c.bytes_realised : c.flops_realised;
      const double dense = bytes ? c.bytes_dense : c.flops_dense;
      if (!c.used()) {
        r.emplace_back("-");
        r.emplace_back("-");
        continue;
      }
      r.push_back(g(real * (bytes ? 1e-6 : 1e-9)));
      r.push_back(dense > 0 ? fmt::format("{:.1f}%", 100.0 * real / dense) : "added");
    }
    t.rows.push_back(std::move(r));
  };
  for (const std::string& op : union_ops(runs, phase))
    add(op, [&](const LedgerFile& lf, std::size_t p) {
      const int o = lf.op_index(op);
      return o < 0 ? Cell{} : lf.op_total(p, static_cast<std::size_t>(o));
    });
  add("(all)", [](const LedgerFile& lf, std::size_t p) { return lf.phase_total(p); });
  return t;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

nlohmann::ordered_json report_json(const LedgerFile& lf) {
  const RunInfo& r = lf.run;
  nlohmann::ordered_json j;
  j["file"] = r.path;
  j["command"] = r.command;
  j["sparsim_version"] = r.version;
  j["schema_version"] = r.schema_version;
  j["method"] = r.method;
  j["backend"] = r.backend;
  j["threads"] = r.threads;
  j["model"] = {{"name", r.model_name}, {"path", r.model_path}, {"storage", r.storage},
                {"n_layer", r.n_layer}, {"d_model", r.d_model}, {"n_params", r.n_params}};
  nlohmann::ordered_json phases = nlohmann::ordered_json::object();
  Cell total;
  for (std::size_t p = 0; p < lf.num_phases(); ++p) {
    const Cell all = lf.phase_total(p);
    total += all;
    nlohmann::ordered_json ph = cell_json(all);
    ph["calls"] = lf.calls[p];
    ph["tokens"] = lf.tokens[p];
    const Cell ov = overhead(lf, p);
    ph["overhead_flops"] = ov.flops_realised;
    ph["overhead_bytes"] = ov.bytes_realised;
    nlohmann::ordered_json ops = nlohmann::ordered_json::object();
    for (std::size_t o = 0; o < lf.num_ops(); ++o) {
      const Cell c = lf.op_total(p, o);
      if (c.used()) ops[lf.ops[o]] = cell_json(c);
    }
    ph["ops"] = ops;
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (std::size_t s = 0; s < lf.num_slots(); ++s) {
      const Cell c = lf.slot_total(p, s);
      if (!c.used()) continue;
      nlohmann::ordered_json l = cell_json(c);
      l["layer"] = lf.layer_index[s];
      l["name"] = lf.layers[s];
      layers.push_back(l);
    }
    ph["layers"] = layers;
    phases[lf.phases[p]] = ph;
  }
  j["phases"] = phases;
  j["total"] = cell_json(total);
  return j;
}

std::string report_text(const std::vector<LedgerFile>& runs, bool by_layer) {
  std::string s;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const LedgerFile& lf = runs[i];
    s += fmt::format("{}{}  {}  ({})\n   {}\n", i ? "\n" : "", run_label(i), lf.run.path,
                     describe(lf), lf.run.command);
    for (std::size_t p = 0; p < lf.num_phases(); ++p) {
      if (!phase_used(lf, p)) continue;
      s += "\n" + phase_heading(lf, p) + "\n";
      s += (by_layer ? layer_table(lf, p) : op_table(lf, p)).text("  ");
      s += overhead_line(lf, p);
    }
  }
  if (runs.size() > 1) {
    s += "\nside by side (realised, and as a share of each run's own dense figure)\n";
    for (const std::string& phase : union_phases(runs)) {
      s += "\n" + phase + ", FLOPs\n" + side_by_side(runs, phase, false).text("  ");
      s += "\n" + phase + ", bytes\n" + side_by_side(runs, phase, true).text("  ");
    }
  }
  return s;
}

std::string report_markdown(const std::vector<LedgerFile>& runs, bool by_layer) {
  std::string s;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const LedgerFile& lf = runs[i];
    s += fmt::format("{}### {}: `{}`\n\n{}; `{}`\n", i ? "\n" : "", run_label(i), lf.run.path,
                     describe(lf), lf.run.command);
    for (std::size_t p = 0; p < lf.num_phases(); ++p) {
      if (!phase_used(lf, p)) continue;
      s += "\n" + phase_heading(lf, p) + "\n\n";
      s += (by_layer ? layer_table(lf, p) : op_table(lf, p)).markdown();
      const std::string ov = overhead_line(lf, p);
      if (!ov.empty()) s += "\n" + ov;
    }
  }
  if (runs.size() > 1) {
    s += "\n### Side by side\n";
    for (const std::string& phase : union_phases(runs)) {
      s += "\n" + phase + ", FLOPs\n\n" + side_by_side(runs, phase, false).markdown();
      s += "\n" + phase + ", bytes\n\n" + side_by_side(runs, phase, true).markdown();
    }
  }
  return s;
}

std::string report_csv(const std::vector<LedgerFile>& runs) {
  std::string s =
      "run,file,method,phase,op,layer,launches,dense_flops,realised_flops,dense_bytes,"
      "realised_bytes,method_overhead\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const LedgerFile& lf = runs[i];
    for (std::size_t p = 0; p < lf.num_phases(); ++p)
      for (std::size_t o = 0; o < lf.num_ops(); ++o)
        for (std::size_t l = 0; l < lf.num_slots(); ++l) {
          const Cell& c = lf.at(p, o, l);
          if (!c.used()) continue;
          s += fmt::format("{},{},{},{},{},{},{:.0f},{:.17g},{:.17g},{:.17g},{:.17g},{}\n",
                           run_label(i), csv_field(lf.run.path), csv_field(lf.run.method),
                           csv_field(lf.phases[p]), csv_field(lf.ops[o]), lf.layer_index[l],
                           c.launches, c.flops_dense, c.flops_realised, c.bytes_dense,
                           c.bytes_realised, c.method_overhead() ? 1 : 0);
        }
  }
  return s;
}

}  // namespace sparsim::flops
