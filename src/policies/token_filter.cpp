#include "policies/token_filter.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "io/hdf5.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sparsim::gating {

const char* to_string(Criterion c) {
  switch (c) {
    case Criterion::Key:
      return "key";
    case Criterion::Value:
      return "value";
    case Criterion::KV:
      break;
  }
  return "kv";
}

const char* to_string(AnchorKind a) {
  return a == AnchorKind::Mean ? "mean" : "ema";
}

const char* to_string(LayerSet s) {
  switch (s) {
    case LayerSet::Tail:
      return "tail";
    case LayerSet::Head:
      return "head";
    case LayerSet::Uniform:
      break;
  }
  return "uniform";
}

Criterion parse_criterion(const std::string& s) {
  if (s == "key") return Criterion::Key;
  if (s == "value") return Criterion::Value;
  if (s == "kv") return Criterion::KV;
  throw OptionError("token_filter.criterion", "Token Filtering's similarity criterion",
                    fmt::format("must be key, value or kv, got '{}'", s));
}

AnchorKind parse_anchor(const std::string& s) {
  if (s == "mean") return AnchorKind::Mean;
  if (s == "ema") return AnchorKind::Ema;
  throw OptionError("token_filter.anchor", "Token Filtering's anchor",
                    fmt::format("must be mean or ema, got '{}'", s));
}

LayerSet parse_layer_set(const std::string& s) {
  if (s == "tail") return LayerSet::Tail;
  if (s == "head") return LayerSet::Head;
  if (s == "uniform") return LayerSet::Uniform;
  throw OptionError("token_filter.layers", "Token Filtering's set of gated layers",
                    fmt::format("must be tail, head or uniform, got '{}'", s));
}

int TokenFilterOptions::gated_layers(int n_layer) const {
  return num_layers > 0 ? num_layers : (3 * n_layer + 3) / 4;
}

double TokenFilterOptions::layer_target(int n_layer) const {
  return ratio * n_layer / gated_layers(n_layer);
}

namespace {
constexpr const char* kRatio = "Token Filtering's skip ratio r";
constexpr const char* kGatedLayers = "Token Filtering's number of gated layers N";
}  // namespace

void TokenFilterOptions::check_values() const {
  require_setting(std::isfinite(ratio) && ratio >= 0 && ratio < 1, "token_filter.ratio", kRatio,
                  "must be in [0, 1), got {}", ratio);
  require_setting(num_layers >= 0, "token_filter.num_layers", kGatedLayers,
                  "must be non-negative, got {}", num_layers);
  require_setting(warmup >= 2, "token_filter.warmup", "Token Filtering's warm-up W",
                  "must be at least 2 tokens (the first has no anchor), got {}", warmup);
  require_setting(std::isfinite(eta) && eta >= 0, "token_filter.eta",
                  "Token Filtering's controller gain η", "must be non-negative, got {}", eta);
  require_setting(std::isfinite(gamma) && gamma >= 0 && gamma < 1, "token_filter.gamma",
                  "Token Filtering's EMA factor γ", "must be in [0, 1), got {}", gamma);
  require_setting(trace_sequences >= 0, "token_filter.trace",
                  "Token Filtering's number of traced sequences", "must be non-negative, got {}",
                  trace_sequences);
}

void TokenFilterOptions::validate(int n_layer) const {
  check_values();
  const int n = gated_layers(n_layer);
  require_setting(n >= 1 && n <= n_layer, "token_filter.num_layers", kGatedLayers,
                  "must be between 1 and the model's {} layers, got {}", n_layer, n);
  require_setting(layer_target(n_layer) <= 1.0 + 1e-12, "token_filter.ratio", kRatio,
                  "{} over {} gated layers of {} needs a per-layer skip ratio r·L/N = {:.3f} "
                  "above 1: gate more layers or lower the ratio",
                  ratio, n, n_layer, layer_target(n_layer));
}

std::vector<int> select_layers(LayerSet set, int n, int n_layer) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    switch (set) {
      case LayerSet::Tail:
        out.push_back(n_layer - n + i);
        break;
      case LayerSet::Head:
        out.push_back(i);
        break;
      case LayerSet::Uniform:
        out.push_back(static_cast<int>(std::floor((i + 0.5) * n_layer / n)));
        break;
    }
  }
  return out;
}

