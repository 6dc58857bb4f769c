#include "sparsity/calibration.hpp"

#include "core/error.hpp"
#include "io/hdf5.hpp"
#include "io/run_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <numeric>

namespace sparsim::sparsity {

// ---------------------------------------------------------------------------------------------
// Greedy allocation

const std::vector<double>& GreedyTable::nearest(double P) const {
  require(!rows.empty(), "GreedyTable::nearest: the table is empty");
  require(!std::isnan(P), "GreedyTable::nearest: P is NaN");
  std::size_t best = 0;
  double best_d = std::abs(rows[0][0] - P);
  for (std::size_t r = 1; r < rows.size(); ++r) {
    const double d = std::abs(rows[r][0] - P);
    if (d < best_d || (d == best_d && rows[r][0] < rows[best][0])) {
      best = r;
      best_d = d;
    }
  }
  return rows[best];
}

std::vector<double> GreedyTable::interpolate(double P) const {
  require(!rows.empty(), "GreedyTable::interpolate: the table is empty");
  require(!std::isnan(P), "GreedyTable::interpolate: P is NaN");
  if (P <= rows.front()[0]) return rows.front();
  if (P >= rows.back()[0]) return rows.back();
  std::size_t b = 1;
  while (b + 1 < rows.size() && rows[b][0] < P) ++b;
  const std::vector<double>& lo = rows[b - 1];
  const std::vector<double>& hi = rows[b];
  const double w = hi[0] - lo[0];
  if (!(w > 0.0)) return hi;
  const double t = (P - lo[0]) / w;
  std::vector<double> out(lo.size());
  for (std::size_t j = 0; j < lo.size(); ++j) out[j] = lo[j] + t * (hi[j] - lo[j]);
  out[0] = P;
  return out;
}

double greedy_step(double alpha, double F, double f_i, double step_cap) {
  const double s = alpha * F / f_i;
  return step_cap > 0.0 ? std::min(s, step_cap) : s;
}

GreedyTable greedy_allocate(const std::vector<double>& f, double alpha, double cap,
                            const BlockErrorFn& block_error) {
  require(static_cast<bool>(block_error), "greedy_allocate: no block error function");
  GreedyEvaluator ev;
  ev.error = [&](const std::vector<double>& p, std::size_t) { return block_error(p); };
  return greedy_allocate(f, alpha, cap, 0.0, ev);
}

GreedyTable greedy_allocate(const std::vector<double>& f, double alpha, double cap, double step_cap,
                            const GreedyEvaluator& eval) {
  const std::size_t n = f.size();
  require(n > 0, "greedy_allocate: no matrices");
  require(static_cast<bool>(eval.error), "greedy_allocate: no block error function");
  require(std::isfinite(step_cap) && step_cap >= 0.0 && step_cap <= 1.0,
          "greedy_allocate: step_cap = {} must be in [0, 1] (0: no cap)", step_cap);
  double F = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    require(std::isfinite(f[i]) && f[i] >= 0.0,
            "greedy_allocate: parameter count f[{}] = {} must be finite and >= 0", i, f[i]);
    F += f[i];
  }
  require(F > 0.0, "greedy_allocate: every parameter count is zero");
  require(std::isfinite(alpha) && alpha > 0.0, "greedy_allocate: alpha = {} must be > 0", alpha);
  require(cap > 0.0 && cap <= 1.0, "greedy_allocate: cap = {} must be in (0, 1]", cap);

  std::vector<double> step(n, 0.0);
  double max_steps = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (f[i] <= 0.0) continue;
    step[i] = greedy_step(alpha, F, f[i], step_cap);
    max_steps += std::ceil(1.0 / step[i]);
  }
  require(max_steps <= 1e7, "greedy_allocate: alpha = {} would take up to {} steps", alpha,
          max_steps);
  auto p_after = [&](std::size_t i, std::int64_t k) {
    return std::min(1.0, static_cast<double>(k) * step[i]);
  };

  GreedyTable t;
  t.n = n;
  std::vector<std::int64_t> k(n, 0);
  std::vector<double> p(n, 0.0);
  t.rows.emplace_back(n + 1, 0.0);
  double P = 0.0;
  while (P < cap) {
    std::size_t best = n;
    double best_e = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      if (f[i] <= 0.0 || p[i] >= 1.0) continue;
      const double saved = p[i];
      p[i] = p_after(i, k[i] + 1);
      const double e = eval.error(p, i);
      p[i] = saved;
      require(!std::isnan(e),
              "greedy_allocate: block error is NaN when raising matrix {} at step {}", i,
              t.rows.size());
      if (best == n || e < best_e) {
        best = i;
        best_e = e;
      }
    }
    if (best == n) break;
    ++k[best];
    p[best] = p_after(best, k[best]);
    if (eval.commit) eval.commit(best, p);
    double weighted = 0.0;
    for (std::size_t i = 0; i < n; ++i) weighted += p[i] * f[i];
    P = weighted / F;
    std::vector<double> row(n + 1);
    row[0] = P;
    std::copy(p.begin(), p.end(), row.begin() + 1);
    t.rows.push_back(std::move(row));
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Budgets

