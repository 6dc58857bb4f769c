#pragma once
/// The activation masker the engine calls before each projection: one MaskParams (rule,
/// threshold, target, clip margin) and optional score weights per layer × projection, and the
/// realised-sparsity statistics of every masked row.
#include "core/error.hpp"
#include "engine/hooks.hpp"
#include "kernels/mask.hpp"
#include "kernels/views.hpp"
#include "model/weights.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace sparsim::sparsity {

/// Realised sparsity of one layer × projection over the masked tokens.
struct ProjStats {
  static constexpr int kBins = 100;  ///< histogram of per-token sparsity over [0, 1]
  std::uint64_t tokens = 0;
  double sum = 0;  ///< Σ per-token sparsity
  double min = 1, max = 0;
  std::uint64_t kept = 0, total = 0;  ///< Σ kept entries, Σ entries
  std::array<std::uint64_t, kBins> hist{};

  void add(int kept_entries, int d) {
    const double s = 1.0 - static_cast<double>(kept_entries) / d;
    ++tokens;
    sum += s;
    min = std::min(min, s);
    max = std::max(max, s);
    kept += static_cast<std::uint64_t>(kept_entries);
    total += static_cast<std::uint64_t>(d);
    ++hist[std::min(kBins - 1, static_cast<int>(s * kBins))];
  }
  double mean() const { return tokens ? sum / static_cast<double>(tokens) : 0.0; }
};

/// Everything an ActivationMasker has counted, as plain host data (for checkpoints).
struct MaskerStats {
  std::vector<std::array<ProjStats, kNumProj>> stats;  ///< [layer][projection]
  std::vector<double> token_sparsity;
};

/// Which projections WINA scores with column norms: k and gate (WINA's reference choice), or
/// all of them.
inline bool wina_uses_norms(Proj p, bool all) {
  return all || p == Proj::K || p == Proj::Gate;
}

/// Column norms ‖W_:,j‖₂ of a projection (WINA's score weights), summed in double in a fixed
/// order.
template <class E>
Vec<E> column_norms(const E& exec, const Matrix<E>& w) {
  Vec<E> out("sparsim::wina::column_norms", w.cols);
  const int rows = w.rows;
  auto run = [&](const auto& m) {
    Kokkos::parallel_for(
        "sparsim::sparsity::column_norms", Kokkos::RangePolicy<E>(exec, 0, w.cols),
        KOKKOS_LAMBDA(const int j) {
          double acc = 0;
          for (int o = 0; o < rows; ++o) {
            const double v = to_f32(m(o, j));
            acc += v * v;
          }
          out(j) = static_cast<float>(kx::sqrt(acc));
        });
  };
  if (w.dtype == DType::F32)
    run(w.f32);
  else if (w.dtype == DType::BF16)
    run(w.bf16);
  else
    run(w.f16);
  exec.fence();
  return out;
}

template <class E>
class ActivationMasker final : public ProjectionMasker<E> {
 public:
  explicit ActivationMasker(int n_layer)
      : params_(static_cast<std::size_t>(n_layer)),
        norms_(static_cast<std::size_t>(n_layer)),
        stats_(static_cast<std::size_t>(n_layer)) {}

  int n_layer() const { return static_cast<int>(params_.size()); }
  /// `weight`: what one input entry of this projection costs (its output width), `d_in` its
  /// input width. With both given for every projection, the per-token sparsity is FLOP-weighted
  /// over all projections of the model, unmasked ones counting as dense; otherwise over the
  /// masked projections only.
  void set(int layer, Proj p, const MaskParams& prm, const CVec<E>& norms = CVec<E>(),
           double weight = 1.0, int d_in = 0) {
    params_.at(static_cast<std::size_t>(layer))[idx(p)] = prm;
    norms_.at(static_cast<std::size_t>(layer))[idx(p)] = norms;
    weight_.resize(params_.size() * kNumProj, 1.0);
    cost_.resize(params_.size() * kNumProj, 0.0);
    const std::size_t i = static_cast<std::size_t>(layer) * kNumProj + idx(p);
    weight_[i] = weight;
    cost_[i] = weight * d_in;
  }
  const MaskParams& params(int layer, Proj p) const {
    return params_[static_cast<std::size_t>(layer)][idx(p)];
  }
  const CVec<E>& norms(int layer, Proj p) const {
    return norms_[static_cast<std::size_t>(layer)][idx(p)];
  }

  bool active(int layer, Proj p) const override { return params(layer, p).rule != MaskRule::None; }

