#pragma once
/// Row gather and scatter for the token gate: the kept rows of a call run Q projection,
/// attention and O projection on their own, and their outputs go back to their places.
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

namespace sparsim {

/// dst[i][:] = src[rows(i)][:] for i < rows.extent(0).
template <class E>
void gather_rows(const E& exec, const CMat<E>& src, const IVec<E>& rows, const Mat<E>& dst) {
  const int n = static_cast<int>(rows.extent(0)), d = static_cast<int>(src.extent(1));
  Kokkos::parallel_for(
      "sparsim::kernels::gather_rows",
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d})),
      KOKKOS_LAMBDA(const int i, const int j) { dst(i, j) = src(rows(i), j); });
}

/// dst[r][:] = 0 for every row, then dst[rows(i)][:] = src[i][:] (rows distinct).
template <class E>
void scatter_rows(const E& exec, const CMat<E>& src, const IVec<E>& rows, const Mat<E>& dst) {
  Kokkos::deep_copy(exec, dst, 0.0f);
  const int n = static_cast<int>(rows.extent(0)), d = static_cast<int>(src.extent(1));
  Kokkos::parallel_for(
      "sparsim::kernels::scatter_rows",
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d})),
      KOKKOS_LAMBDA(const int i, const int j) { dst(rows(i), j) = src(i, j); });
}

/// dst[to(i)][:] = src[i][:] for the rows i with to(i) ≥ 0 (targets distinct).
template <class E>
void copy_rows_to(const E& exec, const CMat<E>& src, const IVec<E>& to, const Mat<E>& dst) {
  const int n = static_cast<int>(to.extent(0)), d = static_cast<int>(src.extent(1));
  Kokkos::parallel_for(
      "sparsim::kernels::copy_rows_to",
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, d})),
      KOKKOS_LAMBDA(const int i, const int j) {
        if (to(i) >= 0) dst(to(i), j) = src(i, j);
      });
}

}  // namespace sparsim
