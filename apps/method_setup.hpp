#pragma once
// The activation-sparsity method options shared by sparsim eval and sparsim bench, and the
// setup they share: calibration file -> plan -> (rotated) weights -> masker.
#include "common.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "model/loader.hpp"
#include "sparsity/calibration.hpp"
#include "sparsity/masker.hpp"
#include "sparsity/plan.hpp"

#include <memory>
#include <optional>
#include <string>

namespace sparsim::app {

/// --method, --sparsity, --calibration and the method's tuning options.
struct MethodArgs {
  std::string method = "dense";
  std::string calib_path, budget_mode, masking_mode, norms_mode;
  bool no_rotation = false;
  sparsity::MethodOptions mopt;
  std::optional<sparsity::Calibration> cal;  ///< read by resolve()

  /// Adds the options to `d` (in the order eval's --help lists them).
  void add_options(po::options_description& d);
  /// After parsing: checks the values, fills mopt and reads the calibration file (so that bad
  /// arguments fail before the model is loaded; `read_calibration` false skips the reading).
  /// Throws sparsim::Error naming the option.
  void resolve(bool read_calibration = true);
  bool sparse() const { return mopt.method != sparsity::Method::Dense; }
};

/// For a sparse method: checks that the calibration belongs to the model, builds the plan and,
/// for rotated plans, replaces `w` by the WINA-rotated model stored as `storage`. For dense, the
/// plan only carries the options.
template <class E>
sparsity::Plan prepare_method(const MethodArgs& a, const ModelInfo& mi,
                              std::shared_ptr<const Weights<E>>& w, DType storage) {
  sparsity::Plan plan;
  plan.opt = a.mopt;
  if (a.cal) {
    a.cal->check_model(mi.fingerprint, w->cfg, mi.path);
    plan = sparsity::make_plan(*a.cal, a.mopt);
    if (plan.rotated) {
      Stopwatch sw;
      w = sparsity::apply_rotation(*w, sparsity::rotation_from(*a.cal), storage);
      log().info("WINA rotation applied ({:.1f} s)", sw.seconds());
    }
  }
  return plan;
}

/// Loads the plan into `masker` (column norms from the engine's weights) and hands it to the
/// engine; nothing for dense.
template <class E>
void attach_masker(Engine<E>& eng, sparsity::ActivationMasker<E>& masker,
                   const sparsity::Plan& plan) {
  if (plan.opt.method == sparsity::Method::Dense) return;
  sparsity::configure_masker(masker, plan, eng.weights());
  eng.set_masker(&masker);
}

}  // namespace sparsim::app
