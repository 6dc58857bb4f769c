// GoogleTest entry point: Kokkos lives for the whole test run.
#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include "core/blas_core.hpp"

int main(int argc, char** argv) {
  sparsim::select_blas_core(argv);
  ::testing::InitGoogleTest(&argc, argv);
  Kokkos::initialize(argc, argv);
  int rc = RUN_ALL_TESTS();
  Kokkos::finalize();
  return rc;
}
