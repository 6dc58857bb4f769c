#include "policies/probe_pruning.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "io/hdf5.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sparsim::pruning {

void ProbePruningOptions::validate() const {
  require_setting(std::isfinite(ratio) && ratio >= 0 && ratio < 1, "probe_pruning.ratio",
                  "Probe Pruning's ratio",
                  "must be in [0, 1) (the pruned fraction of heads and FFN channels), got {}",
                  ratio);
  require_setting(std::isfinite(probe) && probe > 0 && probe <= 1, "probe_pruning.probe",
                  "Probe Pruning's probe share",
                  "must be in (0, 1] (the probe's fraction of a batch's rows), got {}", probe);
}

int probe_rows(int n, double probe) {
  const int k = static_cast<int>(std::ceil(probe * n - 1e-9));
  return std::min(n, std::max(k, std::min(2, n)));
}

int kept_units(int units, double ratio) {
  const auto k = static_cast<int>(std::lround((1.0 - ratio) * units));
  return std::min(units, std::max(1, k));
}

std::vector<int> top_indices(const std::vector<double>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min<int>(k, static_cast<int>(v.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    const double x = v[static_cast<std::size_t>(a)], y = v[static_cast<std::size_t>(b)];
    return x > y || (x == y && a < b);
  });
  idx.resize(static_cast<std::size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

namespace {

/// Σ_r w(r, c)² of every column c of a projection, in double, from its storage type.
template <class View>
std::vector<double> column_norms2(const View& dev) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dev);
  std::vector<double> n(h.extent(1), 0.0);
  for (std::size_t r = 0; r < h.extent(0); ++r)
    for (std::size_t c = 0; c < h.extent(1); ++c) {
      const double x = to_f32(h(r, c));
      n[c] += x * x;
    }
  return n;
}

template <class E>
std::vector<double> column_norms2(const Matrix<E>& m) {
  switch (m.dtype) {
    case DType::BF16:
      return column_norms2(m.bf16);
    case DType::F16:
      return column_norms2(m.f16);
    case DType::F32:
      break;
  }
  return column_norms2(m.f32);
}

}  // namespace

template <class E>
ProbePruner<E>::ProbePruner(const ProbePruningOptions& o, const Weights<E>& w,
                            const calibration::ProbeHistory* history)
    : o_(o), history_(history) {
  o_.validate();
  const Config& c = w.cfg;
  require(!c.structured() && !c.low_rank_kv(),
          "Probe Pruning needs a dense model, not a pruned or low-rank one ({})", c.prune.method);
  if (history) history->check_covers(c.n_layer, c.q_dim(), c.d_ff);
  n_layer_ = c.n_layer;
  n_head_ = c.n_head;
  n_kv_head_ = c.n_kv_head;
  v_dim_ = c.head_dim;
  d_ff_ = c.d_ff;
  for (int l = 0; l < n_layer_; ++l) {
    const LayerWeights<E>& lw = w.layers[static_cast<std::size_t>(l)];
    o_norm2_.push_back(column_norms2(lw.wo));
    down_norm2_.push_back(column_norms2(lw.w_down));
  }
  slots_.resize(static_cast<std::size_t>(2 * n_layer_));
}

template <class E>
void ProbePruner<E>::begin_call(int n_seq, int T, int p0) {
  if (o_.ratio <= 0) return;  // no layer is active: nothing is selected or recorded
  // a decode step continues the batch whose prefill chose the masks
  select_ = T > 1 || p0 == 0 || batches_.empty();
  if (!select_) {
    ++reused_;
    return;
  }
  Batch b;
  b.n_seq = n_seq;
  b.T = T;
  b.p0 = p0;
  b.probe = probe_rows(n_seq * T, o_.probe);
  b.heads_kept.assign(static_cast<std::size_t>(n_layer_), -1);
  b.channels_kept.assign(static_cast<std::size_t>(n_layer_), -1);
  batches_.push_back(std::move(b));
}

