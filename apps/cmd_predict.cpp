// sparsim predict: the time a run's FLOP / byte ledger would take on a hardware profile (roofline
// per kernel plus launch overhead), tokens/s and the method's speedup over dense; predicted
// against measured for run files of `bench --out`.
#include "common.hpp"
#include "cost/hardware.hpp"
#include "cost/report.hpp"
#include "cost/roofline.hpp"
#include "flops/ledger_file.hpp"
#include "io/run_file.hpp"

#include <iostream>

namespace sparsim::app {

int cmd_predict(int argc, char** argv) {
  std::string run, hardware, precision, out;
  int threads = 0;
  bool json = false, by_layer = false, list = false;
  po::options_description d("sparsim predict options");
  d.add_options()("run", po::value(&run),
                  "run file (HDF5) of sparsim forward, eval or bench --out")(
      "hardware", po::value(&hardware),
      "hardware profile: a name (a100-40gb, a100-80gb, h100-sxm, h200, or any profile in "
      "$SPARSIM_HARDWARE_DIR) or the path of a profile file, e.g. one written by sparsim probe")(
      "precision", po::value(&precision)->default_value("fp32"),
      "peak FLOP/s used for the compute roof: fp32 (what sparsim's kernels compute in), or a "
      "Tensor Core rate the profile lists (tf32, bf16, fp16) for what such kernels would reach")(
      "threads", po::value(&threads)->default_value(0),
      "measured profiles: the thread count whose rates apply (0: the run's own thread count)")(
      "by-layer", po::bool_switch(&by_layer), "also print the predicted time per layer")(
      "json", po::bool_switch(&json),
      "JSON: prefill_tokens_per_s, decode_tokens_per_s, speedup_vs_dense, phases, per_op, "
      "per_layer, notes, and validation when the run holds measured times")(
      "list", po::bool_switch(&list), "list the known hardware profiles and exit")(
      "out,o", po::value(&out), "write the report to this file (atomically) instead of stdout");
  po::positional_options_description pos;
  pos.add("run", 1);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: sparsim predict RUN.h5 --hardware NAME|PROFILE.json [--precision fp32] "
             "[--json] [--by-layer] [--out FILE]\n\n"
             "Predicts from the run's FLOP / byte ledger (hardware-independent) the time of "
             "every kernel on the given hardware: max(FLOP / peak, bytes / bandwidth) + launch "
             "overhead, summed per op, layer and phase; tokens/s; and the speedup of the run's "
             "method over the same ledger run densely. A run file of `sparsim bench --out` also "
             "holds measured per-op times: they are set against the prediction.",
             d, vm, &pos))
    return 0;
  if (list) {
    for (const std::string& n : cost::available_hardware_profiles()) {
      const cost::HardwareProfile p = cost::load_hardware_profile(n);
      std::cout << fmt::format("{:<12} {} ({})\n", p.name, p.description, p.file);
    }
    return 0;
  }
  require(!run.empty(), "no run file given (usage: sparsim predict RUN.h5 --hardware NAME)");
  require(!hardware.empty(), "--hardware is required: a profile name ({}) or a profile file's path",
          fmt::format("{}", fmt::join(cost::available_hardware_profiles(), ", ")));
  require(threads >= 0, "--threads must be >= 0, got {}", threads);
  const flops::LedgerFile lf = flops::read_ledger_file(run);
  const cost::HardwareProfile hw_all = cost::load_hardware_profile(hardware);
  std::string note;
  const int t = threads > 0 ? threads : static_cast<int>(lf.run.threads);
  const cost::HardwareProfile hw = hw_all.at_threads(t, &note);
  const cost::Prediction pr = cost::predict(lf, hw, precision);
  const nlohmann::ordered_json j = cost::prediction_json(lf, hw, pr, note);
  const std::string text = json ? io::json_file_text(j) : cost::prediction_text(j, by_layer);
  if (out.empty())
    std::cout << text;
  else
    io::write_file_atomically(out, text);
  return 0;
}

}  // namespace sparsim::app
