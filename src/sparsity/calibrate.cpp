#include "sparsity/calibrate.hpp"

#include "core/error.hpp"
#include "core/log.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace sparsim::sparsity {

namespace {

/// Copies a device matrix's rows to the host (row-major).
template <class E>
std::vector<float> to_host_rows(const CMat<E>& x) {
  std::vector<float> out(x.extent(0) * x.extent(1));
  Kokkos::View<float**, Layout, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(
      out.data(), x.extent(0), x.extent(1));
  Kokkos::deep_copy(h, x);
  return out;
}

/// Threshold masks for p (p ≥ 1 drops everything).
MaskParams threshold_params(const Histogram& h, double p) {
  MaskParams m;
  m.rule = MaskRule::Threshold;
  m.p = static_cast<float>(std::min(p, 1.0));
  m.tau = p >= 1.0 ? FLT_MAX : static_cast<float>(h.threshold(p));
  return m;
}

MaskParams guided_params(const Histogram& h, double p, double delta) {
  MaskParams m;
  m.rule = MaskRule::Guided;
  m.p = static_cast<float>(std::min(p, 0.999));
  m.delta = static_cast<float>(delta);
  m.tau = p >= 1.0 ? FLT_MAX : static_cast<float>(h.threshold(std::min(p, 0.999)));
  return m;
}

}  // namespace

