#pragma once
/// The roofline cost model over a FLOP / byte ledger.
///
/// Every ledger entry (phase, op, layer) aggregates the work of `kernels` distinct kernel
/// launches with F FLOPs and B bytes of memory traffic in total (an op fused into another op's
/// kernel has F and B but no kernels of its own). Its predicted time on a hardware profile is
///
///     t = max(F / P, B / W) + kernels · t_launch
///
/// with P the profile's peak FLOP/s in the chosen precision, W its memory bandwidth and
/// t_launch its per-kernel fixed cost. The dense time of the entry uses the dense F and B
/// (and no launches for ops a dense run does not have). Times add up over entries: the model
/// assumes kernels run one after another, as sparsim's forward pass issues them.
/// docs/cost-model.md discusses what it leaves out.
#include "cost/hardware.hpp"
#include "flops/ledger_file.hpp"

#include <string>
#include <vector>

namespace sparsim::cost {

/// Predicted time of one entry (or a sum of entries).
struct KernelTime {
  double compute_s = 0;  ///< F / P
  double memory_s = 0;   ///< B / W
  double launch_s = 0;   ///< launches · t_launch
  double seconds = 0;    ///< max(compute, memory) + launch, summed entry by entry

  KernelTime& operator+=(const KernelTime& o) {
    compute_s += o.compute_s;
    memory_s += o.memory_s;
    launch_s += o.launch_s;
    seconds += o.seconds;
    return *this;
  }
  /// "compute", "memory" or "launch": which term is the largest.
  const char* bound() const;
};

/// The roofline time of F FLOPs and B bytes over `launches` launches.
KernelTime roofline_time(double flops, double bytes, double launches, double peak_flops,
                         double bandwidth, double launch_overhead_s);

struct Prediction {
  std::string precision;  ///< the peak used ("fp32", …)
  double peak_flops = 0;  ///< P
  double bandwidth = 0;   ///< W
  double launch_overhead_s = 0;
  std::vector<KernelTime> realised;  ///< [phase][op][slot], like LedgerFile::cells
  std::vector<KernelTime> dense;     ///< the same ledger entries run densely

  KernelTime realised_op(const flops::LedgerFile& lf, std::size_t phase, std::size_t op) const;
  KernelTime dense_op(const flops::LedgerFile& lf, std::size_t phase, std::size_t op) const;
  KernelTime realised_slot(const flops::LedgerFile& lf, std::size_t phase, std::size_t slot) const;
  KernelTime dense_slot(const flops::LedgerFile& lf, std::size_t phase, std::size_t slot) const;
  KernelTime realised_phase(const flops::LedgerFile& lf, std::size_t phase) const;
  KernelTime dense_phase(const flops::LedgerFile& lf, std::size_t phase) const;
};

/// Predicts every entry of `lf` on `hw` with peak FLOP/s of `precision`.
Prediction predict(const flops::LedgerFile& lf, const HardwareProfile& hw,
                   const std::string& precision);

}  // namespace sparsim::cost
