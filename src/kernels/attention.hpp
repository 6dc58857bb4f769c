#pragma once
/// Causal grouped-query attention over a KV cache.
///
/// Rows are (sequence, token) pairs, row = s·T + t, at cache position p0 + t. The cache of one
/// layer is [n_seq][max_ctx][kv_dim]. One team computes one (row, query head): it scores every
/// cached key up to its own position, takes a max-shifted softmax and mixes the values. Each
/// score and each output element is produced by one thread with a fixed summation order.
#include "core/compat.hpp"
#include "kernels/fast_math.hpp"
#include "kernels/host_attention.hpp"
#include "kernels/linear.hpp"
#include "kernels/team_softmax.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <vector>

namespace sparsim {

template <class E>
using Cache = Kokkos::View<float***, Layout, DeviceOf<E>>;  // [seq][pos][kv_dim]

/// Writes the new keys/values of rows (s, t) into cache position p0 + t of sequence s. Keys and
/// values may have different widths (a pruned layer). A key cache whose first `k_base` positions
/// were compacted away holds position p at row p − k_base (KVLayer::k).
template <class E>
void kv_store(const E& exec, const CMat<E>& k, const CMat<E>& v, const Cache<E>& kc,
              const Cache<E>& vc, int n_seq, int T, int p0, int k_base = 0) {
  const int kd = static_cast<int>(k.extent(1)), vd = static_cast<int>(v.extent(1));
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    // a row per work item: a decode step is one small launch (a two-dimensional range's set-up
    // cost more than the copy)
    Kokkos::parallel_for("sparsim::kernels::kv_store", light(Kokkos::RangePolicy<E>(exec, 0, n_seq * T)),
                         [=](const int r) {
                           const int s = r / T, t = r % T;
                           for (int j = 0; j < kd; ++j) kc(s, p0 + t - k_base, j) = k(r, j);
                           for (int j = 0; j < vd; ++j) vc(s, p0 + t, j) = v(r, j);
                         });
    return;
  }
  Kokkos::parallel_for(
      "sparsim::kernels::kv_store",
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n_seq * T, kd > vd ? kd : vd})),
      KOKKOS_LAMBDA(const int r, const int j) {
        const int s = r / T, t = r % T;
        if (j < kd) kc(s, p0 + t - k_base, j) = k(r, j);
        if (j < vd) vc(s, p0 + t, j) = v(r, j);
      });
}

namespace detail {

/// Maximum and sum of x[0 … n) in kLanes fixed lanes (lane l takes i ≡ l mod kLanes, then a
/// fixed tree), so that they vectorise and their order is part of the code.
KOKKOS_INLINE_FUNCTION float max_lanes(const float* x, int n) {
  float m[kLanes];
  for (int l = 0; l < kLanes; ++l) m[l] = -3.0e38f;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
  for (int l = 0; i + l < n; ++l) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) m[l] = m[l + h] > m[l] ? m[l + h] : m[l];
  return m[0];
}

KOKKOS_INLINE_FUNCTION float sum_lanes(const float* x, int n) {
  float a[kLanes];
  for (int l = 0; l < kLanes; ++l) a[l] = 0.0f;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) a[l] += x[i + l];
  for (int l = 0; i + l < n; ++l) a[l] += x[i + l];
  for (int h = kLanes / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) a[l] += a[l + h];
  return a[0];
}

/// Query rows per BLAS tile of the host prefill attention.
inline constexpr int kAttnTileRows = 64;
/// Cached positions per work item of the host decode attention.
inline constexpr int kAttnChunk = 256;

template <class E>
using HostLL = Kokkos::View<const float**, Kokkos::LayoutLeft, DeviceOf<E>,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class E>
using HostLLout =
    Kokkos::View<float**, Kokkos::LayoutLeft, DeviceOf<E>, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Per (chunk, query head) partial of the host decode attention: max, sum, unnormalised output.
inline int chunk_part(int v_dim) {
  return v_dim + 2;
}

/// A band of cached rows: row p of the band at ptr + p·stride.
struct RowBand {
  const float* ptr;
  std::size_t stride;
};

