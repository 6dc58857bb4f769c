#include "policies/token_eviction.hpp"

#include "core/backends.hpp"
#include "core/compat.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"
#include "io/hdf5.hpp"
#include "kernels/attention.hpp"
#include "kernels/linear.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sparsim::pruning {

const char* to_string(EvictMethod m) {
  switch (m) {
    case EvictMethod::Streaming:
      return "streaming";
    case EvictMethod::H2O:
      return "h2o";
    case EvictMethod::SnapKV:
      return "snapkv";
    case EvictMethod::PyramidKV:
      return "pyramidkv";
  }
  return "?";
}

EvictMethod parse_evict_method(const std::string& s) {
  if (s == "streaming") return EvictMethod::Streaming;
  if (s == "h2o") return EvictMethod::H2O;
  if (s == "snapkv") return EvictMethod::SnapKV;
  if (s == "pyramidkv") return EvictMethod::PyramidKV;
  throw OptionError("eviction.method", "the eviction policy",
                    fmt::format("must be streaming, h2o, snapkv or pyramidkv, got '{}'", s));
}

const char* to_string(EvictPool p) {
  return p == EvictPool::Avg ? "avg" : "max";
}

void EvictOptions::validate() const {
  constexpr const char* kBudget = "the eviction budget";
  constexpr const char* kWindow = "the eviction's observation and recent window";
  constexpr const char* kSinks = "the eviction's attention sinks";
  require_setting(std::isfinite(budget) && budget > 0, "eviction.budget", kBudget,
                  "must be a fraction of the prompt in (0, 1] or a number of tokens > 1, got {}",
                  budget);
  require_setting(budget <= 1 || (budget == std::floor(budget) && budget <= 1e9), "eviction.budget",
                  kBudget, "{} is above 1, so it counts tokens: it must be a whole number", budget);
  require_setting(window >= 1, "eviction.window", kWindow, "must be at least 1 token, got {}",
                  window);
  require_setting(sinks >= 0, "eviction.sinks", kSinks, "must be non-negative, got {}", sinks);
  require_setting(kernel >= 1 && kernel % 2 == 1, "eviction.kernel", "SnapKV's pooling kernel",
                  "must be an odd number ≥ 1, got {}", kernel);
  require_setting(beta >= 1, "eviction.beta", "PyramidKV's budget ratio β",
                  "must be at least 1, got {}", beta);
  if (budget > 1) {
    const int c = static_cast<int>(budget);
    if (method == EvictMethod::Streaming)
      require_setting(sinks < c, "eviction.sinks", kSinks,
                      "{} leaves no recent token in a budget of {} tokens", sinks, c);
    else
      require_setting(window < c, "eviction.window", kWindow,
                      "{} is not shorter than the budget of {} tokens: nothing would be chosen "
                      "by score",
                      window, c);
  }
}

int EvictOptions::budget_tokens(int T) const {
  if (budget > 1) return static_cast<int>(budget);
  // ⌈b·T⌉, with b·T within 1e−9 of an integer counted as that integer
  const double x = budget * T;
  const double r = std::round(x);
  const int c = std::abs(x - r) < 1e-9 ? static_cast<int>(r) : static_cast<int>(std::ceil(x));
  return std::max(1, c);
}

int layer_budget(const EvictOptions& o, int layer, int n_layer, int T) {
  const int C = o.budget_tokens(T);
  if (o.method != EvictMethod::PyramidKV || C >= T || n_layer < 2) return C;
  const int w = std::min(o.window, C), B = C - w;
  // PyramidKV's code: below twice the prefix budget every layer gets C (SnapKV)
  if (B <= 0 || T < 2 * B) return C;
  int lo = B / o.beta, hi = 2 * B - lo;
  if (hi >= T - w) {
    hi = T - w;
    lo = 2 * B - hi;
  }
  const int steps = std::max(0, (hi - lo) / (n_layer - 1));  // (a window above B: flat)
  return hi - layer * steps + w;
}

