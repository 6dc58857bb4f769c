// Micro-benchmarks of the projection kernel (decode GEMV and prefill GEMM) on SmolLM2-135M's
// projection shapes, for each storage type, and of the sparse decode GEMV against the dense one.
// Run: build/bin/sparsim_bench_kernels
#include "core/blas_core.hpp"
#include "kernels/attention.hpp"
#include "kernels/gather.hpp"
#include "kernels/linear.hpp"
#include "kernels/pointwise.hpp"
#include "kernels/sparse_gemv.hpp"

#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using E = Kokkos::DefaultExecutionSpace;
using namespace sparsim;

Matrix<E> make(int rows, int cols, DType t) {
  Matrix<E> m;
  m.dtype = t;
  m.rows = rows;
  m.cols = cols;
  if (t == DType::F32) {
    m.f32 = decltype(m.f32)("w", rows, cols);
    Kokkos::deep_copy(m.f32, 0.01f);
  } else if (t == DType::BF16) {
    m.bf16 = decltype(m.bf16)("w", rows, cols);
  } else {
    m.f16 = decltype(m.f16)("w", rows, cols);
  }
  return m;
}

void BM_Linear(benchmark::State& st) {
  const int out = static_cast<int>(st.range(0)), in = static_cast<int>(st.range(1));
  const int n = static_cast<int>(st.range(2));
  const DType t = static_cast<DType>(st.range(3));
  Matrix<E> w = make(out, in, t);
  Mat<E> x("x", n, in), y("y", n, out);
  Kokkos::deep_copy(x, 1.0f);
  LinearScratch<E> sc;
  for (auto _ : st) {
    linear(E(), CMat<E>(x), w, y, sc);
    E().fence();
  }
  st.SetBytesProcessed(st.iterations() * static_cast<int64_t>(w.bytes()));
  st.SetLabel(to_string(t) + " n=" + std::to_string(n));
}

void shapes(benchmark::internal::Benchmark* b) {
  // SmolLM2's projections (and LM head), and the output projection of a RAP-pruned layer (9
  // query heads of 24 and of 44 value channels: rows not a multiple of 16 floats); one token,
  // a batch of 8 decode tokens, and 64 (GEMM).
  const int shapes[][2] = {{576, 576},   {192, 576}, {1536, 576}, {576, 1536},
                           {49152, 576}, {576, 216}, {576, 396}};
  for (auto& s : shapes)
    for (int t = 0; t < 3; ++t)
      for (int n : {1, 8, 64}) b->Args({s[0], s[1], n, t});
}
BENCHMARK(BM_Linear)->Apply(shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();

// ---- Sparse decode GEMV against the dense decode GEMV ----------------------------------------
// Every projection shape of SmolLM2-135M and Llama-2-7B, bf16 storage, one token. The dense
// reference is the engine's decode kernel (detail::linear_direct on W[out][in]); the sparse
// kernel reads the kept rows of Wt[in][out] at sparsity s (s = 0: all rows). Kept indices are a
// seeded random subset (a TopK mask has no regular pattern). "cold" weights rotate through
// copies spanning kColdBytes, more than the last-level cache, as in decode where every matrix
// comes from memory once per token; "hot" reuses one copy. GB/s counts the weight bytes read.
// scripts/bench/bench_sparse_gemv.py runs these and tabulates speedup against the ideal 1/(1-s).

struct GemvShape {
  const char* name;
  int in, out;  // Wt[in][out], i.e. W[out][in]
};
constexpr GemvShape kGemvShapes[] = {
    {"smollm2.q_o", 576, 576},       {"smollm2.k_v", 576, 192},
    {"smollm2.gate_up", 576, 1536},  {"smollm2.down", 1536, 576},
    {"llama2-7b.qkvo", 4096, 4096},  {"llama2-7b.gate_up", 4096, 11008},
    {"llama2-7b.down", 11008, 4096},
};
constexpr std::size_t kColdBytes = std::size_t{1} << 30;

/// One bf16 buffer of kColdBytes, filled on first use, from which the weight copies are cut;
/// released before Kokkos::finalize.
Kokkos::View<bf16_t*, DeviceOf<E>> g_weight_pool;

bf16_t* weight_pool() {
  if (g_weight_pool.extent(0) == 0) {
    Kokkos::View<bf16_t*, DeviceOf<E>> p(
        Kokkos::view_alloc("sparsim::bench::weights", Kokkos::WithoutInitializing),
        kColdBytes / sizeof(bf16_t));
    Kokkos::parallel_for(
        "sparsim::bench::fill", Kokkos::RangePolicy<E>(0, static_cast<int64_t>(p.extent(0))),
        KOKKOS_LAMBDA(const int64_t i) {
          p(i) = bf16_t::from_float(0.001f * static_cast<float>(i % 61 - 30));
        });
    E().fence();
    g_weight_pool = p;
  }
  return g_weight_pool.data();
}

using Bf16Mat = Kokkos::View<bf16_t**, Layout, DeviceOf<E>>;

/// `copies` unmanaged rows × cols views into the pool: one when hot, enough to span the pool
/// when cold.
std::vector<Bf16Mat> weight_copies(int rows, int cols, bool cold) {
  const std::size_t elems = static_cast<std::size_t>(rows) * cols;
  const std::size_t copies =
      cold ? std::max<std::size_t>(1, kColdBytes / sizeof(bf16_t) / elems) : 1;
  std::vector<Bf16Mat> v;
  for (std::size_t c = 0; c < copies; ++c) v.emplace_back(weight_pool() + c * elems, rows, cols);
  return v;
}

std::string gemv_label(const GemvShape& sh, double s, bool cold) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "shape=%s in=%d out=%d s=%.1f weights=%s", sh.name, sh.in, sh.out,
                s, cold ? "cold" : "hot");
  return buf;
}