/// out[0 … v_dim) from the partials of chunks 0 … nch − 1 (each chunk_part(v_dim) floats), merged
/// in chunk order.
KOKKOS_INLINE_FUNCTION void merge_chunks(const float* pt, int nch, int v_dim, float* o) {
  const int part = v_dim + 2;
  float mx = -3.0e38f;
  for (int c = 0; c < nch; ++c) mx = pt[c * part] > mx ? pt[c * part] : mx;
  for (int i = 0; i < v_dim; ++i) o[i] = 0.0f;
  float sum = 0.0f;
  for (int c = 0; c < nch; ++c) {
    const float f = exp_nonpos(pt[c * part] - mx);
    sum += f * pt[c * part + 1];
    for (int i = 0; i < v_dim; ++i) o[i] += f * pt[c * part + 2 + i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < v_dim; ++i) o[i] *= inv;
}

/// The bytes [i·B/n, (i+1)·B/n) of a block of B bytes: the share of its prefetches one of n
/// consecutive loops issues.
inline host::Ahead ahead_share(const host::Ahead& a, int i, int n) {
  const std::size_t b0 = a.bytes * static_cast<std::size_t>(i) / static_cast<std::size_t>(n);
  const std::size_t b1 = a.bytes * static_cast<std::size_t>(i + 1) / static_cast<std::size_t>(n);
  return {a.p == nullptr ? nullptr : static_cast<const char*>(a.p) + b0, b1 - b0};
}

/// The chunked host decode shared by attention_host_decode and cached_attention: rows r < n of
/// q and out, row r attending to its first npos(r) ≤ max_pos positions, cut into chunks of
/// kAttnChunk. A work item is one (row, chunk); rows(r, pb, len, values) is the one contiguous
/// block of cache rows the item reads (its full-width key rows, or its value rows; empty where it
/// has none). Then the KV heads in order, each with its query heads together: score(r, kvh, pb,
/// len, S, extra, ahead) writes the chunk's scaled scores to S (len × group, column-major;
/// `extra` is a scratch of n_extra floats), and each query head's max, exponentials and sum
/// (host::chunk_softmax); then each KV head's value mix (vband(r, kvh, pb, len) is the RowBand of
/// the chunk's value rows, v_dim wide). The worker that finishes a row's last item merges that
/// row's chunks, per query head in chunk order (no second parallel pass, whose start and wait
/// cost as much as the merge itself). Chunks and call shapes depend on the positions only, never
/// on the thread count, and which worker merges a row changes nothing in its arithmetic.
///
/// The memory transfers run under the arithmetic: each worker (one per thread) takes its items
/// from a shared counter one ahead, and while it scores an item it prefetches that item's value
/// rows, while it mixes them the next item's key rows (each loop a share of the block, spread over
/// its steps: host::Ahead). Only a worker's first item reads its key rows before computing
/// (host::touch). Which worker takes an item changes nothing in its arithmetic.
template <class E, class NPos, class Rows, class Score, class VBand>
void decode_chunks_host(const E& exec, const std::string& label, int n, int n_head, int n_kv,
                        int v_dim, int max_pos, int n_extra, const NPos& npos, const Rows& rows,
                        const Score& score, const VBand& vband, const Mat<E>& out) {
  constexpr int C = kAttnChunk;
  const int group = n_head / n_kv;
  const int nch = (max_pos + C - 1) / C;
  const int part = chunk_part(v_dim);
  const int items = n * nch;
  Kokkos::View<float**, Layout, DeviceOf<E>> parts(
      Kokkos::view_alloc(label + "::parts", Kokkos::WithoutInitializing), n * n_head, nch * part);
  const int conc = static_cast<int>(exec.concurrency());
  const int workers = conc < items ? (conc > 0 ? conc : 1) : (items > 0 ? items : 1);
  Kokkos::View<float**, Layout, DeviceOf<E>> scratch(
      Kokkos::view_alloc(label + "::chunk", Kokkos::WithoutInitializing), workers,
      n_head * C + n_extra);
  // Host memory: this path runs on host execution spaces only. `next` hands out the items;
  // done[r] counts row r's finished items, and the worker that finishes a row's last one merges
  // that row (its fetch_add acquires every other worker's partials of the row).
  std::atomic<int> counter{0};
  std::atomic<int>* next = &counter;
  std::unique_ptr<std::atomic<int>[]> done_rows(new std::atomic<int>[n > 0 ? n : 1]);
  for (int r = 0; r < n; ++r) done_rows[r].store(0, std::memory_order_relaxed);
  std::atomic<int>* done = done_rows.get();
  Kokkos::parallel_for(label, light(Kokkos::RangePolicy<E>(exec, 0, workers)), [=](const int w) {
    float* sc = &scratch(w, 0);
    float* extra = sc + n_head * C;
    const int pstride = static_cast<int>(parts.stride(0));
    // The next item with positions to read (items past a row's length have none), or `items`.
    const auto take = [&]() {
      for (;;) {
        const int it = next->fetch_add(1, std::memory_order_relaxed);
        if (it >= items) return items;
        if ((it % nch) * C < npos(it / nch)) return it;
      }
    };
    const auto block = [&](int it, bool values) {
      const int r = it / nch, pb = (it % nch) * C, np = npos(r);
      return rows(r, pb, np - pb < C ? np - pb : C, values);
    };
    int cur = take();
    if (cur < items) host::touch(block(cur, false));
    while (cur < items) {
      const int nxt = take();
      const int c = cur % nch, r = cur / nch;
      const int np = npos(r), pb = c * C;
      const int len = np - pb < C ? np - pb : C;
      float* pt = &parts(r * n_head, c * part);
      const host::Ahead va = rows(r, pb, len, true);
      const host::Ahead kn = nxt < items ? block(nxt, false) : host::Ahead{};
      for (int kvh = 0; kvh < n_kv; ++kvh) {
        float* sk = sc + kvh * group * len;
        score(r, kvh, pb, len, sk, extra, ahead_share(va, kvh, n_kv));
        host::chunk_softmax(sk, len, group, pt + kvh * group * pstride, pstride);
      }
      for (int kvh = 0; kvh < n_kv; ++kvh) {
        const RowBand vb = vband(r, kvh, pb, len);
        host::attn_values(sc + kvh * group * len, static_cast<std::size_t>(len), group, vb.ptr,
                          vb.stride, len, v_dim, pt + kvh * group * pstride + 2,
                          static_cast<std::size_t>(pstride), ahead_share(kn, kvh, n_kv));
      }
      const int rch = (np + C - 1) / C;  // row r's items with positions
      if (done[r].fetch_add(1, std::memory_order_acq_rel) + 1 == rch)
        for (int h = 0; h < n_head; ++h)
          merge_chunks(&parts(r * n_head + h, 0), rch, v_dim, &out(r, h * v_dim));
      cur = nxt;
    }
  });
  exec.fence();
}

}  // namespace detail

