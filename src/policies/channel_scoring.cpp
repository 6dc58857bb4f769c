#include "policies/channel_scoring.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sparsim::pruning {

const char* to_string(KvMethod m) {
  return m == KvMethod::Think ? "think" : "grace";
}

HeadGram gram_of(const std::vector<double>& q, int m, const std::vector<double>& k, int n, int d) {
  HeadGram g;
  g.d = d;
  g.gq.assign(static_cast<std::size_t>(d) * d, 0.0);
  g.gk.assign(static_cast<std::size_t>(d) * d, 0.0);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      double a = 0, b = 0;
      for (int r = 0; r < m; ++r)
        a += q[static_cast<std::size_t>(r) * d + i] * q[static_cast<std::size_t>(r) * d + j];
      for (int r = 0; r < n; ++r)
        b += k[static_cast<std::size_t>(r) * d + i] * k[static_cast<std::size_t>(r) * d + j];
      g.gq[static_cast<std::size_t>(i) * d + j] = a;
      g.gk[static_cast<std::size_t>(i) * d + j] = b;
    }
  return g;
}

double pruned_error(const HeadGram& g, const std::vector<int>& pruned) {
  double e = 0;
  for (int i : pruned)
    for (int j : pruned) e += g.q(i, j) * g.k(i, j);
  return e;
}

double total_energy(const HeadGram& g) {
  double e = 0;
  for (int i = 0; i < g.d; ++i)
    for (int j = 0; j < g.d; ++j) e += g.q(i, j) * g.k(i, j);
  return e;
}

int prune_count(double lambda, int d) {
  return static_cast<int>(std::floor(lambda * d + 1e-9));
}

namespace {
constexpr const char* kLambda = "K-channel pruning's pruned fraction λ";
constexpr const char* kProtect = "GRACE's protected range";
}  // namespace

void KvPruneOptions::check_values() const {
  require_setting(std::isfinite(lambda) && lambda >= 0 && lambda < 1, "k_channels.lambda", kLambda,
                  "must be in [0, 1) (the pruned fraction of key channels), got {}", lambda);
  require_setting(window >= 1, "k_channels.window", "K-channel pruning's observation window",
                  "must be at least 1 query, got {}", window);
  require_setting(recent >= 0, "k_channels.recent", "K-channel pruning's recent window",
                  "must be non-negative, got {}", recent);
  require_setting(std::isfinite(protect_lo) && std::isfinite(protect_hi) && protect_lo >= 0 &&
                      protect_lo <= protect_hi && protect_hi < 1,
                  "k_channels.protect", kProtect, "a,b must satisfy 0 <= a <= b < 1, got [{}, {}]",
                  protect_lo, protect_hi);
}

void KvPruneOptions::validate(int head_dim) const {
  check_values();
  const int n = prune_count(lambda, head_dim);
  require_setting(n < head_dim, "k_channels.lambda", kLambda,
                  "{} prunes ⌊λ·d⌋ = {} of the {} key channels of a head: no channel would be "
                  "left",
                  lambda, n, head_dim);
  if (method == KvMethod::Grace) {
    const int lo = static_cast<int>(std::ceil(protect_lo * head_dim - 1e-9));
    require_setting(lo <= head_dim - n, "k_channels.protect", kProtect,
                    "with lower bound {} protects at least {} of {} channels, but λ = {} prunes "
                    "{}: lower a or λ",
                    protect_lo, lo, head_dim, lambda, n);
  }
}

std::vector<int> think_prune(const HeadGram& g, int n, const std::vector<char>& candidate) {
  std::vector<int> idx;
  for (int i = 0; i < g.d; ++i)
    if (candidate.empty() || candidate[static_cast<std::size_t>(i)]) idx.push_back(i);
  require(n >= 0 && n <= static_cast<int>(idx.size()),
          "ThinK: cannot prune {} of {} candidate channels", n, idx.size());
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int a, int b) { return g.node(a) < g.node(b); });  // ties: lower index
  idx.resize(static_cast<std::size_t>(n));
  return idx;
}