void set_gemv_counters(benchmark::State& st, double bytes) {
  st.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["bytes"] = bytes;
}

/// The engine's dense decode GEMV: y[1][out] = x[1][in] · W[out][in]ᵀ, bf16 W.
void BM_DenseGemv(benchmark::State& st) {
  const GemvShape& sh = kGemvShapes[st.range(0)];
  const bool cold = st.range(1) != 0;
  const auto w = weight_copies(sh.out, sh.in, cold);
  Mat<E> x("x", 1, sh.in), y("y", 1, sh.out);
  Kokkos::deep_copy(x, 1.0f);
  std::size_t c = 0;
  for (auto _ : st) {
    detail::linear_direct(E(), CMat<E>(x), w[c], y);
    E().fence();
    if (++c == w.size()) c = 0;
  }
  set_gemv_counters(st, 2.0 * sh.in * sh.out);
  st.SetLabel(gemv_label(sh, 0.0, cold));
}

/// The kept rows at sparsity s: a seeded random subset of [0, in), ascending.
std::vector<int> kept_rows(int in, double s) {
  const int keep = static_cast<int>(std::lround(in * (1.0 - s)));
  std::vector<int> order(static_cast<std::size_t>(in));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(1234));
  order.resize(static_cast<std::size_t>(keep));
  std::sort(order.begin(), order.end());
  return order;
}

