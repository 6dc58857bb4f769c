#include "policies/k_channel_selector.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "io/hdf5.hpp"

#include <algorithm>
#include <string>

namespace sparsim::pruning {

template <class E>
KvChannelPruner<E>::KvChannelPruner(const KvPruneOptions& opt, int n_layer, int n_kv_head,
                                    int qk_dim, int max_seqs, int trace_sequences)
    : opt_(opt),
      n_layer_(n_layer),
      nkv_(n_kv_head),
      d_(qk_dim),
      max_seqs_(max_seqs),
      trace_(trace_sequences) {
  opt_.validate(qk_dim);
  require(n_layer >= 1 && n_kv_head >= 1 && max_seqs >= 1 && trace_sequences >= 0,
          "K-channel pruning: {} layers, {} KV heads, {} sequences", n_layer, n_kv_head, max_seqs);
  gq_ = Kokkos::View<double****, Layout, DeviceOf<E>>("sparsim::kv_prune::gram_q", max_seqs,
                                                      n_kv_head, qk_dim, qk_dim);
  gk_ = Kokkos::View<double****, Layout, DeviceOf<E>>("sparsim::kv_prune::gram_k", max_seqs,
                                                      n_kv_head, qk_dim, qk_dim);
  reset_stats();
}

template <class E>
void KvChannelPruner<E>::reset_stats() {
  rec_.assign(static_cast<std::size_t>(n_layer_ * nkv_), HeadRecord{});
  for (auto& r : rec_) r.kept_count.assign(static_cast<std::size_t>(d_), 0);
  trace_masks_.clear();
  sequences_started_ = 0;
  calls_ = 0;
  gram_s_ = select_s_ = 0;
}

template <class E>
KeptChannels KvChannelPruner<E>::select(const E& exec, int layer, const KVLayer<E>& cache,
                                        const AttnShape& sh, const CMat<E>& q_obs, int n_seq,
                                        int T) {
  require(T >= opt_.window,
          "K-channel pruning: the observation window of {} queries is longer than "
          "the prompt of {} tokens",
          opt_.window, T);
  require(sh.n_kv_head == nkv_ && sh.qk_dim == d_ && n_seq <= max_seqs_ && layer >= 0 &&
              layer < n_layer_ && !cache.compacted(),
          "K-channel pruning: layer {} does not match the selector ({} KV heads of width {})",
          layer, nkv_, d_);
  const int d = d_, nkv = nkv_, group = sh.group(), w = opt_.window;
  require(static_cast<int>(q_obs.extent(0)) == n_seq * w &&
              static_cast<int>(q_obs.extent(1)) == sh.q_width(),
          "K-channel pruning: {}×{} observed queries, expected {}×{}", q_obs.extent(0),
          q_obs.extent(1), n_seq * w, sh.q_width());
  const auto K = cache.k;
  const bool drops = cache.has_drops();
  const auto dropped = cache.dropped;
  const bool evicts = cache.has_evictions();  // a token evictor ran first: its kept tokens only
  const auto evicted = cache.evicted;
  const auto gq = gq_;
  const auto gk = gk_;
  exec.fence();
  Stopwatch sw;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    // One Gram row (s, h, i) per work item; positions in order, the row's d sums side by side.
    Kokkos::parallel_for("sparsim::pruning::gram_rows_host",
                         Kokkos::RangePolicy<E>(exec, 0, n_seq * nkv * d), [=](const int item) {
                           const int s = item / (nkv * d), h = (item / d) % nkv, i = item % d;
                           double* rk = &gk(s, h, i, 0);
                           double* rq = &gq(s, h, i, 0);
                           for (int j = 0; j < d; ++j) rk[j] = rq[j] = 0.0;
                           for (int p = 0; p < T; ++p) {
                             if ((drops && dropped(s, p)) || (evicts && evicted(s, h, p))) continue;
                             const float* kr = &K(s, p, h * d);
                             const double a = kr[i];
                             for (int j = 0; j < d; ++j) rk[j] += a * static_cast<double>(kr[j]);
                           }
                           for (int m = 0; m < group; ++m)
                             for (int r = 0; r < w; ++r) {
                               const float* qr = &q_obs(s * w + r, (h * group + m) * d);
                               const double a = qr[i];
                               for (int j = 0; j < d; ++j) rq[j] += a * static_cast<double>(qr[j]);
                             }
                         });
  } else {
    Kokkos::parallel_for(
        "sparsim::pruning::gram",
        Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n_seq * nkv * d, d}),
        KOKKOS_LAMBDA(const int item, const int j) {
          const int s = item / (nkv * d), h = (item / d) % nkv, i = item % d;
          double ak = 0.0, aq = 0.0;
          for (int p = 0; p < T; ++p)
            if (!(drops && dropped(s, p)) && !(evicts && evicted(s, h, p)))
              ak += static_cast<double>(K(s, p, h * d + i)) * K(s, p, h * d + j);
          for (int m = 0; m < group; ++m)
            for (int r = 0; r < w; ++r)
              aq += static_cast<double>(q_obs(s * w + r, (h * group + m) * d + i)) *
                    q_obs(s * w + r, (h * group + m) * d + j);
          gk(s, h, i, j) = ak;
          gq(s, h, i, j) = aq;
        });
  }
  auto hq = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gq_);
  auto hk = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gk_);
  gram_s_ += sw.seconds();
  sw.reset();

  if (layer == 0) sequences_started_ += n_seq;
  const int first_seq = sequences_started_ - n_seq;  // index of sequence 0 of this call
  ++calls_;
  KeptChannels out;
  out.positions = T;
  out.idx.resize(static_cast<std::size_t>(n_seq));
  HeadGram g;
  g.d = d;
  const std::size_t dd = static_cast<std::size_t>(d) * d;
  g.gq.resize(dd);
  g.gk.resize(dd);
  for (int s = 0; s < n_seq; ++s) {
    const int traced = first_seq + s;
    if (traced < trace_ && static_cast<int>(trace_masks_.size()) <= traced)
      trace_masks_.resize(static_cast<std::size_t>(traced + 1),
                          std::vector<std::uint8_t>(static_cast<std::size_t>(n_layer_) * nkv * d));
    for (int h = 0; h < nkv; ++h) {
      std::copy(&hq(s, h, 0, 0), &hq(s, h, 0, 0) + dd, g.gq.begin());
      std::copy(&hk(s, h, 0, 0), &hk(s, h, 0, 0) + dd, g.gk.begin());
      const HeadChoice c = choose_channels(g, opt_);
      HeadRecord& r = rec_[static_cast<std::size_t>(layer * nkv + h)];
      ++r.selections;
      r.rel_think += c.rel(c.err_think);
      r.rel_mies += c.rel(c.err_mies);
      r.rel_grace += c.rel(c.err_grace);
      r.protected_share += static_cast<double>(c.protected_count) / d;
      r.salient_share += static_cast<double>(c.salient) / d;
      r.guard_used += c.guard_used ? 1 : 0;
      r.grace_worse += c.err_grace > c.err_think ? 1 : 0;
      r.kept += c.kept.size();
      for (int ch : c.kept) ++r.kept_count[static_cast<std::size_t>(ch)];
      if (traced < trace_)
        for (int ch : c.kept)
          trace_masks_[static_cast<std::size_t>(traced)]
                      [(static_cast<std::size_t>(layer) * nkv + h) * d + ch] = 1;
      out.idx[static_cast<std::size_t>(s)].push_back(c.kept);
    }
  }
  select_s_ += sw.seconds();
  // Own cost: the Grams (K: T positions, Q: w rows of each of the group's heads), then the
  // selection (ThinK, protection, MIES with its O(d) update per step, the objective checks).
  const double heads = static_cast<double>(n_seq) * nkv;
  out.flops = heads * (2.0 * d * d * (T + static_cast<double>(w) * group) + 8.0 * d * d);
  out.bytes =
      4.0 * n_seq * (static_cast<double>(T) * nkv * d + static_cast<double>(w) * sh.q_width()) +
      heads * 2.0 * 8.0 * d * d;
  // ThinK's recent window: the last `recent` prompt keys keep their full width.
  out.positions = T - std::min(opt_.recent, T);
  if (prune_count(opt_.lambda, d) == 0 || out.positions < 1) {  // the cache stays dense
    KeptChannels none;
    return none;
  }
  return out;
}

