#pragma once
// Opt-in activation dumps of sparsim eval: the input vectors feeding chosen projections of
// chosen layers for the first sparsified rows, with the masks the method chose for them, written
// to the run file under /activations (docs/run-file-schema.md).
#include "common.hpp"
#include "io/hdf5.hpp"
#include "kernels/mask.hpp"
#include "sparsity/masker.hpp"
#include "sparsity/plan.hpp"

#include <Kokkos_Core.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsim::app {

/// --dump-layers, --dump-proj, --dump-tokens, --dump-every.
struct DumpArgs {
  std::string layers_arg, proj_arg;
  int tokens = 16;
  int every = 1;
  std::vector<int> layers;  ///< parsed by resolve()
  std::vector<Proj> projs;  ///< parsed by resolve()

  void add_options(po::options_description& d);
  /// Checks the values (`sparse`: a sparse method was chosen; `has_out`: a run file is written;
  /// `n_layer`: the model's layer count, from the calibration file). Throws sparsim::Error naming
  /// the option.
  void resolve(const po::variables_map& vm, bool sparse, bool has_out, int n_layer);
  bool enabled() const { return !layers.empty(); }
};

/// Wraps the activation masker the engine calls: every call goes through to it unchanged, and
/// for the dumped layer × projection pairs every `every`-th sparsified row (counted per pair, in
/// processing order) is copied to the host with its kept flags, until `tokens` rows are held.
/// The kept flags are recomputed for the row with mask_indices and the masker's own parameters
/// and checked against the masked row the masker returned.
template <class E>
class DumpingMasker final : public ProjectionMasker<E> {
 public:
  /// `w`: the model the engine runs (for the input width of each projection).
  DumpingMasker(sparsity::ActivationMasker<E>& inner, const DumpArgs& a, const Weights<E>& w)
      : inner_(inner), tokens_(a.tokens), every_(a.every) {
    for (int l : a.layers)
      for (Proj p : a.projs) {
        Slot s;
        s.layer = l;
        s.proj = p;
        s.d = w.layers[static_cast<std::size_t>(l)].proj(p).cols;
        slots_.push_back(std::move(s));
      }
  }

  void begin_call(int n_rows) override {
    ++call_;
    inner_.begin_call(n_rows);
  }
  bool active(int layer, Proj p) const override { return inner_.active(layer, p); }

  CMat<E> apply(const E& exec, int layer, Proj p, const CMat<E>& x, const SparseRows<E>& rows,
                int& ticket) override {
    const CMat<E> y = inner_.apply(exec, layer, p, x, rows, ticket);
    Slot* s = wanted(layer, p);
    if (!s) return y;
    if (full(*s)) {
      s->seen += rows.count;
      return y;
    }
    const int n = static_cast<int>(x.extent(0));
    exec.fence();
    for (int r = 0; r < n; ++r)
      if (rows.host_flags(r)) capture(exec, *s, x, r, &y);
    return y;
  }

  IVec<E> indices(const E& exec, int layer, Proj p, const CMat<E>& x, const IVec<E>& idx,
                  const Vec<E>& xm, int& ticket) override {
    const IVec<E> count = inner_.indices(exec, layer, p, x, idx, xm, ticket);
    if (Slot* s = wanted(layer, p)) capture(exec, *s, x, 0, nullptr);
    return count;
  }

  void end_call(const E& exec) override { inner_.end_call(exec); }
  long long kept(int ticket) const override { return inner_.kept(ticket); }

  /// Writes /activations into a run file.
  void write(io::Group root, const sparsity::Plan& plan) const;

 private:
  struct Slot {
    int layer = 0;
    Proj proj = Proj::Q;
    int d = 0;           ///< input width
    long long seen = 0;  ///< sparsified rows of this pair so far
    std::vector<float> input;
    std::vector<std::uint8_t> kept;
    std::vector<std::int64_t> sparse_row, call, row;
    int rows() const { return static_cast<int>(sparse_row.size()); }
  };