std::vector<double> pool_votes(const std::vector<double>& v, int kernel, EvictPool pool) {
  const int n = static_cast<int>(v.size()), half = kernel / 2;
  std::vector<double> out(v.size());
  for (int i = 0; i < n; ++i) {
    const int a = std::max(0, i - half), b = std::min(n - 1, i + half);
    if (pool == EvictPool::Avg) {
      double s = 0;
      for (int j = a; j <= b; ++j) s += v[static_cast<std::size_t>(j)];
      out[static_cast<std::size_t>(i)] = s / kernel;
    } else {
      double m = v[static_cast<std::size_t>(a)];
      for (int j = a + 1; j <= b; ++j) m = std::max(m, v[static_cast<std::size_t>(j)]);
      out[static_cast<std::size_t>(i)] = m;
    }
  }
  return out;
}

std::vector<int> choose_tokens(const EvictOptions& o, int T, int budget,
                               const std::vector<double>& votes,
                               const std::vector<char>& candidate) {
  std::vector<int> keep;
  if (budget >= T) {
    keep.resize(static_cast<std::size_t>(T));
    std::iota(keep.begin(), keep.end(), 0);
    return keep;
  }
  if (o.method == EvictMethod::Streaming) {
    const int s = std::min(o.sinks, budget);
    for (int p = 0; p < s; ++p) keep.push_back(p);
    for (int p = T - (budget - s); p < T; ++p) keep.push_back(p);
    return keep;
  }
  require(static_cast<int>(votes.size()) == T, "token eviction: {} votes for {} tokens",
          votes.size(), T);
  const int w = std::min(o.window, budget), n = T - w, k = budget - w;
  std::vector<double> score(votes.begin(), votes.begin() + n);
  if (o.method == EvictMethod::SnapKV || o.method == EvictMethod::PyramidKV)
    score = pool_votes(score, o.kernel, o.pool);
  std::vector<int> cand;
  for (int p = 0; p < n; ++p)
    if (candidate.empty() || candidate[static_cast<std::size_t>(p)]) cand.push_back(p);
  const std::size_t kk = std::min(cand.size(), static_cast<std::size_t>(k));
  // the k largest scores, ties to the earlier position
  std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(kk), cand.end(),
                    [&](int a, int b) {
                      const double sa = score[static_cast<std::size_t>(a)],
                                   sb = score[static_cast<std::size_t>(b)];
                      return sa > sb || (sa == sb && a < b);
                    });
  keep.assign(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(kk));
  std::sort(keep.begin(), keep.end());
  for (int p = n; p < T; ++p) keep.push_back(p);
  return keep;
}

template <class E>
TokenEvictorPolicy<E>::TokenEvictorPolicy(const EvictOptions& opt, int n_layer, int n_kv_head,
                                          int max_seqs)
    : opt_(opt), n_layer_(n_layer), nkv_(n_kv_head), max_seqs_(max_seqs) {
  opt_.validate();
  require(n_layer >= 1 && n_kv_head >= 1 && max_seqs >= 1,
          "token eviction: {} layers, {} KV heads, {} sequences", n_layer, n_kv_head, max_seqs);
  rec_.assign(static_cast<std::size_t>(n_layer * n_kv_head), EvictRecord{});
  bytes_dense_.assign(static_cast<std::size_t>(n_layer), 0.0);
  bytes_kept_.assign(static_cast<std::size_t>(n_layer), 0.0);
}

template <class E>
int TokenEvictorPolicy<E>::observation_window(int T) const {
  switch (opt_.method) {
    case EvictMethod::Streaming:
      return 0;
    case EvictMethod::H2O:
      return T;
    default:
      return std::min(opt_.window, T);
  }
}

template <class E>
bool TokenEvictorPolicy<E>::evicts(int T) const {
  for (int l = 0; l < n_layer_; ++l)
    if (layer_budget(opt_, l, n_layer_, T) < T) return true;
  return false;
}

template <class E>
int TokenEvictorPolicy<E>::begin(int layer, const KVLayer<E>& cache, const AttnShape& sh, int n_seq,
                                 int T) {
  require(sh.n_kv_head == nkv_ && n_seq <= max_seqs_ && layer >= 0 && layer < n_layer_ &&
              !cache.compacted() && !cache.has_evictions(),
          "token eviction: layer {} does not match the evictor ({} KV heads)", layer, nkv_);
  ++calls_;
  return layer_budget(opt_, layer, n_layer_, T);
}

