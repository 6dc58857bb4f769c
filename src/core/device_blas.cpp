#include "core/device_blas.hpp"

#include "core/error.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#endif

namespace sparsim::device_blas {

#if defined(KOKKOS_ENABLE_CUDA)

bool available() { return true; }

DeviceInfo device_info() {
  DeviceInfo d;
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    cudaGetLastError();
    return d;
  }
  d.name = p.name;
  d.memory_bytes = static_cast<double>(p.totalGlobalMem);
  d.l2_bytes = static_cast<double>(p.l2CacheSize);
  d.sm_count = p.multiProcessorCount;
  return d;
}

bool memory_info(double& free_bytes, double& total_bytes) {
  std::size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  free_bytes = static_cast<double>(f);
  total_bytes = static_cast<double>(t);
  return true;
}

namespace {

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialised";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
  }
}

void check(cublasStatus_t s, const char* what) {
  require(s == CUBLAS_STATUS_SUCCESS, "cuBLAS {} failed: {} ({})", what, status_name(s),
          static_cast<int>(s));
}

/// One handle for the process, created on first use and destroyed when Kokkos finalises
/// (before the CUDA context goes). Calls set the stream of the instance they run on.
cublasHandle_t handle_on(const Kokkos::Cuda& exec) {
  static cublasHandle_t h = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    check(cublasCreate(&h), "handle creation");
    Kokkos::push_finalize_hook([] {
      if (h) cublasDestroy(h);
      h = nullptr;
    });
  });
  check(cublasSetStream(h, exec.cuda_stream()), "stream selection");
  return h;
}

}  // namespace

void gemm_bf16_rows(const Kokkos::Cuda& exec, int n, int out, int in, const std::uint16_t* x16,
                    int ldx, const std::uint16_t* w16, int ldw, float* y, int ldy) {
  cublasHandle_t h = handle_on(exec);
  const float one = 1.0f, zero = 0.0f;
  // Row-major W[out][in] is the column-major in × out matrix, x the in × n one and y the
  // out × n one: y = Wᵀ·x in column-major terms.
  check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w16, CUDA_R_16BF, ldw, x16,
                     CUDA_R_16BF, ldx, &zero, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "bf16 GEMM");
}

void gemm_batched_f32(const Kokkos::Cuda& exec, bool trans_a, bool trans_b, int m, int n, int k,
                      float alpha, const float* const* a, int lda, const float* const* b, int ldb,
                      float* const* c, int ldc, int count, bool fast) {
  cublasHandle_t h = handle_on(exec);
  const float zero = 0.0f;
  check(cublasGemmBatchedEx(h, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
                            reinterpret_cast<const void* const*>(a), CUDA_R_32F, lda,
                            reinterpret_cast<const void* const*>(b), CUDA_R_32F, ldb, &zero,
                            reinterpret_cast<void* const*>(c), CUDA_R_32F, ldc, count,
                            fast ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
        "batched GEMM");
}

#else

bool available() { return false; }

DeviceInfo device_info() { return {}; }

bool memory_info(double&, double&) { return false; }

#endif

}  // namespace sparsim::device_blas
