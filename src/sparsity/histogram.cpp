#include "sparsity/histogram.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace sparsim::sparsity {

namespace {

/// The q-quantile of `v` (linear interpolation between the order statistics at q·(n−1), numpy's
/// default). Reorders `v`.
double exact_quantile(std::vector<float>& v, double q) {
  const std::size_t n = v.size();
  const double pos = q * static_cast<double>(n - 1);
  const auto k = static_cast<std::size_t>(std::floor(pos));
  const double frac = pos - static_cast<double>(k);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  const double a = v[k];
  if (k + 1 >= n || frac == 0.0) return a;
  const double b = *std::min_element(v.begin() + static_cast<std::ptrdiff_t>(k) + 1, v.end());
  return a + frac * (b - a);
}

}  // namespace

Histogram::Histogram(std::size_t range_values) : range_values_(range_values), counts_(kNumBins, 0) {
  require(range_values > 0, "Histogram: range_values must be at least 1");
}

Histogram Histogram::restore(double lo, double hi, std::vector<std::uint64_t> counts, double min,
                             double max, std::uint64_t count, double sum, double sumsq) {
  require(counts.size() == kNumBins, "histogram has {} bins, expected {}", counts.size(), kNumBins);
  require(std::isfinite(lo) && std::isfinite(hi) && std::isfinite(min) && std::isfinite(max) &&
              std::isfinite(sum) && std::isfinite(sumsq),
          "histogram has a non-finite statistic (lo {}, hi {}, min {}, max {}, sum {}, sumsq {})",
          lo, hi, min, max, sum, sumsq);
  std::uint64_t total = 0;
  for (std::uint64_t c : counts) total += c;
  require(total == count, "histogram bins hold {} values but its count is {}", total, count);
  Histogram h(1);
  h.counts_ = std::move(counts);
  h.count_ = count;
  h.sum_ = sum;
  h.sumsq_ = sumsq;
  h.finish_called_ = true;
  if (count == 0) return h;
  require(hi > lo, "histogram range is empty (lo {} >= hi {})", lo, hi);
  require(min <= max, "histogram minimum {} exceeds its maximum {}", min, max);
  require(sumsq >= 0.0, "histogram sum of squares {} is negative", sumsq);
  h.ranged_ = true;
  h.lo_ = lo;
  h.hi_ = hi;
  h.width_ = (hi - lo) / static_cast<double>(kUniformBins);
  h.min_ = min;
  h.max_ = max;
  return h;
}

void Histogram::add(const float* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    require(std::isfinite(v[i]), "Histogram::add: non-finite activation {} at index {} of {}", v[i],
            i, n);
  std::size_t i = 0;
  while (i < n && !ranged_) {
    const std::size_t take = std::min(n - i, range_values_ - buffer_.size());
    buffer_.insert(buffer_.end(), v + i, v + i + take);
    i += take;
    if (buffer_.size() == range_values_) fix_range();
  }
  // After finish() the range is fixed by whatever has been buffered.
  if (!ranged_ && finish_called_ && !buffer_.empty()) fix_range();
  for (; i < n; ++i) bin(v[i]);
}

void Histogram::finish() {
  finish_called_ = true;
  if (!ranged_ && !buffer_.empty()) fix_range();
}

void Histogram::fix_range() {
  std::vector<float> tmp(buffer_);
  double lo = exact_quantile(tmp, kLoQuantile);
  double hi = exact_quantile(tmp, kHiQuantile);
  if (!(hi > lo)) {
    // At least 98% of the values share one value: give the bins a tiny width around it.
    const double d = std::max(std::abs(lo), 1e-30) * 1e-6;
    lo -= d;
    hi += d;
  }
  lo_ = lo;
  hi_ = hi;
  width_ = (hi - lo) / static_cast<double>(kUniformBins);
  ranged_ = true;
  std::vector<float> buf;
  buf.swap(buffer_);
  for (float x : buf) bin(x);
}