template <class E>
void ProbePruner<E>::prune(const E& exec, int layer, Site site, const CMat<E>& resid,
                           const Mat<E>& in, PolicyCost& cost) {
  require(site == Site::O || site == Site::Down, "Probe Pruning prunes the inputs of W_o, W_down");
  Slot& s = slot(layer, site);
  const int n = static_cast<int>(in.extent(0)), width = static_cast<int>(in.extent(1));
  const int d = static_cast<int>(resid.extent(1));
  const bool attn = site == Site::O;
  require(width == (attn ? n_head_ * v_dim_ : d_ff_),
          "Probe Pruning: layer {} input of {} columns, expected {}", layer, width,
          attn ? n_head_ * v_dim_ : d_ff_);
  if (select_ || s.mask.extent(0) == 0) {
    Stopwatch sw;
    // 1. the probe: the rows with the largest residual norm
    if (norms_.extent(0) < static_cast<std::size_t>(n))
      norms_ = Kokkos::View<double*, DeviceOf<E>>(
          Kokkos::view_alloc(std::string("sparsim::pp::row_norms"), Kokkos::WithoutInitializing),
          n);
    const Kokkos::View<double*, DeviceOf<E>> norms(norms_.data(), n);
    Kokkos::parallel_for(
        "sparsim::pp::row_norms", Kokkos::RangePolicy<E>(exec, 0, n), KOKKOS_LAMBDA(const int r) {
          double a = 0;
          for (int j = 0; j < d; ++j) a += static_cast<double>(resid(r, j)) * resid(r, j);
          norms(r) = a;
        });
    auto hn = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), norms);
    const int k = probe_rows(n, o_.probe);
    s.rows = top_indices(std::vector<double>(hn.data(), hn.data() + n), k);
    // 2. the probe's states: mean of x_j² over the probe rows
    if (rows_.extent(0) < static_cast<std::size_t>(k))
      rows_ = IVec<E>("sparsim::pp::probe_rows", k);
    const IVec<E> rows(rows_.data(), k);
    {
      auto hr = Kokkos::create_mirror_view(rows);
      for (int i = 0; i < k; ++i) hr(i) = s.rows[static_cast<std::size_t>(i)];
      Kokkos::deep_copy(exec, rows, hr);
    }
    if (!history_) {
      if (stat_.extent(0) < static_cast<std::size_t>(width))
        stat_ = Kokkos::View<double*, DeviceOf<E>>("sparsim::pp::stat", width);
      const Kokkos::View<double*, DeviceOf<E>> stat(stat_.data(), width);
      Kokkos::parallel_for(
          "sparsim::pp::probe_stat", Kokkos::RangePolicy<E>(exec, 0, width),
          KOKKOS_LAMBDA(const int j) {
            double a = 0;
            for (int i = 0; i < k; ++i) {
              const double x = in(rows(i), j);
              a += x * x;
            }
            stat(j) = a / k;
          });
      auto hs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), stat);
      s.stat.assign(hs.data(), hs.data() + width);
    } else {
      s.stat = fused_stat(exec, layer, site == Site::Down, in, rows, s.rows, width);
      cost.flops += 8.0 * k * width;  // the fusion: at most one position per probe row
      cost.bytes += 8.0 * k * width + 4.0 * k * width;
    }
    // 3. PPsp scores and the kept units
    const std::vector<double>& wn =
        (attn ? o_norm2_ : down_norm2_)[static_cast<std::size_t>(layer)];
    s.scores.resize(static_cast<std::size_t>(width));
    for (int j = 0; j < width; ++j)
      s.scores[static_cast<std::size_t>(j)] =
          wn[static_cast<std::size_t>(j)] * s.stat[static_cast<std::size_t>(j)];
    const int cols_per_unit = attn ? (n_head_ / n_kv_head_) * v_dim_ : 1;
    const int units = width / cols_per_unit;
    s.unit_scores.assign(static_cast<std::size_t>(units), 0.0);
    for (int j = 0; j < width; ++j)
      s.unit_scores[static_cast<std::size_t>(j / cols_per_unit)] +=
          s.scores[static_cast<std::size_t>(j)];
    s.kept = top_indices(s.unit_scores, kept_units(units, o_.ratio));
    s.any_pruned = static_cast<int>(s.kept.size()) < units;
    if (s.mask.extent(0) != static_cast<std::size_t>(width))
      s.mask = IVec<E>("sparsim::pp::mask", width);
    auto hm = Kokkos::create_mirror_view(s.mask);
    for (int j = 0; j < width; ++j) hm(j) = 0;
    for (int u : s.kept)
      for (int j = u * cols_per_unit; j < (u + 1) * cols_per_unit; ++j) hm(j) = 1;
    Kokkos::deep_copy(exec, s.mask, hm);
    Batch& b = batches_.back();
    (attn ? b.heads_kept : b.channels_kept)[static_cast<std::size_t>(layer)] =
        static_cast<int>(s.kept.size());
    cost.flops += 2.0 * n * d + 2.0 * k * width + 2.0 * width;
    cost.bytes += 4.0 * n * d + 4.0 * k * width + 8.0 * width;
    exec.fence();
    select_seconds_ += sw.seconds();
  }
  // 4. the call runs with the pruned columns zeroed (the kept ones untouched)
  if (!s.any_pruned) return;
  const IVec<E> mask = s.mask;
  Kokkos::parallel_for(
      "sparsim::pp::zero_pruned",
      Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, width}),
      KOKKOS_LAMBDA(const int r, const int j) {
        if (!mask(j)) in(r, j) = 0.0f;
      });
  cost.bytes += 4.0 * n * width;
}

