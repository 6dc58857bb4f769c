#pragma once
/// The one place where Kokkos 3.4 and Kokkos 4.x differ for sparsim.
///  - math functions live in Kokkos::Experimental up to 3.6 and in Kokkos from 3.7 on;
///  - View::rank is a value in 3.x and a callable constant in 4.x (`V::rank` works in both);
///  - Kokkos::printf / abort spellings.
#include "core/blas_core.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>

#define SPARSIM_KOKKOS_VERSION_AT_LEAST(maj, min) (KOKKOS_VERSION >= ((maj)*10000 + (min)*100))

namespace sparsim::kx {

#if SPARSIM_KOKKOS_VERSION_AT_LEAST(3, 7)
KOKKOS_INLINE_FUNCTION float exp(float x) {
  return Kokkos::exp(x);
}
KOKKOS_INLINE_FUNCTION float sqrt(float x) {
  return Kokkos::sqrt(x);
}
KOKKOS_INLINE_FUNCTION float cos(float x) {
  return Kokkos::cos(x);
}
KOKKOS_INLINE_FUNCTION float sin(float x) {
  return Kokkos::sin(x);
}
KOKKOS_INLINE_FUNCTION float fabs(float x) {
  return Kokkos::fabs(x);
}
KOKKOS_INLINE_FUNCTION float log(float x) {
  return Kokkos::log(x);
}
KOKKOS_INLINE_FUNCTION double exp(double x) {
  return Kokkos::exp(x);
}
/// Double-precision square root (a separate name: an overload of sqrt would change which
/// precision existing calls with double arguments use).
KOKKOS_INLINE_FUNCTION double sqrt_d(double x) {
  return Kokkos::sqrt(x);
}
KOKKOS_INLINE_FUNCTION double log(double x) {
  return Kokkos::log(x);
}
KOKKOS_INLINE_FUNCTION bool isfinite(float x) {
  return Kokkos::isfinite(x);
}
#else
KOKKOS_INLINE_FUNCTION float exp(float x) {
  return Kokkos::Experimental::exp(x);
}
KOKKOS_INLINE_FUNCTION float sqrt(float x) {
  return Kokkos::Experimental::sqrt(x);
}
KOKKOS_INLINE_FUNCTION float cos(float x) {
  return Kokkos::Experimental::cos(x);
}
KOKKOS_INLINE_FUNCTION float sin(float x) {
  return Kokkos::Experimental::sin(x);
}
KOKKOS_INLINE_FUNCTION float fabs(float x) {
  return Kokkos::Experimental::fabs(x);
}
KOKKOS_INLINE_FUNCTION float log(float x) {
  return Kokkos::Experimental::log(x);
}
KOKKOS_INLINE_FUNCTION double exp(double x) {
  return Kokkos::Experimental::exp(x);
}
/// Double-precision square root (a separate name: an overload of sqrt would change which
/// precision existing calls with double arguments use).
KOKKOS_INLINE_FUNCTION double sqrt_d(double x) {
  return Kokkos::Experimental::sqrt(x);
}
KOKKOS_INLINE_FUNCTION double log(double x) {
  return Kokkos::Experimental::log(x);
}
KOKKOS_INLINE_FUNCTION bool isfinite(float x) {
  return Kokkos::Experimental::isfinite(x);
}
#endif

/// Rank of a View type, as a constant in both major versions.
template <class View>
constexpr int rank_of() {
  return static_cast<int>(View::rank);
}

}  // namespace sparsim::kx

namespace sparsim {
/// Row-major matrices everywhere (token-major activations, [out][in] weights as in GGUF).
using Layout = Kokkos::LayoutRight;

/// `policy` with Kokkos' light-weight hint: on CUDA the kernel's functor travels as a kernel
/// argument whatever its size. Without it, functors of 512 bytes or more go through constant
/// memory, and each such launch first waits (an event synchronisation on the host) for the
/// previous one to finish: a stream of short kernels then costs a launch-and-wait each (about
/// 11 us on an H200) and cannot be captured in a CUDA graph. Host backends ignore the hint.
template <class Policy>
auto light(const Policy& policy) {
  return Kokkos::Experimental::require(policy,
                                       Kokkos::Experimental::WorkItemProperty::HintLightWeight);
}
}  // namespace sparsim

namespace sparsim {
/// Initialises Kokkos with `threads` host threads (0: the backend's default), spelled for the
/// Kokkos version at hand (InitArguments in 3.x, InitializationSettings in 4.x), then keeps BLAS
/// calls made outside Kokkos's parallel regions on one thread (pin_blas_threads).
inline void initialize_kokkos(int threads) {
#if SPARSIM_KOKKOS_VERSION_AT_LEAST(3, 7)
  Kokkos::InitializationSettings s;
  if (threads > 0) s.set_num_threads(threads);
  s.set_disable_warnings(true);
  Kokkos::initialize(s);
  pin_blas_threads();
#else
  Kokkos::InitArguments a;
  if (threads > 0) a.num_threads = threads;
  a.disable_warnings = true;
  Kokkos::initialize(a);
  pin_blas_threads();
#endif
}
}  // namespace sparsim
