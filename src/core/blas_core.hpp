#pragma once
/// OpenBLAS kernel selection. A DYNAMIC_ARCH OpenBLAS picks its kernels from the CPU model at
/// load time and falls back to its generic SSE3 ("Prescott") kernels for models it does not
/// know (newer Xeons with a generic model name, for instance) — about 3× slower GEMM on an
/// AVX-512 machine. OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so the fix has to
/// happen before the process starts: select_blas_core() re-executes the program once with
/// OPENBLAS_CORETYPE set to the best kernel family the CPU supports.
///
/// It also keeps OpenBLAS from threading a call itself: sparsim cuts its host BLAS work into
/// fixed tiles, one single-threaded call per work item, so that no result depends on the thread
/// count. A call made outside a parallel region (every call of the Serial backend, LAPACK in
/// calibration) would otherwise be split over omp_get_max_threads() threads, and with some kernel
/// families (Haswell's SGEMM, measured on an AVX-512 AMD EPYC run with OPENBLAS_CORETYPE=Haswell)
/// the split call sums differently: Serial and OpenMP logits differed in the last bits.
#include <string>

namespace sparsim {

/// Call first thing in main(). Sets OpenBLAS to one thread per call (always), then does nothing
/// more when OPENBLAS_CORETYPE is already set (by the user or by an earlier re-execution), when
/// the BLAS is not OpenBLAS, when OpenBLAS chose a specific kernel family itself, or when
/// SPARSIM_BLAS_CORE=keep. Otherwise re-executes
/// /proc/self/exe with the same arguments; returns only if that is not needed or not possible.
void select_blas_core(char** argv);

/// Call right after Kokkos is initialised: sets the OpenMP thread count that code outside Kokkos
/// parallel regions sees (omp_get_max_threads) to 1. OpenBLAS's OpenMP build splits a call made
/// outside a parallel region (every call of the Serial backend, LAPACK in calibration) over that
/// many threads, and a split call may sum differently. Kokkos keeps the pool it started with. Code
/// with its own OpenMP loops asks host_threads() for the thread count.
void pin_blas_threads();
/// The OpenMP thread count the process started Kokkos with (omp_get_max_threads() before
/// pin_blas_threads; 1 without OpenMP).
int host_threads();

/// The OpenBLAS kernel family in use ("SkylakeX", "Prescott", …) or "" when unknown.
const char* blas_core_name();

/// A one-line note when OpenBLAS was told (OPENBLAS_CORETYPE) to use AVX2 kernels on a CPU with
/// AVX-512, the case where the prefill GEMMs run slower than they could; empty otherwise.
std::string blas_core_note();

}  // namespace sparsim
