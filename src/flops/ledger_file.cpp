#include "flops/ledger_file.hpp"

#include "core/error.hpp"
#include "io/hdf5.hpp"
#include "io/run_file.hpp"

#include <fmt/format.h>

#include <cmath>

namespace sparsim::flops {

Cell LedgerFile::phase_total(std::size_t phase) const {
  Cell t;
  for (std::size_t o = 0; o < num_ops(); ++o)
    for (std::size_t s = 0; s < num_slots(); ++s) t += at(phase, o, s);
  return t;
}

Cell LedgerFile::op_total(std::size_t phase, std::size_t op) const {
  Cell t;
  for (std::size_t s = 0; s < num_slots(); ++s) t += at(phase, op, s);
  return t;
}

Cell LedgerFile::slot_total(std::size_t phase, std::size_t slot) const {
  Cell t;
  for (std::size_t o = 0; o < num_ops(); ++o) t += at(phase, o, slot);
  return t;
}

int LedgerFile::phase_index(const std::string& name) const {
  for (std::size_t i = 0; i < phases.size(); ++i)
    if (phases[i] == name) return static_cast<int>(i);
  return -1;
}

int LedgerFile::op_index(const std::string& name) const {
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (ops[i] == name) return static_cast<int>(i);
  return -1;
}

namespace {

std::string shape_text(const std::vector<hsize_t>& d) {
  std::string s;
  for (hsize_t x : d) s += fmt::format("[{}]", x);
  return s.empty() ? "scalar" : s;
}

/// Reads a float64 table of shape `want` and checks every entry is finite and non-negative.
std::vector<double> read_table(const io::Group& g, const std::string& name,
                               const std::vector<hsize_t>& want, const std::string& path,
                               const std::vector<std::string>& phases,
                               const std::vector<std::string>& ops,
                               const std::vector<std::string>& layers) {
  require(g.has_dataset(name), "invalid FLOP ledger in '{}': /flops/{} is missing", path, name);
  std::vector<hsize_t> dims;
  std::vector<double> v = g.read<double>(name, &dims);
  require(dims == want,
          "invalid FLOP ledger in '{}': /flops/{} has shape {}, but the name lists give {} "
          "(phases × ops × layers)",
          path, name, shape_text(dims), shape_text(want));
  const std::size_t O = ops.size(), L = layers.size();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]) || v[i] < 0)
      fail("invalid FLOP ledger in '{}': /flops/{} holds {} at phase {}, op {}, layer {}", path,
           name, v[i], phases[i / (O * L)], ops[(i / L) % O], layers[i % L]);
  return v;
}

template <class T>
T attr_or(const io::Object& o, const std::string& name, T fallback) {
  if (!o.has_attr(name)) return fallback;
  try {
    return o.get_attr<T>(name);
  } catch (const Error&) {
    return fallback;
  }
}

RunInfo read_run_info(const io::H5File& f, std::int64_t schema) {
  RunInfo r;
  r.path = f.path();
  r.schema_version = schema;
  const io::Group root = f.root();
  const io::Group run = root.open_group("run");
  r.command = attr_or<std::string>(run, "command", "");
  r.version = attr_or<std::string>(run, "version", "");
  if (root.has_group("backend")) {
    const io::Group b = root.open_group("backend");
    r.backend = attr_or<std::string>(b, "name", "");
    r.threads = attr_or<std::int64_t>(b, "threads", 0);
    r.load_average = attr_or<double>(b, "load_average", -1.0);
  }
  if (root.has_group("model")) {
    const io::Group m = root.open_group("model");
    r.model_name = attr_or<std::string>(m, "name", "");
    r.model_path = attr_or<std::string>(m, "path", "");
    r.storage = attr_or<std::string>(m, "storage", "");
    r.n_layer = attr_or<std::int64_t>(m, "n_layer", 0);
    r.d_model = attr_or<std::int64_t>(m, "d_model", 0);
    r.n_params = attr_or<std::int64_t>(m, "n_params", 0);
  }
  if (root.has_group("config"))
    r.method = attr_or<std::string>(root.open_group("config"), "method", r.method);
  if (root.has_group("sparsity"))
    r.method = attr_or<std::string>(root.open_group("sparsity"), "method", r.method);
  return r;
}

std::vector<std::int64_t> phase_counts(const io::Group& g, const std::vector<std::string>& phases,
                                       const char* what, const std::string& path) {
  std::vector<std::int64_t> out;
  for (const std::string& p : phases) {
    const std::string a = p + "_" + what;
    require(g.has_attr(a),
            "invalid FLOP ledger in '{}': /flops has no attribute {} (the {} count of phase {})",
            path, a, what, p);
    const std::int64_t v = g.get_attr<std::int64_t>(a);
    require(v >= 0, "invalid FLOP ledger in '{}': /flops {} is {}", path, a, v);
    out.push_back(v);
  }
  return out;
}

