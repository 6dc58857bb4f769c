#pragma once
// STREAM-like memory bandwidth: copy (b = a) and read (a sum over a) of arrays sized well past
// the last-level cache, repeated, with the median and the spread. `sparsim probe` (the cost
// model's roofs) and `sparsim bench` (decode's ideal) measure with the same code.
#include "core/timer.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace sparsim::kernels {

/// Size in bytes of the largest cache level sysfs lists for cpu0 (0 when unknown), and where it
/// was read.
std::pair<double, std::string> last_level_cache();

/// Array size for a bandwidth measurement on the host: 4 x the last-level cache, at least
/// 256 MiB and at most 1 GiB.
std::size_t host_stream_bytes();

/// One kind of transfer over its repetitions, in bytes per second.
struct BandwidthStats {
  double median = 0, min = 0, max = 0;
  /// (max - min) / median: how much the repetitions disagree.
  double spread() const { return median > 0 ? (max - min) / median : 0; }
};

struct StreamBandwidth {
  BandwidthStats copy;  ///< read a + write b, counted as 2 x the array (STREAM's convention)
  BandwidthStats read;  ///< read a once
  /// The runtime's own copy of the same arrays (Kokkos::deep_copy: cudaMemcpyAsync device to
  /// device on CUDA, memcpy or a parallel copy on the host), counted like `copy`: the yardstick
  /// the copy kernel is held to.
  BandwidthStats runtime_copy;
  std::size_t array_bytes = 0;
  int reps = 0;
  float checksum = 0;  ///< the sums, so that the reads are not optimised away
  /// The reference for "bytes at memory bandwidth": the faster of the two copies (medians).
  double reference() const { return std::max(copy.median, runtime_copy.median); }
};

namespace detail {
inline BandwidthStats stats_of(std::vector<double> seconds, double bytes) {
  std::sort(seconds.begin(), seconds.end());
  const std::size_t n = seconds.size();
  const double med = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  return {bytes / med, bytes / seconds.back(), bytes / seconds.front()};
}
}  // namespace detail

/// 16 bytes: the unit of the copy kernel, one vector load and store per element on GPUs.
struct alignas(16) Word16 {
  float v[4];
};

/// Copy and read bandwidth of `exec` over two arrays of `array_bytes` each, `reps` timed
/// repetitions after one untimed (page faults, clock ramp-up). The arrays are first written by
/// the same parallel loop shape that reads them, so that on a host each thread's pages lie in
/// its own memory (first touch). The copy moves 16-byte words (one vector load and store per
/// element, which a GPU needs to come near its bandwidth; 4-byte elements reached about 40% of
/// an H200's). The read sums 16 independent lanes per block, so that it streams at memory
/// speed rather than at the latency of one dependent addition per element. The runtime's own
/// copy (deep_copy) is timed over the same arrays as a yardstick.
template <class E>
StreamBandwidth stream_bandwidth(const E& exec, std::size_t array_bytes, int reps,
                                 Clock clock = Clock::Wall) {
  using Dev = typename Kokkos::Device<typename E::execution_space, typename E::memory_space>;
  constexpr int kLanes = 16;
  const std::size_t n = std::max<std::size_t>(array_bytes / sizeof(float) / kLanes, 1) * kLanes;
  Kokkos::View<float*, Dev> a(Kokkos::view_alloc(Kokkos::WithoutInitializing, "sparsim::bw::a"), n);
  Kokkos::View<float*, Dev> b(Kokkos::view_alloc(Kokkos::WithoutInitializing, "sparsim::bw::b"), n);
  Kokkos::parallel_for(
      "sparsim::bw::touch", Kokkos::RangePolicy<E>(exec, 0, n), KOKKOS_LAMBDA(const std::size_t i) {
        a(i) = 1.0f;
        b(i) = 0.0f;
      });
  exec.fence();
  std::vector<double> tc, tr, trc;
  StreamBandwidth out;
  const std::size_t blocks = n / kLanes;
  for (int r = 0; r < reps + 1; ++r) {
    exec.fence();
    Stopwatch sw(clock);
    const Word16* wa = reinterpret_cast<const Word16*>(a.data());
    Word16* wb = reinterpret_cast<Word16*>(b.data());
    Kokkos::parallel_for(
        "sparsim::bw::copy", Kokkos::RangePolicy<E>(exec, 0, n / 4),
        KOKKOS_LAMBDA(const std::size_t i) { wb[i] = wa[i]; });
    exec.fence();
    const double c = sw.seconds();
    sw.reset();
    Kokkos::deep_copy(exec, b, a);
    exec.fence();
    const double rc = sw.seconds();
    float s = 0;
    sw.reset();
    Kokkos::parallel_reduce(
        "sparsim::bw::read", Kokkos::RangePolicy<E>(exec, 0, blocks),
        KOKKOS_LAMBDA(const std::size_t blk, float& acc) {
          float lane[kLanes];
          for (int k = 0; k < kLanes; ++k) lane[k] = b(blk * kLanes + k);
          float t = 0;
          for (int k = 0; k < kLanes; ++k) t += lane[k];
          acc += t;
        },
        s);
    exec.fence();
    const double rd = sw.seconds();
    out.checksum += s;
    if (r > 0) {
      tc.push_back(c);
      tr.push_back(rd);
      trc.push_back(rc);
    }
  }
  const double bytes = static_cast<double>(n) * sizeof(float);
  out.copy = detail::stats_of(tc, 2.0 * bytes);
  out.read = detail::stats_of(tr, bytes);
  out.runtime_copy = detail::stats_of(trc, 2.0 * bytes);
  out.array_bytes = n * sizeof(float);
  out.reps = reps;
  return out;
}

}  // namespace sparsim::kernels