template <class E>
double KvChannelPruner<E>::rel_error_mean(KvMethod m) const {
  double s = 0;
  std::uint64_t n = 0;
  for (const auto& r : rec_) {
    s += m == KvMethod::Think ? r.rel_think : r.rel_grace;
    n += r.selections;
  }
  return n ? s / static_cast<double>(n) : 0.0;
}

template <class E>
double KvChannelPruner<E>::rel_error_mies_mean() const {
  double s = 0;
  std::uint64_t n = 0;
  for (const auto& r : rec_) {
    s += r.rel_mies;
    n += r.selections;
  }
  return n ? s / static_cast<double>(n) : 0.0;
}

template <class E>
double KvChannelPruner<E>::protected_share_mean() const {
  double s = 0;
  std::uint64_t n = 0;
  for (const auto& r : rec_) {
    s += r.protected_share;
    n += r.selections;
  }
  return n ? s / static_cast<double>(n) : 0.0;
}

template <class E>
std::uint64_t KvChannelPruner<E>::selections() const {
  std::uint64_t n = 0;
  for (const auto& r : rec_) n += r.selections;
  return n;
}

template <class E>
std::uint64_t KvChannelPruner<E>::guard_used() const {
  std::uint64_t n = 0;
  for (const auto& r : rec_) n += r.guard_used;
  return n;
}

