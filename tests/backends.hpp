#pragma once
// The execution spaces every backend-generic test is instantiated for.
#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>

namespace sparsim::test {
using Backends = ::testing::Types<
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
    Kokkos::Serial, Kokkos::OpenMP
#elif defined(KOKKOS_ENABLE_OPENMP)
    Kokkos::OpenMP
#else
    Kokkos::Serial
#endif
#ifdef KOKKOS_ENABLE_CUDA
    ,
    Kokkos::Cuda
#endif
    >;

struct BackendName {
  template <class E>
  static std::string GetName(int) {
    return E::name();
  }
};

template <class E, class HostVec>
Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::Device<E, typename E::memory_space>> to_device(
    const HostVec& v, int rows, int cols) {
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::Device<E, typename E::memory_space>> d(
      "t", rows, cols);
  auto h = Kokkos::create_mirror_view(d);
  for (int i = 0; i < rows * cols; ++i) h.data()[i] = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

template <class View>
std::vector<float> to_host(const View& d) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  return std::vector<float>(h.data(), h.data() + h.size());
}
}  // namespace sparsim::test