template <class E>
void TokenEvictorPolicy<E>::record(int layer, int head, int kept, int T, int C) {
  EvictRecord& r = rec_[static_cast<std::size_t>(layer * nkv_ + head)];
  ++r.selections;
  r.evicting += kept < T ? 1 : 0;
  r.kept += kept;
  r.budget += C;
  r.prompt += T;
}

template <class E>
void TokenEvictorPolicy<E>::keep_all(int layer, int n_seq, int T, int C) {
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < nkv_; ++h) record(layer, h, T, T, C);
}

template <class E>
std::vector<double> TokenEvictorPolicy<E>::host_votes(
    const Kokkos::View<double***, Layout, DeviceOf<E>>& v, int n_seq, int T) const {
  auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(static_cast<std::size_t>(n_seq) * nkv_ * T);
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < nkv_; ++h)
      for (int p = 0; p < T; ++p)
        out[(static_cast<std::size_t>(s) * nkv_ + h) * T + p] = hv(s, h, p);
  return out;
}

template <class E>
KeptTokens TokenEvictorPolicy<E>::choose(int layer, const KVLayer<E>& cache, int n_seq, int T,
                                         int C, const std::vector<double>& hvotes) {
  KeptTokens out;
  out.positions = T;
  out.budget = C;
  // positions a token gate dropped cannot be kept
  std::vector<std::vector<char>> cands(static_cast<std::size_t>(n_seq));
  if (cache.has_drops()) {
    auto hd = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cache.dropped);
    for (int s = 0; s < n_seq; ++s) {
      auto& c = cands[static_cast<std::size_t>(s)];
      c.resize(static_cast<std::size_t>(T));
      for (int p = 0; p < T; ++p) c[static_cast<std::size_t>(p)] = hd(s, p) ? 0 : 1;
    }
  }
  out.idx.resize(static_cast<std::size_t>(n_seq));
  std::vector<double> v;
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < nkv_; ++h) {
      v.clear();
      if (!hvotes.empty())
        v.assign(hvotes.begin() + static_cast<std::ptrdiff_t>((s * nkv_ + h) * T),
                 hvotes.begin() + static_cast<std::ptrdiff_t>((s * nkv_ + h + 1) * T));
      std::vector<int> keep = choose_tokens(opt_, T, C, v, cands[static_cast<std::size_t>(s)]);
      record(layer, h, static_cast<int>(keep.size()), T, C);
      out.idx[static_cast<std::size_t>(s)].push_back(std::move(keep));
    }
  // pooling and top-k on the host
  out.flops += static_cast<double>(n_seq) * nkv_ * T * (opt_.kernel + std::log2(T + 1.0));
  return out;
}

template <class E>
KeptTokens TokenEvictorPolicy<E>::select_voted(
    const E& exec, int layer, const KVLayer<E>& cache, const AttnShape& sh,
    const Kokkos::View<double***, Layout, DeviceOf<E>>& votes, double seconds, int n_seq, int T) {
  (void)exec;
  require(opt_.method == EvictMethod::H2O && !cache.has_drops() &&
              votes.extent(0) >= static_cast<std::size_t>(n_seq) &&
              votes.extent(1) == static_cast<std::size_t>(nkv_) &&
              votes.extent(2) >= static_cast<std::size_t>(T),
          "token eviction: summed attention votes ({}×{}×{}) for {} sequences, {} KV heads and "
          "{} tokens of an H2O layer without dropped positions",
          votes.extent(0), votes.extent(1), votes.extent(2), n_seq, nkv_, T);
  Stopwatch sw;
  const int C = begin(layer, cache, sh, n_seq, T);
  if (C >= T) {
    keep_all(layer, n_seq, T, C);
    select_s_ += sw.seconds() + seconds;
    return KeptTokens{};
  }
  KeptTokens out = choose(layer, cache, n_seq, T, C, host_votes(votes, n_seq, T));
  // own cost: inside the prefill attention, each (row, position) weight of every query head
  // added to its tile's sums (a multiply-add; the tiles cover their causal triangle in whole
  // tiles of kAttnTileRows rows), the tiles' sums written and read back once, the votes written
  constexpr int R = detail::kAttnTileRows;
  double tile_pairs = 0, tile_len = 0;
  for (int t0 = 0; t0 < T; t0 += R) {
    const int nr = std::min(R, T - t0);
    tile_pairs += static_cast<double>(nr) * (t0 + nr);
    tile_len += t0 + nr;
  }
  const int nh = sh.n_head;
  out.flops += n_seq * nh * (2.0 * tile_pairs + tile_len);
  out.bytes += 2.0 * 4.0 * n_seq * nh * tile_len + 8.0 * n_seq * nkv_ * T;
  select_s_ += sw.seconds() + seconds;
  return out;
}