/// Host decode attention (T = 1). The cached positions are cut into chunks of kAttnChunk; a
/// work item is one (sequence, chunk): it takes its KV heads in turn, each with its query heads
/// together (they are adjacent in q): the chunk's scores (host::attn_scores), the chunk's max,
/// exponentials and sum per head (host::chunk_softmax); then it mixes the value rows per KV head
/// (host::attn_values), unnormalised. The scores prefetch the chunk's value rows, the value mix
/// the next item's key rows (detail::decode_chunks_host). The worker that finishes a sequence's
/// last item merges its chunks, per query head in chunk order. Chunks depend on the position only,
/// so the result does not depend on the thread count, and a long cache gives every thread work at
/// batch 1.
template <class E>
void attention_host_decode(const E& exec, const CMat<E>& q, const Cache<E>& kc, const Cache<E>& vc,
                           const Mat<E>& out, int n_seq, int p0, int n_head, int n_kv_head,
                           int qk_dim, int v_dim, float scale) {
  const int group = n_head / n_kv_head;
  const std::size_t kstride = kc.stride(0), vstride = vc.stride(0);
  const std::size_t kw = kc.stride(1), vw = vc.stride(1);
  detail::decode_chunks_host(
      exec, "sparsim::kernels::attention_host_decode", n_seq, n_head, n_kv_head, v_dim, p0 + 1, 0,
      [=](int) { return p0 + 1; },
      [=](int s, int pb, int len, bool values) {
        // rows pb … pb + len − 1 of a [pos][width] cache are one block
        return values ? host::Ahead{vc.data() + s * vstride + pb * vw, len * vw * sizeof(float)}
                      : host::Ahead{kc.data() + s * kstride + pb * kw, len * kw * sizeof(float)};
      },
      [=](int s, int kvh, int pb, int len, float* S, float*, const host::Ahead& ahead) {
        host::attn_scores(&q(s, kvh * group * qk_dim), static_cast<std::size_t>(qk_dim), group,
                          kc.data() + s * kstride + pb * kw + kvh * qk_dim, kw, len, qk_dim, scale,
                          S, static_cast<std::size_t>(len), ahead);
      },
      [=](int s, int kvh, int pb, int) {
        return detail::RowBand{vc.data() + s * vstride + pb * vw + kvh * v_dim, vw};
      },
      out);
}

