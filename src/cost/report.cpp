#include "cost/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace sparsim::cost {

namespace {

nlohmann::ordered_json num_or_null(double v, bool ok) {
  return ok && std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

nlohmann::ordered_json time_json(const KernelTime& t) {
  return {{"seconds", t.seconds},
          {"compute_seconds", t.compute_s},
          {"memory_seconds", t.memory_s},
          {"launch_seconds", t.launch_s}};
}

std::string si(double v, const char* unit) {
  const char* pre[] = {"", "k", "M", "G", "T", "P"};
  int k = 0;
  while (std::fabs(v) >= 1000 && k < 5) {
    v /= 1000;
    ++k;
  }
  return fmt::format("{:.3g} {}{}", v, pre[k], unit);
}

std::string secs(double s) {
  if (s == 0) return "0";
  if (s < 1e-3) return fmt::format("{:.2f} us", s * 1e6);
  if (s < 1) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} s", s);
}

std::string pct(double e) {
  return fmt::format("{:+.1f}%", 100.0 * e);
}

}  // namespace

nlohmann::ordered_json prediction_json(const flops::LedgerFile& lf, const HardwareProfile& hw,
                                       const Prediction& pr, const std::string& hardware_note) {
  const flops::RunInfo& r = lf.run;
  nlohmann::ordered_json j;
  j["run"] = {{"file", r.path},        {"command", r.command}, {"method", r.method},
              {"model", r.model_name}, {"storage", r.storage}, {"backend", r.backend},
              {"threads", r.threads},  {"n_layer", r.n_layer}, {"n_params", r.n_params}};
  nlohmann::ordered_json h = hw.summary();
  h["note"] = hardware_note;
  j["hardware"] = h;
  j["precision"] = pr.precision;
  j["roofline"] = {{"peak_flops", pr.peak_flops},
                   {"memory_bandwidth", pr.bandwidth},
                   {"launch_overhead_s", pr.launch_overhead_s},
                   {"ridge_intensity", pr.peak_flops / pr.bandwidth},
                   {"formula",
                    "per ledger entry: max(FLOP / peak_flops, bytes / "
                    "memory_bandwidth) + kernels * launch_overhead_s (kernels: distinct "
                    "launches, counted on the op owning each kernel)"}};

  nlohmann::ordered_json phases = nlohmann::ordered_json::object(),
                         speedup = nlohmann::ordered_json::object();
  double all_s = 0, all_dense = 0;
  nlohmann::ordered_json notes = nlohmann::ordered_json::array();
  for (std::size_t p = 0; p < lf.num_phases(); ++p) {
    const KernelTime t = pr.realised_phase(lf, p), d = pr.dense_phase(lf, p);
    const std::int64_t calls = lf.calls[p], tokens = lf.tokens[p];
    nlohmann::ordered_json ph = time_json(t);
    ph["calls"] = calls;
    ph["tokens"] = tokens;
    ph["dense_seconds"] = d.seconds;
    ph["seconds_per_call"] = num_or_null(t.seconds / static_cast<double>(calls), calls > 0);
    ph["dense_seconds_per_call"] = num_or_null(d.seconds / static_cast<double>(calls), calls > 0);
    ph["tokens_per_s"] =
        num_or_null(static_cast<double>(tokens) / t.seconds, tokens > 0 && t.seconds > 0);
    ph["dense_tokens_per_s"] =
        num_or_null(static_cast<double>(tokens) / d.seconds, tokens > 0 && d.seconds > 0);
    ph["speedup_vs_dense"] = num_or_null(d.seconds / t.seconds, t.seconds > 0);
    ph["bound"] = t.bound();
    phases[lf.phases[p]] = ph;
    if (t.seconds > 0) speedup[lf.phases[p]] = d.seconds / t.seconds;
    all_s += t.seconds;
    all_dense += d.seconds;
    const flops::Cell c = lf.phase_total(p);
    const double per_call = calls > 0 ? c.bytes_realised / static_cast<double>(calls) : 0.0;
    if (per_call > 0 && per_call < hw.l2_bytes)
      notes.push_back(fmt::format(
          "the memory traffic of one {} call ({}) fits in the {} L2 cache: the memory times "
          "assume every byte comes from memory and are an upper bound for this model size",
          lf.phases[p], si(per_call, "B"), si(hw.l2_bytes, "B")));
  }
  j["phases"] = phases;
  for (const char* name : {"prefill", "decode"}) {
    const int p = lf.phase_index(name);
    j[std::string(name) + "_tokens_per_s"] =
        p < 0 ? nlohmann::ordered_json(nullptr) : phases[name]["tokens_per_s"];
  }
  speedup["total"] = num_or_null(all_dense / all_s, all_s > 0);
  j["speedup_vs_dense"] = speedup;
  j["seconds"] = all_s;
  j["dense_seconds"] = all_dense;

  nlohmann::ordered_json per_op = nlohmann::ordered_json::array();
  for (std::size_t p = 0; p < lf.num_phases(); ++p) {
    const double phase_s = pr.realised_phase(lf, p).seconds;
    for (std::size_t o = 0; o < lf.num_ops(); ++o) {
      const flops::Cell c = lf.op_total(p, o);
      if (!c.used()) continue;
      const KernelTime t = pr.realised_op(lf, p, o), d = pr.dense_op(lf, p, o);
      nlohmann::ordered_json e = time_json(t);
      e["phase"] = lf.phases[p];
      e["op"] = lf.ops[o];
      e["launches"] = c.launches;
      e["kernels"] = c.kernels;
      e["flops"] = c.flops_realised;
      e["bytes"] = c.bytes_realised;
      e["dense_flops"] = c.flops_dense;
      e["dense_bytes"] = c.bytes_dense;
      e["intensity"] = c.bytes_realised > 0 ? c.flops_realised / c.bytes_realised : 0.0;
      e["dense_seconds"] = d.seconds;
      e["bound"] = t.bound();
      e["share"] = phase_s > 0 ? t.seconds / phase_s : 0.0;
      e["method_overhead"] = c.method_overhead();
      per_op.push_back(e);
    }
  }
  j["per_op"] = per_op;

  nlohmann::ordered_json per_layer = nlohmann::ordered_json::array();
  for (std::size_t p = 0; p < lf.num_phases(); ++p)
    for (std::size_t s = 0; s < lf.num_slots(); ++s) {
      if (!lf.slot_total(p, s).used()) continue;
      const KernelTime t = pr.realised_slot(lf, p, s), d = pr.dense_slot(lf, p, s);
      per_layer.push_back(
          {{"phase", lf.phases[p]},
           {"layer", lf.layer_index[s]},
           {"name", lf.layers[s]},
           {"seconds", t.seconds},
           {"dense_seconds", d.seconds},
           {"speedup_vs_dense", num_or_null(d.seconds / t.seconds, t.seconds > 0)}});
    }
  j["per_layer"] = per_layer;

  if (!r.storage.empty())
    notes.push_back(fmt::format(
        "weight bytes are those of the run's {} storage; activations and the KV cache are "
        "counted as fp32 (run with --storage bf16 to predict 16-bit weights)",
        r.storage));
  if (!r.backend.empty() && hw.kind == "vendor")
    notes.push_back(fmt::format(
        "the ledger was recorded on {} and holds no timing: it is hardware-independent; the "
        "times are what {} would take at its datasheet roofs, an optimistic bound",
        r.backend, hw.description));
  j["notes"] = notes;

  if (lf.measured) {
    const flops::MeasuredProfile& m = *lf.measured;
    auto m_phase = [&](const std::string& n) -> int {
      for (std::size_t i = 0; i < m.phases.size(); ++i)
        if (m.phases[i] == n) return static_cast<int>(i);
      return -1;
    };
    auto m_op = [&](const std::string& n) -> int {
      for (std::size_t i = 0; i < m.ops.size(); ++i)
        if (m.ops[i] == n) return static_cast<int>(i);
      return -1;
    };
    nlohmann::ordered_json vph = nlohmann::ordered_json::object(),
                           vops = nlohmann::ordered_json::array();
    for (std::size_t p = 0; p < lf.num_phases(); ++p) {
      const int mp = m_phase(lf.phases[p]);
      if (mp < 0 || lf.calls[p] <= 0 || m.calls[static_cast<std::size_t>(mp)] <= 0) continue;
      const std::size_t q = static_cast<std::size_t>(mp);
      const double calls = static_cast<double>(lf.calls[p]);
      const double pred = pr.realised_phase(lf, p).seconds / calls;
      const double meas = m.call_seconds_median[q];
      double prof = 0;
      for (std::size_t o = 0; o < m.ops.size(); ++o) prof += m.op_seconds_at(q, o);
      prof /= static_cast<double>(m.calls[q]);
      vph[lf.phases[p]] = {{"predicted_seconds_per_call", pred},
                           {"measured_seconds_per_call", meas},
                           {"profiled_seconds_per_call", prof},
                           {"tokens_per_call", m.call_tokens[q]},
                           {"error", num_or_null(pred / meas - 1.0, meas > 0)}};
      // Predicted ops grouped by the timer they were measured under.
      std::vector<std::string> timers;
      std::vector<std::vector<std::string>> members;
      std::vector<double> pred_s;
      for (std::size_t o = 0; o < lf.num_ops(); ++o) {
        if (!lf.op_total(p, o).used()) continue;
        const int mo = m_op(lf.ops[o]);
        const std::string timer = mo < 0 ? lf.ops[o] : m.timer[static_cast<std::size_t>(mo)];
        auto it = std::find(timers.begin(), timers.end(), timer);
        if (it == timers.end()) {
          timers.push_back(timer);
          members.emplace_back();
          pred_s.push_back(0);
          it = timers.end() - 1;
        }
        const auto k = static_cast<std::size_t>(it - timers.begin());
        members[k].push_back(lf.ops[o]);
        pred_s[k] += pr.realised_op(lf, p, o).seconds;
      }
      for (std::size_t k = 0; k < timers.size(); ++k) {
        const int mo = m_op(timers[k]);
        const double ms = mo < 0 ? 0.0 : m.op_seconds_at(q, static_cast<std::size_t>(mo));
        const double mcalls = static_cast<double>(m.calls[q]);
        vops.push_back({{"phase", lf.phases[p]},
                        {"timer", timers[k]},
                        {"ops", members[k]},
                        {"predicted_seconds_per_call", pred_s[k] / calls},
                        {"measured_seconds_per_call", ms / mcalls},
                        {"error", num_or_null(pred_s[k] / calls / (ms / mcalls) - 1.0, ms > 0)}});
      }
    }
    j["validation"] = {{"phases", vph}, {"per_op", vops}};
  }
  return j;
}