template <class E>
void calibrate_variant(std::shared_ptr<const Weights<E>> w, const std::vector<int>& stream,
                       const CalibrateOptions& opt, ProbeMasking masking, CalibrationVariant& out,
                       const CalibrateProgress& progress) {
  const Config& c = w->cfg;
  const int L = c.n_layer;
  require(opt.context >= 2 && opt.max_windows >= 1, "calibrate: bad window options");
  require(opt.greedy_seqs >= 1 && opt.greedy_tokens >= 4, "calibrate: bad greedy options");
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

  // 1. Histograms over the calibration windows (dense model).
  out.histograms.clear();
  out.histograms.reserve(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l)
    out.histograms.push_back({Histogram(opt.range_values), Histogram(opt.range_values),
                              Histogram(opt.range_values), Histogram(opt.range_values)});
  eng.set_observer([&](int layer, Site site, const CMat<E>& x) {
    if (site == Site::BlockIn) return;
    const std::vector<float> v = to_host_rows<E>(x);
    out.histograms[static_cast<std::size_t>(layer)][static_cast<std::size_t>(histogram_slot(site))]
        .add(v.data(), v.size());
  });
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

  for (auto& cn : out.col_norms) cn.clear();

  ActivationMasker<E> masker(L);
  eng.set_masker(&masker);
  eng.set_sparse_from(0);
  Mat<E> work("sparsim::calibrate::work", n, D);
  auto host_rows = [&](const Mat<E>& m) { return to_host_rows<E>(CMat<E>(m)); };
  const int score_from = T - std::max(1, static_cast<int>(std::lround(T * opt.score_fraction)));

  auto run_masked = [&](int l) {
    Kokkos::deep_copy(exec, work, x_in[static_cast<std::size_t>(l)]);
    eng.run_block(l, work, G, T, 0);
    return host_rows(work);
  };
  auto clear_layer = [&](int l) {
    for (int i = 0; i < kNumProj; ++i) masker.set(l, static_cast<Proj>(i), MaskParams{});
  };
  ProbeMasking mode = masking;
  auto set_layer = [&](int l, const std::vector<double>& p, const std::vector<Vec<E>>& nv) {
    for (int i = 0; i < kNumProj; ++i) {
      const Proj pr = static_cast<Proj>(i);
      const Histogram& h = out.histograms[static_cast<std::size_t>(l)]
                                         [static_cast<std::size_t>(histogram_slot(site_of(pr)))];
      const double pi = p[static_cast<std::size_t>(i)];
      if (pi <= 0) {
        masker.set(l, pr, MaskParams{});
      } else if (mode == ProbeMasking::Threshold) {
        masker.set(l, pr, threshold_params(h, pi));
      } else {
        masker.set(l, pr, guided_params(h, pi, opt.delta), nv[static_cast<std::size_t>(i)]);
      }
    }
  };

  // 3. Greedy allocation per block (threshold masks during the search), 4. sensitivity.
  std::vector<double> f(kNumProj);
  out.greedy.assign(static_cast<std::size_t>(L), GreedyTable{});
  out.sensitivity.assign(opt.probes.size(), std::vector<double>(static_cast<std::size_t>(L), 0.0));
  for (int l = 0; l < L; ++l) {
    const LayerWeights<E>& lw = w->layers[static_cast<std::size_t>(l)];
    std::vector<Vec<E>> nv(kNumProj);
    for (int i = 0; i < kNumProj; ++i) {
      const Proj pr = static_cast<Proj>(i);
      f[static_cast<std::size_t>(i)] = static_cast<double>(lw.proj(pr).rows) * lw.proj(pr).cols;
      if (masking != ProbeMasking::Guided) continue;
      // WINA column norms: stored for every projection, used as scores where WINA uses them
      const Vec<E> v = column_norms(exec, lw.proj(pr));
      auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
      auto& cn = out.col_norms[static_cast<std::size_t>(i)];
      cn.insert(cn.end(), hv.data(), hv.data() + hv.extent(0));
      if (wina_uses_norms(pr, opt.wina_norms_all)) nv[static_cast<std::size_t>(i)] = v;
    }
    clear_layer(l);
    const std::vector<float> y = run_masked(l);  // dense: no projection of l is masked
    auto error = [&](const std::vector<float>& yh, bool relative_per_seq) {
      double total = 0;
      for (int s = 0; s < G; ++s) {
        double num = 0, den = 0;
        const int t0 = relative_per_seq ? 0 : score_from;
        for (int t = t0; t < T; ++t)
          for (int j = 0; j < D; ++j) {
            const std::size_t k = (static_cast<std::size_t>(s) * T + t) * D + j;
            const double d = static_cast<double>(y[k]) - yh[k];
            num += d * d;
            den += static_cast<double>(y[k]) * y[k];
          }
        total += relative_per_seq ? std::sqrt(num) / (std::sqrt(den) + 1e-6) : num;
      }
      return relative_per_seq ? total / G : std::sqrt(total);
    };
    // the search uses threshold masks whatever the variant (WINA's choice)
    mode = ProbeMasking::Threshold;
    out.greedy[static_cast<std::size_t>(l)] =
        greedy_allocate(f, opt.alpha, opt.cap, [&](const std::vector<double>& p) {
          set_layer(l, p, nv);
          return error(run_masked(l), false);
        });
    mode = masking;
    for (std::size_t k = 0; k < opt.probes.size(); ++k) {
      const auto& row = out.greedy[static_cast<std::size_t>(l)].nearest(opt.probes[k]);
      set_layer(l, std::vector<double>(row.begin() + 1, row.end()), nv);
      out.sensitivity[k][static_cast<std::size_t>(l)] = error(run_masked(l), true);
    }
    clear_layer(l);
    if (progress) progress("greedy and sensitivity", l + 1, L);
  }
  eng.set_masker(nullptr);
}

#ifdef KOKKOS_ENABLE_SERIAL
template void calibrate_variant<Kokkos::Serial>(std::shared_ptr<const Weights<Kokkos::Serial>>,
                                                const std::vector<int>&, const CalibrateOptions&,
                                                ProbeMasking, CalibrationVariant&,
                                                const CalibrateProgress&);
#endif
#ifdef KOKKOS_ENABLE_OPENMP
template void calibrate_variant<Kokkos::OpenMP>(std::shared_ptr<const Weights<Kokkos::OpenMP>>,
                                                const std::vector<int>&, const CalibrateOptions&,
                                                ProbeMasking, CalibrationVariant&,
                                                const CalibrateProgress&);
#endif
#ifdef KOKKOS_ENABLE_CUDA
template void calibrate_variant<Kokkos::Cuda>(std::shared_ptr<const Weights<Kokkos::Cuda>>,
                                              const std::vector<int>&, const CalibrateOptions&,
                                              ProbeMasking, CalibrationVariant&,
                                              const CalibrateProgress&);
#endif

}  // namespace sparsim::sparsity
