#include "sparsity/calibrate.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "sparsity/detail/greedy_block.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace sparsim::sparsity {

namespace {

/// Threshold masks for p during the greedy search (p ≥ 1 drops everything).
MaskParams threshold_params(const Histogram& h, double p) {
  MaskParams m;
  if (p <= 0) return m;
  m.rule = MaskRule::Threshold;
  m.p = static_cast<float>(std::min(p, 1.0));
  m.tau = p >= 1.0 ? FLT_MAX : static_cast<float>(h.threshold(p));
  return m;
}

/// The masks an evaluation applies for target p with `rule` (as make_plan builds them: p is
/// capped at 0.999).
MaskParams probe_params(ProbeRule rule, const Histogram& h, double p, double delta) {
  MaskParams m;
  if (p <= 0) return m;
  const double pi = std::min(p, 0.999);
  m.p = static_cast<float>(pi);
  if (rule == ProbeRule::Threshold) {
    m.rule = MaskRule::Threshold;
    m.tau = static_cast<float>(h.threshold(pi));
  } else if (rule == ProbeRule::TopK) {
    m.rule = MaskRule::TopK;
  } else {
    m.rule = MaskRule::Guided;
    m.delta = static_cast<float>(delta);
    m.tau = static_cast<float>(h.threshold(pi));
  }
  return m;
}

}  // namespace

std::vector<ProbeRule> probe_rules_of(const CalibrateOptions& opt, ProbeMasking masking) {
  if (!opt.probe_rules.empty()) return opt.probe_rules;
  if (masking == ProbeMasking::Threshold) return {ProbeRule::Threshold};
  return {ProbeRule::Guided, ProbeRule::TopK};
}

