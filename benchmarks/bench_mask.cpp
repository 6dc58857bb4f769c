// Cost of choosing an activation mask at decode (one row): TopK and TopK-Guided selection on
// the input widths of SmolLM2-135M and Llama-2-7B projections, next to the GEMV it feeds.
// The selection should stay within a few percent of the projection's dense bf16 GEMV.
// Run: build/bin/sparsim_bench_mask
// Counters: gemv_us (dense decode GEMV of that projection, bf16, the engine's kernel),
// sparse_gemv_us (column-skipping GEMV over the kept columns), pct_of_gemv and
// pct_of_sparse_gemv (selection time as a percentage of each).
// BM_SelectVsSparseGemv times the selection and the sparse GEMV it feeds alternately in the same
// loop, for every projection shape and s in {0.3, 0.5, 0.7}: medians over the iterations (robust
// to other load on the machine) of sel_us (wall) and sel_cpu_us (thread CPU time: the selection
// is one thread), sparse_gemv_us (same threads as the engine, bf16) and gemv_us (dense, bf16);
// pct_sparse = 100 sel_us / sparse_gemv_us and pct_dense = 100 sel_us / gemv_us (the
// requirement: at most 5).
#include "core/blas_core.hpp"
#include "kernels/linear.hpp"
#include "kernels/mask.hpp"
#include "kernels/sparse_gemv.hpp"

#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <time.h>

