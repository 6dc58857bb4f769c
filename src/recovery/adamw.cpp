#include "recovery/adamw.hpp"

#include "core/error.hpp"

#include <cmath>

namespace sparsim::recovery {

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::Cosine:
      return "cosine";
    case Schedule::Linear:
      return "linear";
    case Schedule::Constant:
      break;
  }
  return "constant";
}

Schedule parse_schedule(const std::string& s) {
  if (s == "cosine") return Schedule::Cosine;
  if (s == "linear") return Schedule::Linear;
  if (s == "constant") return Schedule::Constant;
  fail("learning-rate schedule must be cosine, linear or constant, got '{}'", s);
}

void AdamWOptions::validate() const {
  require(std::isfinite(lr) && lr > 0, "learning rate must be a positive number, got {}", lr);
  require(std::isfinite(beta1) && beta1 >= 0 && beta1 < 1, "AdamW beta1 must be in [0, 1), got {}",
          beta1);
  require(std::isfinite(beta2) && beta2 >= 0 && beta2 < 1, "AdamW beta2 must be in [0, 1), got {}",
          beta2);
  require(std::isfinite(eps) && eps > 0, "AdamW epsilon must be a positive number, got {}", eps);
  require(std::isfinite(weight_decay) && weight_decay >= 0,
          "weight decay must be a number >= 0, got {}", weight_decay);
  require(std::isfinite(max_grad_norm) && max_grad_norm >= 0,
          "gradient clipping norm must be a number >= 0, got {}", max_grad_norm);
  require(warmup_steps >= 0, "warm-up steps must be >= 0, got {}", warmup_steps);
}

double learning_rate(const AdamWOptions& o, int step, int total) {
  const int w = o.warmup_steps;
  if (step <= w) return o.lr * step / w;
  if (o.schedule == Schedule::Constant) return o.lr;
  const double q = static_cast<double>(step - w - 1) / std::max(1, total - w);
  if (o.schedule == Schedule::Linear) return o.lr * (1 - q);
  return o.lr * 0.5 * (1 + std::cos(M_PI * q));
}

AdamW::AdamW(const AdamWOptions& o, std::size_t n) : o_(o), m_(n, 0.0), v_(n, 0.0) {
  o_.validate();
}

double AdamW::step(std::vector<double>& p, std::vector<double>& g, double lr) {
  require(p.size() == m_.size() && g.size() == m_.size(),
          "AdamW: {} parameters and {} gradients for {} moments", p.size(), g.size(), m_.size());
  double ss = 0;
  for (double x : g) ss += x * x;
  const double norm = std::sqrt(ss);
  if (o_.max_grad_norm > 0 && norm > o_.max_grad_norm) {
    const double c = o_.max_grad_norm / (norm + 1e-6);  // as torch.nn.utils.clip_grad_norm_
    for (double& x : g) x *= c;
  }
  ++t_;
  const double bc1 = 1 - std::pow(o_.beta1, static_cast<double>(t_));
  const double bc2 = 1 - std::pow(o_.beta2, static_cast<double>(t_));
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1 - lr * o_.weight_decay;
    m_[i] = o_.beta1 * m_[i] + (1 - o_.beta1) * g[i];
    v_[i] = o_.beta2 * v_[i] + (1 - o_.beta2) * g[i] * g[i];
    const double mh = m_[i] / bc1;
    const double vh = v_[i] / bc2;
    p[i] -= lr * mh / (std::sqrt(vh) + o_.eps);
  }
  return norm;
}

void AdamW::restore(std::int64_t steps, std::vector<double> m, std::vector<double> v) {
  require(steps >= 0 && m.size() == m_.size() && v.size() == v_.size(),
          "AdamW: restoring {} moments into an optimizer of {}", m.size(), m_.size());
  t_ = steps;
  m_ = std::move(m);
  v_ = std::move(v);
}

}  // namespace sparsim::recovery
