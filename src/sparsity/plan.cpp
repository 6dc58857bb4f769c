#include "sparsity/plan.hpp"

#include "core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>

namespace sparsim::sparsity {

Method parse_method(const std::string& s) {
  if (s == "dense") return Method::Dense;
  if (s == "teal") return Method::Teal;
  if (s == "wina") return Method::Wina;
  if (s == "topk-guided") return Method::TopkGuided;
  throw OptionError("activation.method", "the activation-sparsity method",
                    fmt::format("'{}' is not one of dense, teal, wina, topk-guided", s));
}

const char* method_name(Method m) {
  switch (m) {
    case Method::Dense:
      return "dense";
    case Method::Teal:
      return "teal";
    case Method::Wina:
      return "wina";
    case Method::TopkGuided:
      return "topk-guided";
  }
  return "?";
}

Lookup parse_lookup(const std::string& s) {
  if (s == "nearest") return Lookup::Nearest;
  if (s == "interpolate") return Lookup::Interpolate;
  throw OptionError("activation.lookup", "the greedy table lookup",
                    fmt::format("'{}' is not one of nearest, interpolate", s));
}

const char* lookup_name(Lookup l) {
  return l == Lookup::Nearest ? "nearest" : "interpolate";
}

void MethodOptions::validate() const {
  require_setting(std::isfinite(sparsity) && sparsity >= 0.0 && sparsity < 1.0,
                  "activation.sparsity", "the target sparsity s", "{} is outside [0, 1)", sparsity);
  require_setting(std::isfinite(delta) && delta >= 0.0 && delta < 0.5, "activation.delta",
                  "TopK-Guided's step δ", "{} is outside [0, 0.5)", delta);
  require_setting(std::isfinite(probe) && probe > 0.0 && probe < 1.0, "activation.probe",
                  "the probe level s̄", "{} is outside (0, 1)", probe);
  require_setting(std::isfinite(lambda) && lambda >= 0.0 && lambda <= 10.0, "activation.lambda",
                  "the redistribution strength λ", "{} is outside [0, 10]", lambda);
  require_setting(sensitivity_from >= 0, "activation.sensitivity_from",
                  "the first position of the sensitivities", "{} is negative", sensitivity_from);
  require_setting(rotation_storage == DType::F32 || rotation_storage == DType::BF16,
                  "activation.rotation_storage", "the re-rotation's storage",
                  "must be f32 or bf16");
}

double Plan::mean_budget() const {
  return budget.empty() ? 0.0
                        : std::accumulate(budget.begin(), budget.end(), 0.0) /
                              static_cast<double>(budget.size());
}

Plan make_plan(const Calibration& cal, const MethodOptions& opt) {
  opt.validate();
  Plan plan;
  plan.opt = opt;
  const int L = cal.n_layer;
  if (opt.method == Method::Dense) return plan;
  plan.rotated = opt.method != Method::Teal && opt.rotate;
  const std::optional<CalibrationVariant>& var = plan.rotated ? cal.rotated : cal.plain;
  require(var.has_value(), "calibration file {} has no {} calibration, which method {} needs",
          cal.file, plan.rotated ? "rotated (WINA)" : "plain (unrotated)", method_name(opt.method));
  require(static_cast<int>(var->greedy.size()) == L,
          "calibration file {} has no greedy allocation tables", cal.file);
  const bool budgets = opt.method == Method::TopkGuided && opt.sensitivity_budget;
  if (budgets) {
    int k = -1;
    for (std::size_t i = 0; i < cal.probe_levels.size(); ++i)
      if (std::fabs(cal.probe_levels[i] - opt.probe) < 1e-9) k = static_cast<int>(i);
    std::string levels;
    for (double v : cal.probe_levels)
      levels += (levels.empty() ? "" : ", ") + fmt::format("{:g}", v);
    require(k >= 0, "the probe level {} was not calibrated in {} (levels: {})", opt.probe, cal.file,
            levels.empty() ? "none" : levels);
    // the sensitivities must have been probed as this evaluation masks
    const ProbeRule rule = opt.guided_masking ? ProbeRule::Guided : ProbeRule::TopK;
    const Sensitivity* set =
        var->find_sensitivity(rule, opt.delta, opt.wina_norms_all, opt.sensitivity_from);
    if (!set) {
      Sensitivity want;
      want.rule = rule;
      want.delta = rule == ProbeRule::Guided ? opt.delta : 0.0;
      want.norms_all = opt.wina_norms_all;
      want.from = opt.sensitivity_from;
      std::string have;
      for (const Sensitivity& s : var->sensitivity)
        have += fmt::format("{}\n    {}", have.empty() ? "" : ";", s.describe());
      fail(
          "calibration file {} holds no sensitivities probed with this evaluation's settings ({}); "
          "it holds:{}\n  calibrate with the same δ, WINA norms, probe masking and sensitivity "
          "source, or evaluate with the settings of one of these",
          cal.file, want.describe(), have.empty() ? std::string(" none") : have);
    }
    plan.sensitivity = set;
    plan.budget = block_budgets(set->e[static_cast<std::size_t>(k)], opt.sparsity, opt.lambda);
  } else {
    plan.budget.assign(static_cast<std::size_t>(L), opt.sparsity);
  }
  for (int l = 0; l < L; ++l) {
    const GreedyTable& table = var->greedy[static_cast<std::size_t>(l)];
    const double b = plan.budget[static_cast<std::size_t>(l)];
    const std::vector<double> row =
        opt.lookup == Lookup::Nearest ? table.nearest(b) : table.interpolate(b);
    plan.table_P.push_back(row[0]);
    std::array<double, kNumProj> p{};
    std::array<MaskParams, kNumProj> prm{};
    for (int i = 0; i < kNumProj; ++i) {
      const Proj pr = static_cast<Proj>(i);
      const double pi = std::min(row[static_cast<std::size_t>(i) + 1], 0.999);
      p[static_cast<std::size_t>(i)] = pi;
      const Histogram& h = var->histograms[static_cast<std::size_t>(l)]
                                          [static_cast<std::size_t>(histogram_slot(site_of(pr)))];
      MaskParams& m = prm[static_cast<std::size_t>(i)];
      m.p = static_cast<float>(pi);
      if (pi <= 0.0) {
        m.rule = MaskRule::None;
        continue;
      }
      switch (opt.method) {
        case Method::Teal:
          m.rule = MaskRule::Threshold;
          m.tau = static_cast<float>(h.threshold(pi));
          break;
        case Method::Wina:
          m.rule = MaskRule::TopK;
          break;
        case Method::TopkGuided:
          m.rule = opt.guided_masking ? MaskRule::Guided : MaskRule::TopK;
          m.tau = static_cast<float>(h.threshold(pi));
          m.delta = static_cast<float>(opt.delta);
          break;
        case Method::Dense:
          break;
      }
    }
    plan.p.push_back(p);
    plan.params.push_back(prm);
  }
  return plan;
}

Rotation rotation_from(const Calibration& cal) {
  require(cal.rotated.has_value() && !cal.rotated->q_attn.empty() && !cal.rotated->q_mlp.empty(),
          "calibration file {} holds no WINA rotation", cal.file);
  Rotation r;
  r.d_model = cal.d_model;
  r.n_layer = cal.n_layer;
  const std::size_t DD = static_cast<std::size_t>(cal.d_model) * cal.d_model;
  for (int i = 0; i <= cal.n_layer; ++i)
    r.q_attn.emplace_back(cal.rotated->q_attn.begin() + static_cast<std::ptrdiff_t>(i * DD),
                          cal.rotated->q_attn.begin() + static_cast<std::ptrdiff_t>((i + 1) * DD));
  for (int i = 0; i < cal.n_layer; ++i)
    r.q_mlp.emplace_back(cal.rotated->q_mlp.begin() + static_cast<std::ptrdiff_t>(i * DD),
                         cal.rotated->q_mlp.begin() + static_cast<std::ptrdiff_t>((i + 1) * DD));
  return r;
}

}  // namespace sparsim::sparsity