/// The column-skipping GEMV at sparsity s = range(1) / 10 on Wt[in][out], bf16.
void BM_SparseGemv(benchmark::State& st) {
  const GemvShape& sh = kGemvShapes[st.range(0)];
  const double s = st.range(1) / 10.0;
  const bool cold = st.range(2) != 0;
  const auto wt = weight_copies(sh.in, sh.out, cold);
  Vec<E> x("x", sh.in), y("y", sh.out);
  Kokkos::deep_copy(x, 1.0f);
  const std::vector<int> order = kept_rows(sh.in, s);
  const int keep = static_cast<int>(order.size());
  IVec<E> idx("idx", std::max(keep, 1));
  auto hi = Kokkos::create_mirror_view(idx);
  for (int k = 0; k < keep; ++k) hi(k) = order[k];
  Kokkos::deep_copy(idx, hi);
  std::size_t c = 0;
  for (auto _ : st) {
    sparse_gemv(E(), CVec<E>(x), idx, keep, wt[c], y);
    E().fence();
    if (++c == wt.size()) c = 0;
  }
  set_gemv_counters(st, 2.0 * keep * sh.out);
  st.SetLabel(gemv_label(sh, s, cold));
}

/// The memory side of the column-skipping GEMV alone: the kept rows of BM_SparseGemv read with
/// no arithmetic (their cache lines XORed) and no software prefetch, split as the kernel splits
/// them (range(3) = 0: each thread a tile of outputs, i.e. a piece of every kept row) or by rows
/// (1: each thread whole kept rows, a contiguous part of the list). What reading a scattered
/// subset of the rows costs on the machine, against the dense kernel's time; not a strict bound
/// (the kernel asks for the next rows ahead, which can beat a plain read on long rows).
using Block = std::uint64_t __attribute__((vector_size(64)));  // one cache line

/// Reads the rows `rows` of every cold copy of a bf16 Wt[in][out] in turn, `tile` outputs of each
/// row per work item (by_rows: whole rows, the list cut into one contiguous part per thread).
void read_kept_rows(benchmark::State& st, const GemvShape& sh, const std::vector<int>& rows,
                    bool by_rows) {
  if (!detail::kHostSpace<E>) {
    st.SkipWithError("host backends only");
    return;
  }
  const auto wt = weight_copies(sh.in, sh.out, true);
  const int keep = static_cast<int>(rows.size()), out = sh.out;
  // Host memory read by host threads: the host execution space (E, which the check above
  // makes a host space whenever this runs; naming it lets a CUDA build compile the lambda).
  using H = Kokkos::DefaultHostExecutionSpace;
  const int threads = H().concurrency();
  const int tile = sparse_gemv_tile(out, threads);
  const int parts = by_rows ? threads : (out + tile - 1) / tile;
  std::vector<std::uint64_t> sink(static_cast<std::size_t>(parts) * 8);
  const int* ip = rows.data();
  std::uint64_t* sp = sink.data();
  std::size_t c = 0;
  for (auto _ : st) {
    const char* base = reinterpret_cast<const char*>(wt[c].data());
    Kokkos::parallel_for(
        "sparsim::bench::kept_row_read", Kokkos::RangePolicy<H>(0, parts), [&](const int t) {
          const int o0 = by_rows ? 0 : t * tile;
          const int n = by_rows ? out : std::min(tile, out - o0);
          const int k0 = by_rows ? static_cast<int>(static_cast<long>(keep) * t / parts) : 0;
          const int k1 =
              by_rows ? static_cast<int>(static_cast<long>(keep) * (t + 1) / parts) : keep;
          // whole 64-byte blocks of the row piece, two independent accumulators
          const std::size_t blocks = static_cast<std::size_t>(n) * sizeof(bf16_t) / 64;
          Block a0{}, a1{};
          for (int k = k0; k < k1; ++k) {
            const char* row = base + (static_cast<std::size_t>(ip[k]) * out + o0) * sizeof(bf16_t);
            std::size_t b = 0;
            for (; b + 2 <= blocks; b += 2) {
              Block x, y;
              std::memcpy(&x, row + 64 * b, 64);
              std::memcpy(&y, row + 64 * b + 64, 64);
              a0 ^= x;
              a1 ^= y;
            }
            if (b < blocks) {
              Block x;
              std::memcpy(&x, row + 64 * b, 64);
              a0 ^= x;
            }
          }
          a0 ^= a1;
          std::memcpy(sp + 8 * t, &a0, 64);
        });
    H().fence();
    benchmark::DoNotOptimize(sink.data());
    if (++c == wt.size()) c = 0;
  }
  set_gemv_counters(st, 2.0 * keep * sh.out);
}

