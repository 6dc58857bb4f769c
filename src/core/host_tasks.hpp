#pragma once
/// Host-side helpers for LAPACK/BLAS work split into independent tasks: one BLAS thread per task,
/// tasks spread over the host execution space, so that results do not depend on the thread count.
#include "core/compat.hpp"

#include <dlfcn.h>
#include <Kokkos_Core.hpp>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace sparsim {

/// Switches BLAS/LAPACK to one thread for the lifetime of the object (OpenBLAS, looked up at
/// run time; its OpenMP build follows omp_get_max_threads(), so that is pinned as well).
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() {
    set_ = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    get_ = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
#ifdef _OPENMP
    omp_saved_ = omp_get_max_threads();
#endif
    if (set_ && get_) {
      blas_saved_ = get_();
      set_(1);
    }
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
  }
  ~SingleThreadedBlas() {
    if (set_ && get_) set_(blas_saved_);
#ifdef _OPENMP
    omp_set_num_threads(omp_saved_);
#endif
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  void (*set_)(int) = nullptr;
  int (*get_)() = nullptr;
  int blas_saved_ = 1;
  int omp_saved_ = 1;
};

/// Runs f(0) … f(n−1) on the host execution space, one task at a time per thread. Every task
/// writes its own outputs, so the result does not depend on the thread count.
template <class F>
void parallel_tasks(int n, const F& f) {
  using H = Kokkos::DefaultHostExecutionSpace;
  Kokkos::parallel_for(
      "sparsim::host_tasks",
      Kokkos::RangePolicy<H, Kokkos::Schedule<Kokkos::Dynamic>, Kokkos::IndexType<int>>(
          0, n, Kokkos::ChunkSize(1)),
      [&](int i) { f(i); });
  Kokkos::fence();
}

}  // namespace sparsim
