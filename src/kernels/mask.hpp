#pragma once
/// Activation masks for the projection inputs (METHODS §1): TEAL's threshold, WINA's TopK and
/// TopK-Guided, selected per row in O(d) by a radix select on the bits of the score, no sort.
///
/// Score_j = |x_j| · (norms(j) if norms is given, else 1). Scores are non-negative floats, so
/// their bit patterns (sign bit cleared, which also makes -0 equal +0) order like the floats.
/// The k-th largest key v is found digit by digit from the top (histogram passes, stopping
/// early once the boundary falls on a bin edge); then every entry with a score above v is kept,
/// and of those equal to v the lowest indices until exactly k are kept. The kept set is thus
/// defined by the keys alone (the k largest, ties to the lowest index), whatever the digits;
/// everything is integer counting, so the mask is the same for any thread count and backend.
///
/// Host backends run one thread per row with the histogram in a local array (select_row_serial:
/// one counting pass over the row, one pass that writes the mask, the exact boundary found among
/// the boundary bin's entries in between); other backends (GPUs) run one team per row with a
/// 256-bin histogram in team scratch and a team scan for the ties.
#include "core/compat.hpp"
#include "core/error.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace sparsim {

enum class MaskRule { None, Threshold, TopK, Guided };

struct MaskParams {
  MaskRule rule = MaskRule::None;
  float tau = 0;    ///< Threshold: drop |x_j| < tau. Guided: tau estimates the sparsity ŝ.
  float p = 0;      ///< target sparsity for TopK / Guided, in [0, 1)
  float delta = 0;  ///< Guided clip margin: s* = clip(ŝ, p - delta, p + delta)
};

/// Device-side scratch reused by mask_indices across calls (device backends only): the kept
/// count read back to the host and a row buffer when the caller wants no masked row.
template <class E>
struct MaskScratch {
  IVec<E> count;
  Vec<E> row;
  void ensure(int d) {
    if (count.extent(0) == 0) count = IVec<E>("sparsim::mask::count", 1);
    if (static_cast<int>(row.extent(0)) < d) row = Vec<E>("sparsim::mask::row", d);
  }
};

