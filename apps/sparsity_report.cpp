#include "sparsity_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace sparsim::app {

namespace {
struct Summary {
  double mean = 0, min = 0, max = 0;
  std::uint64_t n = 0;
};
Summary summarize(const std::vector<double>& v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  return s;
}
// Per projection over layers: mean target, and realised mean / min / max over (token, layer).
struct ProjSummary {
  double target = 0, mean = 0, min = 1, max = 0;
  std::uint64_t tokens = 0;
};
ProjSummary proj_summary(const SparsityReport& r, int i) {
  ProjSummary out;
  double sum = 0;
  const std::size_t L = r.stats.size();
  for (std::size_t l = 0; l < L; ++l) {
    const auto& st = r.stats[l][static_cast<std::size_t>(i)];
    if (l < r.plan.p.size()) out.target += r.plan.p[l][static_cast<std::size_t>(i)];
    if (!st.tokens) continue;
    sum += st.sum;
    out.tokens += st.tokens;
    out.min = std::min(out.min, st.min);
    out.max = std::max(out.max, st.max);
  }
  out.target = L ? out.target / static_cast<double>(L) : 0;
  out.mean = out.tokens ? sum / static_cast<double>(out.tokens) : 0;
  if (!out.tokens) out.min = 0;
  return out;
}
}  // namespace

nlohmann::json SparsityReport::json() const {
  const Summary t = summarize(token_sparsity);
  nlohmann::json j;
  j["method"] = sparsity::method_name(plan.opt.method);
  j["target"] = plan.opt.sparsity;
  j["realised_mean"] = t.mean;
  j["realised_min"] = t.min;
  j["realised_max"] = t.max;
  j["tokens"] = t.n;
  j["weighting"] = "flops";
  j["block_budget_mean"] = plan.mean_budget();
  j["rotated"] = plan.rotated;
  j["calibration"] = calibration;
  j["greedy_lookup"] = sparsity::lookup_name(plan.opt.lookup);
  if (plan.rotated) j["rotation_storage"] = to_string(plan.opt.rotation_storage);
  if (plan.opt.method != sparsity::Method::Teal)
    j["wina_norms"] = plan.opt.wina_norms_all ? "all" : "kg";
  if (plan.opt.method == sparsity::Method::TopkGuided) {
    j["delta"] = plan.opt.delta;
    j["probe"] = plan.opt.probe;
    j["lambda"] = plan.opt.lambda;
    j["budget"] = plan.opt.sensitivity_budget ? "sensitivity" : "uniform";
    j["masking"] = plan.opt.guided_masking ? "guided" : "topk";
    if (plan.sensitivity) j["sensitivity_set"] = plan.sensitivity->describe();
  }
  // per block: the budget, the P of the greedy-table point used, and its targets p_i
  j["block_budget"] = plan.budget;
  j["table_P"] = plan.table_P;
  nlohmann::json tg = nlohmann::json::array();
  for (const auto& row : plan.p) tg.push_back(std::vector<double>(row.begin(), row.end()));
  j["block_targets"] = tg;
  nlohmann::json per;
  for (int i = 0; i < kNumProj; ++i) {
    const ProjSummary s = proj_summary(*this, i);
    per[proj_name(static_cast<Proj>(i))] = {{"target_mean", s.target},
                                            {"realised_mean", s.mean},
                                            {"realised_min", s.min},
                                            {"realised_max", s.max}};
  }
  j["per_projection"] = per;
  return j;
}