void Histogram::bin(double v) {
  std::size_t b;
  if (v < lo_) {
    b = 0;
  } else if (v >= hi_) {
    b = kNumBins - 1;
  } else {
    const double idx = std::floor((v - lo_) / width_);
    b = 1 + static_cast<std::size_t>(std::clamp(idx, 0.0, static_cast<double>(kUniformBins - 1)));
  }
  ++counts_[b];
  if (count_ == 0) {
    min_ = max_ = v;
  } else {
    min_ = std::min(min_, v);
    max_ = std::max(max_, v);
  }
  ++count_;
  sum_ += v;
  sumsq_ += v * v;
}

std::vector<std::uint64_t> Histogram::cumulative() const {
  std::vector<std::uint64_t> cum(kNumBins + 1, 0);
  for (std::size_t b = 0; b < kNumBins; ++b) cum[b + 1] = cum[b] + counts_[b];
  return cum;
}

double Histogram::cdf_count(const std::vector<std::uint64_t>& cum, double x) const {
  // Lower tail: spread over [min, lo], or a point mass at lo.
  double below = 0.0;
  const auto c_low = static_cast<double>(counts_.front());
  if (c_low > 0.0) {
    if (min_ < lo_)
      below += c_low * std::clamp((x - min_) / (lo_ - min_), 0.0, 1.0);
    else if (x > lo_)
      below += c_low;
  }
  // Uniform bins.
  if (x >= hi_) {
    below += static_cast<double>(cum[kNumBins - 1] - cum[1]);
  } else if (x > lo_) {
    const double idx = std::floor((x - lo_) / width_);
    const auto b =
        static_cast<std::size_t>(std::clamp(idx, 0.0, static_cast<double>(kUniformBins - 1)));
    const double left = lo_ + static_cast<double>(b) * width_;
    const double frac = std::clamp((x - left) / width_, 0.0, 1.0);
    below += static_cast<double>(cum[1 + b] - cum[1]) + static_cast<double>(counts_[1 + b]) * frac;
  }
  // Upper tail: spread over [hi, max], or a point mass at hi.
  const auto c_high = static_cast<double>(counts_.back());
  if (c_high > 0.0) {
    if (max_ > hi_)
      below += c_high * std::clamp((x - hi_) / (max_ - hi_), 0.0, 1.0);
    else if (x > hi_)
      below += c_high;
  }
  return below;
}

void Histogram::require_queryable(const char* what) const {
  require(finished(), "Histogram::{}: the range is not fixed yet (call finish() first)", what);
  require(count_ > 0, "Histogram::{}: the histogram holds no values", what);
}

double Histogram::fraction_abs_below(const std::vector<std::uint64_t>& cum, double tau) const {
  if (!(tau > 0.0)) return 0.0;
  const double f = (cdf_count(cum, tau) - cdf_count(cum, -tau)) / static_cast<double>(count_);
  return std::clamp(f, 0.0, 1.0);
}

double Histogram::fraction_abs_below(double tau) const {
  require_queryable("fraction_abs_below");
  require(!std::isnan(tau), "Histogram::fraction_abs_below: tau is NaN");
  return fraction_abs_below(cumulative(), tau);
}

double Histogram::threshold(double p) const {
  require_queryable("threshold");
  require(p >= 0.0 && p < 1.0, "Histogram::threshold: p = {} is outside [0, 1)", p);
  if (p == 0.0) return 0.0;
  const std::vector<std::uint64_t> cum = cumulative();
  // Beyond every value and range edge the fraction is 1 > p.
  double a = 0.0;
  double b = 2.0 * std::max({std::abs(min_), std::abs(max_), std::abs(lo_), std::abs(hi_)}) +
             std::numeric_limits<double>::min();
  // Invariant: fraction(a) < p <= fraction(b). fraction is nondecreasing in tau.
  for (int it = 0; it < 2000; ++it) {
    const double m = a + 0.5 * (b - a);
    if (m <= a || m >= b) break;
    if (fraction_abs_below(cum, m) >= p)
      b = m;
    else
      a = m;
  }
  return b;
}

}  // namespace sparsim::sparsity