template <class E>
KeptTokens TokenEvictorPolicy<E>::select(const E& exec, int layer, const KVLayer<E>& cache,
                                         const AttnShape& sh, const CMat<E>& q_obs,
                                         const IVec<E>& q_ok, int n_seq, int T) {
  Stopwatch sw;
  const int C = begin(layer, cache, sh, n_seq, T);
  if (C >= T) {  // the whole prompt fits: the layer stays as it is
    keep_all(layer, n_seq, T, C);
    select_s_ += sw.seconds();
    return KeptTokens{};
  }
  const int w = observation_window(T);
  double own_flops = 0, own_bytes = 0;
  std::vector<double> hvotes;  // [seq][head][position] of this call
  if (opt_.scores() && w > 0) {
    require(static_cast<int>(q_obs.extent(0)) == n_seq * w &&
                static_cast<int>(q_obs.extent(1)) == sh.q_width(),
            "token eviction: {}×{} observed queries, expected {}×{}", q_obs.extent(0),
            q_obs.extent(1), n_seq * w, sh.q_width());
    if (votes_.extent(0) < static_cast<std::size_t>(n_seq) ||
        votes_.extent(1) != static_cast<std::size_t>(nkv_) ||
        votes_.extent(2) < static_cast<std::size_t>(T))
      votes_ =
          Kokkos::View<double***, Layout, DeviceOf<E>>("sparsim::evict::votes", max_seqs_, nkv_, T);
    const auto K = cache.k;
    const bool drops = cache.has_drops();
    const auto dropped = cache.dropped;
    const auto votes = votes_;
    const int nh = sh.n_head, group = sh.group(), qk = sh.qk_dim, nkv = nkv_;
    const float scale = sh.scale;
    // Observed row r = s·w + i is the query at position T − w + i. The rows go in blocks whose
    // scores fit kScoreFloats. Pass 1, per (row, query head): each score once (a float dot
    // product), the row's maximum, then exp(score − max) in place of the score and the
    // normaliser, over the positions the row attends to (dropped ones excluded). Pass 2, per
    // (sequence, KV head, position chunk): the votes, Σ over the group's heads, then the block's
    // rows in order, of each weight, added to the blocks before. Every sum has one owner and a
    // fixed order, so the votes do not depend on the thread count.
    constexpr std::size_t kScoreFloats = std::size_t{1} << 24;  // 64 MiB of scores
    const std::size_t per_row = static_cast<std::size_t>(n_seq) * nh * T;
    const int rb = static_cast<int>(
        std::max<std::size_t>(1, std::min<std::size_t>(w, kScoreFloats / per_row)));
    Kokkos::View<float***, Layout, DeviceOf<E>> S(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "sparsim::evict::scores"), n_seq * rb, nh,
        T);
    Kokkos::View<double**, Layout, DeviceOf<E>> z("sparsim::evict::sum", n_seq * rb, nh);
    Kokkos::parallel_for(
        "sparsim::evict::votes_zero",
        Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n_seq * nkv, T}),
        KOKKOS_LAMBDA(const int sh_i, const int p) { votes(sh_i / nkv, sh_i % nkv, p) = 0.0; });
    for (int i0 = 0; i0 < w; i0 += rb) {
      const int nr = std::min(rb, w - i0);
      // scores: positions in chunks, each key row read once for all the block's rows (it stays
      // in the first-level cache) instead of once per row
      constexpr int kKeyChunk = 256;
      Kokkos::parallel_for(
          "sparsim::evict::scores",
          Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0},
                                                    {n_seq * nh, (T + kKeyChunk - 1) / kKeyChunk}),
          KOKKOS_LAMBDA(const int shq, const int c) {
            const int s = shq / nh, hq = shq % nh, kvh = hq / group;
            const int p0 = c * kKeyChunk, p1 = p0 + kKeyChunk < T ? p0 + kKeyChunk : T;
            for (int p = p0; p < p1; ++p) {
              const bool gone = drops && dropped(s, p);
              const float* kp = &K(s, p, kvh * qk);
              for (int ii = 0; ii < nr; ++ii) {
                const int i = i0 + ii, r = s * w + i;
                if (T - w + i < p || !q_ok(r)) continue;
                S(s * nr + ii, hq, p) =
                    gone ? -3.0e38f : detail::dot_lanes(&q_obs(r, hq * qk), kp, qk) * scale;
              }
            }
          });
      // each row's maximum, then exp(score − max) in place of the score and the normaliser
      Kokkos::parallel_for(
          "sparsim::evict::softmax",
          Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n_seq * nr, nh}),
          KOKKOS_LAMBDA(const int j, const int hq) {
            const int s = j / nr, i = i0 + j % nr, r = s * w + i, t = T - w + i;
            double sum = 0.0;
            if (q_ok(r)) {
              float m = -3.0e38f;
              for (int p = 0; p <= t; ++p) m = S(j, hq, p) > m ? S(j, hq, p) : m;
              for (int p = 0; p <= t; ++p) {
                const float e = drops && dropped(s, p) ? 0.0f : kx::exp(S(j, hq, p) - m);
                S(j, hq, p) = e;
                sum += e;
              }
            }
            z(j, hq) = sum;
          });
      // positions in chunks of kChunk, so that each row's weights are read contiguously; per
      // position the sum runs over the group's heads, then the rows, as a plain loop would
      constexpr int kChunk = 64;
      Kokkos::parallel_for(
          "sparsim::evict::votes",
          Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0},
                                                    {n_seq * nkv, (T + kChunk - 1) / kChunk}),
          KOKKOS_LAMBDA(const int sh_i, const int c) {
            const int s = sh_i / nkv, h = sh_i % nkv, p0 = c * kChunk;
            const int p1 = p0 + kChunk < T ? p0 + kChunk : T;
            double acc[kChunk];
            for (int p = 0; p < kChunk; ++p) acc[p] = 0.0;
            for (int g = 0; g < group; ++g) {
              const int hq = h * group + g;
              for (int ii = 0; ii < nr; ++ii) {
                const int i = i0 + ii, j = s * nr + ii, t = T - w + i;
                if (!q_ok(s * w + i) || !(z(j, hq) > 0.0)) continue;
                const double zz = z(j, hq);
                const int pe = t + 1 < p1 ? t + 1 : p1;
                for (int p = p0; p < pe; ++p) acc[p - p0] += static_cast<double>(S(j, hq, p)) / zz;
              }
            }
            for (int p = p0; p < p1; ++p)
              if (!(drops && dropped(s, p))) votes(s, h, p) += acc[p - p0];
          });
    }
    hvotes = host_votes(votes_, n_seq, T);
    // own cost: every observed (row, position) pair of every query head scored once (dot,
    // exp), then its weight added to the votes
    const double pairs = static_cast<double>(w) * T - 0.5 * w * (w - 1.0);
    own_flops = n_seq * pairs * nh * (2.0 * qk + 6.0);
    own_bytes = 4.0 * n_seq * static_cast<double>(T) * sh.k_width() +
                4.0 * n_seq * w * sh.q_width() + 3.0 * 4.0 * n_seq * pairs * nh +
                8.0 * n_seq * nkv_ * T;
  }
  KeptTokens out = choose(layer, cache, n_seq, T, C, hvotes);
  out.flops += own_flops;
  out.bytes += own_bytes;
  select_s_ += sw.seconds();
  return out;
}

