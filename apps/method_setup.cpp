#include "method_setup.hpp"

namespace sparsim::app {

void MethodArgs::add_options(po::options_description& d) {
  d.add_options()("method", po::value(&method)->default_value("dense"),
                  "dense, teal (thresholds), wina (TopK on weight-informed scores) or topk-guided")(
      "sparsity,s", po::value(&mopt.sparsity)->default_value(0.5),
      "target activation sparsity s in [0, 1) (sparse methods)")(
      "calibration", po::value(&calib_path), "calibration file from sparsim calibrate")(
      "delta", po::value(&mopt.delta)->default_value(0.01), "TopK-Guided clip margin δ")(
      "probe", po::value(&mopt.probe)->default_value(0.4),
      "TopK-Guided sensitivity probe s̄ (a calibrated level)")(
      "lambda", po::value(&mopt.lambda)->default_value(0.4),
      "TopK-Guided budget redistribution strength λ")(
      "budget", po::value(&budget_mode)->default_value("sensitivity"),
      "TopK-Guided block budgets: sensitivity or uniform (ablation)")(
      "masking", po::value(&masking_mode)->default_value("guided"),
      "TopK-Guided masking: guided or topk (WINA's TopK; ablation)")(
      "no-rotation", po::bool_switch(&no_rotation),
      "WINA / TopK-Guided on the unrotated model (uses the plain calibration)")(
      "wina-norms", po::value(&norms_mode)->default_value("kg"),
      "projections scored with column norms: kg (k and gate, WINA's choice) or all");
}

void MethodArgs::resolve(bool read_calibration) {
  mopt.method = sparsity::parse_method(method);
  mopt.validate();
  require(budget_mode == "sensitivity" || budget_mode == "uniform",
          "--budget must be sensitivity or uniform, got '{}'", budget_mode);
  require(masking_mode == "guided" || masking_mode == "topk",
          "--masking must be guided or topk, got '{}'", masking_mode);
  require(norms_mode == "kg" || norms_mode == "all", "--wina-norms must be kg or all, got '{}'",
          norms_mode);
  mopt.sensitivity_budget = budget_mode == "sensitivity";
  mopt.guided_masking = masking_mode == "guided";
  mopt.rotate = !no_rotation;
  mopt.wina_norms_all = norms_mode == "all";
  require(!mopt.needs_calibration() || !calib_path.empty(),
          "--method {} needs --calibration FILE (made by sparsim calibrate)", method);
  require(mopt.needs_calibration() || calib_path.empty(),
          "--calibration is only used by the sparse methods (--method teal, wina, topk-guided)");
  if (!calib_path.empty() && read_calibration) cal = sparsity::read_calibration(calib_path);
}

}  // namespace sparsim::app
