#pragma once
/// Collecting a sweep: every finished point of the plan becomes one row of results.h5 (one
/// dataset per column under /results, loadable with h5py or pandas) and results.csv.
#include "sweep/plan.hpp"
#include "sweep/store.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace sparsim::sweep {

/// A column of the table: float64 (NaN where missing), int64, or string ("" where missing).
struct Column {
  enum class Type { Float, Int, String };
  std::string name;
  Type type = Type::Float;
  std::string units;    ///< "" for strings and plain counts
  std::string meaning;  ///< one sentence
  std::vector<double> f;
  std::vector<std::int64_t> i;
  std::vector<std::string> s;
};

struct Table {
  std::vector<Column> columns;
  std::size_t rows = 0;
  std::vector<std::string> skipped;  ///< "<id>: why" for points not done
};

/// Reads every done point's manifest, summary and run file into a table (rows in plan order).
/// The fixed columns and the option columns come first; then every column found in a done
/// point's summary `columns` object (io/summary_columns.hpp: what each method family reports),
/// in order of first appearance over the points in plan order, float64 where every value is a
/// number and string otherwise; one whose name a fixed or option column has is named m_<name>.
/// Throws sparsim::Error where two points give a column different units, or a summary's
/// `columns` object is malformed.
Table build_table(const Spec& spec, const Plan& plan, const Store& store);

/// Writes <output>/results.h5 and <output>/results.csv (each atomically).
void write_table(const Spec& spec, const Table& t, const std::string& h5_path,
                 const std::string& csv_path);

/// The CSV text of a table (RFC 4180 quoting; numbers in shortest round-trip form).
std::string table_csv(const Table& t);

}  // namespace sparsim::sweep