template <class E>
std::vector<double> ProbePruner<E>::fused_stat(const E& exec, int layer, bool down_site,
                                               const Mat<E>& in, const IVec<E>& rows,
                                               const std::vector<int>& h_rows, int width) {
  // the probe rows' squares, on the host
  const int k = static_cast<int>(h_rows.size());
  const std::size_t need = static_cast<std::size_t>(k) * width;
  if (sq_.extent(0) < need)
    sq_ = Kokkos::View<double*, DeviceOf<E>>(
        Kokkos::view_alloc(std::string("sparsim::pp::probe_squares"), Kokkos::WithoutInitializing),
        need);
  const Kokkos::View<double**, Layout, DeviceOf<E>> sq(sq_.data(), k, width);
  Kokkos::parallel_for(
      "sparsim::pp::probe_squares",
      Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {k, width}),
      KOKKOS_LAMBDA(const int i, const int j) {
        const double x = in(rows(i), j);
        sq(i, j) = x * x;
      });
  auto hq = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sq);
  // the probe rows grouped by position (positions ascending, rows ascending within one); per
  // position their mean square fused with the history's, summed over the positions in order
  const Batch& b = batches_.back();
  std::vector<std::vector<int>> at;  // probe row indices i, grouped by position
  std::vector<int> pos;
  for (int i = 0; i < k; ++i) {
    const int t = b.p0 + h_rows[static_cast<std::size_t>(i)] % b.T;
    auto it = std::lower_bound(pos.begin(), pos.end(), t);
    const auto g = static_cast<std::size_t>(it - pos.begin());
    if (it == pos.end() || *it != t) {
      pos.insert(it, t);
      at.insert(at.begin() + static_cast<std::ptrdiff_t>(g), std::vector<int>{});
    }
    at[g].push_back(i);
  }
  std::vector<double> stat(static_cast<std::size_t>(width), 0.0);
  for (std::size_t g = 0; g < pos.size(); ++g) {
    // positions the history does not cover count as a history of 0 (the probe's own value)
    const float* h = pos[g] < history_->tokens ? history_->row(layer, down_site, pos[g]) : nullptr;
    const double n = static_cast<double>(at[g].size());
    for (int j = 0; j < width; ++j) {
      double p = 0;
      for (int i : at[g]) p += hq(i, j);
      stat[static_cast<std::size_t>(j)] +=
          calibration::fuse_probe_history(p / n, h ? static_cast<double>(h[j]) : 0.0);
    }
  }
  return stat;
}

template <class E>
double ProbePruner<E>::head_ratio(int layer) const {
  double kept = 0, n = 0;
  for (const Batch& b : batches_)
    if (b.heads_kept[static_cast<std::size_t>(layer)] >= 0) {
      kept += b.heads_kept[static_cast<std::size_t>(layer)];
      n += n_kv_head_;
    }
  return n > 0 ? 1.0 - kept / n : 0.0;
}

template <class E>
double ProbePruner<E>::channel_ratio(int layer) const {
  double kept = 0, n = 0;
  for (const Batch& b : batches_)
    if (b.channels_kept[static_cast<std::size_t>(layer)] >= 0) {
      kept += b.channels_kept[static_cast<std::size_t>(layer)];
      n += d_ff_;
    }
  return n > 0 ? 1.0 - kept / n : 0.0;
}

template <class E>
double ProbePruner<E>::head_ratio() const {
  double sum = 0;
  for (int l = 0; l < n_layer_; ++l) sum += head_ratio(l);
  return n_layer_ > 0 ? sum / n_layer_ : 0.0;
}

template <class E>
double ProbePruner<E>::channel_ratio() const {
  double sum = 0;
  for (int l = 0; l < n_layer_; ++l) sum += channel_ratio(l);
  return n_layer_ > 0 ? sum / n_layer_ : 0.0;
}

template <class E>
std::string ProbePruner<E>::history_description() const {
  if (!history_) return "none (probe-only statistics)";
  return fmt::format(
      "calibration: mean x^2 per position over {} sequences of {} tokens, fused per position "
      "and channel by the dynamic ratio",
      history_->sequences, history_->tokens);
}