namespace detail {

inline constexpr int kMaskBins = 256;

/// Sign-cleared bit pattern of a non-negative float: uint32 order == float order.
KOKKOS_INLINE_FUNCTION unsigned score_key(float s) {
  union {
    float f;
    unsigned u;
  } c;
  c.f = s;
  return c.u & 0x7fffffffu;
}

KOKKOS_INLINE_FUNCTION unsigned mask_key(const float* x, const float* nrm, int j) {
  const float a = kx::fabs(x[j]);
  return score_key(nrm ? a * nrm[j] : a);
}

/// k = floor(d (1 - s)) clamped to [1, d], computed in double precision.
KOKKOS_INLINE_FUNCTION int keep_count(int d, double s) {
  const double f = d * (1.0 - s);
  const int k = f >= 1.0 ? static_cast<int>(f) : 1;
  return k < d ? k : d;
}

/// Guided target sparsity s* = min(p + delta, max(p - delta, ŝ)), ŝ = below / d.
KOKKOS_INLINE_FUNCTION double guided_sparsity(int below, int d, float p, float delta) {
  const double sh = static_cast<double>(below) / d;
  const double lo = static_cast<double>(p) - static_cast<double>(delta);
  const double hi = static_cast<double>(p) + static_cast<double>(delta);
  const double s = sh > lo ? sh : lo;
  return s < hi ? s : hi;
}

/// One bin-walk step shared by the serial and team versions: from the histogram of the
/// current digit among the candidates (no key above bin `top`), picks the bin holding the rem-th
/// largest key, adds it to prefix and returns its count in `count`. Returns true when the search
/// can stop (the whole bin is kept, or the last digit is done).
KOKKOS_INLINE_FUNCTION bool walk_bins(const int* hist, int top, int shift, unsigned& prefix,
                                      int& rem, int& count) {
  int b = top;
  for (; b > 0; --b) {
    if (hist[b] >= rem) break;
    rem -= hist[b];
  }
  prefix |= static_cast<unsigned>(b) << shift;
  count = hist[b];
  return hist[b] == rem || shift == 0;
}

/// Team version's digits: 8 bits from the top; mask of the bits above the current digit.
KOKKOS_INLINE_FUNCTION unsigned high_mask(int shift) {
  return shift >= 24 ? 0u : (~0u << (shift + 8));
}

/// Serial version (host, one thread per row). Keys are computed kMaskChunk at a time into a
/// local block by a branch-free loop the compiler vectorises (with the block's smallest and
/// largest key and Guided's count of |x_j| < tau), and the scalar loops read that block.
/// 1. Counting pass: histogram of bits 30..20 (sign cleared: exponent and 3 mantissa bits);
///    only the bins between the row's smallest and largest key are cleared and walked.
/// 2. Final pass: y and idx for every entry at or above the boundary bin (vectorised for y,
///    branch-free for idx: a branch on the keep flag mispredicts about half the time), noting
///    where the boundary bin's entries (the candidates) went.
/// 3. The exact boundary among the candidates alone (digits about log2(#candidates) wide); the
///    candidates below it, and the ties past the first `need`, are zeroed in y and taken out of
///    idx (closing the gaps with a forward copy).
/// When every entry of the boundary bin is kept, 2 is the last step. Only a boundary bin of
/// more than kMaskCandidates entries costs more full passes (10-bit digits, as many as needed).
inline constexpr int kMaskChunk = 512;
inline constexpr int kMaskSerialBins = 2048;
inline constexpr int kMaskSubBins = 1024;
inline constexpr int kMaskCandidates = 2048;

/// Keys of x[0, n) (scores weighted by nrm when kNorms) into kb: one branch-free loop,
/// vectorised.
template <bool kNorms>
KOKKOS_INLINE_FUNCTION void block_keys(const float* x, const float* nrm, int n, unsigned* kb) {
  for (int i = 0; i < n; ++i) {
    const float a = kx::fabs(x[i]);
    kb[i] = score_key(kNorms ? a * nrm[i] : a);
  }
}

/// block_keys that also returns the smallest and largest key and adds the number of
/// |x_j| < tau to below.
template <bool kNorms>
KOKKOS_INLINE_FUNCTION void block_keys_stats(const float* x, const float* nrm, int n, float tau,
                                             unsigned* kb, unsigned& lo, unsigned& hi, int& below) {
  unsigned l = ~0u, h = 0;
  int b = 0;
  for (int i = 0; i < n; ++i) {
    const float a = kx::fabs(x[i]);
    const unsigned key = score_key(kNorms ? a * nrm[i] : a);
    kb[i] = key;
    l = key < l ? key : l;
    h = key > h ? key : h;
    b += a < tau ? 1 : 0;
  }
  lo = l;
  hi = h;
  below += b;
}

/// Keeps the whole row: y = x, idx = 0..d-1. Returns d.
KOKKOS_INLINE_FUNCTION int keep_all_serial(const float* x, int d, float* y, int* idx) {
  if (y && y != x)
    for (int j = 0; j < d; ++j) y[j] = x[j];
  if (idx)
    for (int j = 0; j < d; ++j) idx[j] = j;
  return d;
}

/// TopK / Guided on one row, one thread (see above). Returns the kept count k.
template <bool kNorms>
KOKKOS_INLINE_FUNCTION int select_row_serial(const float* x, const float* nrm, int d,
                                             const MaskParams& prm, float* y, int* idx) {
  int hist[kMaskSerialBins];
  unsigned kb[kMaskChunk];
  const auto nrm_at = [&](int j0) { return kNorms ? nrm + j0 : nullptr; };
  const auto len_at = [&](int j0) { return d - j0 < kMaskChunk ? d - j0 : kMaskChunk; };

  // first digit and Guided's count in one pass; only the bins between the smallest and the
  // largest key are cleared (and walked)
  int zlo = 0, zhi = -1, below = 0;
  for (int j0 = 0; j0 < d; j0 += kMaskChunk) {
    const int n = len_at(j0);
    unsigned klo = 0, khi = 0;
    block_keys_stats<kNorms>(x + j0, nrm_at(j0), n, prm.tau, kb, klo, khi, below);
    const int bl = static_cast<int>(klo >> 20), bh = static_cast<int>(khi >> 20);
    if (zhi < 0) {
      for (int b = bl; b <= bh; ++b) hist[b] = 0;
      zlo = bl;
      zhi = bh;
    } else {
      for (int b = bl; b < zlo; ++b) hist[b] = 0;
      for (int b = zhi + 1; b <= bh; ++b) hist[b] = 0;
      zlo = bl < zlo ? bl : zlo;
      zhi = bh > zhi ? bh : zhi;
    }
    int i = 0;
    for (; i + 4 <= n; i += 4) {  // unrolled: the loop is a few instructions per entry
      ++hist[kb[i] >> 20];
      ++hist[kb[i + 1] >> 20];
      ++hist[kb[i + 2] >> 20];
      ++hist[kb[i + 3] >> 20];
    }
    for (; i < n; ++i) ++hist[kb[i] >> 20];
  }
  const int k =
      keep_count(d, prm.rule == MaskRule::Guided ? guided_sparsity(below, d, prm.p, prm.delta)
                                                 : static_cast<double>(prm.p));
  if (k >= d) return keep_all_serial(x, d, y, idx);
  unsigned prefix = 0;
  int rem = k, count = 0, shift = 20;
  // the bins below zlo are not cleared, but the walk stops at zlo at the latest: the bins from
  // zlo up hold all d >= rem keys
  bool done = walk_bins(hist, zhi, shift, prefix, rem, count);

  // a boundary bin too large for the candidate buffer: refine it with full passes
  while (!done && count > kMaskCandidates) {
    const int hs = shift;
    shift -= 10;
    const unsigned hp = prefix >> hs;
    for (int b = 0; b < kMaskSubBins; ++b) hist[b] = 0;
    unsigned tb = 0;
    for (int j0 = 0; j0 < d; j0 += kMaskChunk) {
      const int n = len_at(j0);
      block_keys<kNorms>(x + j0, nrm_at(j0), n, kb);
      for (int i = 0; i < n; ++i) {
        const unsigned key = kb[i];
        if ((key >> hs) == hp) {
          const unsigned g = (key >> shift) & (kMaskSubBins - 1);
          ++hist[g];
          tb = g > tb ? g : tb;
        }
      }
    }
    done = walk_bins(hist, static_cast<int>(tb), shift, prefix, rem, count);
  }
  const unsigned pv = prefix >> shift;

  if (done && rem == count) {  // every entry of the boundary bin is kept: one final pass
    std::int64_t n = 0;
    for (int j0 = 0; j0 < d; j0 += kMaskChunk) {
      const int m = len_at(j0);
      block_keys<kNorms>(x + j0, nrm_at(j0), m, kb);
      if (y)
        for (int i = 0; i < m; ++i) y[j0 + i] = (kb[i] >> shift) >= pv ? x[j0 + i] : 0.0f;
      if (idx) {
        const auto step = [&](int i) {
          idx[n] = j0 + i;  // overwritten unless kept: no branch on the mask
          n += 1 + ((static_cast<std::int64_t>(kb[i] >> shift) - pv) >> 63);
        };
        int i = 0;
        for (; i + 4 <= m; i += 4) {
          step(i);
          step(i + 1);
          step(i + 2);
          step(i + 3);
        }
        for (; i < m; ++i) step(i);
      }
    }
    return k;
  }

  if (count > kMaskCandidates) {  // more than kMaskCandidates equal keys: scan for the ties
    int n = 0, ties = 0;
    for (int j0 = 0; j0 < d; j0 += kMaskChunk) {
      const int m = len_at(j0);
      block_keys<kNorms>(x + j0, nrm_at(j0), m, kb);
      for (int i = 0; i < m; ++i) {
        const unsigned kv = kb[i] >> shift;
        bool keep = kv > pv;
        if (kv == pv && ties < rem) {
          keep = true;
          ++ties;
        }
        if (y) y[j0 + i] = keep ? x[j0 + i] : 0.0f;
        if (idx) idx[n] = j0 + i;
        n += keep ? 1 : 0;
      }
    }
    return k;
  }

  // Final pass over the row: keep everything at or above the boundary bin and note the
  // candidates (the boundary bin's entries): their slot in idx, or their index without idx.
  int cs[kMaskCandidates + 1];
  unsigned kc[kMaskChunk];
  std::int64_t n = 0, nc = 0;
  for (int j0 = 0; j0 < d; j0 += kMaskChunk) {
    const int m = len_at(j0);
    block_keys<kNorms>(x + j0, nrm_at(j0), m, kb);
    if (y)
      for (int i = 0; i < m; ++i) y[j0 + i] = (kb[i] >> shift) >= pv ? x[j0 + i] : 0.0f;
    if (idx) {
      // branch-free: the flags come from a vectorised loop (kb becomes keep-for-now, kc
      // candidate), the scalar loop only adds them up
      for (int i = 0; i < m; ++i) {
        const unsigned g = kb[i] >> shift;
        kc[i] = g == pv ? 1u : 0u;
        kb[i] = g >= pv ? 1u : 0u;
      }
      const auto step = [&](int i) {
        idx[n] = j0 + i;
        cs[nc] = static_cast<int>(n);
        n += kb[i];
        nc += kc[i];
      };
      int i = 0;
      for (; i + 4 <= m; i += 4) {
        step(i);
        step(i + 1);
        step(i + 2);
        step(i + 3);
      }
      for (; i < m; ++i) step(i);
    } else {
      for (int i = 0; i < m; ++i) {
        cs[nc] = j0 + i;
        nc += (kb[i] >> shift) == pv ? 1 : 0;
      }
    }
  }
  // the exact boundary among the candidates
  unsigned ck[kMaskCandidates];
  for (int c = 0; c < nc; ++c) {
    const int j = idx ? idx[cs[c]] : cs[c];
    const float a = kx::fabs(x[j]);
    ck[c] = score_key(kNorms ? a * nrm[j] : a);
  }
  int wd = 4;  // digit width: about as many bins as candidates
  while (wd < 10 && (1 << wd) < nc) ++wd;
  while (!done) {
    const int hs = shift;
    shift = hs > wd ? hs - wd : 0;
    const unsigned hp = prefix >> hs, dm = (1u << (hs - shift)) - 1;
    for (unsigned b = 0; b <= dm; ++b) hist[b] = 0;
    unsigned tb = 0;
    for (int c = 0; c < nc; ++c) {
      const unsigned key = ck[c];
      if ((key >> hs) == hp) {
        const unsigned g = (key >> shift) & dm;
        ++hist[g];
        tb = g > tb ? g : tb;
      }
    }
    done = walk_bins(hist, static_cast<int>(tb), shift, prefix, rem, count);
  }
  // take out the candidates below the boundary (and the ties past the first rem): zero them
  // in y and close the gaps they leave in idx
  const unsigned bv = prefix >> shift;
  int ties = 0, w = -1, last = -1;
  for (int c = 0; c < nc; ++c) {
    const unsigned kv = ck[c] >> shift;
    if (kv > bv) continue;
    if (kv == bv && ties < rem) {
      ++ties;
      continue;
    }
    const int s = cs[c];
    if (y) y[idx ? idx[s] : s] = 0.0f;
    if (idx) {
      if (w < 0) {
        w = s;
      } else {
        for (int t = last + 1; t < s; ++t) idx[w++] = idx[t];
      }
      last = s;
    }
  }
  if (idx && w >= 0)
    for (int t = last + 1; t < n; ++t) idx[w++] = idx[t];
  return k;
}

/// Masks one row with one thread: y[j] = x[j] if kept else 0 (y may alias x); the kept
/// indices go to idx in ascending order when idx is not null. Returns the kept count.
KOKKOS_INLINE_FUNCTION int mask_row_serial(const float* x, const float* nrm, int d,
                                           const MaskParams& prm, float* y, int* idx) {
  if (prm.rule == MaskRule::Threshold) {
    int n = 0;
    for (int j = 0; j < d; ++j) {
      const bool keep = kx::fabs(x[j]) >= prm.tau;
      if (y) y[j] = keep ? x[j] : 0.0f;
      if (idx) idx[n] = j;  // overwritten unless kept: no branch on the mask
      n += keep ? 1 : 0;
    }
    return n;
  }
  if (prm.rule == MaskRule::None) return keep_all_serial(x, d, y, idx);
  return nrm ? select_row_serial<true>(x, nrm, d, prm, y, idx)
             : select_row_serial<false>(x, nrm, d, prm, y, idx);
}

template <class E>
constexpr bool host_space() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible;
}