/// Optional output of the host prefill attention (attention_host): the softmax weight each key
/// position receives, summed over the call's query rows and over the query heads of its KV
/// group — H2O's accumulated attention, taken from the weights the kernel computes anyway instead
/// of a second pass over the prompt. votes [n_seq][n_kv_head][≥ p0 + T] (double) is written at
/// p < p0 + T; `seconds` receives the time the sums took, summed over the work items (the CPU
/// time of the fusion, whatever the thread count). Each tile's sums are one thread's (a float
/// axpy per row, rows in order) and the tiles and heads are added in a fixed order in double, so
/// the votes do not depend on the thread count.
template <class E>
struct KeyMass {
  Kokkos::View<double***, Layout, DeviceOf<E>> votes;
  double seconds = 0;
};

namespace detail {
/// votes(s, kvh, p) = Σ over the group's query heads, then the tiles in order, of the tiles'
/// partial sums (tile i holds positions < p0 + its last row + 1).
template <class E>
void key_mass_reduce(const E& exec, const Kokkos::View<float**, Layout, DeviceOf<E>>& part,
                     KeyMass<E>& mass, std::vector<double>& busy, int n_seq, int T, int p0,
                     int n_head, int n_kv_head) {
  constexpr int R = kAttnTileRows, kChunk = 256;
  const int tiles = (T + R - 1) / R, ctx = p0 + T, group = n_head / n_kv_head;
  const int chunks = (ctx + kChunk - 1) / kChunk;
  const auto votes = mass.votes;
  Kokkos::Experimental::UniqueToken<E> token(exec);
  if (busy.size() < static_cast<std::size_t>(token.size()))
    busy.resize(static_cast<std::size_t>(token.size()), 0.0);
  double* const busy_at = busy.data();
  Kokkos::parallel_for(
      "sparsim::kernels::key_mass",
      light(Kokkos::RangePolicy<E>(exec, 0, n_seq * n_kv_head * chunks)), [=](const int it) {
        const auto c0 = std::chrono::steady_clock::now();
        const int c = it % chunks, sh = it / chunks, s = sh / n_kv_head, kvh = sh % n_kv_head;
        const int q0 = c * kChunk, q1 = q0 + kChunk < ctx ? q0 + kChunk : ctx;
        double acc[kChunk];
        for (int p = 0; p < kChunk; ++p) acc[p] = 0.0;
        for (int g = 0; g < group; ++g)
          for (int tile = 0; tile < tiles; ++tile) {
            const int top = p0 + (tile * R + R < T ? tile * R + R : T);  // positions it holds
            const float* pr = &part((s * n_head + kvh * group + g) * tiles + tile, 0);
            for (int p = q0; p < (top < q1 ? top : q1); ++p) acc[p - q0] += pr[p];
          }
        for (int p = q0; p < q1; ++p) votes(s, kvh, p) = acc[p - q0];
        const int slot = token.acquire();
        busy_at[slot] +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
        token.release(slot);
      });
  exec.fence();
  for (const double b : busy) mass.seconds += b;
}
}  // namespace detail

