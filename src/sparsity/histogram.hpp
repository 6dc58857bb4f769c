#pragma once
/// Signed activation histogram of one (layer, site), the calibration statistic of TEAL: the
/// threshold of a projection for target sparsity p is the p-quantile of |h| (METHODS.md §1),
/// read off this histogram. Plain host code, no Kokkos.
///
/// Bins (kNumBins = 10,002 counts, in this order):
///   bin 0                  values v <  lo                      (lower tail)
///   bin 1 + i, i < 10,000  values lo + i·w <= v < lo + (i+1)·w, w = (hi − lo) / 10,000
///   bin 10,001             values v >= hi                      (upper tail)
/// lo and hi are the exact 1% and 99% quantiles (linear interpolation between order statistics,
/// as numpy.quantile's default) of the first `range_values` values added (TEAL's choice of range).
///
/// Interpolation: the mass of a uniform bin is spread evenly over the bin. The mass of a tail bin
/// is spread evenly between the exact extreme seen and the range edge ([min, lo] and [hi, max]);
/// when the extreme equals the edge it is a point mass there. The resulting CDF is piecewise linear
/// and continuous except for such point masses.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace sparsim::sparsity {

class Histogram {
 public:
  /// Uniform bins between lo and hi.
  static constexpr std::size_t kUniformBins = 10000;
  /// Uniform bins plus the two tail bins.
  static constexpr std::size_t kNumBins = kUniformBins + 2;
  /// Quantiles of the buffered values that become lo and hi.
  static constexpr double kLoQuantile = 0.01;
  static constexpr double kHiQuantile = 0.99;

  /// Default number of leading values buffered to fix lo/hi.
  static constexpr std::size_t kDefaultRangeValues = std::size_t{1} << 20;

  Histogram() : Histogram(kDefaultRangeValues) {}
  /// `range_values`: how many leading values are buffered to fix lo/hi (at least 1).
  explicit Histogram(std::size_t range_values);

  /// Rebuilds a finished histogram from stored state (read_calibration). Throws sparsim::Error
  /// when the state is inconsistent: counts.size() != kNumBins, sum(counts) != count, non-finite
  /// numbers, hi <= lo, or (count > 0 and) min > max.
  static Histogram restore(double lo, double hi, std::vector<std::uint64_t> counts, double min,
                           double max, std::uint64_t count, double sum, double sumsq);

  /// Adds n values. While the range is not fixed they are buffered; when the buffer reaches
  /// range_values the range is fixed and the buffer binned. Afterwards values are binned directly.
  /// Throws sparsim::Error on a NaN or infinite value (nothing of that call is added then).
  /// Deterministic: the result depends only on the sequence of values.
  void add(const float* v, std::size_t n);
  void add(const std::vector<float>& v) { add(v.data(), v.size()); }
  /// Fixes the range from the values buffered so far (if not yet fixed) and bins them. Idempotent.
  /// add() may still be called afterwards (values are then binned directly; if finish() found no
  /// values, the first later add() fixes the range from its own values). Queries on a histogram
  /// without values throw.
  void finish();
  /// True once the range is fixed (finish() called or the buffer filled).
  bool finished() const { return ranged_ || finish_called_; }

  /// Estimated fraction of values with |h| < tau: CDF(tau) − CDF(−tau) under the interpolation
  /// above; tau <= 0 gives 0. Requires finished() and count() > 0.
  double fraction_abs_below(double tau) const;
  /// The tau >= 0 with fraction_abs_below(tau) = p: the p-quantile of |h| (for a symmetric
  /// distribution icdf(0.5 + p/2)). p must be in [0, 1); p = 0 gives 0. Where the CDF is flat the
  /// smallest such tau is returned; where it jumps (point mass), the jump's location.
  /// Requires finished() and count() > 0.
  double threshold(double p) const;

  /// Range edges (valid once finished() with count() > 0).
  double lo() const { return lo_; }
  double hi() const { return hi_; }
  /// The kNumBins counts in the order described above (all zero before the range is fixed).
  const std::vector<std::uint64_t>& counts() const { return counts_; }
  /// Exact statistics over every value added (min/max are 0 when empty).
  double min() const { return count_ ? min_ : 0.0; }
  double max() const { return count_ ? max_ : 0.0; }
  std::uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  double sumsq() const { return sumsq_; }
  std::size_t range_values() const { return range_values_; }

 private:
  void fix_range();
  void bin(double v);
  /// Cumulative counts: cum[b] = values in bins < b (size kNumBins + 1).
  std::vector<std::uint64_t> cumulative() const;
  /// Estimated number of values < x, given the cumulative counts.
  double cdf_count(const std::vector<std::uint64_t>& cum, double x) const;
  double fraction_abs_below(const std::vector<std::uint64_t>& cum, double tau) const;
  void require_queryable(const char* what) const;

  std::size_t range_values_;
  std::vector<float> buffer_;
  bool ranged_ = false;
  bool finish_called_ = false;
  double lo_ = 0.0;
  double hi_ = 0.0;
  double width_ = 0.0;  ///< (hi − lo) / kUniformBins
  std::vector<std::uint64_t> counts_;
  double min_ = 0.0;
  double max_ = 0.0;
  std::uint64_t count_ = 0;
  double sum_ = 0.0;
  double sumsq_ = 0.0;
};

}  // namespace sparsim::sparsity