MeasuredProfile read_profile(const io::Group& g, const std::string& path) {
  MeasuredProfile m;
  auto need = [&](const char* name) {
    require(g.has_dataset(name), "invalid /op_times in '{}': dataset {} is missing", path, name);
  };
  for (const char* n : {"phases", "ops", "op_seconds", "timer", "calls", "tokens",
                        "call_seconds_median", "call_tokens"})
    need(n);
  m.phases = g.read_strings("phases");
  m.ops = g.read_strings("ops");
  std::vector<hsize_t> dims;
  m.op_seconds = g.read<double>("op_seconds", &dims);
  const std::vector<hsize_t> want = {static_cast<hsize_t>(m.phases.size()),
                                     static_cast<hsize_t>(m.ops.size())};
  require(dims == want, "invalid /op_times in '{}': op_seconds has shape {}, expected {}", path,
          shape_text(dims), shape_text(want));
  m.timer = g.read_strings("timer");
  m.calls = g.read<std::int64_t>("calls");
  m.tokens = g.read<std::int64_t>("tokens");
  m.call_seconds_median = g.read<double>("call_seconds_median");
  m.call_tokens = g.read<std::int64_t>("call_tokens");
  const std::size_t P = m.phases.size();
  require(m.timer.size() == m.ops.size() && m.calls.size() == P && m.tokens.size() == P &&
              m.call_seconds_median.size() == P && m.call_tokens.size() == P,
          "invalid /op_times in '{}': per-op or per-phase datasets of the wrong length", path);
  for (double s : m.op_seconds)
    require(std::isfinite(s) && s >= 0, "invalid /op_times in '{}': op_seconds holds {}", path, s);
  return m;
}

}  // namespace

LedgerFile read_ledger_file(const std::string& path) {
  io::H5File f;
  try {
    f = io::H5File::open_read(path);
  } catch (const Error& e) {
    fail("cannot read run file '{}': {}", path, e.what());
  }
  LedgerFile lf;
  const std::int64_t schema = io::check_run_schema(f);
  lf.run = read_run_info(f, schema);
  const io::Group root = f.root();
  if (!root.has_group("flops")) {
    std::vector<std::string> groups;
    for (const std::string& n : root.list())
      if (root.has_group(n)) groups.push_back("/" + n);
    fail(
        "run file '{}' has no FLOP ledger (/flops; it holds {}): it was written by '{}', "
        "which keeps none; flops and predict read the run files of sparsim forward, eval and "
        "bench --out",
        path, fmt::format("{}", fmt::join(groups, ", ")), lf.run.command);
  }
  const io::Group g = root.open_group("flops");
  for (const char* n : {"phases", "ops", "layers", "layer_index"})
    require(g.has_dataset(n), "invalid FLOP ledger in '{}': /flops/{} is missing", path, n);
  lf.phases = g.read_strings("phases");
  lf.ops = g.read_strings("ops");
  lf.layers = g.read_strings("layers");
  lf.layer_index = g.read<std::int64_t>("layer_index");
  require(!lf.phases.empty() && !lf.ops.empty() && !lf.layers.empty(),
          "invalid FLOP ledger in '{}': empty phase, op or layer list", path);
  require(lf.layer_index.size() == lf.layers.size(),
          "invalid FLOP ledger in '{}': {} layer names but {} layer indices", path,
          lf.layers.size(), lf.layer_index.size());
  for (std::size_t i = 0; i < lf.ops.size(); ++i)
    for (std::size_t j = i + 1; j < lf.ops.size(); ++j)
      require(lf.ops[i] != lf.ops[j], "invalid FLOP ledger in '{}': op '{}' is listed twice", path,
              lf.ops[i]);
  const std::vector<hsize_t> want = {static_cast<hsize_t>(lf.phases.size()),
                                     static_cast<hsize_t>(lf.ops.size()),
                                     static_cast<hsize_t>(lf.layers.size())};
  const auto fd = read_table(g, "flops_dense", want, path, lf.phases, lf.ops, lf.layers);
  const auto fr = read_table(g, "flops_realised", want, path, lf.phases, lf.ops, lf.layers);
  const auto bd = read_table(g, "bytes_dense", want, path, lf.phases, lf.ops, lf.layers);
  const auto br = read_table(g, "bytes_realised", want, path, lf.phases, lf.ops, lf.layers);
  require(g.has_dataset("launches"), "invalid FLOP ledger in '{}': /flops/launches is missing",
          path);
  std::vector<hsize_t> dims;
  const std::vector<std::uint64_t> la = g.read<std::uint64_t>("launches", &dims);
  require(dims == want, "invalid FLOP ledger in '{}': /flops/launches has shape {}, expected {}",
          path, shape_text(dims), shape_text(want));
  // distinct kernels: files written before the ledger counted them have launches only, and
  // there each launch was recorded once, on the op owning the kernel
  std::vector<std::uint64_t> ke = la;
  if (g.has_dataset("kernels")) {
    ke = g.read<std::uint64_t>("kernels", &dims);
    require(dims == want, "invalid FLOP ledger in '{}': /flops/kernels has shape {}, expected {}",
            path, shape_text(dims), shape_text(want));
  }
  lf.cells.resize(fd.size());
  for (std::size_t i = 0; i < fd.size(); ++i)
    lf.cells[i] = Cell{fd[i],
                       fr[i],
                       bd[i],
                       br[i],
                       static_cast<double>(la[i]),
                       static_cast<double>(ke[i])};
  lf.calls = phase_counts(g, lf.phases, "calls", path);
  lf.tokens = phase_counts(g, lf.phases, "tokens", path);
  if (root.has_group("op_times")) lf.measured = read_profile(root.open_group("op_times"), path);
  return lf;
}

}  // namespace sparsim::flops
