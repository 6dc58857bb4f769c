#pragma once
/// Column-skipping GEMV for activation sparsity at decode time.
///
/// The weight is stored transposed, Wt[in][out] (TEAL's layout): the weights that multiply one
/// input entry h_j are contiguous, so skipping h_j = 0 skips a whole row of Wt and the kernel
/// reads only the kept rows. y[o] = Σ_k h[idx[k]] · Wt[idx[k]][o] over the kept indices in
/// ascending order; each output is owned by one thread (blocks of kOutBlock outputs), so the
/// result does not depend on the thread count.
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

namespace sparsim {

inline constexpr int kOutBlock = 64;  ///< outputs per work item

/// y[out] = Σ_{k < nnz} x[idx[k]] · wt[idx[k]][:], wt is [in][out].
template <class E, class T>
void sparse_gemv(const E& exec, const CVec<E>& x, const IVec<E>& idx, int nnz,
                 const Kokkos::View<T**, Layout, DeviceOf<E>>& wt, const Vec<E>& y) {
  const int out = static_cast<int>(wt.extent(1));
  const int blocks = (out + kOutBlock - 1) / kOutBlock;
  Kokkos::parallel_for(
      "sparsim::kernels::sparse_gemv", Kokkos::RangePolicy<E>(exec, 0, blocks),
      KOKKOS_LAMBDA(const int b) {
        const int o0 = b * kOutBlock;
        const int nb = out - o0 < kOutBlock ? out - o0 : kOutBlock;
        float acc[kOutBlock];
        for (int j = 0; j < kOutBlock; ++j) acc[j] = 0.0f;
        for (int k = 0; k < nnz; ++k) {
          const int i = idx(k);
          const float xi = x(i);
          const T* row = &wt(i, o0);
          if (nb == kOutBlock) {  // the fixed-width loop vectorises
            for (int j = 0; j < kOutBlock; ++j) acc[j] += xi * to_f32(row[j]);
          } else {
            for (int j = 0; j < nb; ++j) acc[j] += xi * to_f32(row[j]);
          }
        }
        for (int j = 0; j < nb; ++j) y(o0 + j) = acc[j];
      });
}

}  // namespace sparsim
