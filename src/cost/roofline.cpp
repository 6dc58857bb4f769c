#include "cost/roofline.hpp"

#include "core/error.hpp"

#include <algorithm>

namespace sparsim::cost {

const char* KernelTime::bound() const {
  if (launch_s > std::max(compute_s, memory_s)) return "launch";
  return compute_s > memory_s ? "compute" : "memory";
}

KernelTime roofline_time(double flops, double bytes, double launches, double peak_flops,
                         double bandwidth, double launch_overhead_s) {
  KernelTime t;
  t.compute_s = flops / peak_flops;
  t.memory_s = bytes / bandwidth;
  t.launch_s = launches * launch_overhead_s;
  t.seconds = std::max(t.compute_s, t.memory_s) + t.launch_s;
  return t;
}

namespace {
template <class F>
KernelTime sum_over(const std::vector<KernelTime>& v, F&& index, std::size_t n) {
  KernelTime t;
  for (std::size_t i = 0; i < n; ++i) t += v[index(i)];
  return t;
}
}  // namespace

KernelTime Prediction::realised_op(const flops::LedgerFile& lf, std::size_t p,
                                   std::size_t o) const {
  const std::size_t S = lf.num_slots(), base = (p * lf.num_ops() + o) * S;
  return sum_over(
      realised, [&](std::size_t s) { return base + s; }, S);
}

KernelTime Prediction::dense_op(const flops::LedgerFile& lf, std::size_t p, std::size_t o) const {
  const std::size_t S = lf.num_slots(), base = (p * lf.num_ops() + o) * S;
  return sum_over(
      dense, [&](std::size_t s) { return base + s; }, S);
}

KernelTime Prediction::realised_slot(const flops::LedgerFile& lf, std::size_t p,
                                     std::size_t s) const {
  const std::size_t S = lf.num_slots(), O = lf.num_ops();
  return sum_over(
      realised, [&](std::size_t o) { return (p * O + o) * S + s; }, O);
}

KernelTime Prediction::dense_slot(const flops::LedgerFile& lf, std::size_t p, std::size_t s) const {
  const std::size_t S = lf.num_slots(), O = lf.num_ops();
  return sum_over(
      dense, [&](std::size_t o) { return (p * O + o) * S + s; }, O);
}

KernelTime Prediction::realised_phase(const flops::LedgerFile& lf, std::size_t p) const {
  const std::size_t n = lf.num_ops() * lf.num_slots();
  return sum_over(
      realised, [&](std::size_t i) { return p * n + i; }, n);
}

KernelTime Prediction::dense_phase(const flops::LedgerFile& lf, std::size_t p) const {
  const std::size_t n = lf.num_ops() * lf.num_slots();
  return sum_over(
      dense, [&](std::size_t i) { return p * n + i; }, n);
}

Prediction predict(const flops::LedgerFile& lf, const HardwareProfile& hw,
                   const std::string& precision) {
  Prediction pr;
  pr.precision = precision;
  pr.peak_flops = hw.peak(precision);
  pr.bandwidth = hw.memory_bandwidth;
  pr.launch_overhead_s = hw.launch_overhead_s;
  require(pr.peak_flops > 0 && pr.bandwidth > 0 && pr.launch_overhead_s >= 0,
          "hardware profile '{}' has a non-positive roof", hw.name);
  pr.realised.reserve(lf.cells.size());
  pr.dense.reserve(lf.cells.size());
  for (const flops::Cell& c : lf.cells) {
    // each distinct kernel pays the launch cost once, on the op that owns it
    pr.realised.push_back(roofline_time(c.flops_realised, c.bytes_realised, c.kernels,
                                        pr.peak_flops, pr.bandwidth, pr.launch_overhead_s));
    // An op a dense run does not have costs it nothing, launches included.
    const bool in_dense = c.flops_dense > 0 || c.bytes_dense > 0;
    pr.dense.push_back(roofline_time(c.flops_dense, c.bytes_dense, in_dense ? c.kernels : 0.0,
                                     pr.peak_flops, pr.bandwidth, pr.launch_overhead_s));
  }
  return pr;
}

}  // namespace sparsim::cost