template <class E>
void TokenEvictorPolicy<E>::account(int layer, double dense_bytes, double kept_bytes) {
  bytes_dense_[static_cast<std::size_t>(layer)] += dense_bytes;
  bytes_kept_[static_cast<std::size_t>(layer)] += kept_bytes;
}

template <class E>
double TokenEvictorPolicy<E>::kept_fraction() const {
  double k = 0, p = 0;
  for (const auto& r : rec_) k += r.kept, p += r.prompt;
  return p > 0 ? k / p : 1.0;
}

template <class E>
double TokenEvictorPolicy<E>::budget_use() const {
  double k = 0, b = 0;
  for (const auto& r : rec_) k += r.kept, b += r.budget;
  return b > 0 ? k / b : 0.0;
}

template <class E>
double TokenEvictorPolicy<E>::kv_bytes_dense() const {
  return std::accumulate(bytes_dense_.begin(), bytes_dense_.end(), 0.0);
}

template <class E>
double TokenEvictorPolicy<E>::kv_bytes_kept() const {
  return std::accumulate(bytes_kept_.begin(), bytes_kept_.end(), 0.0);
}

template <class E>
std::uint64_t TokenEvictorPolicy<E>::selections() const {
  std::uint64_t n = 0;
  for (const auto& r : rec_) n += r.selections;
  return n;
}