namespace detail {

/// One team per sequence walks the call's tokens in order: head cosines (threads over heads),
/// the decision and the controller (one thread), the anchor update (threads over channels).
template <class E>
struct GateStep {
  using Team = typename Kokkos::TeamPolicy<E>::member_type;
  using D3 = Kokkos::View<double***, Layout, DeviceOf<E>>;
  using D2 = Kokkos::View<double**, Layout, DeviceOf<E>>;
  using I2 = Kokkos::View<int**, Layout, DeviceOf<E>>;
  CMat<E> k, v;
  D3 ak, av, warm;
  I2 count, nwarm, decided, nskipped;
  D2 tau, cosb;
  Kokkos::View<float**, Layout, DeviceOf<E>> out;  // [row][S, τ, skip, has anchor]
  IVec<E> skip;
  int a, T, p0, nkv, qk, vd, W, crit;
  bool ema, may_skip, drop;
  double gamma, target, eta;

  KOKKOS_FUNCTION void operator()(const Team& team) const {
    const int s = team.league_rank();
    const int kw = nkv * qk, vw = nkv * vd;
    for (int t = 0; t < T; ++t) {
      const int r = s * T + t, pos = p0 + t;
      const int cnt = count(a, s);
      if (cnt > 0) {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, 2 * nkv), [&](const int i) {
          const bool isv = i >= nkv;
          const int h = isv ? i - nkv : i, d = isv ? vd : qk;
          double dot = 0, nx = 0, na = 0;
          for (int j = 0; j < d; ++j) {
            const double x = isv ? v(r, h * d + j) : k(r, h * d + j);
            double an = isv ? av(a, s, h * d + j) : ak(a, s, h * d + j);
            if (!ema) an /= cnt;
            dot += x * an;
            nx += x * x;
            na += an * an;
          }
          cosb(s, i) = nx > 0 && na > 0 ? dot / kx::sqrt_d(nx * na) : 0.0;
        });
        team.team_barrier();
      }
      Kokkos::single(Kokkos::PerTeam(team), [&]() {
        double S = 0, tu = tau(a, s);
        int sk = 0;
        if (cnt > 0) {
          double mk = 0, mv = 0;
          for (int h = 0; h < nkv; ++h) {
            mk += cosb(s, h);
            mv += cosb(s, nkv + h);
          }
          mk /= nkv;
          mv /= nkv;
          double vk = 0, vv = 0;
          for (int h = 0; h < nkv; ++h) {
            vk += (cosb(s, h) - mk) * (cosb(s, h) - mk);
            vv += (cosb(s, nkv + h) - mv) * (cosb(s, nkv + h) - mv);
          }
          vk /= nkv;
          vv /= nkv;
          S = crit == 0 ? mk : crit == 1 ? mv : fuse_kv(mk, vk, mv, vv);
          if (pos < W) {
            // warm-up: keep the S values sorted, τ follows their (1 − r_ℓ) quantile
            double* w = &warm(a, s, 0);
            int m = nwarm(a, s);
            int i = m;
            while (i > 0 && w[i - 1] > S) {
              w[i] = w[i - 1];
              --i;
            }
            w[i] = S;
            nwarm(a, s) = ++m;
            tu = sorted_quantile(w, m, 1.0 - target);
          } else {
            sk = may_skip && S > tu ? 1 : 0;
            const int dec = decided(a, s) + 1, sks = nskipped(a, s) + sk;
            decided(a, s) = dec;
            nskipped(a, s) = sks;
            tu += eta * (static_cast<double>(sks) / dec - target);
          }
          tau(a, s) = tu;
        }
        skip(r) = sk;
        out(r, 0) = static_cast<float>(S);
        out(r, 1) = static_cast<float>(tu);
        out(r, 2) = static_cast<float>(sk);
        out(r, 3) = cnt > 0 ? 1.0f : 0.0f;
      });
      team.team_barrier();
      if (!(drop && skip(r))) {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kw + vw), [&](const int j) {
          const bool isv = j >= kw;
          const int jj = isv ? j - kw : j;
          const double x = isv ? v(r, jj) : k(r, jj);
          double& an = isv ? av(a, s, jj) : ak(a, s, jj);
          if (!ema)
            an += x;
          else
            an = cnt == 0 ? x : gamma * an + (1.0 - gamma) * x;
        });
        team.team_barrier();
        Kokkos::single(Kokkos::PerTeam(team), [&]() { count(a, s) = cnt + 1; });
      }
      team.team_barrier();
    }
  }
};