void SparsityReport::write(io::Group root) const {
  io::Group g = root.create_group("sparsity");
  g.set_attr("method", std::string(sparsity::method_name(plan.opt.method)));
  g.set_attr("target", plan.opt.sparsity);
  g.set_attr("rotated", plan.rotated ? 1 : 0);
  g.set_attr("calibration", calibration);
  g.set_attr("delta", plan.opt.delta);
  g.set_attr("probe", plan.opt.probe);
  g.set_attr("lambda", plan.opt.lambda);
  g.set_attr("budget", std::string(plan.opt.sensitivity_budget ? "sensitivity" : "uniform"));
  g.set_attr("masking", std::string(plan.opt.guided_masking ? "guided" : "topk"));
  g.set_attr("wina_norms", std::string(plan.opt.wina_norms_all ? "all" : "kg"));
  g.set_attr("greedy_lookup", std::string(sparsity::lookup_name(plan.opt.lookup)));
  g.set_attr("rotation_storage", std::string(to_string(plan.opt.rotation_storage)));
  g.set_attr("sensitivity_set",
             plan.sensitivity ? plan.sensitivity->describe() : std::string("none"));
  const Summary t = summarize(token_sparsity);
  g.set_attr("realised_mean", t.mean);
  g.set_attr("realised_min", t.min);
  g.set_attr("realised_max", t.max);
  g.set_attr("block_budget_mean", plan.mean_budget());
  const std::size_t L = stats.size();
  const hsize_t hl = static_cast<hsize_t>(L), hp = static_cast<hsize_t>(kNumProj);
  std::vector<double> target, mean, mn, mx, tau;
  std::vector<std::uint64_t> tokens, hist;
  std::vector<std::int32_t> rule;
  for (std::size_t l = 0; l < L; ++l)
    for (std::size_t i = 0; i < static_cast<std::size_t>(kNumProj); ++i) {
      const auto& st = stats[l][i];
      target.push_back(l < plan.p.size() ? plan.p[l][i] : 0.0);
      tau.push_back(l < plan.params.size() ? plan.params[l][i].tau : 0.0);
      rule.push_back(l < plan.params.size() ? static_cast<std::int32_t>(plan.params[l][i].rule)
                                            : 0);
      mean.push_back(st.mean());
      mn.push_back(st.tokens ? st.min : 0.0);
      mx.push_back(st.tokens ? st.max : 0.0);
      tokens.push_back(st.tokens);
      hist.insert(hist.end(), st.hist.begin(), st.hist.end());
    }
  std::vector<std::string> names;
  for (int i = 0; i < kNumProj; ++i) names.emplace_back(proj_name(static_cast<Proj>(i)));
  g.write_strings("projections", names);
  g.write<double>("target", target.data(), {hl, hp}, {"", "target sparsity p_i [layer][proj]"});
  g.write<double>("realised_mean", mean.data(), {hl, hp},
                  {"", "mean realised sparsity over tokens"});
  g.write<double>("realised_min", mn.data(), {hl, hp}, {"", "min realised sparsity over tokens"});
  g.write<double>("realised_max", mx.data(), {hl, hp}, {"", "max realised sparsity over tokens"});
  g.write<double>("threshold", tau.data(), {hl, hp},
                  {"", "|h| threshold (teal, topk-guided's estimate)"});
  g.write<std::int32_t>("rule", rule.data(), {hl, hp},
                        {"", "0 none, 1 threshold, 2 topk, 3 guided"});
  g.write<std::uint64_t>("tokens", tokens.data(), {hl, hp}, {"token", "masked tokens"});
  g.write<std::uint64_t>("histogram", hist.data(),
                         {hl, hp, static_cast<hsize_t>(sparsity::ProjStats::kBins)},
                         {"token", "tokens per realised-sparsity bin (100 bins over [0, 1])"});
  g.write<double>("block_budget", plan.budget, {"", "block budget s_i"});
  g.write<double>("table_P", plan.table_P, {"", "P of the greedy-table row used per block"});
  g.write<double>("token_sparsity", token_sparsity,
                  {"", "per masked token, FLOP-weighted over all projections"});
}

std::string SparsityReport::table() const {
  const Summary t = summarize(token_sparsity);
  std::string s = fmt::format(
      "\nsparsity  {} target {:.3f}: realised mean {:.4f} (min {:.4f}, max {:.4f}) over {} tokens, "
      "mean block budget {:.4f}\n",
      sparsity::method_name(plan.opt.method), plan.opt.sparsity, t.mean, t.min, t.max, t.n,
      plan.mean_budget());
  s +=
      fmt::format("  {:<6} {:>8} {:>10} {:>8} {:>8}\n", "proj", "target", "realised", "min", "max");
  for (int i = 0; i < kNumProj; ++i) {
    const ProjSummary p = proj_summary(*this, i);
    s += fmt::format("  {:<6} {:>8.4f} {:>10.4f} {:>8.4f} {:>8.4f}\n",
                     proj_name(static_cast<Proj>(i)), p.target, p.mean, p.min, p.max);
  }
  return s;
}

}  // namespace sparsim::app
