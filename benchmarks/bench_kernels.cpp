// Micro-benchmarks of the projection kernel (decode GEMV and prefill GEMM) on SmolLM2-135M's
// projection shapes, for each storage type. Run: build/bin/sparsim_bench_kernels
#include "kernels/linear.hpp"
#include "kernels/sparse_gemv.hpp"

#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>

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
  const int shapes[][2] = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
  for (auto& s : shapes)
    for (int t = 0; t < 3; ++t)
      for (int n : {1, 64}) b->Args({s[0], s[1], n, t});
}
BENCHMARK(BM_Linear)->Apply(shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();

/// Column-skipping GEMV on a transposed bf16 weight at sparsity s = range(2) / 10; s = 0 is
/// the dense reference of the same kernel. Counters: bytes of kept rows per second.
void BM_SparseGemv(benchmark::State& st) {
  const int out = static_cast<int>(st.range(0)), in = static_cast<int>(st.range(1));
  const double s = st.range(2) / 10.0;
  Kokkos::View<bf16_t**, Layout, DeviceOf<E>> wt("wt", in, out);
  Vec<E> x("x", in), y("y", out);
  Kokkos::deep_copy(x, 1.0f);
  const int keep = static_cast<int>(in * (1.0 - s));
  IVec<E> idx("idx", std::max(keep, 1));
  auto hi = Kokkos::create_mirror_view(idx);
  for (int k = 0; k < keep; ++k) hi(k) = static_cast<int>((static_cast<long>(k) * in) / keep);
  Kokkos::deep_copy(idx, hi);
  for (auto _ : st) {
    sparse_gemv(E(), CVec<E>(x), idx, keep, wt, y);
    E().fence();
  }
  st.SetBytesProcessed(st.iterations() * static_cast<int64_t>(keep) * out * 2);
  st.SetLabel("bf16 s=" + std::to_string(st.range(2) * 10) + "%");
}

void sparse_shapes(benchmark::internal::Benchmark* b) {
  // SmolLM2-135M gate/up and down; Llama-2-7B q/k/v/o, gate/up and down
  const int shapes[][2] = {{1536, 576}, {576, 1536}, {4096, 4096}, {11008, 4096}, {4096, 11008}};
  for (auto& sh : shapes)
    for (int s : {0, 3, 5, 7, 9}) b->Args({sh[0], sh[1], s});
}
BENCHMARK(BM_SparseGemv)->Apply(sparse_shapes)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  Kokkos::initialize(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  Kokkos::finalize();
  return 0;
}
