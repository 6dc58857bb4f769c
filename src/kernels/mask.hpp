#pragma once
/// Activation masks for the projection inputs (METHODS §1): TEAL's threshold, WINA's TopK and
/// TopK-Guided, selected per row in O(d) by a radix select on the bits of the score, no sort.
///
/// Score_j = |x_j| · (norms(j) if norms is given, else 1). Scores are non-negative floats, so
/// their bit patterns (sign bit cleared, which also makes -0 equal +0) order like the floats.
/// The k-th largest key v is found byte by byte from the top (four passes of a 256-bin
/// histogram, stopping early once the boundary falls on a bin edge); then every entry with a
/// score above v is kept, and of those equal to v the lowest indices until exactly k are kept.
/// Everything is integer counting, so the mask is the same for any thread count and backend.
///
/// Host backends run one thread per row with the histogram in a local array; other backends
/// (GPUs) run one team per row with the histogram in team scratch and a team scan for the ties.
#include "core/compat.hpp"
#include "core/error.hpp"
#include "kernels/views.hpp"

#include <Kokkos_Core.hpp>

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

/// Result of the radix select: keep key >> shift > prefix >> shift, and the first `need`
/// entries (lowest index) with key >> shift == prefix >> shift.
struct Boundary {
  unsigned prefix;
  int shift;
  int need;
};

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

/// Serial version's digits: bits 30..20 (sign cleared: exponent and 3 mantissa bits), 19..10,
/// 9..0. Once the boundary bin holds at most kMaskCandidates keys they are copied to a local
/// buffer and the later digits only look at those.
inline constexpr int kMaskSerialBins = 2048;
inline constexpr int kMaskCandidates = 1024;

/// The keep count of a TopK / Guided row and, when 1 <= k < d, the radix select of the k-th
/// largest key, one thread. Guided's count of |x_j| < tau rides on the first pass.
struct Selection {
  int k;
  Boundary bd;
};

KOKKOS_INLINE_FUNCTION Selection select_serial(const float* x, const float* nrm, int d,
                                               const MaskParams& prm) {
  int hist[kMaskSerialBins];
  unsigned cand[kMaskCandidates];
  const bool guided = prm.rule == MaskRule::Guided;
  unsigned prefix = 0;
  int rem = 0, k = 0, nc = -1, last = d;
  for (int pass = 0;; ++pass) {
    const int shift = 20 - 10 * pass;
    const int bins = pass == 0 ? kMaskSerialBins : kMaskSerialBins / 2;
    const unsigned dm = static_cast<unsigned>(bins - 1);
    const int hs = pass == 0 ? 31 : shift + 10;  // bits above this digit
    const unsigned hp = prefix >> hs;
    for (int b = 0; b < bins; ++b) hist[b] = 0;
    unsigned top = 0;  // highest digit seen: the walk starts there
    if (pass == 0) {
      int below = 0;
      for (int j = 0; j < d; ++j) {
        const unsigned g = (mask_key(x, nrm, j) >> shift) & dm;
        ++hist[g];
        top = g > top ? g : top;
        if (guided) below += kx::fabs(x[j]) < prm.tau ? 1 : 0;
      }
      k = keep_count(
          d, guided ? guided_sparsity(below, d, prm.p, prm.delta) : static_cast<double>(prm.p));
      if (k >= d) return Selection{d, Boundary{0u, 0, 0}};
      rem = k;
    } else if (nc >= 0) {  // filter the buffered candidates in place
      int m = 0;
      for (int i = 0; i < nc; ++i) {
        const unsigned key = cand[i];
        if ((key >> hs) == hp) {
          const unsigned g = (key >> shift) & dm;
          ++hist[g];
          top = g > top ? g : top;
          cand[m++] = key;
        }
      }
      nc = m;
    } else if (last <= kMaskCandidates) {  // last full scan: buffer the candidates
      int m = 0;
      for (int j = 0; j < d; ++j) {
        const unsigned key = mask_key(x, nrm, j);
        if ((key >> hs) == hp) {
          const unsigned g = (key >> shift) & dm;
          ++hist[g];
          top = g > top ? g : top;
          cand[m++] = key;
        }
      }
      nc = m;
    } else {
      for (int j = 0; j < d; ++j) {
        const unsigned key = mask_key(x, nrm, j);
        if ((key >> hs) == hp) {
          const unsigned g = (key >> shift) & dm;
          ++hist[g];
          top = g > top ? g : top;
        }
      }
    }
    if (walk_bins(hist, static_cast<int>(top), shift, prefix, rem, last))
      return Selection{k, {prefix, shift, rem}};
  }
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
  const Selection sel =
      prm.rule == MaskRule::None ? Selection{d, Boundary{0u, 0, 0}} : select_serial(x, nrm, d, prm);
  if (sel.k >= d) {
    for (int j = 0; j < d; ++j) {
      if (y) y[j] = x[j];
      if (idx) idx[j] = j;
    }
    return d;
  }
  const Boundary bd = sel.bd;
  const unsigned pv = bd.prefix >> bd.shift;
  int ties = 0, n = 0;
  for (int j = 0; j < d; ++j) {
    const unsigned kv = mask_key(x, nrm, j) >> bd.shift;
    bool keep = kv > pv;
    if (kv == pv && ties < bd.need) {
      keep = true;
      ++ties;
    }
    if (y) y[j] = keep ? x[j] : 0.0f;
    if (idx) idx[n] = j;
    n += keep ? 1 : 0;
  }
  return n;
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
      "sparsim::kernels::mask_rows", pol, KOKKOS_LAMBDA(const Member& t) {
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
        "sparsim::kernels::mask_rows", Kokkos::RangePolicy<E>(exec, 0, n),
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
/// into idx[0, nnz) and returns nnz (an entry that is kept but exactly 0 is still listed;
/// idx[nnz, d) is overwritten as scratch).
/// y: the masked row, or empty to skip it; y may alias x. MaskRule::None keeps every entry.
template <class E>
int mask_indices(const E& exec, const CVec<E>& x, const CVec<E>& norms, const MaskParams& prm,
                 const IVec<E>& idx, const Vec<E>& y, MaskScratch<E>& sc) {
  const int d = static_cast<int>(x.extent(0));
  require(static_cast<int>(idx.extent(0)) >= d, "mask_indices: idx holds {} of {} entries",
          idx.extent(0), d);
  require(y.extent(0) == 0 || static_cast<int>(y.extent(0)) == d,
          "mask_indices: output has {} entries, input {}", y.extent(0), d);
  require(norms.extent(0) == 0 || static_cast<int>(norms.extent(0)) == d,
          "mask_indices: {} norms for {} entries", norms.extent(0), d);
  if (d == 0) return 0;
  if constexpr (detail::host_space<E>()) {
    // one row is O(d) and tiny next to the GEMV: one host thread, after the producer is done
    exec.fence();
    return detail::mask_row_serial(x.data(), norms.extent(0) ? norms.data() : nullptr, d, prm,
                                   y.extent(0) ? y.data() : nullptr, idx.data());
  } else {
    sc.ensure(d);
    const Vec<E> yv = y.extent(0) ? y : sc.row;
    const CMat<E> xm(x.data(), 1, d);
    const Mat<E> ym(yv.data(), 1, d);
    detail::mask_rows_team(exec, xm, norms, IVec<E>(), prm, ym, IVec<E>(), idx, sc.count);
    int nnz = 0;
    Kokkos::deep_copy(exec, Kokkos::View<int, Kokkos::HostSpace>(&nnz),
                      Kokkos::subview(sc.count, 0));
    exec.fence();
    return nnz;
  }
}

}  // namespace sparsim