std::vector<double> block_budgets(const std::vector<double>& e, double s, double lambda, double lo,
                                  double hi) {
  require(!e.empty(), "block_budgets: no sensitivities");
  require(std::isfinite(s) && std::isfinite(lambda), "block_budgets: s = {}, lambda = {}", s,
          lambda);
  require(lo <= hi, "block_budgets: lower bound {} exceeds upper bound {}", lo, hi);
  double mean = 0.0;
  for (std::size_t i = 0; i < e.size(); ++i) {
    require(std::isfinite(e[i]), "block_budgets: sensitivity e[{}] = {} is not finite", i, e[i]);
    mean += e[i];
  }
  mean /= static_cast<double>(e.size());
  std::vector<double> out(e.size());
  for (std::size_t i = 0; i < e.size(); ++i)
    out[i] = std::clamp(s + lambda * (mean - e[i]), lo, hi);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Calibration: checks

int histogram_slot(Site s) {
  for (int i = 0; i < kNumHistogramSites; ++i)
    if (kHistogramSites[static_cast<std::size_t>(i)] == s) return i;
  fail("site '{}' has no calibration histogram", site_name(s));
}

const char* probe_rule_name(ProbeRule r) {
  switch (r) {
    case ProbeRule::Threshold:
      return "threshold";
    case ProbeRule::TopK:
      return "topk";
    case ProbeRule::Guided:
      break;
  }
  return "guided";
}

ProbeRule parse_probe_rule(const std::string& s) {
  if (s == "threshold") return ProbeRule::Threshold;
  if (s == "topk") return ProbeRule::TopK;
  if (s == "guided") return ProbeRule::Guided;
  fail("probe masking '{}' is not one of threshold, topk, guided", s);
}

bool Sensitivity::matches(ProbeRule r, double d, bool all, int first) const {
  if (r != rule || first != from) return false;
  if (rule == ProbeRule::Threshold) return true;
  if (all != norms_all) return false;
  return rule != ProbeRule::Guided || std::fabs(d - delta) < 1e-9;
}

std::string Sensitivity::describe() const {
  std::string s = probe_rule_name(rule);
  if (rule == ProbeRule::Guided) s += fmt::format(" δ = {:g}", delta);
  if (rule != ProbeRule::Threshold) s += norms_all ? ", norms on all" : ", norms on k,gate";
  return s + fmt::format(", positions ≥ {}", from);
}

const Sensitivity* CalibrationVariant::find_sensitivity(ProbeRule r, double delta, bool norms_all,
                                                        int from) const {
  for (const Sensitivity& s : sensitivity)
    if (s.matches(r, delta, norms_all, from)) return &s;
  return nullptr;
}

int Calibration::d_in(Proj p) const {
  switch (p) {
    case Proj::O:
      return q_dim;
    case Proj::Down:
      return d_ff;
    default:
      return d_model;
  }
}

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const char* const kVariantNames[2] = {"plain", "rotated"};

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

void validate_variant(const Calibration& c, const CalibrationVariant& v, const char* name) {
  const auto L = static_cast<std::size_t>(c.n_layer);
  const auto D = static_cast<std::size_t>(c.d_model);
  require(v.histograms.size() == L, "{}: {} layers of histograms, expected {}", name,
          v.histograms.size(), L);
  for (std::size_t l = 0; l < L; ++l)
    for (int s = 0; s < kNumHistogramSites; ++s) {
      const Histogram& h = v.histograms[l][static_cast<std::size_t>(s)];
      require(h.finished(), "{}: histogram of layer {} site '{}' is not finished", name, l,
              site_name(kHistogramSites[static_cast<std::size_t>(s)]));
    }
  if (!v.greedy.empty()) {
    require(v.greedy.size() == L, "{}: {} greedy tables, expected {}", name, v.greedy.size(), L);
    for (std::size_t l = 0; l < L; ++l) {
      const GreedyTable& t = v.greedy[l];
      require(t.n == kNumProj, "{}: greedy table of layer {} covers {} matrices, expected {}", name,
              l, t.n, kNumProj);
      require(!t.rows.empty(), "{}: greedy table of layer {} has no rows", name, l);
      double prev_P = 0.0;
      for (std::size_t r = 0; r < t.rows.size(); ++r) {
        const std::vector<double>& row = t.rows[r];
        require(row.size() == kNumProj + 1, "{}: greedy table of layer {} row {} has {} columns",
                name, l, r, row.size());
        for (std::size_t j = 0; j < row.size(); ++j)
          require(std::isfinite(row[j]) && row[j] >= 0.0 && row[j] <= 1.0,
                  "{}: greedy table of layer {} row {} column {} is {} (must be in [0, 1])", name,
                  l, r, j, row[j]);
        if (r == 0)
          require(std::all_of(row.begin(), row.end(), [](double x) { return x == 0.0; }),
                  "{}: greedy table of layer {} does not start with an all-zero row", name, l);
        require(row[0] >= prev_P, "{}: greedy table of layer {}: P decreases at row {}", name, l,
                r);
        prev_P = row[0];
      }
    }
  }
  for (std::size_t si = 0; si < v.sensitivity.size(); ++si) {
    const Sensitivity& set = v.sensitivity[si];
    require(set.e.size() == c.probe_levels.size(),
            "{}: sensitivity set {} has {} rows but there are {} probe levels", name, si,
            set.e.size(), c.probe_levels.size());
    require(std::isfinite(set.delta) && set.delta >= 0.0 && set.delta < 0.5,
            "{}: sensitivity set {} has δ = {} (must be in [0, 0.5))", name, si, set.delta);
    require(set.from >= 0, "{}: sensitivity set {} starts at position {}", name, si, set.from);
    for (std::size_t sj = 0; sj < si; ++sj)
      require(!v.sensitivity[sj].matches(set.rule, set.delta, set.norms_all, set.from),
              "{}: sensitivity sets {} and {} have the same settings ({})", name, sj, si,
              set.describe());
    for (std::size_t k = 0; k < set.e.size(); ++k) {
      require(set.e[k].size() == L, "{}: sensitivity set {} row {} has {} layers, expected {}",
              name, si, k, set.e[k].size(), L);
      for (std::size_t l = 0; l < L; ++l)
        require(std::isfinite(set.e[k][l]) && set.e[k][l] >= 0.0,
                "{}: sensitivity set {} at probe {} layer {} is {}", name, si, k, l, set.e[k][l]);
    }
  }
  if (!v.q_attn.empty()) {
    require(v.q_attn.size() == (L + 1) * D * D, "{}: q_attn holds {} values, expected {} x {} x {}",
            name, v.q_attn.size(), L + 1, D, D);
    require(all_finite(v.q_attn), "{}: q_attn holds a non-finite value", name);
  }
  if (!v.q_mlp.empty()) {
    require(v.q_mlp.size() == L * D * D, "{}: q_mlp holds {} values, expected {} x {} x {}", name,
            v.q_mlp.size(), L, D, D);
    require(all_finite(v.q_mlp), "{}: q_mlp holds a non-finite value", name);
  }
  for (int pi = 0; pi < kNumProj; ++pi) {
    const auto p = static_cast<Proj>(pi);
    const std::vector<float>& cn = v.col_norms[static_cast<std::size_t>(pi)];
    if (cn.empty()) continue;
    const auto din = static_cast<std::size_t>(c.d_in(p));
    require(cn.size() == L * din, "{}: column norms of '{}' hold {} values, expected {} x {}", name,
            proj_name(p), cn.size(), L, din);
    for (std::size_t j = 0; j < cn.size(); ++j)
      require(std::isfinite(cn[j]) && cn[j] >= 0.0f,
              "{}: column norm of '{}' layer {} column {} is {}", name, proj_name(p), j / din,
              j % din, cn[j]);
  }
}

}  // namespace