/// Team-per-row masking (the device path; runs on host backends too, for tests).
/// sparse_rows and kept may be empty (all rows sparse / counts not stored); idx (used only
/// when n == 1) receives the kept indices in ascending order and count(0) the kept count.
/// team_size 0: one thread per team on host backends, AUTO elsewhere.
template <class E>
void mask_rows_team(const E& exec, const CMat<E>& x, const CVec<E>& norms,
                    const IVec<E>& sparse_rows, const MaskParams& prm, const Mat<E>& y,
                    const IVec<E>& kept, const IVec<E>& idx, const IVec<E>& count,
                    int team_size = 0) {
  using Policy = Kokkos::TeamPolicy<E>;
  using Member = typename Policy::member_type;
  using Scratch = Kokkos::View<int*, typename E::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  const int n = static_cast<int>(x.extent(0)), d = static_cast<int>(x.extent(1));
  if (n == 0 || d == 0) return;
  Policy pol = team_size > 0 ? Policy(exec, n, team_size) : team_policy(exec, n);
  const int words = kMaskBins + 4;
  pol.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(words)));
  const bool has_norms = norms.extent(0) > 0, has_rows = sparse_rows.extent(0) > 0;
  const bool has_kept = kept.extent(0) > 0, has_idx = idx.extent(0) > 0;
  const bool has_count = count.extent(0) > 0;
  Kokkos::parallel_for(
      "sparsim::kernels::mask_rows", light(pol), KOKKOS_LAMBDA(const Member& t) {
        const int r = t.league_rank();
        const float* xr = &x(r, 0);
        const float* nrm = has_norms ? norms.data() : nullptr;
        float* yr = &y(r, 0);
        int* ix = has_idx ? idx.data() : nullptr;
        const auto finish = [&](int nk) {
          Kokkos::single(Kokkos::PerTeam(t), [&]() {
            if (has_kept) kept(r) = nk;
            if (has_count) count(0) = nk;
          });
        };
        const auto keep_all = [&]() {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, d), [&](int j) {
            yr[j] = xr[j];
            if (ix) ix[j] = j;
          });
          finish(d);
        };
        if ((has_rows && sparse_rows(r) == 0) || prm.rule == MaskRule::None) {
          keep_all();
          return;
        }
        if (prm.rule == MaskRule::Threshold) {
          // exclusive scan of the keep flags gives each kept entry its slot in idx
          int nk = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(t, d),
              [&](int j, int& c) { c += kx::fabs(xr[j]) >= prm.tau ? 1 : 0; }, nk);
          Kokkos::parallel_scan(Kokkos::TeamThreadRange(t, d), [&](int j, int& pre, bool fin) {
            const float v = xr[j];
            const bool keep = kx::fabs(v) >= prm.tau;
            if (fin) {
              yr[j] = keep ? v : 0.0f;
              if (keep && ix) ix[pre] = j;
            }
            pre += keep ? 1 : 0;
          });
          finish(nk);
          return;
        }
        int k = d;
        if (prm.rule == MaskRule::TopK) {
          k = keep_count(d, static_cast<double>(prm.p));
        } else {
          int below = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(t, d),
              [&](int j, int& c) { c += kx::fabs(xr[j]) < prm.tau ? 1 : 0; }, below);
          k = keep_count(d, guided_sparsity(below, d, prm.p, prm.delta));
        }
        if (k >= d) {
          keep_all();
          return;
        }
        Scratch sh(t.team_scratch(0), words);
        int* hist = sh.data();
        int* state = sh.data() + kMaskBins;  // prefix, rem, done
        Kokkos::single(Kokkos::PerTeam(t), [&]() {
          state[0] = 0;
          state[1] = k;
        });
        int shift = 24;
        for (;; shift -= 8) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, kMaskBins), [&](int b) { hist[b] = 0; });
          t.team_barrier();
          const unsigned prefix = static_cast<unsigned>(state[0]);
          const unsigned hm = high_mask(shift);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, d), [&](int j) {
            const unsigned key = mask_key(xr, nrm, j);
            if ((key & hm) == prefix) Kokkos::atomic_add(&hist[(key >> shift) & 0xffu], 1);
          });
          t.team_barrier();
          Kokkos::single(Kokkos::PerTeam(t), [&]() {
            unsigned p = static_cast<unsigned>(state[0]);
            int rem = state[1];
            int in_bin = 0;
            const bool done = walk_bins(hist, kMaskBins - 1, shift, p, rem, in_bin);
            state[0] = static_cast<int>(p);
            state[1] = rem;
            state[2] = done ? 1 : 0;
          });
          t.team_barrier();
          if (state[2]) break;
        }
        const unsigned pv = static_cast<unsigned>(state[0]) >> shift;
        const int need = state[1];
        // packed exclusive scan: high half counts keys above the boundary, low half ties
        Kokkos::parallel_scan(Kokkos::TeamThreadRange(t, d), [&](int j, long long& pre, bool fin) {
          const unsigned kv = mask_key(xr, nrm, j) >> shift;
          const bool above = kv > pv, tie = kv == pv;
          if (fin) {
            const int ties = static_cast<int>(pre & 0xffffffffLL);
            const bool keep = above || (tie && ties < need);
            yr[j] = keep ? xr[j] : 0.0f;
            if (keep && ix) ix[static_cast<int>(pre >> 32) + (ties < need ? ties : need)] = j;
          }
          pre += above ? (1LL << 32) : (tie ? 1LL : 0LL);
        });
        finish(k);
      });
}

}  // namespace detail