/// The statistics of one decide() call, added row by row in order: per gated layer a the
/// decided and skipped counts and Σ S (warm-up excluded), τ after each sequence's latest token,
/// and the call's skipped rows.
template <class E>
struct GateTally {
  Kokkos::View<float**, Layout, DeviceOf<E>> out;  // [row][S, τ, skip, has anchor]
  Kokkos::View<std::uint64_t**, Layout, DeviceOf<E>> tally;
  Kokkos::View<double*, Layout, DeviceOf<E>> s_sum;
  Kokkos::View<double**, Layout, DeviceOf<E>> tau_last;
  Kokkos::View<int*, Layout, DeviceOf<E>> n_skip;
  int n, T, p0, W, a;

  KOKKOS_FUNCTION void operator()(const int) const {
    int nsk = 0;
    for (int r = 0; r < n; ++r) {
      const int s = r / T, pos = p0 + r % T;
      const bool has = out(r, 3) > 0;
      const int sk = out(r, 2) > 0 ? 1 : 0;
      nsk += sk;
      if (has) tau_last(a, s) = out(r, 1);
      if (has && pos >= W) {
        tally(a, 0) += 1;
        tally(a, 1) += static_cast<std::uint64_t>(sk);
        s_sum(a) += static_cast<double>(out(r, 0));
      }
    }
    n_skip(0) = nsk;
  }
};

}  // namespace detail

template <class E>
TokenFilter<E>::TokenFilter(const TokenFilterOptions& opt, int n_layer, int n_kv_head, int qk_dim,
                            int v_dim, int max_seqs)
    : opt_(opt), n_layer_(n_layer), nkv_(n_kv_head), qk_(qk_dim), vd_(v_dim), max_seqs_(max_seqs) {
  opt_.validate(n_layer);
  target_ = opt_.layer_target(n_layer);
  layers_ = select_layers(opt_.layers, opt_.gated_layers(n_layer), n_layer);
  slot_.assign(static_cast<std::size_t>(n_layer), -1);
  for (std::size_t i = 0; i < layers_.size(); ++i)
    slot_[static_cast<std::size_t>(layers_[i])] = static_cast<int>(i);
  const int A = static_cast<int>(layers_.size());
  ak_ = decltype(ak_)("sparsim::token_filter::anchor_k", A, max_seqs, nkv_ * qk_);
  av_ = decltype(av_)("sparsim::token_filter::anchor_v", A, max_seqs, nkv_ * vd_);
  count_ = decltype(count_)("sparsim::token_filter::count", A, max_seqs);
  nwarm_ = decltype(nwarm_)("sparsim::token_filter::nwarm", A, max_seqs);
  decided_ = decltype(decided_)("sparsim::token_filter::decided", A, max_seqs);
  nskipped_ = decltype(nskipped_)("sparsim::token_filter::skipped", A, max_seqs);
  tau_ = decltype(tau_)("sparsim::token_filter::tau", A, max_seqs);
  warm_ = decltype(warm_)("sparsim::token_filter::warmup_s", A, max_seqs, opt_.warmup);
  cos_ = decltype(cos_)("sparsim::token_filter::cos", max_seqs, 2 * nkv_);
  tally_ = decltype(tally_)("sparsim::token_filter::tally", A, 2);
  s_sum_d_ = decltype(s_sum_d_)("sparsim::token_filter::s_sum", A);
  tau_last_d_ = decltype(tau_last_d_)("sparsim::token_filter::tau_last", A, max_seqs);
  Kokkos::deep_copy(tau_last_d_, std::numeric_limits<double>::quiet_NaN());
  n_skip_d_ = decltype(n_skip_d_)("sparsim::token_filter::n_skip", 1);
  n_skip_h_ = Kokkos::create_mirror_view(n_skip_d_);
  skipped_.assign(layers_.size(), 0);
  decided_l_.assign(layers_.size(), 0);
  s_sum_.assign(layers_.size(), 0.0);
  tau_last_.assign(layers_.size() * static_cast<std::size_t>(max_seqs),
                   std::numeric_limits<double>::quiet_NaN());
  trace_of_seq_.assign(static_cast<std::size_t>(max_seqs), -1);
}

