#pragma once
/// AdamW (Loshchilov & Hutter 2019, as torch.optim.AdamW computes it) over one flat vector of
/// parameters in double on the host, a learning-rate schedule, and gradient clipping by the
/// global norm. Everything runs in a fixed order, so a run and its resumption agree bitwise.
#include <cstdint>
#include <string>
#include <vector>

namespace sparsim::recovery {

enum class Schedule { Cosine, Linear, Constant };
const char* schedule_name(Schedule s);
Schedule parse_schedule(const std::string& s);

struct AdamWOptions {
  double lr = 2e-4;  ///< peak learning rate
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;   ///< decoupled: p ← p − lr·wd·p
  double max_grad_norm = 1;  ///< clip the global gradient norm to this; 0: no clipping
  Schedule schedule = Schedule::Cosine;
  int warmup_steps = 0;
  void validate() const;
};

/// Learning rate of step s (1-based) of `total`: linear warm-up lr·s/W for s ≤ W, then over the
/// remaining steps (progress q = (s − W − 1)/(total − W)) cosine lr·½(1 + cos πq), linear
/// lr·(1 − q), or constant lr.
double learning_rate(const AdamWOptions& o, int step, int total);

class AdamW {
 public:
  AdamW(const AdamWOptions& o, std::size_t n_params);
  /// One update of `params` with `grad` (clipped in place first) at learning rate `lr`;
  /// returns the gradient's global norm before clipping.
  double step(std::vector<double>& params, std::vector<double>& grad, double lr);

  std::int64_t steps() const { return t_; }
  /// The moments (for checkpoints).
  const std::vector<double>& m() const { return m_; }
  const std::vector<double>& v() const { return v_; }
  void restore(std::int64_t steps, std::vector<double> m, std::vector<double> v);

 private:
  AdamWOptions o_;
  std::int64_t t_ = 0;
  std::vector<double> m_, v_;
};

}  // namespace sparsim::recovery