/// Host attention, tiled for the vendor BLAS (decode calls go to attention_host_decode). A work
/// item is one (sequence, query head, tile of up to kAttnTileRows consecutive rows): S =
/// scale·Q·Kᵀ over the positions the tile needs (one GEMM), a max-shifted softmax per row with
/// the causally hidden positions set to 0, O = P·V (one GEMM), then each row divided by its
/// sum. Each BLAS call runs on one thread and its shape depends only on T, p0 and the tile — not
/// on the thread count or the number of sequences — so every output element has one fixed
/// summation order. Query and key heads are `qk_dim` wide, value and output heads `v_dim`.
template <class E>
void attention_host(const E& exec, const CMat<E>& q, const Cache<E>& kc, const Cache<E>& vc,
                    const Mat<E>& out, int n_seq, int T, int p0, int n_head, int n_kv_head,
                    int qk_dim, int v_dim, float scale, KeyMass<E>* mass = nullptr) {
  if (T == 1 && !mass) {
    attention_host_decode(exec, q, kc, vc, out, n_seq, p0, n_head, n_kv_head, qk_dim, v_dim, scale);
    return;
  }
  using LL = detail::HostLL<E>;
  using LLout = detail::HostLLout<E>;
  using Dyn = Kokkos::RangePolicy<E, Kokkos::Schedule<Kokkos::Dynamic>>;
  const int ctx = p0 + T;
  const int group = n_head / n_kv_head;
  const int rows = n_seq * T;
  constexpr int R = detail::kAttnTileRows;
  const int tiles = (T + R - 1) / R;
  const int maxc = static_cast<int>(kc.extent(1));
  // Row-major [pos][width] caches are column-major (width, pos) matrices; a head is a band of
  // rows whose column stride (BLAS lda) stays the cache's row stride.
  const auto kstride = kc.stride(0), vstride = vc.stride(0);
  const int kw = static_cast<int>(kc.stride(1)), vw = static_cast<int>(vc.stride(1));
  const int qw = static_cast<int>(q.stride(0)), ow = static_cast<int>(out.stride(0));
  // One scratch block of scores (ctx × R, column-major) and row sums per concurrent worker.
  Kokkos::Experimental::UniqueToken<E> token(exec);
  Kokkos::View<float**, Layout, DeviceOf<E>> scratch(
      Kokkos::view_alloc(std::string("sparsim::attention::scores"), Kokkos::WithoutInitializing),
      token.size(), ctx * R + R);
  // key mass: one row of partial sums per (sequence, query head, tile), and each slot's time
  Kokkos::View<float**, Layout, DeviceOf<E>> part;
  std::vector<double> busy;
  if (mass) {
    part = Kokkos::View<float**, Layout, DeviceOf<E>>(
        Kokkos::view_alloc(std::string("sparsim::attention::key_mass"),
                           Kokkos::WithoutInitializing),
        n_seq * n_head * tiles, ctx);
    busy.assign(static_cast<std::size_t>(token.size()), 0.0);
  }
  double* const busy_at = busy.data();
  Kokkos::parallel_for(
      "sparsim::kernels::attention_host", light(Dyn(exec, 0, n_seq * n_head * tiles).set_chunk_size(1)),
      [=](const int it) {
        // Heavier (later) tiles first: the causal triangle makes them the long ones.
        const int tile = tiles - 1 - it % tiles;
        const int s = it / tiles / n_head, h = it / tiles % n_head;
        const int kvh = h / group;
        const int t0 = tile * R;
        const int nr = T - t0 < R ? T - t0 : R;
        const int npe = p0 + t0 + nr;  // positions the tile reads
        const int r0 = s * T + t0;
        const int slot = token.acquire();
        float* sc = &scratch(slot, 0);
        float* inv = sc + static_cast<std::ptrdiff_t>(npe) * nr;
        const LL K(kc.data() + s * kstride, kw, maxc), V(vc.data() + s * vstride, vw, maxc);
        const LL Q(q.data(), qw, rows);
        const LLout Oall(out.data(), ow, rows);
        const auto P = Kokkos::make_pair(0, npe);
        const auto Rw = Kokkos::make_pair(r0, r0 + nr);
        const LLout S(sc, npe, nr);
        KokkosBlas::gemm("T", "N", scale,
                         Kokkos::subview(K, Kokkos::make_pair(kvh * qk_dim, (kvh + 1) * qk_dim), P),
                         Kokkos::subview(Q, Kokkos::make_pair(h * qk_dim, (h + 1) * qk_dim), Rw),
                         0.0f, S);
        for (int j = 0; j < nr; ++j) {
          float* col = sc + static_cast<std::ptrdiff_t>(j) * npe;
          const int valid = p0 + t0 + j + 1;
          const float mx = detail::max_lanes(col, valid);
          for (int p = 0; p < valid; ++p) col[p] = detail::exp_nonpos(col[p] - mx);
          for (int p = valid; p < npe; ++p) col[p] = 0.0f;
          inv[j] = 1.0f / detail::sum_lanes(col, valid);
        }
        if (busy_at) {  // the tile's weights, Σ over its rows in order
          const auto c0 = std::chrono::steady_clock::now();
          float* pr = &part((s * n_head + h) * tiles + tile, 0);
          for (int p = 0; p < npe; ++p) pr[p] = 0.0f;
          for (int j = 0; j < nr; ++j) {
            const float* col = sc + static_cast<std::ptrdiff_t>(j) * npe;
            const float a = inv[j];
            for (int p = 0; p < npe; ++p) pr[p] += col[p] * a;
          }
          busy_at[slot] +=
              std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
        }
        const auto O = Kokkos::subview(Oall, Kokkos::make_pair(h * v_dim, (h + 1) * v_dim), Rw);
        KokkosBlas::gemm("N", "N", 1.0f,
                         Kokkos::subview(V, Kokkos::make_pair(kvh * v_dim, (kvh + 1) * v_dim), P),
                         LL(sc, npe, nr), 0.0f, O);
        for (int j = 0; j < nr; ++j)
          for (int i = 0; i < v_dim; ++i) O(i, j) *= inv[j];
        token.release(slot);
      });
  exec.fence();
  if (mass) detail::key_mass_reduce(exec, part, *mass, busy, n_seq, T, p0, n_head, n_kv_head);
}