void Calibration::validate() const {
  require(!model_fingerprint.empty(), "calibration: model_fingerprint is empty");
  require(n_layer > 0 && d_model > 0 && d_ff > 0 && q_dim > 0 && kv_dim > 0,
          "calibration: model shape n_layer {} d_model {} d_ff {} q_dim {} kv_dim {} must be "
          "positive",
          n_layer, d_model, d_ff, q_dim, kv_dim);
  require(tokens >= 0 && windows >= 0 && context >= 0 && greedy_tokens >= 0,
          "calibration: negative tokens {}, windows {}, context {} or greedy_tokens {}", tokens,
          windows, context, greedy_tokens);
  require(greedy_seqs >= 0 && greedy_seq_tokens >= 0 &&
              static_cast<std::int64_t>(greedy_seqs) * greedy_seq_tokens == greedy_tokens,
          "calibration: {} greedy sequences of {} tokens do not make greedy_tokens {}", greedy_seqs,
          greedy_seq_tokens, greedy_tokens);
  require(std::isfinite(greedy_step_cap) && greedy_step_cap >= 0.0 && greedy_step_cap <= 1.0,
          "calibration: greedy_step_cap = {} not in [0, 1]", greedy_step_cap);
  require(std::isfinite(alpha) && alpha > 0.0, "calibration: alpha = {} must be > 0", alpha);
  require(greedy_cap > 0.0 && greedy_cap <= 1.0, "calibration: greedy_cap = {} not in (0, 1]",
          greedy_cap);
  require(greedy_score_fraction > 0.0 && greedy_score_fraction <= 1.0,
          "calibration: greedy_score_fraction = {} not in (0, 1]", greedy_score_fraction);
  require(histogram_range_values >= 1, "calibration: histogram_range_values = {} must be >= 1",
          histogram_range_values);
  for (std::size_t k = 0; k < probe_levels.size(); ++k)
    require(probe_levels[k] >= 0.0 && probe_levels[k] < 1.0,
            "calibration: probe level {} = {} not in [0, 1)", k, probe_levels[k]);
  require(
      plain.has_value() || rotated.has_value() || fisher.has_value() || probe_history.has_value(),
      "calibration: neither the plain nor the rotated variant, Fisher scores nor Probe "
      "Pruning's history are present");
  if (probe_history) {
    probe_history->validate();
    probe_history->check_covers(n_layer, q_dim, d_ff, "calibration: ");
  }
  if (plain) validate_variant(*this, *plain, "plain");
  if (rotated) validate_variant(*this, *rotated, "rotated");
  if (fisher) {
    fisher->validate();
    require(fisher->n_layer == n_layer && fisher->kv_dim() == kv_dim,
            "calibration: Fisher scores cover {} layers of {} K/V channels, the model has {} of {}",
            fisher->n_layer, fisher->kv_dim(), n_layer, kv_dim);
  }
}