template <class E>
void TokenFilter<E>::begin_call(const E& exec, int n_seq, int T, int p0) {
  require(n_seq <= max_seqs_, "token filter: {} sequences, sized for {}", n_seq, max_seqs_);
  n_seq_ = n_seq;
  T_ = T;
  p0_ = p0;
  if (static_cast<int>(out_.extent(0)) < n_seq * T)
    out_ = decltype(out_)("sparsim::token_filter::out", n_seq * T, 4);
  if (p0 != 0) return;
  // New sequences: anchors, thresholds and counters start over.
  Kokkos::deep_copy(exec, ak_, 0.0);
  Kokkos::deep_copy(exec, av_, 0.0);
  Kokkos::deep_copy(exec, count_, 0);
  Kokkos::deep_copy(exec, nwarm_, 0);
  Kokkos::deep_copy(exec, decided_, 0);
  Kokkos::deep_copy(exec, nskipped_, 0);
  Kokkos::deep_copy(exec, tau_, 0.0);
  Kokkos::deep_copy(exec, tau_last_d_, std::numeric_limits<double>::quiet_NaN());
  stale_ = true;
  for (int s = 0; s < max_seqs_; ++s) {
    int& tr = trace_of_seq_[static_cast<std::size_t>(s)];
    tr = -1;
    if (s < n_seq && static_cast<int>(traces_.size()) < opt_.trace_sequences) {
      tr = static_cast<int>(traces_.size());
      traces_.emplace_back(layers_.size());
    }
  }
}

template <class E>
int TokenFilter<E>::decide(const E& exec, int layer, const CMat<E>& k, const CMat<E>& v,
                           const IVec<E>& skip, PolicyCost& cost) {
  const int a = slot_.at(static_cast<std::size_t>(layer));
  require(a >= 0, "token filter: layer {} is not gated", layer);
  const int n = n_seq_ * T_;
  detail::GateStep<E> f;
  f.k = k;
  f.v = v;
  f.ak = ak_;
  f.av = av_;
  f.warm = warm_;
  f.count = count_;
  f.nwarm = nwarm_;
  f.decided = decided_;
  f.nskipped = nskipped_;
  f.tau = tau_;
  f.cosb = cos_;
  f.out = out_;
  f.skip = skip;
  f.a = a;
  f.T = T_;
  f.p0 = p0_;
  f.nkv = nkv_;
  f.qk = qk_;
  f.vd = vd_;
  f.W = opt_.warmup;
  f.crit = opt_.criterion == Criterion::Key ? 0 : opt_.criterion == Criterion::Value ? 1 : 2;
  f.ema = opt_.anchor == AnchorKind::Ema;
  // r_ℓ = 0 never skips (the run is then the dense one, bit for bit)
  f.may_skip = !opt_.observe_only && target_ > 0;
  f.drop = opt_.drop_skipped;
  f.gamma = opt_.gamma;
  f.target = target_;
  f.eta = opt_.eta;
  Kokkos::parallel_for("sparsim::gating::token_filter", light(team_policy(exec, n_seq_)), f);
  // The statistics stay where the decisions are: the rows are added in order (as one loop on
  // the host, by one thread on a device), and only the skipped count is read.
  const detail::GateTally<E> tally{out_, tally_, s_sum_d_, tau_last_d_, n_skip_d_,
                                   n,    T_,     p0_,      opt_.warmup, a};
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    exec.fence();
    tally(0);
  } else {
    Kokkos::parallel_for("sparsim::gating::token_filter::tally",
                         light(Kokkos::RangePolicy<E>(exec, 0, 1)), tally);
  }
  Kokkos::deep_copy(exec, n_skip_h_, n_skip_d_);
  stale_ = true;
  bool traced = false;
  for (int s = 0; s < n_seq_; ++s)
    traced = traced || trace_of_seq_[static_cast<std::size_t>(s)] >= 0;
  if (traced) {  // a diagnostic: the traced sequences' rows come to the host
    const auto ho = Kokkos::create_mirror_view_and_copy(
        Kokkos::HostSpace(), Kokkos::subview(out_, Kokkos::make_pair(0, n), Kokkos::ALL));
    const std::size_t ai = static_cast<std::size_t>(a);
    for (int s = 0; s < n_seq_; ++s) {
      const int tr = trace_of_seq_[static_cast<std::size_t>(s)];
      if (tr < 0) continue;
      GateTrace& g = traces_[static_cast<std::size_t>(tr)][ai];
      for (int t = 0; t < T_; ++t) {
        const int r = s * T_ + t;
        const bool has = ho(r, 3) > 0;
        g.similarity.push_back(has ? ho(r, 0) : std::numeric_limits<float>::quiet_NaN());
        g.threshold.push_back(has ? ho(r, 1) : std::numeric_limits<float>::quiet_NaN());
        g.skipped.push_back(static_cast<std::uint8_t>(ho(r, 2) > 0 ? 1 : 0));
      }
    }
  }
  exec.fence();
  const int n_skip = n_skip_h_(0);
  const double kvw = static_cast<double>(nkv_) * (qk_ + vd_);
  cost.flops = static_cast<double>(n) * (8.0 * kvw + 10.0 * nkv_);
  cost.bytes = static_cast<double>(n) * 28.0 * kvw;
  return n_skip;
}