template <class E>
void TokenEvictorPolicy<E>::write(io::Group& g) const {
  g.set_attr("method", to_string(opt_.method));
  g.set_attr("budget", opt_.budget);
  g.set_attr("budget_unit", opt_.budget > 1 ? "tokens" : "fraction of the prompt");
  g.set_attr("window", opt_.window);
  g.set_attr("sinks", opt_.sinks);
  g.set_attr("kernel", opt_.kernel);
  g.set_attr("pool", to_string(opt_.pool));
  g.set_attr("beta", opt_.beta);
  g.set_attr("selections", static_cast<std::int64_t>(selections()));
  g.set_attr("kept_fraction", kept_fraction());
  g.set_attr("kv_bytes_dense", kv_bytes_dense());
  g.set_attr("kv_bytes_kept", kv_bytes_kept());
  g.set_attr("select_seconds", select_s_);
  const std::vector<hsize_t> dims = {static_cast<hsize_t>(n_layer_), static_cast<hsize_t>(nkv_)};
  std::vector<double> kept, budget, prompt;
  std::vector<std::uint64_t> sel, evicting;
  for (const auto& r : rec_) {
    const double n = r.selections ? static_cast<double>(r.selections) : 1.0;
    kept.push_back(r.kept / n);
    budget.push_back(r.budget / n);
    prompt.push_back(r.prompt / n);
    sel.push_back(r.selections);
    evicting.push_back(r.evicting);
  }
  g.write<double>("kept_tokens", kept.data(), dims,
                  {"token", "mean prompt tokens kept per selection [layer][kv head]"});
  g.write<double>("budget_tokens", budget.data(), dims,
                  {"token", "mean budget (tokens per head, window included) [layer][kv head]"});
  g.write<double>("prompt_tokens", prompt.data(), dims,
                  {"token", "mean prompt length per selection [layer][kv head]"});
  g.write<std::uint64_t>("selections", sel.data(), dims,
                         {"", "selections made (sequences x prefills) [layer][kv head]"});
  g.write<std::uint64_t>("evicting", evicting.data(), dims,
                         {"", "selections that evicted at least one token [layer][kv head]"});
  g.write<double>("kv_bytes_dense", bytes_dense_,
                  {"byte", "prompt K+V bytes of a dense cache, summed over prefills [layer]"});
  g.write<double>("kv_bytes_kept", bytes_kept_,
                  {"byte",
                   "prompt K+V bytes of the kept tokens (compacted keys at their kept "
                   "width), summed over prefills [layer]"});
}

#define SPARSIM_INSTANTIATE_TOKEN_EVICTOR(E) template class TokenEvictorPolicy<E>;
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_TOKEN_EVICTOR)

}  // namespace sparsim::pruning
