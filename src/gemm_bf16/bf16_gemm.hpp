#pragma once
/// bf16 × bf16 → fp32 matrix products on the host through oneDNN's matmul (its AVX-512 BF16
/// kernels where the CPU has them), for the opt-in "bf16 compute" prefill of bf16 weights: the
/// activations are rounded to bf16, as llama.cpp does for bf16 weights and GPU tensor cores do.
///
/// Its own library with a plain C++ interface (no Kokkos): oneDNN's headers stay away from the
/// CUDA build's compiler redirection, and a build without oneDNN compiles the same interface
/// with bf16_gemm_available() false.

#include <cstddef>
#include <cstdint>
#include <string>

namespace sparsim::host {

/// True when this build has oneDNN and its bf16 matmul runs on this CPU (AVX-512 at least).
bool bf16_gemm_available();
/// Why bf16_gemm_available() is false ("" when it is true).
std::string bf16_gemm_unavailable_reason();
/// The oneDNN implementation a tile runs ("" when unavailable), e.g. "gemm:jit".
std::string bf16_gemm_implementation();

/// y[t·ldy + r] = Σ_k x[t·ldx + k] · w[r·ldw + k] for t < nt, r < nr, k < K: bf16 bit patterns
/// in, fp32 out (fp32 accumulation). Runs on the calling thread alone; the same shapes and
/// strides give the same bits on the same CPU whatever other threads do. Thread-safe.
void bf16_gemm_tile(const std::uint16_t* x, std::size_t ldx, const std::uint16_t* w,
                    std::size_t ldw, float* y, std::size_t ldy, int nt, int nr, int K);

}  // namespace sparsim::host