void BM_KeptRowRead(benchmark::State& st) {
  const GemvShape& sh = kGemvShapes[st.range(0)];
  const double s = st.range(1) / 10.0;
  const bool by_rows = st.range(3) != 0;
  read_kept_rows(st, sh, kept_rows(sh.in, s), by_rows);
  st.SetLabel(gemv_label(sh, s, st.range(2) != 0) + (by_rows ? " split=rows" : " split=tiles"));
}

/// The plain read by whole rows (BM_KeptRowRead, split=rows) when the kept rows come in runs of
/// range(2) consecutive rows: a seeded random set of runs, (1 − s) of them. Activation masks are
/// not clustered like this; the benchmark measures how the cost of reading a subset depends on
/// how scattered it is (run 1 = BM_KeptRowRead's pattern), i.e. what grouping the kept channels
/// (a static permutation of Wt's rows) could buy on the machine.
void BM_KeptRunRead(benchmark::State& st) {
  const GemvShape& sh = kGemvShapes[st.range(0)];
  const double s = st.range(1) / 10.0;
  const int run = static_cast<int>(st.range(2));
  std::vector<int> rows;
  for (int f : kept_rows(sh.in / run, s))  // the kept runs
    for (int r = 0; r < run; ++r) rows.push_back(f * run + r);
  read_kept_rows(st, sh, rows, true);
  st.SetLabel(gemv_label(sh, s, true) + " split=rows run=" + std::to_string(run));
}

