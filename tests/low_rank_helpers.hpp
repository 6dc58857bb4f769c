#pragma once
// The full-width model of a low-rank K/V model (PaLU, SVD-LLM): the reference the latent-cache
// engine and the low-rank backward pass are checked against.
#include "model/weights.hpp"

#include <Kokkos_Core.hpp>

#include <memory>

namespace sparsim::test {

/// The full-width model whose W_k, W_v are the low-rank model's B·A (computed in double, rounded
/// once to fp32); `full` gives the configuration of the model it was factorised from.
template <class E>
std::shared_ptr<Weights<E>> rebuilt(const Weights<E>& lr, const Weights<E>& full) {
  auto out = std::make_shared<Weights<E>>(lr);
  out->cfg = full.cfg;
  for (std::size_t l = 0; l < out->layers.size(); ++l) {
    auto& lw = out->layers[l];
    for (int which = 0; which < 2; ++which) {
      const Matrix<E>& a = which == 0 ? lr.layers[l].wk : lr.layers[l].wv;
      const Matrix<E>& b = which == 0 ? lr.layers[l].k_up : lr.layers[l].v_up;
      auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.f32);
      auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.f32);
      Matrix<E> w;
      w.rows = b.rows;
      w.cols = a.cols;
      w.f32 = decltype(w.f32)("rebuilt", w.rows, w.cols);
      auto hw = Kokkos::create_mirror_view(w.f32);
      for (int i = 0; i < w.rows; ++i)
        for (int j = 0; j < w.cols; ++j) {
          double s = 0;
          for (int k = 0; k < a.rows; ++k) s += static_cast<double>(hb(i, k)) * ha(k, j);
          hw(i, j) = static_cast<float>(s);
        }
      Kokkos::deep_copy(w.f32, hw);
      (which == 0 ? lw.wk : lw.wv) = w;
    }
    lw.k_up = Matrix<E>{};
    lw.v_up = Matrix<E>{};
  }
  return out;
}

}  // namespace sparsim::test