/// Masks each row r of x[n][d] into y (dropped entries exactly 0.0f); rows with
/// sparse_rows(r) == 0 are copied unchanged. kept(r) receives the number of kept entries (d for
/// copied rows). norms: [d] score weights or empty (weight 1); sparse_rows: [n] or empty (every
/// row sparse); kept: [n] or empty. y may alias x.
template <class E>
void mask_rows(const E& exec, const CMat<E>& x, const CVec<E>& norms, const IVec<E>& sparse_rows,
               const MaskParams& prm, const Mat<E>& y, const IVec<E>& kept) {
  const int n = static_cast<int>(x.extent(0)), d = static_cast<int>(x.extent(1));
  require(static_cast<int>(y.extent(0)) >= n && static_cast<int>(y.extent(1)) == d,
          "mask_rows: output is {}x{}, input {}x{}", y.extent(0), y.extent(1), n, d);
  require(norms.extent(0) == 0 || static_cast<int>(norms.extent(0)) == d,
          "mask_rows: {} norms for {} columns", norms.extent(0), d);
  require(sparse_rows.extent(0) == 0 || static_cast<int>(sparse_rows.extent(0)) >= n,
          "mask_rows: sparse_rows has {} entries for {} rows", sparse_rows.extent(0), n);
  require(kept.extent(0) == 0 || static_cast<int>(kept.extent(0)) >= n,
          "mask_rows: kept has {} entries for {} rows", kept.extent(0), n);
  if (n == 0 || d == 0) return;
  if constexpr (detail::host_space<E>()) {
    const bool has_norms = norms.extent(0) > 0, has_rows = sparse_rows.extent(0) > 0;
    const bool has_kept = kept.extent(0) > 0;
    Kokkos::parallel_for(
        "sparsim::kernels::mask_rows", light(Kokkos::RangePolicy<E>(exec, 0, n)),
        KOKKOS_LAMBDA(const int r) {
          const float* xr = &x(r, 0);
          float* yr = &y(r, 0);
          int nk = d;
          if (has_rows && sparse_rows(r) == 0) {
            for (int j = 0; j < d; ++j) yr[j] = xr[j];
          } else {
            nk = detail::mask_row_serial(xr, has_norms ? norms.data() : nullptr, d, prm, yr,
                                         nullptr);
          }
          if (has_kept) kept(r) = nk;
        });
  } else {
    detail::mask_rows_team(exec, x, norms, sparse_rows, prm, y, kept, IVec<E>(), IVec<E>());
  }
}

