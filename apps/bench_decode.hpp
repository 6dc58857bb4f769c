#pragma once
// The timed decode of every bench mode: one prefill of a batch of prompts, then single-token
// steps of all sequences, each step timed; optionally profiled (per-op times, fences after
// every kernel) and recorded in a FLOP ledger. The modes differ only in their prompts and in
// what they read from the result.
#include "common.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "flops/ledger.hpp"

#include <algorithm>
#include <array>
#include <vector>

namespace sparsim::app {

struct DecodeLoop {
  Clock clock = Clock::Wall;        ///< the prefill, the steps and, profiled, the per-op times
  bool profile = false;             ///< per-op times of the decode steps
  flops::Ledger* ledger = nullptr;  ///< records the decode steps (nullptr: none)
  /// The token sequence s feeds after token n: (31·n + 7 + salt·s) mod vocab.
  int salt = 0;
};

struct DecodeTiming {
  double prefill = 0;                        ///< seconds of the prefill
  double step = 0;                           ///< median seconds of a decode step
  std::array<double, flops::kNumOps> ops{};  ///< profiled: per-op seconds of all decode steps
  /// profiled: the attention kernels' seconds (scores, softmax, values) per decode step
  double attention_per_step() const {
    return (ops[static_cast<int>(flops::Op::AttnScore)] +
            ops[static_cast<int>(flops::Op::AttnSoftmax)] +
            ops[static_cast<int>(flops::Op::AttnValue)]);
  }
};

/// Prefill of `prompts` (one per sequence of `eng`'s batch) at position 0, then `decode` steps
/// of one token per sequence, the first fed token being each prompt's last.
template <class E>
DecodeTiming timed_decode(Engine<E>& eng, const std::vector<std::vector<int>>& prompts, int decode,
                          int vocab, const DecodeLoop& o = {}) {
  DecodeTiming r;
  const int prompt = static_cast<int>(prompts.front().size());
  Stopwatch sw(o.clock);
  eng.forward(prompts, 0, false);
  r.prefill = sw.seconds();
  std::vector<std::vector<int>> next;
  for (const auto& s : prompts) next.push_back({s.back()});
  if (o.profile) {
    eng.clear_op_seconds();
    eng.set_profile_clock(o.clock);
    eng.set_profile(true);
  }
  if (o.ledger) eng.set_ledger(o.ledger);
  std::vector<double> steps;
  for (int t = 0; t < decode; ++t) {
    Stopwatch st(o.clock);
    eng.forward(next, prompt + t, false);
    steps.push_back(st.seconds());
    for (std::size_t s = 0; s < next.size(); ++s)
      next[s][0] = (next[s][0] * 31 + 7 + o.salt * static_cast<int>(s)) % vocab;
  }
  if (o.profile) {
    eng.set_profile(false);
    r.ops = eng.op_seconds();
  }
  if (o.ledger) eng.set_ledger(nullptr);
  r.step = median_of(steps);
  return r;
}

}  // namespace sparsim::app