template <class E>
std::uint64_t KvChannelPruner<E>::grace_worse() const {
  std::uint64_t n = 0;
  for (const auto& r : rec_) n += r.grace_worse;
  return n;
}

template <class E>
void KvChannelPruner<E>::write(io::Group& g) const {
  g.set_attr("method", to_string(opt_.method));
  g.set_attr("lambda", opt_.lambda);
  g.set_attr("window", opt_.window);
  g.set_attr("protect_lo", opt_.protect_lo);
  g.set_attr("protect_hi", opt_.protect_hi);
  g.set_attr("guard", opt_.guard ? 1 : 0);
  g.set_attr("recent", opt_.recent);
  g.set_attr("head_dim", d_);
  g.set_attr("pruned_per_head", prune_count(opt_.lambda, d_));
  g.set_attr("selections", static_cast<std::int64_t>(selections()));
  g.set_attr("recon_error_mean", recon_error_mean());
  g.set_attr("protected_share_mean", protected_share_mean());
  g.set_attr("gram_seconds", gram_s_);
  g.set_attr("select_seconds", select_s_);
  const std::vector<hsize_t> dims = {static_cast<hsize_t>(n_layer_), static_cast<hsize_t>(nkv_)};
  std::vector<double> think, mies_e, grace, prot, sal, kept;
  std::vector<std::uint64_t> sel, guard, worse, freq;
  for (const auto& r : rec_) {
    const double n = r.selections ? static_cast<double>(r.selections) : 1.0;
    think.push_back(r.rel_think / n);
    mies_e.push_back(r.rel_mies / n);
    grace.push_back(r.rel_grace / n);
    prot.push_back(r.protected_share / n);
    sal.push_back(r.salient_share / n);
    kept.push_back(static_cast<double>(r.kept) / n);
    sel.push_back(r.selections);
    guard.push_back(r.guard_used);
    worse.push_back(r.grace_worse);
    freq.insert(freq.end(), r.kept_count.begin(), r.kept_count.end());
  }
  g.write<double>("recon_error_think", think.data(), dims,
                  {"1", "mean ||Q_P K_P^T||_F / ||Q K^T||_F of ThinK's choice [layer][kv head]"});
  g.write<double>("recon_error_mies", mies_e.data(), dims,
                  {"1", "the same for MIES on GRACE's candidates, before the guard"});
  g.write<double>("recon_error_grace", grace.data(), dims,
                  {"1", "the same for GRACE's choice (protection, MIES, guard)"});
  g.write<double>("protected_share", prot.data(), dims,
                  {"1", "mean share of channels GRACE protects [layer][kv head]"});
  g.write<double>("salient_share", sal.data(), dims,
                  {"1", "mean share of channels with ||k_i|| > mean + std, before clamping"});
  g.write<double>("kept_channels", kept.data(), dims,
                  {"channel", "mean key channels the method kept [layer][kv head]"});
  g.write<std::uint64_t>("selections", sel.data(), dims,
                         {"", "selections made (sequences x prefills) [layer][kv head]"});
  g.write<std::uint64_t>("guard_used", guard.data(), dims,
                         {"", "selections where GRACE took ThinK's choice on its candidates"});
  g.write<std::uint64_t>("grace_worse_than_think", worse.data(), dims,
                         {"", "selections where GRACE's error exceeds ThinK's"});
  g.write<std::uint64_t>(
      "kept_count", freq.data(),
      {static_cast<hsize_t>(n_layer_), static_cast<hsize_t>(nkv_), static_cast<hsize_t>(d_)},
      {"", "selections that kept each channel [layer][kv head][channel]"});
  if (!trace_masks_.empty()) {
    std::vector<std::uint8_t> all;
    for (const auto& m : trace_masks_) all.insert(all.end(), m.begin(), m.end());
    g.write<std::uint8_t>(
        "kept_mask", all.data(),
        {static_cast<hsize_t>(trace_masks_.size()), static_cast<hsize_t>(n_layer_),
         static_cast<hsize_t>(nkv_), static_cast<hsize_t>(d_)},
        {"", "1: channel kept [traced sequence][layer][kv head][channel]"});
  }
}

#define SPARSIM_INSTANTIATE_KV_CHANNEL_PRUNER(E) template class KvChannelPruner<E>;
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_KV_CHANNEL_PRUNER)

}  // namespace sparsim::pruning
