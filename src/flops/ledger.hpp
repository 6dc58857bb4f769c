#pragma once
/// FLOP and byte accounting per kernel launch.
///
/// Every kernel launch site on the host calls Ledger::add() with what the operation would cost
/// if it were run densely ("dense") and what the sparse path actually performed ("realised").
/// Storage is one dense array indexed by (layer + 1, phase, op), so add() is an index
/// computation and five additions; it allocates only when a layer beyond the current extent
/// shows up (never, when the ledger is constructed with the model's layer count).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsim::io {
class Group;
}

namespace sparsim::flops {

enum class Phase : std::uint8_t { Prefill, Decode };
inline constexpr int kNumPhases = 2;

enum class Op : std::uint8_t {
  Embedding,
  RMSNorm,
  QProj,
  KProj,
  VProj,
  OProj,
  GateProj,
  UpProj,
  DownProj,
  RoPE,
  AttnScore,
  AttnSoftmax,
  AttnValue,
  SwiGLU,
  Residual,
  LMHead,
  Rotation,        ///< WINA's online re-rotation of the residual stream
  MaskSelect,      ///< activation-mask selection (threshold test, TopK selection)
  GateSimilarity,  ///< token gate: similarity test and anchor update (Token Filtering)
  GatherScatter,   ///< token gate: gathering the kept rows and scattering their outputs back
  ChannelSelect,   ///< K-cache channel selection and compaction (ThinK, GRACE)
  KVReconstruct,   ///< keys and values rebuilt from cached latents (PaLU, SVD-LLM)
  TokenEvict,      ///< token eviction: scoring and choosing the kept prompt tokens (H2O, SnapKV)
  Other
};
inline constexpr int kNumOps = static_cast<int>(Op::Other) + 1;

/// "prefill" / "decode".
const char* to_string(Phase p);
/// Snake-case names following Llama tensor naming: "q_proj", "attn_softmax", "lm_head", ...
const char* to_string(Op op);

class Ledger {
 public:
  struct Totals {
    double flops_dense = 0;
    double flops_realised = 0;
    double bytes_dense = 0;
    double bytes_realised = 0;
    /// Kernel launches this op's work took part in: a kernel that fuses several ops (the
    /// decode GEMV that also normalises its input, rotates and stores the keys) counts for each.
    std::uint64_t launches = 0;
    /// Distinct kernels: each launch counted once, on the op that owns the kernel (0 for the
    /// ops fused into it). Fixed per-launch costs are these times the cost of one launch.
    std::uint64_t kernels = 0;

    Totals& operator+=(const Totals& o) {
      flops_dense += o.flops_dense;
      flops_realised += o.flops_realised;
      bytes_dense += o.bytes_dense;
      bytes_realised += o.bytes_realised;
      launches += o.launches;
      kernels += o.kernels;
      return *this;
    }
  };

  /// `n_layers`: transformer layers the tables cover from the start (they grow on demand).
  explicit Ledger(int n_layers = 0);

  /// Records the work of `launches` kernel launches (one by default; several when one entry
  /// covers several kernels). `kernels` (default: `launches`) is how many of them this op owns:
  /// 0 when the op runs inside another op's kernel, whose entry counts the launch once. `layer`
  /// is the transformer layer (0-based) or -1 for ops outside the layers (embedding, final
  /// norm, LM head).
  void add(Op op, int layer, Phase phase, double flops_dense, double flops_realised,
           double bytes_dense, double bytes_realised, std::uint64_t launches = 1,
           std::int64_t kernels = -1) {
    if (layer + 1 >= slots_ || layer < -1) grow(layer);
    Totals& c = cells_[index(phase, op, layer)];
    c.flops_dense += flops_dense;
    c.flops_realised += flops_realised;
    c.bytes_dense += bytes_dense;
    c.bytes_realised += bytes_realised;
    c.launches += launches;
    c.kernels += kernels < 0 ? launches : static_cast<std::uint64_t>(kernels);
  }

  /// Replaces one table entry (restoring a saved ledger).
  void set(Phase phase, Op op, int layer, const Totals& t) {
    if (layer + 1 >= slots_ || layer < -1) grow(layer);
    cells_[index(phase, op, layer)] = t;
  }

  /// Records one forward call of `tokens` token rows (all sequences together) in `phase`: the
  /// denominators of tokens/s and of per-step figures in reports and predictions.
  void count_call(Phase phase, std::int64_t tokens) {
    calls_[static_cast<int>(phase)] += 1;
    tokens_[static_cast<int>(phase)] += tokens;
  }
  /// Sets the call and token counts of `phase` (restoring a saved ledger).
  void set_calls(Phase phase, std::int64_t calls, std::int64_t tokens) {
    calls_[static_cast<int>(phase)] = calls;
    tokens_[static_cast<int>(phase)] = tokens;
  }
  /// Forward calls and token rows recorded with count_call().
  std::int64_t calls(Phase phase) const { return calls_[static_cast<int>(phase)]; }
  std::int64_t tokens(Phase phase) const { return tokens_[static_cast<int>(phase)]; }

  /// Zeroes every entry (and the call and token counts); the layer extent and storage are kept.
  void reset();

  Totals total() const;
  Totals total(Phase phase) const;
  Totals by_op(Op op, Phase phase) const;
  Totals by_op(Op op) const;
  /// `layer` may be -1 (non-layer ops); layers never seen give zeros.
  Totals by_layer(int layer, Phase phase) const;
  Totals by_layer(int layer) const;
  /// One table entry (zeros when never added).
  Totals at(Phase phase, Op op, int layer) const;

  /// Transformer layers covered by the tables: max(constructor's n_layers, highest layer + 1).
  int num_layers() const { return slots_ - 1; }

  /// Adds every entry of `other` to this ledger (extending the layer range as needed).
  void merge(const Ledger& other);
  /// The same, leaving out the entries of op `except`.
  void merge(const Ledger& other, Op except);

  /// Writes the tables into `g` (the run writer passes /flops); see docs/run-file-schema.md:
  /// datasets flops_dense, flops_realised, bytes_dense, bytes_realised (float64), launches and
  /// kernels (uint64), each of shape [phase][op][layer + 1]; string datasets phases, ops, layers;
  /// int64 dataset layer_index; totals, call and token counts as attributes of `g`.
  void write(io::Group& g) const;

  /// Human-readable per-op summary (GFLOP, GB, share of the realised FLOP total) for stdout.
  std::string table() const;

 private:
  std::size_t index(Phase phase, Op op, int layer) const {
    return (static_cast<std::size_t>(layer + 1) * kNumPhases + static_cast<std::size_t>(phase)) *
               kNumOps +
           static_cast<std::size_t>(op);
  }
  /// Validates `layer` and extends the tables to cover it.
  void grow(int layer);
  void check_layer(int layer) const;

  int slots_ = 1;  ///< layer slots: index 0 is layer -1
  std::vector<Totals> cells_;
  std::int64_t calls_[kNumPhases] = {};
  std::int64_t tokens_[kNumPhases] = {};
};

}  // namespace sparsim::flops
