#pragma once
/// The inner loops of the host decode attention (kernels/attention.hpp,
/// detail::decode_chunks_host): one chunk of cached positions of one KV head against that head's
/// query heads. Compiled once per x86-64 level and chosen at run time (kernels/host_clones.hpp).
///
/// The scores of 16 positions (8 without AVX-512) are reduced together, for up to three query
/// heads at once, so that
/// each key block is loaded once for all of them: a vector holds the partial sums of two
/// positions (8 lanes each), so a head's products take one vector per 8 channels of two
/// positions, and the reduction (a transposing tree of shuffles and adds, instead of one
/// horizontal reduction per score) starts with two positions per vector. The work of a score is
/// then close to proportional to the head width in steps of 8 channels, where whole blocks of 16
/// made a pruned head of 18 or 50 channels cost as much as one of 32 or 64, and where the tree
/// (three levels for 16 positions, four for 8 before) cost more than the products of a narrow
/// head. The value mix keeps every query head's output row in registers while it reads the value
/// rows once (four heads and 64 channels at a time with AVX-512, two heads and 32 channels
/// without); a slab's last 1 … 8 channels past its last block of 16 take a block of 8. With
/// AVX-512 the 16 lanes are one register; without, two halves of 8 (a 16-float vector variable has
/// no register there and lived in memory, ten times slower). The arithmetic is the same.
///
/// These loops read one head's slice of 16 rows at a time, a pattern the hardware prefetchers
/// follow poorly from memory, so the rows they read come from the first- and second-level caches:
/// the caller brings a chunk's rows in as one block in address order, either read whole before the
/// loops (touch) or, while the loops of the previous block compute, as prefetches into the
/// second-level cache spread over their steps (Ahead). Prefetches into the first-level cache
/// (locality 3) competed with the loops' own loads and measured slower than no prefetch at all.
///
/// Arithmetic, fixed by the code (never by the thread count or the chunking):
/// - a score sums its products in 8 lanes, lane l taking channels i ≡ l (mod 8) in order of i;
///   when d is not a multiple of 8 the last block is the row's last 8 channels, its first
///   8 − d mod 8 lanes (already counted) weighted 0; then the lanes are added pairwise at
///   distances 4, 2, 1 and the sum is multiplied by `scale`;
/// - an output channel of the value mix adds w_p · v_p over the positions in order.
/// Whether a multiply and an add are fused depends on the clone (FMA from x86-64-v3 on).
#include <cstddef>

namespace sparsim::host {

/// Bytes a loop brings towards the caches (prefetches spread over its steps) while it computes:
/// the rows the caller reads next.
struct Ahead {
  const void* p = nullptr;
  std::size_t bytes = 0;
};

/// s[g·ls + p] = scale · Σ_{i<d} q[g·qs + i] · k[p·ks + i] for g < group, p < len.
void attn_scores(const float* q, std::size_t qs, int group, const float* k, std::size_t ks, int len,
                 int d, float scale, float* s, std::size_t ls, Ahead ahead = {});

/// o[g·os + i] = Σ_{p<len} w[g·ws + p] · v[p·vs + i] for g < group, i < d.
void attn_values(const float* w, std::size_t ws, int group, const float* v, std::size_t vs, int len,
                 int d, float* o, std::size_t os, Ahead ahead = {});

/// Max and sum of one chunk's scores for a KV head's `group` query heads: exponentiates the
/// scores (len × group, column-major, in `sc`) in place, max-shifted per head
/// (detail::exp_nonpos), and writes head g's max and sum (detail::max_lanes, detail::sum_lanes)
/// to part[g·pstride] and part[g·pstride + 1].
void chunk_softmax(float* sc, int len, int group, float* part, int pstride);

/// Issues the prefetches of `ahead` at once (where no loop runs to spread them over).
void prefetch(Ahead ahead);

/// Reads the block's floats in address order and discards what it read: brings a block of cache
/// rows into the caches as one forward stream.
void touch(Ahead block);

}  // namespace sparsim::host
