#include "core/blas_core.hpp"

#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

extern "C" {
// OpenBLAS's own query; weak so that other BLAS libraries link too.
char* openblas_get_corename(void) __attribute__((weak));
void openblas_set_num_threads(int) __attribute__((weak));
}

namespace sparsim {

const char* blas_core_name() {
  return openblas_get_corename ? openblas_get_corename() : "";
}

namespace {

#if defined(__x86_64__) && defined(__linux__)
/// The OpenBLAS kernel family in use, lower case.
std::string core_lower() {
  std::string core = blas_core_name();
  for (auto& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return core;
}

/// The AVX-512 subsets OpenBLAS's SkylakeX kernels need.
bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
#endif

}  // namespace

std::string blas_core_note() {
#if defined(__x86_64__) && defined(__linux__)
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if (!set) return {};
  const std::string core = core_lower();
  if ((core != "haswell" && core != "zen") || !cpu_has_avx512()) return {};
  return "note: OPENBLAS_CORETYPE=" + std::string(set) +
         " runs OpenBLAS's AVX2 kernels on this AVX-512 CPU; OPENBLAS_CORETYPE=SkylakeX may make "
         "prefill faster (docs/performance.md)";
#else
  return {};
#endif
}

namespace {
int g_host_threads = 0;  // omp_get_max_threads() when pin_blas_threads ran
}  // namespace

int host_threads() {
#ifdef _OPENMP
  return g_host_threads > 0 ? g_host_threads : omp_get_max_threads();
#else
  return 1;
#endif
}

void pin_blas_threads() {
#ifdef _OPENMP
  if (g_host_threads == 0) g_host_threads = omp_get_max_threads();
  // Kokkos's OpenMP backend opens every parallel region with its own pool size
  // (num_threads(...)), so only calls made outside its regions see this: OpenBLAS's OpenMP build
  // and LAPACK then run each such call on the calling thread.
  omp_set_num_threads(1);
#endif
}

void select_blas_core(char** argv) {
  // Keeps a pthreads OpenBLAS to one thread per call. (The OpenMP build of OpenBLAS instead
  // follows omp_get_max_threads() at each call, and its openblas_set_num_threads also calls
  // omp_set_num_threads: the process's own OpenMP thread count, which Kokkos starts with, is put
  // back here and pinned only once Kokkos runs: pin_blas_threads.)
  if (openblas_set_num_threads) {
#ifdef _OPENMP
    const int omp_threads = omp_get_max_threads();
#endif
    openblas_set_num_threads(1);
#ifdef _OPENMP
    omp_set_num_threads(omp_threads);
#endif
  }
#if defined(__x86_64__) && defined(__linux__)
  if (std::getenv("OPENBLAS_CORETYPE")) return;
  if (const char* keep = std::getenv("SPARSIM_BLAS_CORE"); keep && std::strcmp(keep, "keep") == 0)
    return;
  if (!openblas_get_corename) return;
  const std::string core = core_lower();
  // Only the generic fallbacks are replaced; a family OpenBLAS recognised is kept.
  if (core != "prescott" && core != "core2" && core != "katmai" && core != "northwood") return;
  const char* target = nullptr;
  if (cpu_has_avx512())
    target = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    target = "Haswell";
  if (!target) return;
  ::setenv("OPENBLAS_CORETYPE", target, 1);
  ::execv("/proc/self/exe", argv);
  // exec failed: run on with the kernels OpenBLAS chose (the variable stays for children)
#else
  (void)argv;
#endif
}

}  // namespace sparsim