std::string prediction_text(const nlohmann::ordered_json& j, bool by_layer) {
  std::string s;
  const auto& run = j["run"];
  const auto& hw = j["hardware"];
  const auto& rf = j["roofline"];
  s += fmt::format("predict {} (method {}, model {}, {} weights) on {}: {}\n",
                   run["file"].get<std::string>(), run["method"].get<std::string>(),
                   run["model"].get<std::string>(), run["storage"].get<std::string>(),
                   hw["name"].get<std::string>(), hw["description"].get<std::string>());
  if (!hw["note"].get<std::string>().empty())
    s += fmt::format("  profile: {}\n", hw["note"].get<std::string>());
  s += fmt::format(
      "  roofline per ledger entry: max(FLOP / {}FLOP/s [{}], bytes / {}B/s) + kernels x {}; "
      "ridge at {:.1f} FLOP/byte\n",
      si(rf["peak_flops"].get<double>(), ""), j["precision"].get<std::string>(),
      si(rf["memory_bandwidth"].get<double>(), ""), secs(rf["launch_overhead_s"].get<double>()),
      rf["ridge_intensity"].get<double>());

  s +=
      fmt::format("\n  {:<8} {:>6} {:>8} {:>12} {:>12} {:>9} {:>13} {:>13}  {}\n", "phase", "calls",
                  "tokens", "dense", "realised", "speedup", "dense tok/s", "tok/s", "bound");
  for (const auto& [name, ph] : j["phases"].items()) {
    if (ph["calls"].get<std::int64_t>() == 0) continue;
    auto num = [](const nlohmann::ordered_json& v, const char* f) {
      return v.is_null() ? std::string("-") : fmt::format(f, v.get<double>());
    };
    s +=
        fmt::format("  {:<8} {:>6} {:>8} {:>12} {:>12} {:>9} {:>13} {:>13}  {}\n", name,
                    ph["calls"].get<std::int64_t>(), ph["tokens"].get<std::int64_t>(),
                    secs(ph["dense_seconds"].get<double>()), secs(ph["seconds"].get<double>()),
                    num(ph["speedup_vs_dense"], "{:.3f}x"), num(ph["dense_tokens_per_s"], "{:.1f}"),
                    num(ph["tokens_per_s"], "{:.1f}"), ph["bound"].get<std::string>());
  }

  std::string cur;
  for (const auto& e : j["per_op"]) {
    const std::string phase = e["phase"].get<std::string>();
    if (phase != cur) {
      cur = phase;
      s += fmt::format(
          "\n  {} by op\n  {:<16} {:>9} {:>11} {:>11} {:>8} {:>11} {:>11} {:>11} "
          "{:>11} {:>7}  {}\n",
          phase, "op", "kernels", "GFLOP", "MB", "FLOP/B", "compute", "memory", "launch", "time",
          "share", "bound");
    }
    s += fmt::format(
        "  {:<16} {:>9.0f} {:>11.4g} {:>11.4g} {:>8.2f} {:>11} {:>11} {:>11} {:>11} "
        "{:>6.1f}%  {}\n",
        e["op"].get<std::string>() + (e["method_overhead"].get<bool>() ? " +" : ""),
        e["kernels"].get<double>(), e["flops"].get<double>() * 1e-9,
        e["bytes"].get<double>() * 1e-6, e["intensity"].get<double>(),
        secs(e["compute_seconds"].get<double>()), secs(e["memory_seconds"].get<double>()),
        secs(e["launch_seconds"].get<double>()), secs(e["seconds"].get<double>()),
        100 * e["share"].get<double>(), e["bound"].get<std::string>());
  }
  if (by_layer) {
    cur.clear();
    for (const auto& e : j["per_layer"]) {
      const std::string phase = e["phase"].get<std::string>();
      if (phase != cur) {
        cur = phase;
        s += fmt::format("\n  {} by layer\n  {:<10} {:>12} {:>12} {:>9}\n", phase, "layer", "dense",
                         "realised", "speedup");
      }
      s += fmt::format("  {:<10} {:>12} {:>12} {:>9}\n", e["name"].get<std::string>(),
                       secs(e["dense_seconds"].get<double>()), secs(e["seconds"].get<double>()),
                       e["speedup_vs_dense"].is_null()
                           ? std::string("-")
                           : fmt::format("{:.3f}x", e["speedup_vs_dense"].get<double>()));
    }
  }
  if (j.contains("validation")) {
    const auto& v = j["validation"];
    s += "\n  predicted against measured (this run's profile; whole calls are medians of "
         "unprofiled timings)\n";
    s += fmt::format("  {:<8} {:>14} {:>14} {:>14} {:>9}\n", "phase", "predicted/call",
                     "measured/call", "profiled/call", "error");
    for (const auto& [name, e] : v["phases"].items())
      s += fmt::format("  {:<8} {:>14} {:>14} {:>14} {:>9}\n", name,
                       secs(e["predicted_seconds_per_call"].get<double>()),
                       secs(e["measured_seconds_per_call"].get<double>()),
                       secs(e["profiled_seconds_per_call"].get<double>()),
                       e["error"].is_null() ? std::string("-") : pct(e["error"].get<double>()));
    cur.clear();
    for (const auto& e : v["per_op"]) {
      const std::string phase = e["phase"].get<std::string>();
      if (phase != cur) {
        cur = phase;
        s += fmt::format("\n  {} per timer          {:>14} {:>14} {:>9}\n", phase, "predicted/call",
                         "measured/call", "error");
      }
      std::string ops;
      for (const auto& o : e["ops"]) ops += (ops.empty() ? "" : "+") + o.get<std::string>();
      s += fmt::format("  {:<34} {:>14} {:>14} {:>9}\n", ops,
                       secs(e["predicted_seconds_per_call"].get<double>()),
                       secs(e["measured_seconds_per_call"].get<double>()),
                       e["error"].is_null() ? std::string("-") : pct(e["error"].get<double>()));
    }
  }
  if (!j["notes"].empty()) {
    s += "\n";
    for (const auto& n : j["notes"]) s += "  note: " + n.get<std::string>() + "\n";
  }
  return s;
}

}  // namespace sparsim::cost
