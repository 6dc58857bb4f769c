#include "records.hpp"

#include "io/run_file.hpp"

#include <Kokkos_Core.hpp>

#include <ctime>
#include <fstream>

namespace sparsim::app {

std::string command_line(int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  return cmd;
}

double load_average() {
  std::ifstream f("/proc/loadavg");
  double one = -1;
  if (!(f >> one)) return -1;
  return one;
}

void write_run_group(io::Group root, int argc, char** argv) {
  io::Group run = root.create_group("run");
  run.set_attr("format", io::kRunFormat);
  run.set_attr("schema_version", io::kRunSchemaVersion);
  run.set_attr("command", command_line(argc, argv));
  run.set_attr("version", SPARSIM_VERSION);
  const std::time_t now = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  run.set_attr("started_utc", std::string(buf));
}

void write_run_header(io::Group root, int argc, char** argv, const std::string& backend,
                      int threads, const ModelInfo& mi, const Config& cfg, DType storage) {
  write_run_group(root, argc, argv);

  io::Group be = root.create_group("backend");
  be.set_attr("name", backend);
  be.set_attr("threads", threads);
  be.set_attr("kokkos_version", static_cast<std::int64_t>(KOKKOS_VERSION));
  be.set_attr("load_average", load_average());

  io::Group m = root.create_group("model");
  m.set_attr("path", mi.path);
  m.set_attr("format", mi.format);
  m.set_attr("fingerprint", mi.fingerprint);
  m.set_attr("file_bytes", static_cast<std::int64_t>(mi.file_bytes));
  m.set_attr("storage", to_string(storage));
  m.set_attr("name", cfg.name);
  m.set_attr("n_layer", cfg.n_layer);
  m.set_attr("d_model", cfg.d_model);
  m.set_attr("n_head", cfg.n_head);
  m.set_attr("n_kv_head", cfg.n_kv_head);
  m.set_attr("head_dim", cfg.head_dim);
  m.set_attr("d_ff", cfg.d_ff);
  m.set_attr("vocab", cfg.vocab);
  m.set_attr("context_length", cfg.context_length);
  m.set_attr("rope_theta", static_cast<double>(cfg.rope_theta));
  m.set_attr("rms_eps", static_cast<double>(cfg.rms_eps));
  m.set_attr("tied_embeddings", cfg.tied_embeddings ? 1 : 0);
  m.set_attr("n_params", static_cast<std::int64_t>(cfg.n_params()));
  m.set_attr("nonfinite_weights", static_cast<std::int64_t>(mi.nonfinite));
}

}  // namespace sparsim::app
