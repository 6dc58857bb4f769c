#pragma once
/// The vendor BLAS of a CUDA build (cuBLAS), called directly for what Kokkos Kernels does not
/// offer: products of bf16 matrices on the tensor cores with fp32 accumulation, and the batched
/// products of prefill attention (one per sequence and head, pointers built on the device).
///
/// Every function runs on the stream of the execution space instance it is given. cuBLAS picks
/// its kernel from the call's shape and its results are the same run after run for the same
/// shape (no split reductions with atomics are asked for), so a call per sequence keeps every
/// row's bits independent of how many sequences share a forward call.
///
/// In builds without CUDA this header declares nothing but available(), which is false.
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace sparsim::device_blas {

/// Whether this build calls cuBLAS (a CUDA build).
bool available();

/// The GPU a CUDA build runs on (device 0), as its runtime reports it; empty name without one.
struct DeviceInfo {
  std::string name;
  double memory_bytes = 0;
  double l2_bytes = 0;
  int sm_count = 0;
};
DeviceInfo device_info();

/// Free and total memory of the current GPU in bytes (cudaMemGetInfo); false without one.
bool memory_info(double& free_bytes, double& total_bytes);

#if defined(KOKKOS_ENABLE_CUDA)
/// y[n][out] (row stride ldy) = x16[n][in] · W16[out][in]ᵀ, both bf16 (raw bits, row strides
/// ldx, ldw), fp32 accumulation and output: cublasGemmEx on the tensor cores.
void gemm_bf16_rows(const Kokkos::Cuda& exec, int n, int out, int in, const std::uint16_t* x16,
                    int ldx, const std::uint16_t* w16, int ldw, float* y, int ldy);

/// A batch of `count` products, column-major as BLAS sees them:
///   C_b (m × n, ldc) = alpha · op(A_b) (m × k) · op(B_b) (k × n)
/// with op = transpose where trans_a / trans_b, fp32 data, pointers in device memory
/// (a[b], b[b], c[b]). `fast`: fp32 inputs through the tensor cores in TF32 (cuBLAS's
/// CUBLAS_COMPUTE_32F_FAST_TF32); otherwise plain fp32 arithmetic.
void gemm_batched_f32(const Kokkos::Cuda& exec, bool trans_a, bool trans_b, int m, int n, int k,
                      float alpha, const float* const* a, int lda, const float* const* b, int ldb,
                      float* const* c, int ldc, int count, bool fast);
#endif

}  // namespace sparsim::device_blas