template <class E>
std::uint64_t TokenFilter<E>::skipped(int layer) const {
  pull();
  const int a = slot_.at(static_cast<std::size_t>(layer));
  return a < 0 ? 0 : skipped_[static_cast<std::size_t>(a)];
}

template <class E>
void TokenFilter<E>::pull() const {
  if (!stale_) return;
  stale_ = false;
  const auto t = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tally_);
  const auto ss = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s_sum_d_);
  const auto tl = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tau_last_d_);
  for (std::size_t a = 0; a < layers_.size(); ++a) {
    decided_l_[a] = t(a, 0);
    skipped_[a] = t(a, 1);
    s_sum_[a] = ss(a);
    for (int s = 0; s < max_seqs_; ++s)
      tau_last_[a * static_cast<std::size_t>(max_seqs_) + static_cast<std::size_t>(s)] = tl(a, s);
  }
  // every call decides the same rows in every gated layer
  decided_tokens_ = layers_.empty() ? 0 : decided_l_[0];
}

template <class E>
double TokenFilter<E>::realised() const {
  pull();
  if (decided_tokens_ == 0) return 0.0;
  std::uint64_t tot = 0;
  for (std::uint64_t s : skipped_) tot += s;
  return static_cast<double>(tot) / (static_cast<double>(n_layer_) * decided_tokens_);
}

template <class E>
double TokenFilter<E>::realised(int layer) const {
  pull();
  const int a = slot_.at(static_cast<std::size_t>(layer));
  if (a < 0 || decided_l_[static_cast<std::size_t>(a)] == 0) return 0.0;
  return static_cast<double>(skipped_[static_cast<std::size_t>(a)]) /
         decided_l_[static_cast<std::size_t>(a)];
}

template <class E>
double TokenFilter<E>::similarity_mean(int layer) const {
  pull();
  const int a = slot_.at(static_cast<std::size_t>(layer));
  if (a < 0 || decided_l_[static_cast<std::size_t>(a)] == 0) return 0.0;
  return s_sum_[static_cast<std::size_t>(a)] / decided_l_[static_cast<std::size_t>(a)];
}

template <class E>
double TokenFilter<E>::threshold_final_mean(int layer) const {
  pull();
  const int a = slot_.at(static_cast<std::size_t>(layer));
  if (a < 0) return 0.0;
  double sum = 0;
  int cnt = 0;
  for (int s = 0; s < max_seqs_; ++s) {
    const double t = tau_last_[static_cast<std::size_t>(a) * max_seqs_ + s];
    if (std::isfinite(t)) sum += t, ++cnt;
  }
  return cnt ? sum / cnt : 0.0;
}

