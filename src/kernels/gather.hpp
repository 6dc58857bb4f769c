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

namespace detail {
/// One step of the kept-row listing: row r, i kept rows before it.
template <class E>
struct ListKeptRows {
  IVec<E> skip, sparse, rows, seqs, pos, flags;
  int T, p0;
  bool has_flags;
  KOKKOS_FUNCTION void operator()(const int r, int& i, const bool final) const {
    if (skip(r)) return;
    if (final) {
      rows(i) = r;
      seqs(i) = r / T;
      pos(i) = p0 + r % T;
      flags(i) = has_flags ? sparse(r) : 0;
    }
    ++i;
  }
};
}  // namespace detail

/// The kept rows of a gated call, listed where the gate decided them: for the rows r (= s·T + t)
/// with skip(r) = 0, in ascending order, rows(i) = r, seqs(i) = s, pos(i) = p0 + t and
/// flags(i) = sparse(r) (0 where `sparse` is empty). The lists must hold the kept count. In
/// host memory one loop after the queued work (no launch); in device memory a scan.
template <class E>
void list_kept_rows(const E& exec, const IVec<E>& skip, const IVec<E>& sparse, int T, int p0,
                    const IVec<E>& rows, const IVec<E>& seqs, const IVec<E>& pos,
                    const IVec<E>& flags) {
  const int n = static_cast<int>(skip.extent(0));
  const detail::ListKeptRows<E> f{
      skip, sparse, rows, seqs, pos, flags, T, p0, sparse.extent(0) > 0};
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    exec.fence();
    int i = 0;
    for (int r = 0; r < n; ++r) f(r, i, true);
  } else {
    Kokkos::parallel_scan("sparsim::kernels::list_kept_rows", Kokkos::RangePolicy<E>(exec, 0, n),
                          f);
  }
}

}  // namespace sparsim