void Calibration::check_model(const std::string& fingerprint, const Config& cfg,
                              const std::string& what) const {
  const std::string src = file.empty() ? std::string("(in memory)") : file;
  if (lower(fingerprint) != lower(model_fingerprint))
    fail("calibration file {} was made for model fingerprint {} (path {}), this model ({}) is {}",
         src, model_fingerprint, model_path, what, fingerprint);
  if (cfg.n_layer != n_layer || cfg.d_model != d_model || cfg.d_ff != d_ff ||
      cfg.q_dim() != q_dim || cfg.kv_dim() != kv_dim)
    fail(
        "calibration file {} was made for a model of shape n_layer {} d_model {} d_ff {} q_dim {} "
        "kv_dim {}, this model ({}) has n_layer {} d_model {} d_ff {} q_dim {} kv_dim {}",
        src, n_layer, d_model, d_ff, q_dim, kv_dim, what, cfg.n_layer, cfg.d_model, cfg.d_ff,
        cfg.q_dim(), cfg.kv_dim());
}

void Calibration::check_model(std::uint64_t fingerprint, const Config& cfg,
                              const std::string& what) const {
  check_model(fmt::format("{:016x}", fingerprint), cfg, what);
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

using Dims = std::vector<hsize_t>;

void write_variant(io::Group g, const Calibration& c, const CalibrationVariant& v) {
  const auto L = static_cast<std::size_t>(c.n_layer);
  const auto D = static_cast<hsize_t>(c.d_model);
  constexpr std::size_t B = Histogram::kNumBins;

  io::Group hg = g.create_group("histograms");
  for (int s = 0; s < kNumHistogramSites; ++s) {
    const auto slot = static_cast<std::size_t>(s);
    const std::string site = site_name(kHistogramSites[slot]);
    io::Group sg = hg.create_group(site);
    std::vector<std::uint64_t> counts(L * B), count(L);
    std::vector<double> lo(L), hi(L), mn(L), mx(L), sum(L), sumsq(L);
    for (std::size_t l = 0; l < L; ++l) {
      const Histogram& h = v.histograms[l][slot];
      std::copy(h.counts().begin(), h.counts().end(), counts.begin() + l * B);
      count[l] = h.count();
      lo[l] = h.count() ? h.lo() : 0.0;
      hi[l] = h.count() ? h.hi() : 0.0;
      mn[l] = h.min();
      mx[l] = h.max();
      sum[l] = h.sum();
      sumsq[l] = h.sumsq();
    }
    sg.write<std::uint64_t>(
        "counts", counts.data(), {L, B},
        {"1", fmt::format("[layer][bin] values at {} per bin: bin 0 < lo, bin 1+i in "
                          "[lo + i*w, lo + (i+1)*w) with w = (hi - lo)/10000, bin 10001 >= hi",
                          site)});
    sg.write("count", count, {"1", "[layer] values histogrammed (sum of counts over bins)"});
    sg.write("lo", lo, {"1", "[layer] lower range edge: 1% quantile of the first values"});
    sg.write("hi", hi, {"1", "[layer] upper range edge: 99% quantile of the first values"});
    sg.write("min", mn, {"1", "[layer] exact minimum of all values"});
    sg.write("max", mx, {"1", "[layer] exact maximum of all values"});
    sg.write("sum", sum, {"1", "[layer] sum of all values"});
    sg.write("sumsq", sumsq, {"1", "[layer] sum of squares of all values"});
  }

  if (!v.greedy.empty()) {
    io::Group gg = g.create_group("greedy");
    std::size_t R = 0;
    for (const GreedyTable& t : v.greedy) R = std::max(R, t.rows.size());
    constexpr std::size_t C = kNumProj + 1;
    std::vector<double> rows(L * R * C, std::numeric_limits<double>::quiet_NaN());
    std::vector<std::int64_t> nrows(L);
    for (std::size_t l = 0; l < L; ++l) {
      const GreedyTable& t = v.greedy[l];
      nrows[l] = static_cast<std::int64_t>(t.rows.size());
      for (std::size_t r = 0; r < t.rows.size(); ++r)
        std::copy(t.rows[r].begin(), t.rows[r].end(), rows.begin() + (l * R + r) * C);
    }
    gg.write<double>("rows", rows.data(), {L, R, C},
                     {"1",
                      "[layer][row][column] greedy table rows (P, p_q, p_k, p_v, p_o, p_gate, "
                      "p_up, p_down); rows at or beyond row_count[layer] are NaN padding"});
    gg.write("row_count", nrows, {"1", "[layer] valid rows of each layer's greedy table"});
  }

  if (!v.sensitivity.empty()) {
    io::Group sg = g.create_group("sensitivity");
    for (std::size_t si = 0; si < v.sensitivity.size(); ++si) {
      const Sensitivity& set = v.sensitivity[si];
      const std::size_t P = set.e.size();
      std::vector<double> e(P * L);
      for (std::size_t k = 0; k < P; ++k)
        std::copy(set.e[k].begin(), set.e[k].end(), e.begin() + k * L);
      io::Group one = sg.create_group(std::to_string(si));
      one.set_attr("rule", std::string(probe_rule_name(set.rule)));
      one.set_attr("delta", set.delta);
      one.set_attr("norms", std::string(set.rule == ProbeRule::Threshold ? "none"
                                        : set.norms_all                  ? "all"
                                                                         : "kg"));
      one.set_attr("from", static_cast<std::int64_t>(set.from));
      one.write<double>("e", e.data(), {P, L},
                        {"1",
                         "[probe][layer] mean over the sequences of the relative block-output "
                         "error (positions >= from) with only that block sparsified at probe "
                         "level /probe_levels[probe], masked by `rule`"});
    }
  }

  if (!v.q_attn.empty())
    g.write<double>("rotation/q_attn", v.q_attn.data(), {L + 1, D, D},
                    {"1", "[i][row][col] WINA rotation Q_attn,i (i = n_layer: Q_final)"});
  if (!v.q_mlp.empty())
    g.write<double>("rotation/q_mlp", v.q_mlp.data(), {L, D, D},
                    {"1", "[i][row][col] WINA rotation Q_mlp,i"});

  for (int pi = 0; pi < kNumProj; ++pi) {
    const auto p = static_cast<Proj>(pi);
    const std::vector<float>& cn = v.col_norms[static_cast<std::size_t>(pi)];
    if (cn.empty()) continue;
    g.write<float>(fmt::format("column_norms/{}", proj_name(p)), cn.data(),
                   {L, static_cast<hsize_t>(c.d_in(p))},
                   {"1", fmt::format("[layer][input column] L2 norm of each input column of the "
                                     "{} projection weight as used at run time",
                                     proj_name(p))});
  }
}

void write_fisher(io::Group g, const calibration::FisherScores& f) {
  const auto S = static_cast<hsize_t>(f.sequences), L = static_cast<hsize_t>(f.n_layer),
             KV = static_cast<hsize_t>(f.kv_dim()), H = static_cast<hsize_t>(f.n_kv_head),
             P = static_cast<hsize_t>(f.head_dim / 2);
  g.set_attr("sequences", f.sequences);
  g.set_attr("tokens", f.tokens);
  g.set_attr("n_kv_head", f.n_kv_head);
  g.set_attr("head_dim", f.head_dim);
  g.set_attr("rope_layout", f.rope_layout);
  g.set_attr("forward_seconds", f.forward_seconds);
  g.set_attr("backward_seconds", f.backward_seconds);
  g.write<double>("loss", f.loss.data(), {S},
                  {"nat", "[sequence] mean next-token cross-entropy of each calibration sequence"});
  g.write<double>("gate_grad_k", f.gate_k.data(), {S, L, KV},
                  {"nat", "[sequence][layer][kv channel] G_c = sum_t dL/dk_tc * k_tc (pre-RoPE)"});
  g.write<double>("gate_grad_v", f.gate_v.data(), {S, L, KV},
                  {"nat", "[sequence][layer][kv channel] G_c = sum_t dL/dv_tc * v_tc"});
  g.write<double>("k", f.k.data(), {L, KV},
                  {"nat^2", "[layer][kv channel] Fisher score F_c = sum over sequences of G_c^2"});
  g.write<double>("v", f.v.data(), {L, KV},
                  {"nat^2", "[layer][kv channel] Fisher score of the V channels"});
  g.write<double>("pair", f.pair.data(), {L, H, P},
                  {"nat^2",
                   "[layer][kv head][RoPE frequency index] F_p = sum over sequences of "
                   "(G_c + G_c')^2 over the pair's two K channels"});
}

void write_probe_history(io::Group g, const calibration::ProbeHistory& h) {
  const auto L = static_cast<hsize_t>(h.n_layer), T = static_cast<hsize_t>(h.tokens);
  g.set_attr("sequences", h.sequences);
  g.set_attr("tokens", h.tokens);
  g.set_attr("fusion", std::string("dynamic ratio: r = p / (p + h + 1e-6), (1 - r) h + r p"));
  g.write<float>("o", h.o.data(), {L, T, static_cast<hsize_t>(h.o_width)},
                 {"1",
                  "[layer][position][W_o input channel] mean over the calibration sequences "
                  "of x^2"});
  g.write<float>("down", h.down.data(), {L, T, static_cast<hsize_t>(h.down_width)},
                 {"1",
                  "[layer][position][W_down input channel] mean over the calibration "
                  "sequences of x^2"});
}

}  // namespace

