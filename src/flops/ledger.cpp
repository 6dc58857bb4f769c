#include "flops/ledger.hpp"

#include "core/error.hpp"
#include "io/hdf5.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace sparsim::flops {

const char* to_string(Phase p) {
  switch (p) {
    case Phase::Prefill:
      return "prefill";
    case Phase::Decode:
      return "decode";
  }
  return "?";
}

const char* to_string(Op op) {
  switch (op) {
    case Op::Embedding:
      return "embedding";
    case Op::RMSNorm:
      return "rms_norm";
    case Op::QProj:
      return "q_proj";
    case Op::KProj:
      return "k_proj";
    case Op::VProj:
      return "v_proj";
    case Op::OProj:
      return "o_proj";
    case Op::GateProj:
      return "gate_proj";
    case Op::UpProj:
      return "up_proj";
    case Op::DownProj:
      return "down_proj";
    case Op::RoPE:
      return "rope";
    case Op::AttnScore:
      return "attn_score";
    case Op::AttnSoftmax:
      return "attn_softmax";
    case Op::AttnValue:
      return "attn_value";
    case Op::SwiGLU:
      return "swiglu";
    case Op::Residual:
      return "residual";
    case Op::Rotation:
      return "rotation";
    case Op::MaskSelect:
      return "mask_select";
    case Op::GateSimilarity:
      return "gate_similarity";
    case Op::GatherScatter:
      return "gather_scatter";
    case Op::ChannelSelect:
      return "channel_select";
    case Op::KVReconstruct:
      return "kv_reconstruct";
    case Op::TokenEvict:
      return "token_evict";
    case Op::LMHead:
      return "lm_head";
    case Op::Other:
      return "other";
  }
  return "?";
}

namespace {
constexpr std::size_t kSlotCells = static_cast<std::size_t>(kNumPhases) * kNumOps;
constexpr Phase kPhases[kNumPhases] = {Phase::Prefill, Phase::Decode};
}  // namespace

Ledger::Ledger(int n_layers) {
  require(n_layers >= 0, "a FLOP ledger needs a non-negative layer count, got {}", n_layers);
  slots_ = n_layers + 1;
  cells_.assign(static_cast<std::size_t>(slots_) * kSlotCells, Totals{});
}

void Ledger::check_layer(int layer) const {
  require(layer >= -1, "FLOP ledger: layer {} is invalid (use -1 for ops outside the layers)",
          layer);
}

void Ledger::grow(int layer) {
  check_layer(layer);
  if (layer + 1 < slots_) return;
  slots_ = layer + 2;
  cells_.resize(static_cast<std::size_t>(slots_) * kSlotCells, Totals{});
}

void Ledger::reset() {
  std::fill(cells_.begin(), cells_.end(), Totals{});
  for (int p = 0; p < kNumPhases; ++p) calls_[p] = tokens_[p] = 0;
}

Ledger::Totals Ledger::at(Phase phase, Op op, int layer) const {
  check_layer(layer);
  if (layer + 1 >= slots_) return {};
  return cells_[index(phase, op, layer)];
}

Ledger::Totals Ledger::total() const {
  Totals t;
  for (const Totals& c : cells_) t += c;
  return t;
}

Ledger::Totals Ledger::total(Phase phase) const {
  Totals t;
  for (int l = -1; l + 1 < slots_; ++l)
    for (int o = 0; o < kNumOps; ++o) t += cells_[index(phase, static_cast<Op>(o), l)];
  return t;
}

Ledger::Totals Ledger::by_op(Op op, Phase phase) const {
  Totals t;
  for (int l = -1; l + 1 < slots_; ++l) t += cells_[index(phase, op, l)];
  return t;
}

Ledger::Totals Ledger::by_op(Op op) const {
  Totals t = by_op(op, Phase::Prefill);
  t += by_op(op, Phase::Decode);
  return t;
}

Ledger::Totals Ledger::by_layer(int layer, Phase phase) const {
  check_layer(layer);
  Totals t;
  if (layer + 1 >= slots_) return t;
  for (int o = 0; o < kNumOps; ++o) t += cells_[index(phase, static_cast<Op>(o), layer)];
  return t;
}

Ledger::Totals Ledger::by_layer(int layer) const {
  Totals t = by_layer(layer, Phase::Prefill);
  t += by_layer(layer, Phase::Decode);
  return t;
}

void Ledger::merge(const Ledger& other) {
  if (other.slots_ > slots_) grow(other.slots_ - 2);
  // Both tables are laid out with the layer slot outermost, so other's cells map 1:1 onto the
  // first other.cells_.size() cells of this one.
  for (std::size_t i = 0; i < other.cells_.size(); ++i) cells_[i] += other.cells_[i];
  for (int p = 0; p < kNumPhases; ++p) {
    calls_[p] += other.calls_[p];
    tokens_[p] += other.tokens_[p];
  }
}

void Ledger::merge(const Ledger& other, Op except) {
  if (other.slots_ > slots_) grow(other.slots_ - 2);
  for (std::size_t i = 0; i < other.cells_.size(); ++i)
    if (i % kNumOps != static_cast<std::size_t>(except)) cells_[i] += other.cells_[i];
}