  Slot* wanted(int layer, Proj p) {
    for (Slot& s : slots_)
      if (s.layer == layer && s.proj == p) return &s;
    return nullptr;
  }
  bool full(const Slot& s) const { return s.rows() >= tokens_; }

  void capture(const E& exec, Slot& s, const CMat<E>& x, int r, const CMat<E>* y) {
    const long long ordinal = s.seen++;
    if (full(s) || ordinal % every_ != 0) return;
    const int d = static_cast<int>(x.extent(1));
    const CVec<E> xr(x.data() + static_cast<std::size_t>(r) * d, d);
    if (static_cast<int>(idx_.extent(0)) < d) idx_ = IVec<E>("sparsim::dump::idx", d);
    const int nnz = mask_indices(exec, xr, inner_.norms(s.layer, s.proj),
                                 inner_.params(s.layer, s.proj), idx_, Vec<E>(), scratch_);
    auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), xr);
    auto hi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), idx_);
    std::vector<std::uint8_t> k(static_cast<std::size_t>(d), 0);
    for (int i = 0; i < nnz; ++i) k[static_cast<std::size_t>(hi(i))] = 1;
    if (y) {  // the masker's own output must keep exactly these entries
      const CVec<E> yr(y->data() + static_cast<std::size_t>(r) * d, d);
      auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), yr);
      for (int j = 0; j < d; ++j)
        require(hy(j) == (k[static_cast<std::size_t>(j)] ? hx(j) : 0.0f),
                "activation dump: layer {} {} entry {}: the recomputed mask disagrees with the "
                "masker's output",
                s.layer, proj_name(s.proj), j);
    }
    for (int j = 0; j < d; ++j) s.input.push_back(hx(j));
    s.kept.insert(s.kept.end(), k.begin(), k.end());
    s.sparse_row.push_back(ordinal);
    s.call.push_back(call_ - 1);
    s.row.push_back(r);
  }

  sparsity::ActivationMasker<E>& inner_;
  int tokens_, every_;
  std::vector<Slot> slots_;
  long long call_ = 0;
  IVec<E> idx_;
  MaskScratch<E> scratch_;
};

/// Name of a masking rule as the run file stores it.
const char* rule_name(MaskRule r);

template <class E>
void DumpingMasker<E>::write(io::Group root, const sparsity::Plan& plan) const {
  io::Group g = root.create_group("activations");
  g.set_attr("tokens", tokens_);
  g.set_attr("every", every_);
  g.set_attr("method", sparsity::method_name(plan.opt.method));
  g.set_attr("basis", plan.rotated ? "rotated" : "plain");
  for (const Slot& s : slots_) {
    io::Group pg = g.create_group(fmt::format("layer_{}/{}", s.layer, proj_name(s.proj)));
    const MaskParams& prm =
        plan.params[static_cast<std::size_t>(s.layer)][static_cast<std::size_t>(s.proj)];
    const int d = s.d;
    pg.set_attr("rule", rule_name(prm.rule));
    pg.set_attr("target", static_cast<double>(prm.p));
    pg.set_attr("threshold", static_cast<double>(prm.tau));
    pg.set_attr("delta", static_cast<double>(prm.delta));
    pg.set_attr("sparse_rows_seen", static_cast<std::int64_t>(s.seen));
    const std::vector<hsize_t> dims = {static_cast<hsize_t>(s.rows()), static_cast<hsize_t>(d)};
    pg.write<float>("input", s.input.data(), dims,
                    {"1", "dense input vector of the projection for each dumped row [row][d_in]"});
    pg.write<std::uint8_t>("kept", s.kept.data(), dims,
                           {"1",
                            "1 where the mask keeps the input entry, 0 where it is zeroed "
                            "[row][d_in]"});
    pg.write<std::int64_t>("sparse_row", s.sparse_row,
                           {"1", "ordinal of the row among this projection's sparsified rows"});
    pg.write<std::int64_t>("call", s.call, {"1", "forward call (0-based) the row belongs to"});
    pg.write<std::int64_t>("row", s.row, {"1", "row (sequence·T + token) within that call"});
  }
}

}  // namespace sparsim::app
