#pragma once
/// Prefill attention as two batched matrix products around a row softmax, the shape that lets a
/// GPU's BLAS (cuBLAS) do the arithmetic:
///
///   S_b = scale · Q_b K_bᵀ    (T × ctx, every query row of a sequence against its cache)
///   P_b = causal softmax(S_b) (row t keeps keys 0 … p0 + t; the rest become exact zeros)
///   O_b = P_b V_b             (T × v_dim)
///
/// for every (sequence, query head) b, K_b and V_b the KV head of the head's group. Pointers to
/// each product's operands are computed on the device, so a call needs no host-to-device copy.
/// The scores of a chunk of (sequence, head) pairs live in a workspace of at most kMaxScores
/// floats (`max_scores`); longer prompts go through in several chunks.
///
/// The products run through cuBLAS on CUDA (plain fp32 arithmetic, or TF32 tensor cores with
/// `fast`); on other backends through a plain Kokkos loop, which is how the tests check the
/// pointer arithmetic, the masking and the softmax against the reference attention. The
/// softmax's sums have a fixed order (one team per row, fixed team size).
#include "core/compat.hpp"
#include "core/device_blas.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace sparsim {

namespace attn {

/// Score floats one chunk may hold (1 GiB).
inline constexpr std::size_t kMaxScores = std::size_t(1) << 28;

/// Scores and operand pointers of the GEMM prefill attention; grows on demand.
template <class E>
struct GemmWorkspace {
  Kokkos::View<float*, DeviceOf<E>> scores;
  Kokkos::View<std::uintptr_t*, DeviceOf<E>> ptrs;  ///< [5][batch]: k, q, s, v, o
  void ensure(std::size_t score_floats, int batch) {
    if (scores.extent(0) < score_floats)
      scores = Kokkos::View<float*, DeviceOf<E>>(
          Kokkos::view_alloc("sparsim::attention::gemm_scores", Kokkos::WithoutInitializing),
          score_floats);
    if (ptrs.extent(0) < static_cast<std::size_t>(5) * batch)
      ptrs = Kokkos::View<std::uintptr_t*, DeviceOf<E>>(
          Kokkos::view_alloc("sparsim::attention::gemm_ptrs", Kokkos::WithoutInitializing),
          static_cast<std::size_t>(5) * batch);
  }
};

/// C_b (m × n, column-major, ldc) = alpha · op(A_b) · op(B_b) for b < count, pointer arrays in
/// device memory. Plain loops on backends without a vendor BLAS (one thread per element,
/// fixed order).
template <class E>
void gemm_batched(const E& exec, bool ta, bool tb, int m, int n, int k, float alpha,
                  const std::uintptr_t* a, int lda, const std::uintptr_t* b, int ldb,
                  const std::uintptr_t* c, int ldc, int count, bool fast) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<E, Kokkos::Cuda>) {
    device_blas::gemm_batched_f32(exec, ta, tb, m, n, k, alpha,
                                  reinterpret_cast<const float* const*>(a), lda,
                                  reinterpret_cast<const float* const*>(b), ldb,
                                  reinterpret_cast<float* const*>(c), ldc, count, fast);
    return;
  }
#endif
  (void)fast;
  Kokkos::parallel_for(
      "sparsim::attention::gemm_batched_loops",
      light(Kokkos::RangePolicy<E>(exec, 0, static_cast<std::size_t>(count) * m * n)),
      KOKKOS_LAMBDA(const std::size_t x) {
        const int i = static_cast<int>(x % m), j = static_cast<int>((x / m) % n);
        const int bb = static_cast<int>(x / (static_cast<std::size_t>(m) * n));
        const float* A = reinterpret_cast<const float*>(a[bb]);
        const float* B = reinterpret_cast<const float*>(b[bb]);
        float* C = reinterpret_cast<float*>(c[bb]);
        float acc = 0.0f;
        for (int l = 0; l < k; ++l) {
          const float av = ta ? A[l + static_cast<std::size_t>(i) * lda]
                              : A[i + static_cast<std::size_t>(l) * lda];
          const float bv = tb ? B[j + static_cast<std::size_t>(l) * ldb]
                              : B[l + static_cast<std::size_t>(j) * ldb];
          acc += av * bv;
        }
        C[i + static_cast<std::size_t>(j) * ldc] = alpha * acc;
      });
}

}  // namespace attn