namespace {

using E = Kokkos::DefaultExecutionSpace;
using namespace sparsim;
using Clock = std::chrono::steady_clock;

/// Output width of the projection that reads an input of width d.
int out_of(int d) {
  switch (d) {
    case 576:
      return 1536;  // SmolLM2-135M gate/up
    case 1536:
      return 576;  // SmolLM2-135M down
    case 4096:
      return 11008;  // Llama-2-7B gate/up
    default:
      return 4096;  // Llama-2-7B down (d = 11008)
  }
}

/// Median seconds of f over a few runs.
template <class F>
double median_time(F&& f, int reps) {
  std::vector<double> t;
  f();  // warm up
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct GemvTimes {
  double dense = 0, sparse = 0;
};

/// Dense and sparse (at keep = k) GEMV times for the projection reading width d.
GemvTimes gemv_times(int d, int k) {
  static std::map<std::pair<int, int>, GemvTimes> cache;
  const auto key = std::make_pair(d, k);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const int out = out_of(d);
  Matrix<E> w;
  w.dtype = DType::BF16;
  w.rows = out;
  w.cols = d;
  w.bf16 = decltype(w.bf16)("w", out, d);
  Mat<E> x("x", 1, d), y("y", 1, out);
  Kokkos::deep_copy(x, 1.0f);
  LinearScratch<E> sc;
  GemvTimes g;
  g.dense = median_time(
      [&] {
        linear(E(), CMat<E>(x), w, y, sc);
        E().fence();
      },
      15);
  w = Matrix<E>();
  Kokkos::View<bf16_t**, Layout, DeviceOf<E>> wt("wt", d, out);
  Vec<E> xv("xv", d), yv("yv", out);
  IVec<E> idx("idx", d);
  auto hi = Kokkos::create_mirror_view(idx);
  for (int i = 0; i < k; ++i) hi(i) = static_cast<int>((static_cast<long>(i) * d) / k);
  Kokkos::deep_copy(idx, hi);
  g.sparse = median_time(
      [&] {
        sparse_gemv(E(), CVec<E>(xv), idx, k, wt, yv);
        E().fence();
      },
      15);
  cache[key] = g;
  return g;
}

/// mask_indices on one row of width range(0); range(1): 0 TopK, 1 Guided; target p = 0.5.
void BM_MaskSelect(benchmark::State& st) {
  const int d = static_cast<int>(st.range(0));
  const bool guided = st.range(1) != 0;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd;
  Vec<E> x("x", d), norms("norms", d), y("y", d);
  IVec<E> idx("idx", d);
  {
    auto hx = Kokkos::create_mirror_view(x);
    auto hn = Kokkos::create_mirror_view(norms);
    for (int j = 0; j < d; ++j) {
      hx(j) = nd(rng);
      hn(j) = 0.5f + std::fabs(nd(rng));
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(norms, hn);
  }
  MaskParams prm;
  prm.rule = guided ? MaskRule::Guided : MaskRule::TopK;
  prm.p = 0.5f;
  prm.tau = 0.6745f;  // the median of |N(0,1)|: ŝ ≈ p
  prm.delta = 0.01f;
  MaskScratch<E> sc;
  int nnz = 0;
  double total = 0;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    nnz = mask_indices(E(), CVec<E>(x), CVec<E>(norms), prm, idx, y, sc);
    total += std::chrono::duration<double>(Clock::now() - t0).count();
    benchmark::DoNotOptimize(nnz);
  }
  const double sel = total / static_cast<double>(st.iterations());
  const GemvTimes g = gemv_times(d, nnz);
  st.counters["gemv_us"] = g.dense * 1e6;
  st.counters["sparse_gemv_us"] = g.sparse * 1e6;
  st.counters["pct_of_gemv"] = 100.0 * sel / g.dense;
  st.counters["pct_of_sparse_gemv"] = 100.0 * sel / g.sparse;
  st.SetLabel(std::string(guided ? "guided" : "topk") + " d=" + std::to_string(d) +
              " out=" + std::to_string(out_of(d)) + " kept=" + std::to_string(nnz));
}
BENCHMARK(BM_MaskSelect)
    ->ArgsProduct({{576, 1536, 4096, 11008}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

/// CPU time of the calling thread, seconds.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

/// tau with P(|N(0, 1)| < tau) = s: erf(tau / sqrt 2) = s by bisection.
float abs_normal_quantile(double s) {
  double lo = 0, hi = 10;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (std::erf(mid / std::sqrt(2.0)) < s ? lo : hi) = mid;
  }
  return static_cast<float>(0.5 * (lo + hi));
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// The transposed bf16 weight [d][out] of a projection, shared by the benchmarks of that shape
/// (values do not change the time; zeros).
using WtView = Kokkos::View<bf16_t**, Layout, DeviceOf<E>>;
/// Cached weights; emptied before Kokkos::finalize (a View must not outlive Kokkos).
std::map<std::pair<int, int>, WtView>& weight_cache() {
  static std::map<std::pair<int, int>, WtView> cache;
  return cache;
}
WtView transposed_weight(int d, int out) {
  WtView& w = weight_cache()[{d, out}];
  if (w.extent(0) == 0) w = WtView("wt", d, out);
  return w;
}

/// Dense bf16 decode GEMV time of a d -> out projection (the engine's kernel), cached.
double dense_gemv_seconds(int d, int out) {
  static std::map<std::pair<int, int>, double> cache;
  if (auto it = cache.find({d, out}); it != cache.end()) return it->second;
  Matrix<E> w;
  w.dtype = DType::BF16;
  w.rows = out;
  w.cols = d;
  w.bf16 = decltype(w.bf16)("w", out, d);
  Mat<E> x("x", 1, d), y("y", 1, out);
  Kokkos::deep_copy(x, 1.0f);
  LinearScratch<E> sc;
  const double t = median_time(
      [&] {
        linear(E(), CMat<E>(x), w, y, sc);
        E().fence();
      },
      21);
  cache[{d, out}] = t;
  return t;
}

/// Selection (mask_indices, as the engine calls it: masked row and indices) against the sparse
/// GEMV it feeds, timed alternately in one loop. range: d, out, s in percent, rule (0 TopK,
/// 1 Guided with tau at the s-quantile of |N(0, 1)|, so that ŝ ≈ s).
void BM_SelectVsSparseGemv(benchmark::State& st) {
  const int d = static_cast<int>(st.range(0)), out = static_cast<int>(st.range(1));
  const float s = static_cast<float>(st.range(2)) / 100.0f;
  const bool guided = st.range(3) != 0;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd;
  Vec<E> x("x", d), norms("norms", d), xm("xm", d), y("y", out);
  IVec<E> idx("idx", d);
  {
    auto hx = Kokkos::create_mirror_view(x);
    auto hn = Kokkos::create_mirror_view(norms);
    for (int j = 0; j < d; ++j) {
      hx(j) = nd(rng);
      hn(j) = 0.5f + std::fabs(nd(rng));
    }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(norms, hn);
  }
  MaskParams prm;
  prm.rule = guided ? MaskRule::Guided : MaskRule::TopK;
  prm.p = s;
  prm.tau = abs_normal_quantile(s);
  prm.delta = 0.01f;
  const auto wt = transposed_weight(d, out);
  MaskScratch<E> sc;
  std::vector<double> sel, sel_cpu, gemv;
  int nnz = 0;
  for (auto _ : st) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    nnz = mask_indices(E(), CVec<E>(x), CVec<E>(norms), prm, idx, xm, sc);
    const double c1 = thread_cpu_seconds();
    const auto t1 = Clock::now();
    sparse_gemv(E(), CVec<E>(xm), idx, nnz, wt, y);
    E().fence();
    const auto t2 = Clock::now();
    sel.push_back(std::chrono::duration<double>(t1 - t0).count());
    sel_cpu.push_back(c1 - c0);
    gemv.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  const double ts = median_of(sel), tg = median_of(gemv), td = dense_gemv_seconds(d, out);
  st.counters["sel_us"] = ts * 1e6;
  st.counters["sel_cpu_us"] = median_of(sel_cpu) * 1e6;
  st.counters["sparse_gemv_us"] = tg * 1e6;
  st.counters["gemv_us"] = td * 1e6;
  st.counters["pct_sparse"] = 100.0 * ts / tg;
  st.counters["pct_dense"] = 100.0 * ts / td;
  st.counters["threads"] = E().concurrency();
  st.SetLabel(std::string(guided ? "guided" : "topk") + " d=" + std::to_string(d) +
              " out=" + std::to_string(out) + " kept=" + std::to_string(nnz));
}
BENCHMARK(BM_SelectVsSparseGemv)
    ->ArgsProduct({{576}, {576, 192, 1536}, {30, 50, 70}, {0, 1}})
    ->ArgsProduct({{1536}, {576}, {30, 50, 70}, {0, 1}})
    ->ArgsProduct({{4096}, {4096, 11008}, {30, 50, 70}, {0, 1}})
    ->ArgsProduct({{11008}, {4096}, {30, 50, 70}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

/// mask_rows at prefill-like batch sizes: range(0) rows of width range(1), TopK p = 0.5.
void BM_MaskRows(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0)), d = static_cast<int>(st.range(1));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  Mat<E> x("x", n, d), y("y", n, d);
  IVec<E> kept("kept", n);
  auto hx = Kokkos::create_mirror_view(x);
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < d; ++j) hx(r, j) = nd(rng);
  Kokkos::deep_copy(x, hx);
  MaskParams prm;
  prm.rule = MaskRule::TopK;
  prm.p = 0.5f;
  for (auto _ : st) {
    mask_rows(E(), CMat<E>(x), CVec<E>(), IVec<E>(), prm, y, kept);
    E().fence();
  }
  st.SetItemsProcessed(st.iterations() * static_cast<int64_t>(n) * d);
}
BENCHMARK(BM_MaskRows)
    ->ArgsProduct({{64}, {576, 4096}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  sparsim::select_blas_core(argv);
  Kokkos::initialize(argc, argv);
  sparsim::pin_blas_threads();
  // The threads the kernels really ran on, in the results' context (scripts check it).
  benchmark::AddCustomContext("kokkos_host_threads",
                              std::to_string(Kokkos::DefaultHostExecutionSpace().concurrency()));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  weight_cache().clear();
  Kokkos::finalize();
  return 0;
}
