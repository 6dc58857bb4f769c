#pragma once
/// Copies of chosen rows and columns of a weight matrix, in its storage type (the pruning
/// transforms that cut projections: RAP / KVPruner fusion, FLAP), and a matrix's values on the
/// host in double (the scores and factorisations of FLAP, SlimGPT and the low-rank methods).
#include "core/matrix.hpp"

#include <Kokkos_Core.hpp>

#include <string>
#include <vector>

namespace sparsim::pruning::detail {

/// A device matrix with the given rows (and, if not empty, columns) of `src`, in its type.
template <class E, class S>
Kokkos::View<S**, Layout, DeviceOf<E>> select(const Kokkos::View<S**, Layout, DeviceOf<E>>& src,
                                              const std::vector<int>& rows,
                                              const std::vector<int>& cols,
                                              const std::string& name) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), src);
  const int nr = rows.empty() ? static_cast<int>(src.extent(0)) : static_cast<int>(rows.size());
  const int nc = cols.empty() ? static_cast<int>(src.extent(1)) : static_cast<int>(cols.size());
  Kokkos::View<S**, Layout, DeviceOf<E>> out(Kokkos::view_alloc(name, Kokkos::WithoutInitializing),
                                             nr, nc);
  auto ho = Kokkos::create_mirror_view(out);
  for (int r = 0; r < nr; ++r) {
    const int sr = rows.empty() ? r : rows[static_cast<std::size_t>(r)];
    for (int k = 0; k < nc; ++k)
      ho(r, k) = h(sr, cols.empty() ? k : cols[static_cast<std::size_t>(k)]);
  }
  Kokkos::deep_copy(out, ho);
  return out;
}

/// The rows `rows` (all when empty) and columns `cols` (all when empty) of m, in its type.
template <class E>
Matrix<E> select_matrix(const Matrix<E>& m, const std::vector<int>& rows,
                        const std::vector<int>& cols, const std::string& name) {
  Matrix<E> o;
  o.dtype = m.dtype;
  o.rows = rows.empty() ? m.rows : static_cast<int>(rows.size());
  o.cols = cols.empty() ? m.cols : static_cast<int>(cols.size());
  switch (m.dtype) {
    case DType::F32:
      o.f32 = select<E>(m.f32, rows, cols, name);
      break;
    case DType::BF16:
      o.bf16 = select<E>(m.bf16, rows, cols, name);
      break;
    case DType::F16:
      o.f16 = select<E>(m.f16, rows, cols, name);
      break;
  }
  return o;
}

/// The values of m (any storage type, any backend) widened to fp32 and then to double,
/// row-major.
template <class E>
std::vector<double> host_values(const Matrix<E>& m) {
  std::vector<double> out(static_cast<std::size_t>(m.rows) * static_cast<std::size_t>(m.cols));
  auto copy = [&](const auto& v) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    for (int r = 0; r < m.rows; ++r)
      for (int c = 0; c < m.cols; ++c)
        out[static_cast<std::size_t>(r) * static_cast<std::size_t>(m.cols) +
            static_cast<std::size_t>(c)] = static_cast<double>(to_f32(h(r, c)));
  };
  switch (m.dtype) {
    case DType::BF16:
      copy(m.bf16);
      break;
    case DType::F16:
      copy(m.f16);
      break;
    case DType::F32:
      copy(m.f32);
      break;
  }
  return out;
}

}  // namespace sparsim::pruning::detail
