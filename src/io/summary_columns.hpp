#pragma once
/// The `columns` object of a JSON run summary (sparsim eval --json): one entry per figure that a
/// method family or record puts in a sweep's results table,
///
///     "columns": {"tf_realised": {"value": 0.21, "units": "1", "meaning": "…"}, …}
///
/// Each family adds its columns in one place, where it builds its own summary block; sparsim
/// collect turns every column it finds into a table column (units and meaning become the
/// dataset's attributes) without knowing the families. Names are lower-case identifiers
/// ([a-z][a-z0-9_]*), unique in a summary; names beginning with "m_" are reserved for collect,
/// which prefixes a method column whose name a fixed or option column of the table already has.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace sparsim::io {

struct SummaryColumn {
  std::string name;
  nlohmann::json value;  ///< a number or a string (null: not known for this run)
  std::string units;     ///< "" for strings, "1" for ratios and plain counts
  std::string meaning;   ///< one sentence
};

class SummaryColumns {
 public:
  /// Throws sparsim::Error for a bad or repeated name (a non-finite value is stored as null).
  void add(const std::string& name, double value, const std::string& units,
           const std::string& meaning);
  void add(const std::string& name, const std::string& value, const std::string& units,
           const std::string& meaning);
  const std::vector<SummaryColumn>& list() const { return cols_; }
  bool empty() const { return cols_.empty(); }
  /// The `columns` object.
  nlohmann::json json() const;
  /// Reads a `columns` object back (entries in name order), throwing sparsim::Error that names
  /// the entry at fault where it is not of the form above.
  static SummaryColumns from_json(const nlohmann::json& j);

 private:
  void push(SummaryColumn c);
  std::vector<SummaryColumn> cols_;
};

}  // namespace sparsim::io