Protection protect_salient(const HeadGram& g, double a, double b, int n_prune) {
  const int d = g.d;
  Protection p;
  p.is_protected.assign(static_cast<std::size_t>(d), 0);
  std::vector<double> norm(static_cast<std::size_t>(d));
  double mean = 0;
  for (int i = 0; i < d; ++i) mean += (norm[static_cast<std::size_t>(i)] = std::sqrt(g.k(i, i)));
  mean /= d;
  double var = 0;
  for (double x : norm) var += (x - mean) * (x - mean);
  const double sd = d > 1 ? std::sqrt(var / (d - 1)) : 0.0;
  for (double x : norm) p.salient += x > mean + sd ? 1 : 0;
  int count = p.salient;
  count = std::max(count, static_cast<int>(std::ceil(a * d - 1e-9)));
  count = std::min(count, static_cast<int>(std::floor(b * d + 1e-9)));
  count = std::max(0, std::min(count, d - n_prune));
  std::vector<int> order(static_cast<std::size_t>(d));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return norm[static_cast<std::size_t>(x)] > norm[static_cast<std::size_t>(y)];
  });
  for (int i = 0; i < count; ++i)
    p.is_protected[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = 1;
  p.count = count;
  return p;
}

MiesResult mies(const HeadGram& g, int n, const std::vector<char>& candidate) {
  const int d = g.d;
  std::vector<char> open(static_cast<std::size_t>(d), 1);
  int n_cand = 0;
  for (int i = 0; i < d; ++i) {
    if (!candidate.empty() && !candidate[static_cast<std::size_t>(i)])
      open[static_cast<std::size_t>(i)] = 0;
    n_cand += open[static_cast<std::size_t>(i)];
  }
  require(n >= 0 && n <= n_cand, "MIES: cannot prune {} of {} candidate channels", n, n_cand);
  // s_k: the objective increase if k joined P; starts at the node weight
  std::vector<double> s(static_cast<std::size_t>(d));
  for (int i = 0; i < d; ++i) s[static_cast<std::size_t>(i)] = g.node(i);
  MiesResult r;
  for (int step = 0; step < n; ++step) {
    int best = -1;
    for (int i = 0; i < d; ++i)
      if (open[static_cast<std::size_t>(i)] &&
          (best < 0 || s[static_cast<std::size_t>(i)] < s[static_cast<std::size_t>(best)]))
        best = i;
    open[static_cast<std::size_t>(best)] = 0;
    r.pruned.push_back(best);
    r.increments.push_back(s[static_cast<std::size_t>(best)]);
    r.objective += s[static_cast<std::size_t>(best)];
    for (int i = 0; i < d; ++i)
      if (open[static_cast<std::size_t>(i)]) s[static_cast<std::size_t>(i)] += g.edge(i, best);
  }
  return r;
}

double HeadChoice::rel(double err) const {
  return energy > 0 ? std::sqrt(std::max(0.0, err) / energy) : 0.0;
}

HeadChoice choose_channels(const HeadGram& g, const KvPruneOptions& opt) {
  const int d = g.d, n = prune_count(opt.lambda, d);
  HeadChoice c;
  c.energy = total_energy(g);
  const std::vector<int> think = think_prune(g, n);
  c.err_think = pruned_error(g, think);
  const Protection prot = protect_salient(g, opt.protect_lo, opt.protect_hi, n);
  c.salient = prot.salient;
  c.protected_count = prot.count;
  std::vector<char> cand(static_cast<std::size_t>(d));
  for (int i = 0; i < d; ++i)
    cand[static_cast<std::size_t>(i)] = prot.is_protected[static_cast<std::size_t>(i)] ? 0 : 1;
  const MiesResult m = mies(g, n, cand);
  c.err_mies = pruned_error(g, m.pruned);
  std::vector<int> grace = m.pruned;
  c.err_grace = c.err_mies;
  if (opt.guard) {
    const std::vector<int> tc = think_prune(g, n, cand);
    const double e = pruned_error(g, tc);
    if (e < c.err_mies) {
      grace = tc;
      c.err_grace = e;
      c.guard_used = true;
    }
  }
  c.pruned = opt.method == KvMethod::Think ? think : grace;
  std::sort(c.pruned.begin(), c.pruned.end());
  std::vector<char> is_pruned(static_cast<std::size_t>(d), 0);
  for (int i : c.pruned) is_pruned[static_cast<std::size_t>(i)] = 1;
  for (int i = 0; i < d; ++i)
    if (!is_pruned[static_cast<std::size_t>(i)]) c.kept.push_back(i);
  return c;
}

}  // namespace sparsim::pruning