template <class E>
void TokenFilter<E>::account_cache(const std::vector<KVOccupancy>& occ) {
  if (kv_.layers.size() != occ.size()) kv_.layers.assign(occ.size(), KVCacheRecord::Layer{});
  double held = 0, dense = 0, alloc = 0, alloc_dense = 0;
  for (std::size_t l = 0; l < occ.size(); ++l) {
    const KVOccupancy& o = occ[l];
    KVCacheRecord::Layer& r = kv_.layers[l];
    r.compacted = o.compacted;
    r.position_bytes = o.position_bytes;
    r.positions_final = o.positions;
    r.held_final = o.held;
    r.positions_sum += o.positions;
    r.held_sum += o.held;
    r.held_bytes_peak = std::max(r.held_bytes_peak, o.held * o.position_bytes);
    r.allocated_final = o.allocated;
    r.allocated_peak = std::max(r.allocated_peak, o.allocated);
    r.allocated_dense = o.allocated_dense;
    held += o.held * o.position_bytes;
    dense += o.positions * o.position_bytes;
    alloc += o.allocated;
    alloc_dense += o.allocated_dense;
  }
  ++kv_.calls;
  kv_.held_final = held;
  kv_.dense_final = dense;
  kv_.allocated_final = alloc;
  kv_.allocated_dense = alloc_dense;
  kv_.held_peak = std::max(kv_.held_peak, held);
  kv_.dense_peak = std::max(kv_.dense_peak, dense);
  kv_.allocated_peak = std::max(kv_.allocated_peak, alloc);
  kv_.held_sum += held;
  kv_.dense_sum += dense;
}

template <class E>
void TokenFilter<E>::reset_stats() {
  kv_ = KVCacheRecord{};
  Kokkos::deep_copy(tally_, 0);
  Kokkos::deep_copy(s_sum_d_, 0.0);
  stale_ = true;  // (the counts are now zero; τ after the latest token is kept)
  decided_tokens_ = 0;
  std::fill(skipped_.begin(), skipped_.end(), 0);
  std::fill(decided_l_.begin(), decided_l_.end(), 0);
  std::fill(s_sum_.begin(), s_sum_.end(), 0.0);
  traces_.clear();
  sequences_started_ = 0;
}

