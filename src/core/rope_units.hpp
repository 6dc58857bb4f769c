#pragma once
/// The RoPE rotations of one layer as plain host data (Config::rope_units makes them; the
/// kernels upload them).
#include <vector>

namespace sparsim {

/// The RoPE rotations of one layer, per KV head (query heads use their KV head's): each unit is
/// either a pair (i0, i1) of channels of the (possibly reduced) head rotated together by the
/// angle pos·θ_freq, i0 the first member: (a, b) → (a·cos − b·sin, a·sin + b·cos); or a single
/// channel i0 (i1 = −1) whose RoPE partner was pruned: it is rotated with a zero partner and
/// keeps its own component, x → x·cos. Heads are padded to the same unit count with i0 = −1.
struct RopeUnits {
  int units = 0;                  ///< units per KV head (after padding)
  std::vector<int> i0, i1, freq;  ///< [n_kv_head][units]
};

}  // namespace sparsim