void Ledger::write(io::Group& g) const {
  const std::size_t L = static_cast<std::size_t>(slots_);
  const std::vector<hsize_t> dims = {static_cast<hsize_t>(kNumPhases),
                                     static_cast<hsize_t>(kNumOps), static_cast<hsize_t>(L)};
  const std::size_t n = kSlotCells * L;
  std::vector<double> fd(n), fr(n), bd(n), br(n);
  std::vector<std::uint64_t> launches(n), kernels(n);
  for (int p = 0; p < kNumPhases; ++p)
    for (int o = 0; o < kNumOps; ++o)
      for (std::size_t s = 0; s < L; ++s) {
        const std::size_t out = (static_cast<std::size_t>(p) * kNumOps + o) * L + s;
        const Totals& c =
            cells_[index(static_cast<Phase>(p), static_cast<Op>(o), static_cast<int>(s) - 1)];
        fd[out] = c.flops_dense;
        fr[out] = c.flops_realised;
        bd[out] = c.bytes_dense;
        br[out] = c.bytes_realised;
        launches[out] = c.launches;
        kernels[out] = c.kernels;
      }

  const char* shape = "indexed [phase][op][layer + 1]; names in phases, ops, layers";
  g.write("flops_dense", fd.data(), dims,
          {"FLOP", fmt::format("floating-point operations a dense run would perform, {}", shape)});
  g.write("flops_realised", fr.data(), dims,
          {"FLOP", fmt::format("floating-point operations the sparse run performed, {}", shape)});
  g.write("bytes_dense", bd.data(), dims,
          {"byte", fmt::format("memory traffic a dense run would cause, {}", shape)});
  g.write("bytes_realised", br.data(), dims,
          {"byte", fmt::format("memory traffic the sparse run caused, {}", shape)});
  g.write("launches", launches.data(), dims,
          {"launch",
           fmt::format("kernel launches the op took part in (a fused kernel counts for every op "
                       "inside it), {}",
                       shape)});
  g.write("kernels", kernels.data(), dims,
          {"launch", fmt::format("distinct kernel launches, each counted once on the op owning the "
                                 "kernel, {}",
                                 shape)});

  std::vector<std::string> phases, ops, layers;
  std::vector<std::int64_t> layer_index;
  for (Phase p : kPhases) phases.emplace_back(to_string(p));
  for (int o = 0; o < kNumOps; ++o) ops.emplace_back(to_string(static_cast<Op>(o)));
  for (std::size_t s = 0; s < L; ++s) {
    layers.push_back(s == 0 ? std::string("non-layer") : std::to_string(s - 1));
    layer_index.push_back(static_cast<std::int64_t>(s) - 1);
  }
  g.write_strings("phases", phases, {"", "names of the first index of the flops/bytes tables"});
  g.write_strings("ops", ops, {"", "names of the second index of the flops/bytes tables"});
  g.write_strings("layers", layers,
                  {"",
                   "names of the third index of the flops/bytes tables; entry 0 collects "
                   "ops outside the transformer layers"});
  g.write("layer_index", layer_index,
          {"1", "transformer layer of each third index of the flops/bytes tables (-1: none)"});

  auto put = [&g](const std::string& prefix, const Totals& t) {
    g.set_attr(prefix + "_flops_dense", t.flops_dense);
    g.set_attr(prefix + "_flops_realised", t.flops_realised);
    g.set_attr(prefix + "_bytes_dense", t.bytes_dense);
    g.set_attr(prefix + "_bytes_realised", t.bytes_realised);
    g.set_attr(prefix + "_launches", static_cast<std::int64_t>(t.launches));
    g.set_attr(prefix + "_kernels", static_cast<std::int64_t>(t.kernels));
  };
  put("total", total());
  for (Phase p : kPhases) {
    put(to_string(p), total(p));
    g.set_attr(std::string(to_string(p)) + "_calls", calls(p));
    g.set_attr(std::string(to_string(p)) + "_tokens", tokens(p));
  }
  g.set_attr("num_layers", static_cast<std::int64_t>(num_layers()));
}

std::string Ledger::table() const {
  const Totals all = total();
  const double share_base = all.flops_realised > 0 ? all.flops_realised : 1.0;
  std::string s;
  auto row = [&](const char* phase, const char* op, const Totals& t) {
    s += fmt::format("{:<8} {:<13} {:>10} {:>13.3f} {:>13.3f} {:>7.1f}% {:>11.3f} {:>11.3f}\n",
                     phase, op, t.launches, t.flops_dense * 1e-9, t.flops_realised * 1e-9,
                     100.0 * t.flops_realised / share_base, t.bytes_dense * 1e-9,
                     t.bytes_realised * 1e-9);
  };
  s += fmt::format("{:<8} {:<13} {:>10} {:>13} {:>13} {:>8} {:>11} {:>11}\n", "phase", "op",
                   "launches", "GFLOP dense", "GFLOP real", "share", "GB dense", "GB real");
  for (Phase p : kPhases) {
    const Totals pt = total(p);
    if (pt.launches == 0) continue;
    for (int o = 0; o < kNumOps; ++o) {
      const Totals t = by_op(static_cast<Op>(o), p);
      if (t.launches > 0) row(to_string(p), to_string(static_cast<Op>(o)), t);
    }
    row(to_string(p), "(all)", pt);
  }
  row("total", "", all);
  return s;
}

}  // namespace sparsim::flops