  CMat<E> apply(const E& exec, int layer, Proj p, const CMat<E>& x, const SparseRows<E>& rows,
                long long& kept_sum) override {
    const int n = static_cast<int>(x.extent(0)), d = static_cast<int>(x.extent(1));
    if (static_cast<std::size_t>(n) * d > buf_.extent(0))
      buf_ = Vec<E>(Kokkos::view_alloc("sparsim::masker::out", Kokkos::WithoutInitializing),
                    static_cast<std::size_t>(n) * d);
    if (static_cast<int>(kept_.extent(0)) < n) kept_ = IVec<E>("sparsim::masker::kept", n);
    const Mat<E> y(buf_.data(), n, d);
    const IVec<E> kept(kept_.data(), n);
    mask_rows(exec, x, norms(layer, p), rows.flags, params(layer, p), y, kept);
    auto hk = Kokkos::create_mirror_view(kept);
    auto hf = Kokkos::create_mirror_view(rows.flags);
    Kokkos::deep_copy(exec, hk, kept);
    Kokkos::deep_copy(exec, hf, rows.flags);
    exec.fence();
    ProjStats& st = stats_[static_cast<std::size_t>(layer)][idx(p)];
    kept_sum = 0;
    for (int r = 0; r < n; ++r) {
      if (!hf(r)) continue;
      kept_sum += hk(r);
      st.add(hk(r), d);
      if (static_cast<std::size_t>(r) < row_kept_.size()) {
        row_kept_[static_cast<std::size_t>(r)] += wt(layer, p) * hk(r);
        row_total_[static_cast<std::size_t>(r)] += wt(layer, p) * d;
      }
    }
    return CMat<E>(y);
  }

  int indices(const E& exec, int layer, Proj p, const CMat<E>& x, const IVec<E>& idx,
              const Vec<E>& xm) override {
    const int d = static_cast<int>(x.extent(1));
    const CVec<E> row(x.data(), d);
    const int nnz = mask_indices(exec, row, norms(layer, p), params(layer, p), idx, xm, scratch_);
    stats_[static_cast<std::size_t>(layer)][idx_of(p)].add(nnz, d);
    if (!row_kept_.empty()) {
      row_kept_[0] += wt(layer, p) * nnz;
      row_total_[0] += wt(layer, p) * d;
    }
    return nnz;
  }

  /// Statistics of every layer × projection since the last reset.
  const std::vector<std::array<ProjStats, kNumProj>>& all_stats() const { return stats_; }
  /// Statistics per layer × projection since the last reset.
  const ProjStats& stats(int layer, Proj p) const {
    return stats_[static_cast<std::size_t>(layer)][idx(p)];
  }
  /// Per-token sparsity over all masked projections of all layers, FLOP-weighted (skipped /
  /// masked multiply-adds), one entry per masked token, in the order the tokens were processed.
  const std::vector<double>& token_sparsity() {
    flush();
    return token_sparsity_;
  }
  /// The statistics so far; restore(snapshot()) continues exactly where the snapshot was taken.
  MaskerStats snapshot() {
    flush();
    return {stats_, token_sparsity_};
  }
  void restore(const MaskerStats& s) {
    require(s.stats.size() == stats_.size(), "masker statistics for {} layers, the model has {}",
            s.stats.size(), stats_.size());
    stats_ = s.stats;
    token_sparsity_ = s.token_sparsity;
    row_kept_.clear();
    row_total_.clear();
  }
  void reset_stats() {
    for (auto& l : stats_) l.fill(ProjStats{});
    token_sparsity_.clear();
    row_kept_.clear();
    row_total_.clear();
  }

  void begin_call(int n) override {
    flush();
    row_kept_.assign(static_cast<std::size_t>(n), 0);
    row_total_.assign(static_cast<std::size_t>(n), 0);
  }

 private:
  static std::size_t idx(Proj p) { return static_cast<std::size_t>(p); }
  static std::size_t idx_of(Proj p) { return idx(p); }
  double wt(int layer, Proj p) const {
    const std::size_t i = static_cast<std::size_t>(layer) * kNumProj + idx(p);
    return i < weight_.size() ? weight_[i] : 1.0;
  }
  void flush() {
    double all = 0;
    bool complete = !cost_.empty();
    for (double c : cost_) {
      all += c;
      complete = complete && c > 0;
    }
    for (std::size_t r = 0; r < row_total_.size(); ++r)
      if (row_total_[r] > 0)
        token_sparsity_.push_back(complete ? (row_total_[r] - row_kept_[r]) / all
                                           : 1.0 - row_kept_[r] / row_total_[r]);
    row_kept_.clear();
    row_total_.clear();
  }

  std::vector<std::array<MaskParams, kNumProj>> params_;
  std::vector<std::array<CVec<E>, kNumProj>> norms_;
  std::vector<std::array<ProjStats, kNumProj>> stats_;
  Vec<E> buf_;
  IVec<E> kept_;
  MaskScratch<E> scratch_;
  std::vector<double> weight_, cost_;
  std::vector<double> row_kept_, row_total_;
  std::vector<double> token_sparsity_;
};

}  // namespace sparsim::sparsity