void dense_gemv_args(benchmark::internal::Benchmark* b) {
  for (int cold : {1, 0})
    for (int i = 0; i < static_cast<int>(std::size(kGemvShapes)); ++i) b->Args({i, cold});
}
void sparse_gemv_args(benchmark::internal::Benchmark* b) {
  for (int cold : {1, 0})
    for (int i = 0; i < static_cast<int>(std::size(kGemvShapes)); ++i)
      for (int s : {0, 3, 5, 7, 9}) b->Args({i, s, cold});
}
BENCHMARK(BM_DenseGemv)->Apply(dense_gemv_args)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_SparseGemv)->Apply(sparse_gemv_args)->Unit(benchmark::kMicrosecond)->UseRealTime();
void kept_row_read_args(benchmark::internal::Benchmark* b) {
  for (int split : {0, 1})
    for (int i = 0; i < static_cast<int>(std::size(kGemvShapes)); ++i)
      for (int s : {0, 3, 5, 7, 9}) b->Args({i, s, 1, split});
}
BENCHMARK(BM_KeptRowRead)->Apply(kept_row_read_args)->Unit(benchmark::kMicrosecond)->UseRealTime();
void kept_run_read_args(benchmark::internal::Benchmark* b) {
  for (int i = 0; i < static_cast<int>(std::size(kGemvShapes)); ++i)
    for (int s : {0, 5})
      for (int run : {1, 2, 4, 8, 16}) b->Args({i, s, run});
}
BENCHMARK(BM_KeptRunRead)->Apply(kept_run_read_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

/// The host decode attention of one SmolLM2-shaped layer (9 query heads, 3 KV heads) over a
/// cache of range(1) positions, heads range(0) wide (RAP narrows them to 24 … 58 channels, odd
/// multiples of 2 included). range(2) = 0: enough layer copies are cycled (at least 30, and at
/// least 256 MiB of caches) that they come from memory as in a decode step, whatever the width;
/// 1: one layer, whose cache stays in the processor's caches (the loop's own cost). Counter: cache
/// bytes/s. At 16 positions the time is the call's fixed cost.
void BM_DecodeAttention(benchmark::State& st) {
  const int d = static_cast<int>(st.range(0)), ctx = static_cast<int>(st.range(1));
  constexpr int nh = 9, nkv = 3;
  const double bytes = 2.0 * ctx * nkv * d * sizeof(float);
  const int copies =
      st.range(2) == 1 ? 1 : std::max(30, static_cast<int>(std::ceil(256.0 * (1 << 20) / bytes)));
  std::vector<Cache<E>> kc, vc;
  for (int l = 0; l < copies; ++l) {
    kc.emplace_back("k", 1, ctx + 1, nkv * d);
    vc.emplace_back("v", 1, ctx + 1, nkv * d);
    Kokkos::deep_copy(kc.back(), 0.01f * static_cast<float>(l % 30 + 1));
    Kokkos::deep_copy(vc.back(), 1.0f);
  }
  Mat<E> q("q", 1, nh * d), out("out", 1, nh * d);
  Kokkos::deep_copy(q, 0.1f);
  int l = 0;
  for (auto _ : st) {
    attention(E(), CMat<E>(q), kc[l], vc[l], out, 1, 1, ctx - 1, nh, nkv, d, d, 0.125f);
    E().fence();
    if (++l == copies) l = 0;
  }
  st.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel("d=" + std::to_string(d) + " ctx=" + std::to_string(ctx) +
              (copies == 1 ? " hot" : ""));
}
BENCHMARK(BM_DecodeAttention)
    ->ArgsProduct({{64, 58, 56, 50, 48, 42, 36, 24}, {16, 2048}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

/// A decode step's rotations and cache append for one SmolLM2-shaped layer: 9 query heads and
/// 3 KV heads at `n` tokens (one per sequence), as the engine runs them (queries and keys
/// rotated in one launch, then keys and values written into the cache); range(1) = 1: a pruned
/// layer of 24 kept
/// pairs (48 channels) per head through the rotation-unit kernel. These are the launches whose
/// cost does not shrink with a pruned layer's width.
void BM_DecodeRopeStore(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  const bool pruned = st.range(1) == 1;
  constexpr int hd = 64, nh = 9, nkv = 3, ctx = 4096;
  const int w = pruned ? 48 : hd;
  Mat<E> q("q", n, nh * w), k("k", n, nkv * w), v("v", n, nkv * w);
  Mat<E> cs("cos", ctx, hd / 2), sn("sin", ctx, hd / 2);
  Kokkos::deep_copy(q, 0.5f);
  Kokkos::deep_copy(k, 0.25f);
  Kokkos::deep_copy(cs, 0.8f);
  Kokkos::deep_copy(sn, 0.6f);
  Cache<E> kc("kc", n, ctx, nkv * w), vc("vc", n, ctx, nkv * w);
  IVec<E> pos("pos", n);
  Kokkos::deep_copy(pos, ctx / 2);
  RopeUnits u;
  u.units = w / 2;
  for (int h = 0; h < nkv; ++h)
    for (int j = 0; j < w / 2; ++j) {  // kept pairs 0, 1, 3, 4, 6, … of the full head's 32
      u.i0.push_back(j);
      u.i1.push_back(j + w / 2);
      u.freq.push_back(j + j / 2);
    }
  const RopeMap<E> map = make_rope_map<E>(u);
  for (auto _ : st) {
    if (pruned)
      rope_units(E(), q, k, pos, CMat<E>(cs), CMat<E>(sn), map, w);
    else
      rope(E(), q, k, pos, CMat<E>(cs), CMat<E>(sn), hd, false);
    kv_store(E(), CMat<E>(k), CMat<E>(v), kc, vc, n, 1, ctx / 2);
    E().fence();
  }
  st.SetLabel(std::string(pruned ? "pruned w=48" : "dense") + " n=" + std::to_string(n));
}
BENCHMARK(BM_DecodeRopeStore)
    ->ArgsProduct({{1, 8}, {0, 1}})
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
  g_weight_pool = {};
  Kokkos::finalize();
  return 0;
}
