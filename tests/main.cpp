// GoogleTest entry point: Kokkos lives for the whole test run.
#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>

#include <vector>

#include "core/blas_core.hpp"

int main(int argc, char** argv) {
  sparsim::select_blas_core(argv);
  ::testing::InitGoogleTest(&argc, argv);
  // Kokkos's start-up advice (OMP_PROC_BIND ...) would otherwise land in the test list that
  // CTest reads from --gtest_list_tests, as a test of its own.
  std::vector<char*> args(argv, argv + argc);
  char quiet[] = "--kokkos-disable-warnings";
  args.push_back(quiet);
  int n = static_cast<int>(args.size());
  Kokkos::initialize(n, args.data());
  sparsim::pin_blas_threads();
  int rc = RUN_ALL_TESTS();
  Kokkos::finalize();
  return rc;
}