void write_calibration(const std::string& path, const Calibration& cal) {
  cal.validate();
  io::RunFile out(path);
  io::Group root = out.root();
  root.set_attr("format", kCalibrationFormat);
  root.set_attr("version", kCalibrationVersion);
  root.set_attr("sparsim_version", SPARSIM_VERSION);
  root.set_attr("command", cal.command);
  root.set_attr("model_fingerprint", cal.model_fingerprint);
  root.set_attr("model_path", cal.model_path);
  root.set_attr("corpus_fingerprint", cal.corpus_fingerprint);
  root.set_attr("corpus_path", cal.corpus_path);
  root.set_attr("n_layer", cal.n_layer);
  root.set_attr("d_model", cal.d_model);
  root.set_attr("d_ff", cal.d_ff);
  root.set_attr("q_dim", cal.q_dim);
  root.set_attr("kv_dim", cal.kv_dim);
  root.set_attr("tokens", cal.tokens);
  root.set_attr("context", cal.context);
  root.set_attr("windows", cal.windows);
  root.set_attr("alpha", cal.alpha);
  root.set_attr("greedy_cap", cal.greedy_cap);
  root.set_attr("greedy_tokens", cal.greedy_tokens);
  root.set_attr("greedy_score_fraction", cal.greedy_score_fraction);
  root.set_attr("greedy_seqs", static_cast<std::int64_t>(cal.greedy_seqs));
  root.set_attr("greedy_seq_tokens", static_cast<std::int64_t>(cal.greedy_seq_tokens));
  root.set_attr("greedy_step_cap", cal.greedy_step_cap);
  root.set_attr("greedy_masking", std::string("threshold"));
  root.set_attr("histogram_bins", static_cast<std::int64_t>(Histogram::kUniformBins));
  root.set_attr("histogram_range_values", cal.histogram_range_values);
  root.write("probe_levels", cal.probe_levels,
             {"1", "[probe] probe sparsities of the sensitivity measurement"});
  if (cal.plain) write_variant(root.create_group("plain"), cal, *cal.plain);
  if (cal.rotated) write_variant(root.create_group("rotated"), cal, *cal.rotated);
  if (cal.fisher) write_fisher(root.create_group("fisher"), *cal.fisher);
  if (cal.probe_history)
    write_probe_history(root.create_group("probe_history"), *cal.probe_history);
  if (!cal.timings.empty()) {
    io::Group tg = root.create_group("timings");
    std::vector<std::string> names;
    std::vector<double> wall, cpu;
    for (const auto& t : cal.timings) {
      names.push_back(t.stage);
      wall.push_back(t.wall_seconds);
      cpu.push_back(t.cpu_seconds);
    }
    tg.write_strings("stage", names, {"", "calibration stages in the order run"});
    tg.write("wall_seconds", wall, {"s", "[stage] wall-clock seconds"});
    tg.write("cpu_seconds", cpu, {"s", "[stage] CPU seconds of the process (all threads)"});
  }
  out.commit();
}

