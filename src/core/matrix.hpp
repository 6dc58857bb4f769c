#pragma once
/// A 2-D weight matrix in one of its storage types, on the memory space of an execution space:
/// what the kernels read and the model holds.
#include "core/compat.hpp"
#include "core/types.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace sparsim {

template <class ExecSpace>
using DeviceOf = Kokkos::Device<ExecSpace, typename ExecSpace::memory_space>;

/// A 2-D weight matrix in one of the storage types; exactly one of the views is allocated.
template <class ExecSpace>
struct Matrix {
  using Dev = DeviceOf<ExecSpace>;
  DType dtype = DType::F32;
  int rows = 0;  ///< output features
  int cols = 0;  ///< input features
  Kokkos::View<float**, Layout, Dev> f32;
  Kokkos::View<bf16_t**, Layout, Dev> bf16;
  Kokkos::View<f16_t**, Layout, Dev> f16;

  std::size_t bytes() const { return static_cast<std::size_t>(rows) * cols * dtype_size(dtype); }
  bool empty() const { return rows == 0; }
};

}  // namespace sparsim
