#include "run_summary.hpp"

#include <fmt/format.h>

#include <cmath>

namespace sparsim::app {

PplSpread ppl_spread(const PplResult& r) {
  PplSpread s;
  s.windows = static_cast<int>(r.window_nll.size());
  if (s.windows == 0) return s;
  std::vector<double> per;
  for (std::size_t i = 0; i < r.window_nll.size(); ++i)
    per.push_back(r.window_nll[i] /
                  static_cast<double>(std::max<std::uint64_t>(1, r.window_tokens[i])));
  double m = 0;
  for (double v : per) m += v;
  m /= static_cast<double>(per.size());
  double ss = 0;
  for (double v : per) ss += (v - m) * (v - m);
  s.mean_nll = m;
  s.se = per.size() > 1
             ? std::sqrt(ss / static_cast<double>(per.size() - 1) / static_cast<double>(per.size()))
             : 0.0;
  s.ci95 = {std::exp(m - 1.96 * s.se), std::exp(m + 1.96 * s.se)};
  return s;
}

namespace {
struct Parts {
  flops::Ledger::Totals all, rot, sel;
};
Parts parts(const flops::Ledger& l) {
  Parts p;
  p.all = l.total();
  p.rot = l.by_op(flops::Op::Rotation);
  p.sel = l.by_op(flops::Op::MaskSelect);
  return p;
}
}  // namespace

nlohmann::json cost_json(const flops::Ledger& l) {
  const Parts p = parts(l);
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  return {{"flops",
           {{"dense", p.all.flops_dense},
            {"realised", p.all.flops_realised},
            {"rotation", p.rot.flops_realised},
            {"mask_select", p.sel.flops_realised},
            {"realised_over_dense", ratio(p.all.flops_realised, p.all.flops_dense)}}},
          {"bytes",
           {{"dense", p.all.bytes_dense},
            {"realised", p.all.bytes_realised},
            {"rotation", p.rot.bytes_realised},
            {"mask_select", p.sel.bytes_realised},
            {"realised_over_dense", ratio(p.all.bytes_realised, p.all.bytes_dense)}}}};
}

std::string cost_table(const flops::Ledger& l, bool sparse) {
  const Parts p = parts(l);
  std::string s = fmt::format("  {:<22} {:>14.3f}\n", "GFLOP (dense)", p.all.flops_dense / 1e9);
  if (!sparse) return s;
  const double fr = p.all.flops_dense > 0 ? p.all.flops_realised / p.all.flops_dense : 0;
  const double br = p.all.bytes_dense > 0 ? p.all.bytes_realised / p.all.bytes_dense : 0;
  s += fmt::format("  {:<22} {:>14.3f}  ({:.3f} x dense{})\n", "GFLOP (realised)",
                   p.all.flops_realised / 1e9, fr, fr > 1 ? ": MORE than dense" : "");
  if (p.rot.flops_realised > 0)
    s += fmt::format("  {:<22} {:>14.3f}  (online re-rotation, {:.1f}% of realised)\n",
                     "  of which rotation", p.rot.flops_realised / 1e9,
                     100 * p.rot.flops_realised / p.all.flops_realised);
  s += fmt::format("  {:<22} {:>14.3f}\n", "GB (dense)", p.all.bytes_dense / 1e9);
  s += fmt::format("  {:<22} {:>14.3f}  ({:.3f} x dense{})\n", "GB (realised)",
                   p.all.bytes_realised / 1e9, br, br > 1 ? ": MORE than dense" : "");
  if (p.rot.bytes_realised > 0)
    s += fmt::format("  {:<22} {:>14.3f}\n", "  of which rotation", p.rot.bytes_realised / 1e9);
  return s;
}

}  // namespace sparsim::app
