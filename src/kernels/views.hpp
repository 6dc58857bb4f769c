#pragma once
/// View aliases used by the kernels: row-major, in the memory space of the execution space.
#include "core/compat.hpp"
#include "core/matrix.hpp"
#include "core/rope_units.hpp"

#include <Kokkos_Core.hpp>

namespace sparsim {

template <class E>
using Vec = Kokkos::View<float*, DeviceOf<E>>;
template <class E>
using CVec = Kokkos::View<const float*, DeviceOf<E>>;
template <class E>
using Mat = Kokkos::View<float**, Layout, DeviceOf<E>>;
template <class E>
using CMat = Kokkos::View<const float**, Layout, DeviceOf<E>>;
template <class E>
using IVec = Kokkos::View<int*, DeviceOf<E>>;

/// A team policy whose team size is fixed where results depend on it: one thread per team on
/// host backends (so a reduction's order never depends on the thread count), AUTO on devices.
template <class E>
Kokkos::TeamPolicy<E> team_policy(const E& exec, int league) {
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible)
    return Kokkos::TeamPolicy<E>(exec, league, 1);
  else
    return Kokkos::TeamPolicy<E>(exec, league, Kokkos::AUTO);
}

}  // namespace sparsim