/// Prefill attention through batched products: rows r = s·T + t of q ([n_seq·T][n_head·qk])
/// at positions p0 + t against keys 0 … p0 + t of the cache ([seq][max_ctx][n_kv·qk], values
/// [seq][max_ctx][n_kv·vd]); out is [n_seq·T][n_head·vd]. `scale` multiplies the scores.
template <class E>
void attention_prefill_gemm(const E& exec, const CMat<E>& q,
                            const Kokkos::View<float***, Layout, DeviceOf<E>>& kc,
                            const Kokkos::View<float***, Layout, DeviceOf<E>>& vc,
                            const Mat<E>& out, int n_seq, int T, int p0, int n_head, int n_kv,
                            int qk, int vd, float scale, attn::GemmWorkspace<E>& ws,
                            bool fast = false, std::size_t max_scores = attn::kMaxScores) {
  const int ctx = p0 + T;
  const int group = n_head / n_kv;
  const int max_ctx = static_cast<int>(kc.extent(1));
  const int qd = n_head * qk, kvd = n_kv * qk, vvd = n_kv * vd, od = n_head * vd;
  const std::size_t per = static_cast<std::size_t>(T) * ctx;
  const int total = n_seq * n_head;
  const int chunk = static_cast<int>(
      std::max<std::size_t>(1, std::min<std::size_t>(total, max_scores / per)));
  ws.ensure(per * chunk, chunk);
  const float* qp = q.data();
  const float* kp = kc.data();
  const float* vp = vc.data();
  float* op = out.data();
  float* sp = ws.scores.data();
  std::uintptr_t* pt = ws.ptrs.data();
  constexpr bool host =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible;
  const int team = host ? 1 : 256;
  for (int b0 = 0; b0 < total; b0 += chunk) {
    const int nb = std::min(chunk, total - b0);
    Kokkos::parallel_for(
        "sparsim::attention::gemm_pointers", light(Kokkos::RangePolicy<E>(exec, 0, nb)),
        KOKKOS_LAMBDA(const int b) {
          const int pair = b0 + b;
          const int s = pair / n_head, h = pair % n_head, g = h / group;
          const std::size_t cache = static_cast<std::size_t>(s) * max_ctx;
          pt[b] = reinterpret_cast<std::uintptr_t>(kp + cache * kvd + g * qk);
          pt[chunk + b] =
              reinterpret_cast<std::uintptr_t>(qp + static_cast<std::size_t>(s) * T * qd + h * qk);
          pt[2 * chunk + b] = reinterpret_cast<std::uintptr_t>(sp + b * per);
          pt[3 * chunk + b] = reinterpret_cast<std::uintptr_t>(vp + cache * vvd + g * vd);
          pt[4 * chunk + b] =
              reinterpret_cast<std::uintptr_t>(op + static_cast<std::size_t>(s) * T * od + h * vd);
        });
    // S (column-major ctx × T, i.e. row-major [t][key]) = scale · Kᵀ-as-stored · Q
    attn::gemm_batched(exec, true, false, ctx, T, qk, scale, pt, kvd, pt + chunk, qd,
                       pt + 2 * chunk, ctx, nb, fast);
    // causal softmax of every row, keys past p0 + t set to exact zeros
    using Member = typename Kokkos::TeamPolicy<E>::member_type;
    Kokkos::parallel_for(
        "sparsim::attention::gemm_softmax",
        light(Kokkos::TeamPolicy<E>(exec, nb * T, team, 1)), KOKKOS_LAMBDA(const Member& tm) {
          const int row = tm.league_rank();
          const int t = row % T;
          float* sr = sp + static_cast<std::size_t>(row) * ctx;
          const int valid = p0 + t + 1;
          float mx = -3.0e38f;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(tm, valid),
              [&](const int j, float& m) { m = sr[j] > m ? sr[j] : m; }, Kokkos::Max<float>(mx));
          float sum = 0.0f;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(tm, valid),
              [&](const int j, float& a) { a += kx::exp(sr[j] - mx); }, sum);
          const float inv = 1.0f / sum;
          tm.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(tm, ctx), [&](const int j) {
            sr[j] = j < valid ? kx::exp(sr[j] - mx) * inv : 0.0f;
          });
        });
    // O (column-major vd × T, ld od) = V-as-stored (vd × ctx) · P (ctx × T)
    attn::gemm_batched(exec, false, false, vd, T, ctx, 1.0f, pt + 3 * chunk, vvd,
                       pt + 2 * chunk, ctx, pt + 4 * chunk, od, nb, fast);
  }
}

}  // namespace sparsim