/// Masks one row x[d] for the decode sparse GEMV: writes the kept indices in ascending order
/// into idx[0, nnz) and nnz into count(0), without waiting for the result on devices (an entry
/// that is kept but exactly 0 is still listed; idx[nnz, d) is overwritten as scratch).
/// y: the masked row, or empty to skip it; y may alias x. MaskRule::None keeps every entry.
/// On host backends the work is done when the call returns.
template <class E>
void mask_indices_to(const E& exec, const CVec<E>& x, const CVec<E>& norms, const MaskParams& prm,
                     const IVec<E>& idx, const Vec<E>& y, const IVec<E>& count,
                     MaskScratch<E>& sc) {
  const int d = static_cast<int>(x.extent(0));
  require(static_cast<int>(idx.extent(0)) >= d, "mask_indices: idx holds {} of {} entries",
          idx.extent(0), d);
  require(y.extent(0) == 0 || static_cast<int>(y.extent(0)) == d,
          "mask_indices: output has {} entries, input {}", y.extent(0), d);
  require(norms.extent(0) == 0 || static_cast<int>(norms.extent(0)) == d,
          "mask_indices: {} norms for {} entries", norms.extent(0), d);
  require(count.extent(0) >= 1, "mask_indices: no room for the count");
  if constexpr (detail::host_space<E>()) {
    // one row is O(d) and tiny next to the GEMV: one host thread, after the producer is done
    exec.fence();
    count(0) = d == 0
                   ? 0
                   : detail::mask_row_serial(x.data(), norms.extent(0) ? norms.data() : nullptr, d,
                                             prm, y.extent(0) ? y.data() : nullptr, idx.data());
  } else {
    if (d == 0) {
      Kokkos::deep_copy(exec, count, 0);
      return;
    }
    sc.ensure(d);
    const Vec<E> yv = y.extent(0) ? y : sc.row;
    const CMat<E> xm(x.data(), 1, d);
    const Mat<E> ym(yv.data(), 1, d);
    detail::mask_rows_team(exec, xm, norms, IVec<E>(), prm, ym, IVec<E>(), idx, count);
  }
}

/// mask_indices_to, returning nnz (read back from the device on devices).
template <class E>
int mask_indices(const E& exec, const CVec<E>& x, const CVec<E>& norms, const MaskParams& prm,
                 const IVec<E>& idx, const Vec<E>& y, MaskScratch<E>& sc) {
  sc.ensure(0);
  mask_indices_to(exec, x, norms, prm, idx, y, sc.count, sc);
  int nnz = 0;
  Kokkos::deep_copy(exec, Kokkos::View<int, Kokkos::HostSpace>(&nnz), Kokkos::subview(sc.count, 0));
  exec.fence();
  return nnz;
}

}  // namespace sparsim