template <class E>
void calibrate_variant(std::shared_ptr<const Weights<E>> w, const std::vector<int>& stream,
                       const CalibrateOptions& opt, ProbeMasking masking, CalibrationVariant& out,
                       const CalibrateProgress& progress, std::vector<Calibration::Timing>* timings,
                       const std::string& prefix) {
  const Config& c = w->cfg;
  const int L = c.n_layer;
  require(opt.context >= 2 && opt.max_windows >= 1, "calibrate: bad window options");
  require(opt.greedy_seqs >= 1 && opt.greedy_tokens >= 4, "calibrate: bad greedy options");
  require(!opt.sensitivity_from.empty() && !opt.norms_modes.empty(),
          "calibrate: no sensitivity positions or norm modes");
  for (int f : opt.sensitivity_from)
    require(f >= 0 && f < opt.greedy_tokens,
            "calibrate: sensitivity position {} is outside the greedy sequences of {} tokens", f,
            opt.greedy_tokens);
  const int windows = std::min<int>(
      opt.max_windows, static_cast<int>(stream.size() / static_cast<size_t>(opt.context)));
  require(windows >= 1, "calibrate: the corpus has {} tokens, one window needs {}", stream.size(),
          opt.context);
  const std::size_t greedy_need =
      static_cast<std::size_t>(opt.greedy_seqs) * static_cast<std::size_t>(opt.greedy_tokens);
  require(stream.size() >= greedy_need, "calibrate: the corpus has {} tokens, greedy needs {}",
          stream.size(), greedy_need);
  const int max_ctx = std::max(opt.context, opt.greedy_tokens);
  Engine<E> eng(w, std::max(1, opt.greedy_seqs), max_ctx);
  E exec = eng.exec();
  StageClock clock;
  auto stage_done = [&](const std::string& name) {
    if (timings)
      timings->push_back(
          {prefix.empty() ? name : name + " (" + prefix + ")", clock.wall(), clock.cpu()});
    log().debug("calibrate {} {}: {:.1f} s wall, {:.1f} s CPU", name, prefix, clock.wall(),
                clock.cpu());
    clock.reset();
  };

  // 1. Histograms over the calibration windows (dense model).
  out.histograms.clear();
  out.histograms.reserve(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l)
    out.histograms.push_back({Histogram(opt.range_values), Histogram(opt.range_values),
                              Histogram(opt.range_values), Histogram(opt.range_values)});
  std::vector<float> host;
  eng.set_observer([&](int layer, Site site, const CMat<E>& x) {
    if (site == Site::BlockIn) return;
    host.resize(x.extent(0) * x.extent(1));
    Kokkos::View<float**, Layout, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
        host.data(), x.extent(0), x.extent(1));
    Kokkos::deep_copy(h, x);
    out.histograms[static_cast<std::size_t>(layer)][static_cast<std::size_t>(histogram_slot(site))]
        .add(host.data(), host.size());
  });
  if (progress) progress("histograms", 0, windows);
  for (int i = 0; i < windows; ++i) {
    const auto b = stream.begin() + static_cast<std::ptrdiff_t>(i) * opt.context;
    eng.forward_tail({std::vector<int>(b, b + opt.context)}, 0, 1);
    if (progress) progress("histograms", i + 1, windows);
  }
  for (auto& row : out.histograms)
    for (auto& h : row) h.finish();

  // 2. Dense block inputs of the greedy sequences (the first greedy_need tokens).
  const int G = opt.greedy_seqs, T = opt.greedy_tokens, n = G * T, D = c.d_model;
  std::vector<Mat<E>> x_in(static_cast<std::size_t>(L));
  eng.set_observer([&](int layer, Site site, const CMat<E>& x) {
    if (site != Site::BlockIn) return;
    Mat<E> copy(Kokkos::view_alloc("sparsim::calibrate::block_in", Kokkos::WithoutInitializing), n,
                D);
    Kokkos::deep_copy(exec, copy, x);
    x_in[static_cast<std::size_t>(layer)] = copy;
  });
  {
    std::vector<std::vector<int>> seqs;
    for (int s = 0; s < G; ++s)
      seqs.emplace_back(stream.begin() + static_cast<std::ptrdiff_t>(s) * T,
                        stream.begin() + static_cast<std::ptrdiff_t>(s + 1) * T);
    eng.forward_tail(seqs, 0, 1);
  }
  eng.set_observer({});
  exec.fence();
  stage_done("histograms");

  auto hist = [&](int l, Proj p) -> const Histogram& {
    return out.histograms[static_cast<std::size_t>(l)]
                         [static_cast<std::size_t>(histogram_slot(site_of(p)))];
  };

  // 3. Greedy allocation per block, with threshold masks whatever the variant (WINA's choice),
  //    scored on the last score_fraction of each sequence.
  const int score_from = T - std::max(1, static_cast<int>(std::lround(T * opt.score_fraction)));
  out.greedy.assign(static_cast<std::size_t>(L), GreedyTable{});
  const int est_steps = static_cast<int>(std::ceil(opt.cap / opt.alpha));
  int steps_before = 0;  // committed steps of the finished layers
  for (int l = 0; l < L; ++l) {
    const LayerWeights<E>& lw = w->layers[static_cast<std::size_t>(l)];
    std::vector<double> f(kNumProj);
    for (int i = 0; i < kNumProj; ++i) {
      const Matrix<E>& m = lw.proj(static_cast<Proj>(i));
      f[static_cast<std::size_t>(i)] = static_cast<double>(m.rows) * m.cols;
    }
    detail::GreedyBlock<E> gb(*w, l, CMat<E>(x_in[static_cast<std::size_t>(l)]), G, T, score_from,
                              exec);
    int steps = 0;
    GreedyEvaluator ev;
    ev.error = [&](const std::vector<double>& p, std::size_t i) {
      const Proj pr = static_cast<Proj>(i);
      return gb.error(static_cast<int>(i), threshold_params(hist(l, pr), p[i]));
    };
    ev.commit = [&](std::size_t i, const std::vector<double>&) {
      gb.commit(static_cast<int>(i));
      ++steps;
      if (progress)
        progress("greedy", steps_before + std::min(steps, est_steps),
                 steps_before + (L - l) * est_steps);
    };
    out.greedy[static_cast<std::size_t>(l)] =
        greedy_allocate(f, opt.alpha, opt.cap, opt.step_cap, ev);
    steps_before += steps;
  }
  if (progress) progress("greedy", steps_before, steps_before);
  stage_done("greedy");

  // 4. Sensitivities: block l alone masked at the greedy row nearest each probe level, every
  //    token of every sequence, per rule and norm mode; errors over positions ≥ each `from`.
  for (auto& cn : out.col_norms) cn.clear();
  const std::vector<ProbeRule> rules = probe_rules_of(opt, masking);
  bool need_norms = masking == ProbeMasking::Guided;
  for (ProbeRule r : rules) need_norms = need_norms || r != ProbeRule::Threshold;
  struct Setup {
    ProbeRule rule;
    bool norms_all;
  };
  std::vector<Setup> setups;
  for (ProbeRule r : rules) {
    if (r == ProbeRule::Threshold) {
      setups.push_back({r, false});
      continue;
    }
    for (bool a : opt.norms_modes) setups.push_back({r, a});
  }
  out.sensitivity.clear();
  for (const Setup& su : setups)
    for (int from : opt.sensitivity_from) {
      Sensitivity s;
      s.rule = su.rule;
      s.delta = su.rule == ProbeRule::Guided ? opt.delta : 0.0;
      s.norms_all = su.norms_all;
      s.from = from;
      s.e.assign(opt.probes.size(), std::vector<double>(static_cast<std::size_t>(L), 0.0));
      out.sensitivity.push_back(std::move(s));
    }

  ActivationMasker<E> masker(L);
  eng.set_masker(&masker);
  eng.set_sparse_from(0);
  Mat<E> work("sparsim::calibrate::work", n, D);
  auto run_block = [&](int l) {
    Kokkos::deep_copy(exec, work, x_in[static_cast<std::size_t>(l)]);
    eng.run_block(l, work, G, T, 0);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), work);
    return std::vector<float>(h.data(), h.data() + h.size());
  };
  auto clear_layer = [&](int l) {
    for (int i = 0; i < kNumProj; ++i) masker.set(l, static_cast<Proj>(i), MaskParams{});
  };
  const int total_runs = L * (1 + static_cast<int>(setups.size() * opt.probes.size()));
  int runs = 0;
  if (progress) progress("sensitivity", 0, total_runs);
  for (int l = 0; l < L; ++l) {
    const LayerWeights<E>& lw = w->layers[static_cast<std::size_t>(l)];
    std::array<Vec<E>, kNumProj> nv;
    if (need_norms)
      for (int i = 0; i < kNumProj; ++i) {
        const Vec<E> v = column_norms(exec, lw.proj(static_cast<Proj>(i)));
        nv[static_cast<std::size_t>(i)] = v;
        if (masking != ProbeMasking::Guided) continue;  // stored for the rotated variant
        auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
        auto& cn = out.col_norms[static_cast<std::size_t>(i)];
        cn.insert(cn.end(), hv.data(), hv.data() + hv.extent(0));
      }
    clear_layer(l);
    const std::vector<float> y = run_block(l);  // dense: no projection of l is masked
    if (progress) progress("sensitivity", ++runs, total_runs);
    for (const Setup& su : setups)
      for (std::size_t k = 0; k < opt.probes.size(); ++k) {
        const auto& row = out.greedy[static_cast<std::size_t>(l)].nearest(opt.probes[k]);
        for (int i = 0; i < kNumProj; ++i) {
          const Proj pr = static_cast<Proj>(i);
          const MaskParams m =
              probe_params(su.rule, hist(l, pr), row[static_cast<std::size_t>(i) + 1], opt.delta);
          const bool norms = m.rule != MaskRule::None && su.rule != ProbeRule::Threshold &&
                             wina_uses_norms(pr, su.norms_all);
          masker.set(l, pr, m, norms ? CVec<E>(nv[static_cast<std::size_t>(i)]) : CVec<E>());
        }
        const std::vector<float> yh = run_block(l);
        for (Sensitivity& s : out.sensitivity) {
          if (s.rule != su.rule || s.norms_all != su.norms_all) continue;
          double total = 0;
          for (int q = 0; q < G; ++q) {
            double num = 0, den = 0;
            for (int t = s.from; t < T; ++t)
              for (int j = 0; j < D; ++j) {
                const std::size_t e = (static_cast<std::size_t>(q) * T + t) * D + j;
                const double d = static_cast<double>(y[e]) - yh[e];
                num += d * d;
                den += static_cast<double>(y[e]) * y[e];
              }
            total += std::sqrt(num) / (std::sqrt(den) + 1e-6);
          }
          s.e[k][static_cast<std::size_t>(l)] = total / G;
        }
        if (progress) progress("sensitivity", ++runs, total_runs);
      }
    clear_layer(l);
  }
  eng.set_masker(nullptr);
  stage_done("sensitivity");
}

#define SPARSIM_INSTANTIATE_CALIBRATE(E)                                                          \
  template void calibrate_variant<E>(std::shared_ptr<const Weights<E>>, const std::vector<int>&,  \
                                     const CalibrateOptions&, ProbeMasking, CalibrationVariant&,  \
                                     const CalibrateProgress&, std::vector<Calibration::Timing>*, \
                                     const std::string&);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_CALIBRATE)

}  // namespace sparsim::sparsity