/// out[r][h·dv + i] = Σ_p softmax_p(scale · q_h·k_p) v_p[i] over p ≤ p0 + t, with query/key
/// heads `qk_dim` wide and value/output heads `v_dim` wide (a pruned layer keeps the full
/// model's scale 1/√head_dim).
/// `mass`: the key mass (KeyMass), host backends only.
template <class E>
void attention(const E& exec, const CMat<E>& q, const Cache<E>& kc, const Cache<E>& vc,
               const Mat<E>& out, int n_seq, int T, int p0, int n_head, int n_kv_head, int qk_dim,
               int v_dim, float scale, KeyMass<E>* mass = nullptr) {
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    attention_host(exec, q, kc, vc, out, n_seq, T, p0, n_head, n_kv_head, qk_dim, v_dim, scale,
                   mass);
    return;
  }
  if (mass) throw std::logic_error("attention: the key mass is summed on host backends only");
  using Policy = Kokkos::TeamPolicy<E>;
  using Team = typename Policy::member_type;
  using ScratchVec = Kokkos::View<float*, typename E::scratch_memory_space,
                                  Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const int ctx = p0 + T;
  const int group = n_head / n_kv_head;
  Policy pol = team_policy(exec, n_seq * T * n_head);
  pol = pol.set_scratch_size(1, Kokkos::PerTeam(ScratchVec::shmem_size(ctx)));
  Kokkos::parallel_for(
      "sparsim::kernels::attention", light(pol), KOKKOS_LAMBDA(const Team& team) {
        const int r = team.league_rank() / n_head;
        const int h = team.league_rank() % n_head;
        const int s = r / T, t = r % T;
        const int kvh = h / group;
        const int npos = p0 + t + 1;
        ScratchVec sc(team.team_scratch(1), ctx);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, npos), [&](const int p) {
          float acc = 0.0f;
          for (int i = 0; i < qk_dim; ++i) acc += q(r, h * qk_dim + i) * kc(s, p, kvh * qk_dim + i);
          sc(p) = acc * scale;
        });
        detail::team_softmax_mix(team, sc, npos, vc, out, r, s, h, kvh, v_dim);
      });
}

/// Dense heads: every head `head_dim` wide, scale 1/√head_dim.
template <class E>
void attention(const E& exec, const CMat<E>& q, const Cache<E>& kc, const Cache<E>& vc,
               const Mat<E>& out, int n_seq, int T, int p0, int n_head, int n_kv_head,
               int head_dim) {
  attention(exec, q, kc, vc, out, n_seq, T, p0, n_head, n_kv_head, head_dim, head_dim,
            1.0f / kx::sqrt(static_cast<float>(head_dim)));
}

}  // namespace sparsim