template <class E>
void ProbePruner<E>::write(io::Group& g) const {
  g.set_attr("ratio", o_.ratio);
  g.set_attr("probe", o_.probe);
  g.set_attr("units_per_layer", n_kv_head_);
  g.set_attr("d_ff", d_ff_);
  g.set_attr("history", history_description());
  g.set_attr("reused_calls", static_cast<std::int64_t>(reused_));
  const auto nb = static_cast<hsize_t>(batches_.size());
  std::vector<std::int32_t> heads, channels, probe;
  for (const Batch& b : batches_) {
    heads.insert(heads.end(), b.heads_kept.begin(), b.heads_kept.end());
    channels.insert(channels.end(), b.channels_kept.begin(), b.channels_kept.end());
    probe.push_back(b.probe);
  }
  if (nb == 0) return;
  const std::vector<hsize_t> dims = {nb, static_cast<hsize_t>(n_layer_)};
  g.write<std::int32_t>(
      "heads_kept", heads.data(), dims,
      {"", "attention units (KV groups) kept per batch and layer [batch][layer]"});
  g.write<std::int32_t>("channels_kept", channels.data(), dims,
                        {"", "FFN channels kept per batch and layer [batch][layer]"});
  g.write<std::int32_t>("probe_rows", probe.data(), {nb}, {"", "probe rows of each batch"});
  std::vector<double> hr, cr;
  for (int l = 0; l < n_layer_; ++l) {
    hr.push_back(head_ratio(l));
    cr.push_back(channel_ratio(l));
  }
  g.write<double>("head_ratio", hr, {"1", "realised pruned fraction of attention units [layer]"});
  g.write<double>("channel_ratio", cr, {"1", "realised pruned fraction of FFN channels [layer]"});
}

template <class E>
calibration::ProbeHistory collect_probe_history(std::shared_ptr<const Weights<E>> w,
                                                const std::vector<std::vector<int>>& seqs,
                                                int batch,
                                                const std::function<void(int, int)>& progress) {
  const Config& c = w->cfg;
  require(!seqs.empty() && batch >= 1, "Probe Pruning history: {} sequences, batch {}", seqs.size(),
          batch);
  const int T = static_cast<int>(seqs.front().size());
  for (const auto& s : seqs)
    require(static_cast<int>(s.size()) == T && T >= 1 && T <= c.context_length,
            "Probe Pruning history: sequences of {} and {} tokens (one length, at most the "
            "model's context of {})",
            T, s.size(), c.context_length);
  require(!c.structured() && !c.low_rank_kv(),
          "Probe Pruning history needs the dense model, not a pruned or low-rank one ({})",
          c.prune.method);
  const int L = c.n_layer, wo = c.q_dim(), wd = c.d_ff;
  using Acc = Kokkos::View<double***, Layout, DeviceOf<E>>;
  const Acc acc_o("sparsim::pp::history_o", L, T, wo), acc_d("sparsim::pp::history_down", L, T, wd);
  const E exec;
  const int B = std::min<int>(batch, static_cast<int>(seqs.size()));
  Engine<E> eng(w, B, T, nullptr, exec);
  int n_seq = 0;
  eng.set_observer([&](int l, Site site, const CMat<E>& x) {
    if (site != Site::O && site != Site::Down) return;
    const Acc acc = site == Site::O ? acc_o : acc_d;
    const int width = static_cast<int>(x.extent(1)), ns = n_seq;
    Kokkos::parallel_for(
        "sparsim::pp::history_add",
        Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {T, width}),
        KOKKOS_LAMBDA(const int t, const int j) {
          double a = acc(l, t, j);
          for (int s = 0; s < ns; ++s) {
            const double v = x(s * T + t, j);
            a += v * v;
          }
          acc(l, t, j) = a;
        });
  });
  const int total = static_cast<int>(seqs.size());
  for (int i = 0; i < total; i += B) {
    n_seq = std::min(B, total - i);
    eng.forward(std::vector<std::vector<int>>(seqs.begin() + i, seqs.begin() + i + n_seq), 0,
                false);
    if (progress) progress(i + n_seq, total);
  }
  exec.fence();
  calibration::ProbeHistory h;
  h.sequences = total;
  h.tokens = T;
  h.n_layer = L;
  h.o_width = wo;
  h.down_width = wd;
  for (const auto& [acc, out] : {std::pair<Acc, std::vector<float>*>{acc_o, &h.o},
                                 std::pair<Acc, std::vector<float>*>{acc_d, &h.down}}) {
    auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), acc);
    out->resize(ha.size());
    std::size_t i = 0;
    for (int l = 0; l < L; ++l)
      for (int t = 0; t < T; ++t)
        for (std::size_t j = 0; j < ha.extent(2); ++j)
          (*out)[i++] = static_cast<float>(ha(l, t, j) / total);
  }
  h.validate();
  return h;
}

#define SPARSIM_INSTANTIATE_PROBE_PRUNER(E)                                         \
  template class ProbePruner<E>;                                                    \
  template calibration::ProbeHistory collect_probe_history<E>(                      \
      std::shared_ptr<const Weights<E>>, const std::vector<std::vector<int>>&, int, \
      const std::function<void(int, int)>&);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_PROBE_PRUNER)

}  // namespace sparsim::pruning
