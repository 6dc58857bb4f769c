#include "io/summary_columns.hpp"

#include "core/error.hpp"

#include <cmath>

namespace sparsim::io {

namespace {
bool valid_name(const std::string& n) {
  if (n.empty() || n[0] < 'a' || n[0] > 'z' || n.rfind("m_", 0) == 0) return false;
  for (char ch : n)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) return false;
  return true;
}
}  // namespace

void SummaryColumns::push(SummaryColumn c) {
  require(valid_name(c.name),
          "summary column '{}': names are [a-z][a-z0-9_]* and do not begin with m_", c.name);
  for (const auto& o : cols_)
    require(o.name != c.name, "summary column '{}' is added twice", c.name);
  cols_.push_back(std::move(c));
}

void SummaryColumns::add(const std::string& name, double value, const std::string& units,
                         const std::string& meaning) {
  push({name, std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr), units,
        meaning});
}

void SummaryColumns::add(const std::string& name, const std::string& value,
                         const std::string& units, const std::string& meaning) {
  push({name, value, units, meaning});
}

nlohmann::json SummaryColumns::json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& c : cols_)
    j[c.name] = {{"value", c.value}, {"units", c.units}, {"meaning", c.meaning}};
  return j;
}

SummaryColumns SummaryColumns::from_json(const nlohmann::json& j) {
  require(j.is_object(), "summary columns: not a JSON object");
  SummaryColumns s;
  for (const auto& [name, e] : j.items()) {
    require(e.is_object() && e.contains("value") &&
                (e["value"].is_number() || e["value"].is_string() || e["value"].is_null()) &&
                e.contains("units") && e["units"].is_string() && e.contains("meaning") &&
                e["meaning"].is_string(),
            "summary column '{}': not {{\"value\": number or string, \"units\": string, "
            "\"meaning\": string}}",
            name);
    s.push({name, e["value"], e["units"].get<std::string>(), e["meaning"].get<std::string>()});
  }
  return s;
}

}  // namespace sparsim::io