// ---------------------------------------------------------------------------------------------
// Reading

namespace {

std::string shape_str(const Dims& d) {
  if (d.empty()) return "scalar";
  std::string s;
  for (hsize_t x : d) s += fmt::format("[{}]", x);
  return s;
}

std::string obj_path(const io::Group& g, const std::string& name) {
  return g.path() == "/" ? "/" + name : g.path() + "/" + name;
}

template <class T>
std::vector<T> read_shaped(const io::Group& g, const std::string& name, const Dims& want) {
  Dims dims;
  std::vector<T> v = g.read<T>(name, &dims);
  require(dims == want, "dataset '{}' has shape {}, expected {}", obj_path(g, name),
          shape_str(dims), shape_str(want));
  return v;
}

template <class T>
void require_finite(const std::vector<T>& v, const io::Group& g, const std::string& name) {
  for (std::size_t i = 0; i < v.size(); ++i)
    require(std::isfinite(v[i]), "dataset '{}' holds a non-finite value ({}) at flat index {}",
            obj_path(g, name), v[i], i);
}

int int_attr(const io::Group& g, const std::string& name) {
  const std::int64_t v = g.get_attr<std::int64_t>(name);
  require(v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max(),
          "attribute '{}' = {} is out of range", name, v);
  return static_cast<int>(v);
}

CalibrationVariant read_variant(const io::Group& g, const Calibration& c) {
  const auto L = static_cast<hsize_t>(c.n_layer);
  const auto D = static_cast<hsize_t>(c.d_model);
  constexpr hsize_t B = Histogram::kNumBins;
  CalibrationVariant v;
  v.histograms.resize(L);

  const io::Group hg = g.open_group("histograms");
  for (int s = 0; s < kNumHistogramSites; ++s) {
    const auto slot = static_cast<std::size_t>(s);
    const io::Group sg = hg.open_group(site_name(kHistogramSites[slot]));
    const auto counts = read_shaped<std::uint64_t>(sg, "counts", {L, B});
    const auto count = read_shaped<std::uint64_t>(sg, "count", {L});
    std::vector<std::vector<double>> stat;
    for (const char* name : {"lo", "hi", "min", "max", "sum", "sumsq"}) {
      stat.push_back(read_shaped<double>(sg, name, {L}));
      require_finite(stat.back(), sg, name);
    }
    for (hsize_t l = 0; l < L; ++l) {
      try {
        v.histograms[l][slot] = Histogram::restore(
            stat[0][l], stat[1][l],
            std::vector<std::uint64_t>(counts.begin() + static_cast<std::ptrdiff_t>(l * B),
                                       counts.begin() + static_cast<std::ptrdiff_t>((l + 1) * B)),
            stat[2][l], stat[3][l], count[l], stat[4][l], stat[5][l]);
      } catch (const Error& e) {
        fail("histogram '{}' layer {}: {}", sg.path(), l, e.what());
      }
    }
  }

  if (g.has_group("greedy")) {
    const io::Group gg = g.open_group("greedy");
    Dims dims;
    const std::vector<double> rows = gg.read<double>("rows", &dims);
    constexpr hsize_t C = kNumProj + 1;
    require(dims.size() == 3 && dims[0] == L && dims[2] == C,
            "dataset '{}' has shape {}, expected [{}][rows][{}]", obj_path(gg, "rows"),
            shape_str(dims), L, C);
    const hsize_t R = dims[1];
    const auto nrows = read_shaped<std::int64_t>(gg, "row_count", {L});
    v.greedy.resize(L);
    for (hsize_t l = 0; l < L; ++l) {
      require(nrows[l] >= 1 && static_cast<hsize_t>(nrows[l]) <= R,
              "dataset '{}': layer {} has {} rows, expected 1 to {}", obj_path(gg, "row_count"), l,
              nrows[l], R);
      GreedyTable& t = v.greedy[l];
      t.n = kNumProj;
      for (hsize_t r = 0; r < static_cast<hsize_t>(nrows[l]); ++r) {
        const auto first = rows.begin() + static_cast<std::ptrdiff_t>((l * R + r) * C);
        t.rows.emplace_back(first, first + C);
      }
    }
  }

  if (g.has_group("sensitivity")) {
    const io::Group sg = g.open_group("sensitivity");
    const auto P = static_cast<hsize_t>(c.probe_levels.size());
    for (int si = 0; sg.has_group(std::to_string(si)); ++si) {
      const io::Group one = sg.open_group(std::to_string(si));
      Sensitivity set;
      set.rule = parse_probe_rule(one.get_attr<std::string>("rule"));
      set.delta = one.get_attr<double>("delta");
      const std::string norms = one.get_attr<std::string>("norms");
      require(norms == "kg" || norms == "all" || norms == "none",
              "'{}' has norms '{}' (expected kg, all or none)", one.path(), norms);
      set.norms_all = norms == "all";
      set.from = int_attr(one, "from");
      const auto e = read_shaped<double>(one, "e", {P, L});
      require_finite(e, one, "e");
      for (hsize_t k = 0; k < P; ++k)
        set.e.emplace_back(e.begin() + static_cast<std::ptrdiff_t>(k * L),
                           e.begin() + static_cast<std::ptrdiff_t>((k + 1) * L));
      v.sensitivity.push_back(std::move(set));
    }
  }

  if (g.has_dataset("rotation/q_attn")) {
    v.q_attn = read_shaped<double>(g, "rotation/q_attn", {L + 1, D, D});
    require_finite(v.q_attn, g, "rotation/q_attn");
  }
  if (g.has_dataset("rotation/q_mlp")) {
    v.q_mlp = read_shaped<double>(g, "rotation/q_mlp", {L, D, D});
    require_finite(v.q_mlp, g, "rotation/q_mlp");
  }
  for (int pi = 0; pi < kNumProj; ++pi) {
    const auto p = static_cast<Proj>(pi);
    const std::string name = fmt::format("column_norms/{}", proj_name(p));
    if (!g.has_dataset(name)) continue;
    v.col_norms[static_cast<std::size_t>(pi)] =
        read_shaped<float>(g, name, {L, static_cast<hsize_t>(c.d_in(p))});
  }
  return v;
}

calibration::FisherScores read_fisher(const io::Group& g, const Calibration& c) {
  calibration::FisherScores f;
  f.sequences = int_attr(g, "sequences");
  f.tokens = int_attr(g, "tokens");
  f.n_layer = c.n_layer;
  f.n_kv_head = int_attr(g, "n_kv_head");
  f.head_dim = int_attr(g, "head_dim");
  f.rope_layout = g.get_attr<std::string>("rope_layout");
  f.forward_seconds = g.get_attr<double>("forward_seconds");
  f.backward_seconds = g.get_attr<double>("backward_seconds");
  require(f.sequences >= 1 && f.n_kv_head >= 1 && f.head_dim >= 2 &&
              f.n_kv_head * f.head_dim == c.kv_dim,
          "'{}': {} sequences, {} KV heads of width {} do not fit kv_dim {}", g.path(), f.sequences,
          f.n_kv_head, f.head_dim, c.kv_dim);
  const auto S = static_cast<hsize_t>(f.sequences), L = static_cast<hsize_t>(c.n_layer),
             KV = static_cast<hsize_t>(c.kv_dim), H = static_cast<hsize_t>(f.n_kv_head),
             P = static_cast<hsize_t>(f.head_dim / 2);
  f.loss = read_shaped<double>(g, "loss", {S});
  f.gate_k = read_shaped<double>(g, "gate_grad_k", {S, L, KV});
  f.gate_v = read_shaped<double>(g, "gate_grad_v", {S, L, KV});
  f.k = read_shaped<double>(g, "k", {L, KV});
  f.v = read_shaped<double>(g, "v", {L, KV});
  f.pair = read_shaped<double>(g, "pair", {L, H, P});
  require_finite(f.loss, g, "loss");
  require_finite(f.gate_k, g, "gate_grad_k");
  require_finite(f.gate_v, g, "gate_grad_v");
  require_finite(f.k, g, "k");
  require_finite(f.v, g, "v");
  require_finite(f.pair, g, "pair");
  return f;
}

calibration::ProbeHistory read_probe_history(const io::Group& g, const Calibration& c) {
  calibration::ProbeHistory h;
  h.sequences = int_attr(g, "sequences");
  h.tokens = int_attr(g, "tokens");
  h.n_layer = c.n_layer;
  h.o_width = c.q_dim;
  h.down_width = c.d_ff;
  require(h.sequences >= 1 && h.tokens >= 1, "'{}': {} sequences of {} tokens", g.path(),
          h.sequences, h.tokens);
  const auto L = static_cast<hsize_t>(c.n_layer), T = static_cast<hsize_t>(h.tokens);
  h.o = read_shaped<float>(g, "o", {L, T, static_cast<hsize_t>(c.q_dim)});
  h.down = read_shaped<float>(g, "down", {L, T, static_cast<hsize_t>(c.d_ff)});
  require_finite(h.o, g, "o");
  require_finite(h.down, g, "down");
  return h;
}

Calibration read_impl(const std::string& path) {
  io::H5File f = io::H5File::open_read(path);
  const io::Group root = f.root();
  if (!root.has_attr("format")) fail("not a sparsim calibration file (no 'format' attribute)");
  const std::string format = root.get_attr<std::string>("format");
  require(format == kCalibrationFormat,
          "not a sparsim calibration file (format '{}', expected '{}')", format,
          kCalibrationFormat);
  const std::int64_t version = root.get_attr<std::int64_t>("version");
  require(version == kCalibrationVersion,
          "layout version {} is not supported (this sparsim reads version {}; make the file "
          "again with sparsim calibrate)",
          version, kCalibrationVersion);
  const std::int64_t bins = root.get_attr<std::int64_t>("histogram_bins");
  require(bins == static_cast<std::int64_t>(Histogram::kUniformBins),
          "histograms have {} bins, this sparsim uses {}", bins, Histogram::kUniformBins);

  Calibration c;
  c.file = path;
  c.command = root.get_attr<std::string>("command");
  c.model_fingerprint = root.get_attr<std::string>("model_fingerprint");
  c.model_path = root.get_attr<std::string>("model_path");
  c.corpus_fingerprint = root.get_attr<std::string>("corpus_fingerprint");
  c.corpus_path = root.get_attr<std::string>("corpus_path");
  c.n_layer = int_attr(root, "n_layer");
  c.d_model = int_attr(root, "d_model");
  c.d_ff = int_attr(root, "d_ff");
  c.q_dim = int_attr(root, "q_dim");
  c.kv_dim = int_attr(root, "kv_dim");
  require(c.n_layer > 0 && c.d_model > 0 && c.d_ff > 0 && c.q_dim > 0 && c.kv_dim > 0,
          "model shape n_layer {} d_model {} d_ff {} q_dim {} kv_dim {} must be positive",
          c.n_layer, c.d_model, c.d_ff, c.q_dim, c.kv_dim);
  c.tokens = root.get_attr<std::int64_t>("tokens");
  c.context = int_attr(root, "context");
  c.windows = root.get_attr<std::int64_t>("windows");
  c.alpha = root.get_attr<double>("alpha");
  c.greedy_cap = root.get_attr<double>("greedy_cap");
  c.greedy_tokens = root.get_attr<std::int64_t>("greedy_tokens");
  c.greedy_score_fraction = root.get_attr<double>("greedy_score_fraction");
  c.greedy_seqs = int_attr(root, "greedy_seqs");
  c.greedy_seq_tokens = int_attr(root, "greedy_seq_tokens");
  c.greedy_step_cap = root.get_attr<double>("greedy_step_cap");
  c.histogram_range_values = root.get_attr<std::int64_t>("histogram_range_values");
  {
    Dims dims;
    c.probe_levels = root.read<double>("probe_levels", &dims);
    require(dims.size() == 1, "dataset '/probe_levels' has shape {}, expected [probes]",
            shape_str(dims));
    require_finite(c.probe_levels, root, "probe_levels");
  }
  for (const char* name : kVariantNames) {
    if (!root.has(name)) continue;
    require(root.has_group(name), "'/{}' is not a group", name);
    CalibrationVariant v = read_variant(root.open_group(name), c);
    (std::string(name) == "plain" ? c.plain : c.rotated) = std::move(v);
  }
  if (root.has("fisher")) {
    require(root.has_group("fisher"), "'/fisher' is not a group");
    c.fisher = read_fisher(root.open_group("fisher"), c);
  }
  if (root.has("probe_history")) {
    require(root.has_group("probe_history"), "'/probe_history' is not a group");
    c.probe_history = read_probe_history(root.open_group("probe_history"), c);
  }
  if (root.has_group("timings")) {
    const io::Group tg = root.open_group("timings");
    const std::vector<std::string> names = tg.read_strings("stage");
    const auto wall = read_shaped<double>(tg, "wall_seconds", {names.size()});
    const auto cpu = read_shaped<double>(tg, "cpu_seconds", {names.size()});
    for (std::size_t i = 0; i < names.size(); ++i) c.timings.push_back({names[i], wall[i], cpu[i]});
  }
  c.validate();
  return c;
}

}  // namespace

Calibration read_calibration(const std::string& path) {
  try {
    return read_impl(path);
  } catch (const Error& e) {
    fail("invalid calibration file '{}': {}", path, e.what());
  }
}

}  // namespace sparsim::sparsity