template <class E>
void TokenFilter<E>::write(io::Group& g) const {
  pull();
  g.set_attr("target", opt_.ratio);
  g.set_attr("realised", realised());
  g.set_attr("layer_target", target_);
  g.set_attr("criterion", to_string(opt_.criterion));
  g.set_attr("anchor", to_string(opt_.anchor));
  g.set_attr("gamma", opt_.gamma);
  g.set_attr("keys", opt_.pre_rope ? "pre-rope" : "post-rope");
  g.set_attr("warmup", opt_.warmup);
  g.set_attr("eta", opt_.eta);
  g.set_attr("layer_set", to_string(opt_.layers));
  g.set_attr("num_layers", static_cast<int>(layers_.size()));
  g.set_attr("drop_skipped", opt_.drop_skipped ? 1 : 0);
  g.set_attr("observe_only", opt_.observe_only ? 1 : 0);
  g.set_attr("decided_tokens", static_cast<std::int64_t>(decided_tokens_));
  std::vector<std::int32_t> li(layers_.begin(), layers_.end());
  g.write<std::int32_t>("layers", li, {"", "gated layers"});
  std::vector<double> real, tgt, smean, tfin;
  std::vector<std::uint64_t> sk, dec;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    real.push_back(realised(layers_[i]));
    tgt.push_back(target_);
    smean.push_back(similarity_mean(layers_[i]));
    tfin.push_back(threshold_final_mean(layers_[i]));
    sk.push_back(skipped_[i]);
    dec.push_back(decided_l_[i]);
  }
  g.write<double>("target_per_layer", tgt,
                  {"1", "target skip ratio r_l = r*L/N of each gated layer"});
  g.write<double>("realised_per_layer", real,
                  {"1", "skipped / decided tokens of each gated layer (warm-up excluded)"});
  g.write<std::uint64_t>("skipped", sk, {"token", "tokens skipped in each gated layer"});
  g.write<std::uint64_t>("decided", dec, {"token", "tokens decided in each gated layer"});
  g.write<double>("similarity_mean", smean, {"1", "mean similarity S over decided tokens"});
  g.write<double>("threshold_final", tfin,
                  {"1", "threshold after the last token, mean over the last call's sequences"});
  if (!kv_.empty()) {
    io::Group kg = g.create_group("kv_cache");
    kg.set_attr("meaning",
                "KV cache of the run with skipped tokens dropped, at the end of every call over "
                "the call's sequences: held = positions still cached, dense = every position "
                "written, allocated = the key and value buffers; [layer] tables over all layers");
    kg.set_attr("calls", static_cast<std::int64_t>(kv_.calls));
    kg.set_attr("bytes_held_final", kv_.held_final);
    kg.set_attr("bytes_dense_final", kv_.dense_final);
    kg.set_attr("bytes_allocated_final", kv_.allocated_final);
    kg.set_attr("bytes_held_peak", kv_.held_peak);
    kg.set_attr("bytes_dense_peak", kv_.dense_peak);
    kg.set_attr("bytes_allocated_peak", kv_.allocated_peak);
    kg.set_attr("bytes_allocated_dense", kv_.allocated_dense);
    kg.set_attr("held_fraction", kv_.held_fraction());
    std::vector<std::int32_t> comp;
    std::vector<double> pos, held, frac, hpeak, apeak, afin, adense;
    for (const auto& r : kv_.layers) {
      comp.push_back(r.compacted ? 1 : 0);
      pos.push_back(r.positions_final);
      held.push_back(r.held_final);
      frac.push_back(r.positions_sum > 0 ? r.held_sum / r.positions_sum : 1.0);
      hpeak.push_back(r.held_bytes_peak);
      apeak.push_back(r.allocated_peak);
      afin.push_back(r.allocated_final);
      adense.push_back(r.allocated_dense);
    }
    kg.write<std::int32_t>("compacted", comp, {"", "1: the layer held only the kept tokens"});
    kg.write<double>("positions_final", pos, {"token", "positions written, latest call"});
    kg.write<double>("held_final", held, {"token", "positions held, latest call"});
    kg.write<double>("held_fraction", frac,
                     {"1", "positions held / written, summed over the calls"});
    kg.write<double>("bytes_held_peak", hpeak, {"B", "held key and value bytes, max over calls"});
    kg.write<double>("bytes_allocated_peak", apeak,
                     {"B", "allocated key and value bytes, max over calls"});
    kg.write<double>("bytes_allocated_final", afin,
                     {"B", "allocated key and value bytes, latest call"});
    kg.write<double>("bytes_allocated_dense", adense,
                     {"B", "key and value bytes of the dense layout (max_seqs x max_ctx)"});
  }
  if (traces_.empty()) return;
  io::Group tg = g.create_group("trace");
  tg.set_attr("meaning",
              "per traced sequence: [gated layer][position] similarity S (NaN: no anchor), "
              "threshold after the token, skip decision");
  for (std::size_t q = 0; q < traces_.size(); ++q) {
    const auto& tr = traces_[q];
    const std::size_t len = tr.empty() ? 0 : tr[0].similarity.size();
    std::vector<float> S, tau;
    std::vector<std::uint8_t> sk8;
    for (const GateTrace& x : tr) {
      S.insert(S.end(), x.similarity.begin(), x.similarity.end());
      tau.insert(tau.end(), x.threshold.begin(), x.threshold.end());
      sk8.insert(sk8.end(), x.skipped.begin(), x.skipped.end());
    }
    io::Group sg = tg.create_group("seq" + std::to_string(q));
    const std::vector<hsize_t> dims = {static_cast<hsize_t>(tr.size()), static_cast<hsize_t>(len)};
    sg.write<float>("similarity", S.data(), dims,
                    {"1", "similarity S per gated layer and position"});
    sg.write<float>("threshold", tau.data(), dims, {"1", "threshold after each position"});
    sg.write<std::uint8_t>("skipped", sk8.data(), dims, {"", "1: attention skipped"});
  }
}

#define SPARSIM_INSTANTIATE_TOKEN_FILTER(E) template class TokenFilter<E>;
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_TOKEN_FILTER)

}  // namespace sparsim::gating
