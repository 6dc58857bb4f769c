#pragma once
/// From a calibration file and a method's options to the masks the engine applies: per block a
/// budget s_i, per projection a target p_i (the greedy table's row nearest s_i), the masking rule
/// and its threshold (METHODS.md §1).
#include "sparsity/calibration.hpp"
#include "sparsity/masker.hpp"
#include "sparsity/rotation.hpp"

#include <array>
#include <string>
#include <vector>

namespace sparsim::sparsity {

enum class Method { Dense, Teal, Wina, TopkGuided };
/// How a block budget picks its greedy-table row: the row whose P is nearest (the paper), or
/// the point interpolated between the two rows around the budget (P exact).
enum class Lookup { Nearest, Interpolate };
/// "dense", "teal", "wina", "topk-guided"; throws for anything else.
Method parse_method(const std::string& s);
const char* method_name(Method m);

struct MethodOptions {
  Method method = Method::Dense;
  double sparsity = 0.5;  ///< s: the global target, in [0, 1)
  double delta = 0.01;    ///< TopK-Guided clip margin δ, in [0, 0.5)
  double probe = 0.4;     ///< s̄: the sensitivity probe level (one of the calibrated levels)
  double lambda = 0.4;    ///< λ ≥ 0: redistribution strength
  bool sensitivity_budget = true;   ///< TopK-Guided: s_i from sensitivities (false: s_i = s)
  bool guided_masking = true;       ///< TopK-Guided: guided TopK (false: WINA's TopK)
  bool rotate = true;               ///< WINA / TopK-Guided on the rotated model
  bool wina_norms_all = false;      ///< score every projection with its column norms
  Lookup lookup = Lookup::Nearest;  ///< greedy-table row per block budget
  int sensitivity_from = 0;         ///< TopK-Guided: the sensitivity set over positions ≥ this
  DType rotation_storage = DType::F32;  ///< rotated plans: the online re-rotation matrices' type
  /// Throws OptionError naming the setting that is out of range (the CLI maps it to its option).
  void validate() const;
  /// Whether the method needs a calibration file.
  bool needs_calibration() const { return method != Method::Dense; }
};

struct Plan {
  MethodOptions opt;
  bool rotated = false;
  std::vector<double> budget;                   ///< [layer] block budget s_i
  std::vector<double> table_P;                  ///< [layer] P of the greedy row used
  std::vector<std::array<double, kNumProj>> p;  ///< [layer][proj] target p_i
  std::vector<std::array<MaskParams, kNumProj>> params;
  /// The sensitivity set the budgets came from (nullptr: uniform budgets); points into the
  /// calibration passed to make_plan.
  const Sensitivity* sensitivity = nullptr;
  /// Mean of the budgets (the clamp can move it away from s).
  double mean_budget() const;
};

/// Builds the plan; throws when the calibration lacks what the method needs.
Plan make_plan(const Calibration& cal, const MethodOptions& opt);

/// "nearest" or "interpolate"; throws for anything else.
Lookup parse_lookup(const std::string& s);
const char* lookup_name(Lookup l);

/// The rotation stored in a calibration file (its rotated variant must hold q_attn / q_mlp).
Rotation rotation_from(const Calibration& cal);

/// Loads the plan into a masker; column norms (WINA scores) are computed from `w`, the model the
/// engine runs (rotated when the plan is).
template <class E>
void configure_masker(ActivationMasker<E>& m, const Plan& plan, const Weights<E>& w) {
  const E exec;
  for (int l = 0; l < static_cast<int>(plan.params.size()); ++l)
    for (int i = 0; i < kNumProj; ++i) {
      const Proj pr = static_cast<Proj>(i);
      const MaskParams& prm = plan.params[static_cast<std::size_t>(l)][static_cast<std::size_t>(i)];
      CVec<E> norms;
      if (prm.rule == MaskRule::TopK || prm.rule == MaskRule::Guided)
        if (wina_uses_norms(pr, plan.opt.wina_norms_all))
          norms = column_norms(exec, w.layers[static_cast<std::size_t>(l)].proj(pr));
      const Matrix<E>& wm = w.layers[static_cast<std::size_t>(l)].proj(pr);
      m.set(l, pr, prm, norms, wm.rows, wm.cols);
    }
}

}  // namespace sparsim::sparsity
