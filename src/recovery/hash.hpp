#pragma once
/// A 64-bit mixing function for counter-based random numbers (splitmix64's finaliser): the
/// dropout masks, the data order and the adapters' initial values depend only on their indices.
#include <Kokkos_Core.hpp>

#include <cstdint>

namespace sparsim::recovery {

KOKKOS_INLINE_FUNCTION std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace sparsim::recovery
