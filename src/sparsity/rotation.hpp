#pragma once
/// WINA tensor rotation (paper 000, Appendix C; METHODS §1 "Tensor rotation").
///
/// Each RMSNorm weight g is folded into the matrices that read its output (W' = W·diag(g), the
/// norm weight becomes 1), then every block gets two orthogonal D×D bases:
///   Q_attn,l = right singular vectors of W'_k,l,   Q_mlp,l = those of W'_gate,l,
/// and Q_final = those of the folded LM head. The rotated model computes the same function:
///   E' = E·Q_attn,0;  q,k,v: W'·Q_attn,l;  o: Q_mlp,lᵀ·W_o;  gate, up: W'·Q_mlp,l;
///   down: Q_attn,l+1ᵀ·W_down (Q_attn,L = Q_final);  LM head: W'·Q_final,
/// with the residual stream moved between bases online by the engine (Weights::rot_attn_mlp
/// M_l = Q_mlp,lᵀ·Q_attn,l after attention, Weights::rot_mlp_next N_l = Q_attn,l+1ᵀ·Q_mlp,l after
/// the MLP). Since RMSNorm has weight 1 and an orthogonal Q keeps the rms, rmsnorm(x·Q) =
/// rmsnorm(x)·Q. After rotation W_k·Q_attn and W_gate·Q_mlp have orthogonal columns, which is
/// what makes WINA's column-norm-weighted TopK the right criterion.
///
/// Numerics: everything is computed in float64 on the host and rounded once to the storage type.
/// The right singular vectors V of a folded matrix W' (rows × D) are taken as the eigenvectors of
/// its D×D Gram matrix W'ᵀW' (LAPACK dsyevd), ordered by descending eigenvalue = squared singular
/// value, i.e. the SVD's V in the SVD's order. This is one path for every matrix: W_k (kv_dim < D
/// rows: the trailing eigenvectors span its null space, still orthonormal), W_gate and the LM head
/// (vocab × D, where an SVD would have to form a vocab-sized U). It is also what the rotation needs
/// exactly: (W'·Q)ᵀ(W'·Q) = QᵀW'ᵀW'Q is diagonal to rounding. dsyevd on the Gram matrix is about
/// twice as fast as dgesdd (which also forms U) for W_gate. Each vector's sign is fixed so that its
/// largest-magnitude component (the first one on ties) is positive.
///
/// Determinism: BLAS/LAPACK run single-threaded (OpenBLAS is switched to one thread for the
/// duration, found at run time, so any BLAS links) and sparsim parallelises over independent
/// decompositions, fixed 4096-row blocks of the Gram matrices (summed in block order) and fixed
/// 128-row chunks of every product, each written by one task. The result is therefore bitwise
/// the same for any OpenMP thread count on a given machine and BLAS.
#include "core/types.hpp"
#include "model/weights.hpp"

#include <memory>
#include <vector>

namespace sparsim::sparsity {

/// The orthogonal bases of a rotation; each matrix is D×D row-major with the basis vectors as
/// its columns (Q[i·D + j] = component i of vector j), so a rotated row vector is x·Q.
struct Rotation {
  int d_model = 0;
  int n_layer = 0;
  std::vector<std::vector<double>> q_attn;  ///< n_layer + 1; q_attn[n_layer] is Q_final
  std::vector<std::vector<double>> q_mlp;   ///< n_layer
};

/// Computes the bases of `w` (which must not be rotated already). Throws sparsim::Error if a
/// LAPACK decomposition fails.
template <class E>
Rotation compute_rotation(const Weights<E>& w);

/// A new, rotated model stored as `storage` (all norm weights 1, embeddings untied, the online
/// re-rotation matrices filled and stored as `rotation_storage`: fp32 by default, since they act
/// on the residual stream twice per block and 16-bit rounding there accumulates over the layers;
/// bf16 halves the bytes a decode step reads for them); `w` is left untouched. `r` must come
/// from compute_rotation on a model of the same shape.
template <class E>
std::shared_ptr<Weights<E>> apply_rotation(const Weights<E>& w, const Rotation& r, DType storage,
                                           DType rotation_storage = DType::F32);

}  // namespace sparsim::sparsity
