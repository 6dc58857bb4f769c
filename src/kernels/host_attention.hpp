#pragma once
/// The inner loops of the host decode attention (kernels/attention.hpp,
/// detail::decode_chunks_host): one chunk of cached positions of one KV head against that head's
/// query heads. Compiled once per x86-64 level and chosen at run time (kernels/host_clones.hpp).
///
/// The scores of 16 positions are reduced together (a transposing tree of shuffles and adds,
/// instead of one horizontal reduction per score), and the value mix keeps every query head's
/// output row in registers while it reads the value rows once.
///
/// The caller first reads the chunk's cache rows whole, in address order (touch_rows): these loops
/// read one head's slice of 16 rows at a time, a pattern the hardware prefetchers follow poorly
/// (from memory it streamed far below the rate of the same bytes read in order), and software
/// prefetches ahead of it made it slower still. From the first- and second-level caches the
/// head-by-head loops then run at their own speed.
///
/// Arithmetic, fixed by the code (never by the thread count or the chunking):
/// - a score sums its products in 16 lanes, lane l taking channels i ≡ l (mod 16) in order of i;
///   when d is not a multiple of 16 the last block is the row's last 16 channels, its first
///   16 − d mod 16 lanes (already counted) weighted 0; then the lanes are added pairwise at
///   distances 8, 4, 2, 1 (the tree of detail::dot_lanes) and the sum is multiplied by `scale`;
/// - an output channel of the value mix adds w_p · v_p over the positions in order.
/// Whether a multiply and an add are fused depends on the clone (FMA from x86-64-v3 on).
#include <cstddef>

namespace sparsim::host {

/// s[g·ls + p] = scale · Σ_{i<d} q[g·qs + i] · k[p·ks + i] for g < group, p < len.
void attn_scores(const float* q, std::size_t qs, int group, const float* k, std::size_t ks, int len,
                 int d, float scale, float* s, std::size_t ls);

/// o[g·os + i] = Σ_{p<len} w[g·ws + p] · v[p·vs + i] for g < group, i < d.
void attn_values(const float* w, std::size_t ws, int group, const float* v, std::size_t vs, int len,
                 int d, float* o, std::size_t os);

/// Reads rows p + r·stride (r < rows), `width` floats each, in address order and discards what it
/// read: brings a chunk of cache rows into the caches as one forward stream.
void touch_rows(const float* p, std::size_t stride, int rows, int width);

}  // namespace sparsim::host
