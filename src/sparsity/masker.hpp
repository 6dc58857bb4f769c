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
#include <utility>
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

namespace detail {
template <class E, class M>
void column_norms_into(const E& exec, const M& m, int rows, const Vec<E>& out) {
  Kokkos::parallel_for(
      "sparsim::sparsity::column_norms",
      light(Kokkos::RangePolicy<E>(exec, 0, static_cast<int>(m.extent(1)))), KOKKOS_LAMBDA(const int j) {
        double acc = 0;
        for (int o = 0; o < rows; ++o) {
          const double v = to_f32(m(o, j));
          acc += v * v;
        }
        out(j) = static_cast<float>(kx::sqrt(acc));
      });
}
}  // namespace detail

/// Column norms ‖W_:,j‖₂ of a projection (WINA's score weights), summed in double in a fixed
/// order.
template <class E>
Vec<E> column_norms(const E& exec, const Matrix<E>& w) {
  Vec<E> out("sparsim::wina::column_norms", w.cols);
  if (w.dtype == DType::F32)
    detail::column_norms_into(exec, w.f32, w.rows, out);
  else if (w.dtype == DType::BF16)
    detail::column_norms_into(exec, w.bf16, w.rows, out);
  else
    detail::column_norms_into(exec, w.f16, w.rows, out);
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

  void begin_call(int n) override {
    flush();
    row_kept_.assign(static_cast<std::size_t>(n), 0);
    row_total_.assign(static_cast<std::size_t>(n), 0);
    calls_.clear();
    used_ = 0;
    // room for every projection of every layer of this call: allocated here, never mid-call
    const std::size_t need = static_cast<std::size_t>(n_layer()) * kNumProj * (n > 0 ? n : 1);
    if (log_.extent(0) < need) {
      log_ = IVec<E>("sparsim::masker::kept_log", need);
      log_host_ = Kokkos::create_mirror_view(log_);
    }
  }

  CMat<E> apply(const E& exec, int layer, Proj p, const CMat<E>& x, const SparseRows<E>& rows,
                int& ticket) override {
    const int n = static_cast<int>(x.extent(0)), d = static_cast<int>(x.extent(1));
    if (static_cast<std::size_t>(n) * d > buf_.extent(0))
      buf_ = Vec<E>(Kokkos::view_alloc("sparsim::masker::out", Kokkos::WithoutInitializing),
                    static_cast<std::size_t>(n) * d);
    const Mat<E> y(buf_.data(), n, d);
    const IVec<E> kept = slots(n);
    mask_rows(exec, x, norms(layer, p), rows.flags, params(layer, p), y, kept);
    ticket = record(layer, p, d, n, rows);
    return CMat<E>(y);
  }

  IVec<E> indices(const E& exec, int layer, Proj p, const CMat<E>& x, const IVec<E>& idx,
                  const Vec<E>& xm, int& ticket) override {
    const int d = static_cast<int>(x.extent(1));
    const CVec<E> row(x.data(), d);
    const IVec<E> count = slots(1);
    mask_indices_to(exec, row, norms(layer, p), params(layer, p), idx, xm, count, scratch_);
    ticket = record(layer, p, d, 1, SparseRows<E>());
    return count;
  }

  bool threshold_slot(int layer, Proj p, int d, float& tau, IVec<E>& count, int& ticket) override {
    const MaskParams& prm = params(layer, p);
    if (prm.rule != MaskRule::Threshold || norms(layer, p).extent(0) != 0) return false;
    tau = prm.tau;
    count = slots(1);
    ticket = record(layer, p, d, 1, SparseRows<E>());
    return true;
  }

  void end_call(const E& exec) override {
    if (calls_.empty()) return;
    if constexpr (!Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                              typename E::memory_space>::accessible) {
      Kokkos::deep_copy(exec, Kokkos::subview(log_host_, std::make_pair(std::size_t{0}, used_)),
                        Kokkos::subview(log_, std::make_pair(std::size_t{0}, used_)));
    }
    exec.fence();
    for (Call& c : calls_) {
      if (c.done) continue;
      c.done = true;
      ProjStats& st = stats_[static_cast<std::size_t>(c.layer)][idx(c.proj)];
      long long sum = 0;
      for (int r = 0; r < c.n; ++r) {
        if (!c.all_rows && !c.flags[static_cast<std::size_t>(r)]) continue;
        const int k = log_host_(c.off + static_cast<std::size_t>(r));
        sum += k;
        st.add(k, c.d);
        // per-token statistics go to the call row this row stands for (gathered rows)
        const std::size_t ro =
            c.origin.empty() ? static_cast<std::size_t>(r) : static_cast<std::size_t>(c.origin[r]);
        if (ro < row_kept_.size()) {
          row_kept_[ro] += wt(c.layer, c.proj) * k;
          row_total_[ro] += wt(c.layer, c.proj) * c.d;
        }
      }
      c.kept = sum;
    }
  }

  long long kept(int ticket) const override {
    return calls_.at(static_cast<std::size_t>(ticket)).kept;
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

 private:
  /// One masked projection call of the current forward call: where its kept counts are.
  struct Call {
    int layer = 0;
    Proj proj = Proj::Q;
    int d = 0, n = 0;
    std::size_t off = 0;
    bool all_rows = false;  ///< every row counts (the decode path), else the call's flags
    bool done = false;
    long long kept = 0;
    std::vector<int> flags;   ///< the call's sparse-row flags (when not all_rows)
    std::vector<int> origin;  ///< the call row each row stands for (empty: itself)
  };

  /// The next n slots of the kept log (grown only between calls, see begin_call).
  IVec<E> slots(int n) {
    if (used_ + static_cast<std::size_t>(n) > log_.extent(0)) {
      // a caller that skipped begin_call: keep what was logged, then grow
      end_call(E());
      IVec<E> bigger("sparsim::masker::kept_log", 2 * (used_ + static_cast<std::size_t>(n)));
      Kokkos::deep_copy(Kokkos::subview(bigger, std::make_pair(std::size_t{0}, log_.extent(0))),
                        log_);
      log_ = bigger;
      log_host_ = Kokkos::create_mirror_view(log_);
      Kokkos::deep_copy(log_host_, log_);
    }
    const IVec<E> v = Kokkos::subview(log_, std::make_pair(used_, used_ + n));
    return v;
  }
  int record(int layer, Proj p, int d, int n, const SparseRows<E>& rows) {
    Call c;
    c.layer = layer;
    c.proj = p;
    c.d = d;
    c.n = n;
    c.off = used_;
    c.all_rows = rows.flags.extent(0) == 0;
    if (!c.all_rows) {
      c.flags.resize(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r)
        c.flags[static_cast<std::size_t>(r)] =
            rows.host_flags.extent(0) > static_cast<std::size_t>(r) ? rows.host_flags(r) : 1;
      if (rows.origin) c.origin.assign(rows.origin, rows.origin + n);
    }
    used_ += static_cast<std::size_t>(n);
    calls_.push_back(c);
    return static_cast<int>(calls_.size()) - 1;
  }

  static std::size_t idx(Proj p) { return static_cast<std::size_t>(p); }
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
  IVec<E> log_;  ///< kept count of every masked row of the current call, in call order
  typename IVec<E>::HostMirror log_host_;
  std::size_t used_ = 0;
  std::vector<Call> calls_;
  MaskScratch<E> scratch_;
  std::vector<double> weight_, cost_;
  std::vector<double> row_kept_, row_total_;
  std::vector<double> token_sparsity_;
};

}  // namespace sparsim::sparsity
