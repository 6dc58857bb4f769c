#include "transforms/pruned_gguf.hpp"

#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/loader.hpp"
#include "model/pruned_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>

namespace sparsim::pruning {

namespace {

/// Layer and projection of a tensor name "blk.<l>.<which>.weight" that `pruned` cuts: the
/// attention projections attn_{q,k,v,output} of a pruned or structured model, and ffn_{gate,up,
/// down} of a structured one; false otherwise.
bool cut_tensor(const std::string& name, const Config& pruned, int& layer, std::string& which) {
  int l = -1;
  char buf[32] = {};
  if (std::sscanf(name.c_str(), "blk.%d.%31[a-z_].weight", &l, buf) != 2) return false;
  const std::string w = buf;
  if (name != fmt::format("blk.{}.{}.weight", l, w)) return false;
  const bool attn = w == "attn_q" || w == "attn_k" || w == "attn_v" || w == "attn_output";
  const bool ffn = w == "ffn_gate" || w == "ffn_up" || w == "ffn_down";
  if (!attn && !(ffn && pruned.structured())) return false;
  layer = l;
  which = w;
  return true;
}

/// Whether tensor `which` loses columns (W_o, W_down) rather than rows.
bool cuts_columns(const std::string& which) {
  return which == "attn_output" || which == "ffn_down";
}

/// Rows (q, k, v, gate, up) or columns (output, down) of the full projection kept in layer l,
/// ascending.
std::vector<int> kept_indices(const Config& full, const Config& pruned, int l,
                              const std::string& which) {
  const int D = full.head_dim, group = full.n_head / full.n_kv_head;
  std::vector<int> sel;
  if (pruned.structured()) {
    const LayerStructure& st = pruned.structure[static_cast<std::size_t>(l)];
    if (which == "ffn_gate" || which == "ffn_up" || which == "ffn_down") return st.ffn;
    const bool query_heads = which == "attn_q" || which == "attn_output";
    for (int h : query_heads ? st.q_heads : pruned.kv_heads_at(l))
      for (int i = 0; i < D; ++i) sel.push_back(h * D + i);
    return sel;
  }
  const bool query_heads = which == "attn_q" || which == "attn_output",
             keys = which == "attn_q" || which == "attn_k";
  const int heads = query_heads ? full.n_head : full.n_kv_head;
  const int width = keys ? pruned.qk_head_dim(l) : pruned.v_head_dim(l);
  for (int h = 0; h < heads; ++h) {
    const int kvh = query_heads ? h / group : h;
    for (int i = 0; i < width; ++i)
      sel.push_back(h * D + (keys ? pruned.k_channel(l, kvh, i) : pruned.v_channel(l, kvh, i)));
  }
  return sel;
}

/// The tensor bytes of rows `sel` of t, byte for byte.
std::vector<std::uint8_t> copy_rows(const gguf::TensorInfo& t, const std::vector<int>& sel) {
  const std::uint64_t rb = gguf::row_bytes(t.type, t.ne[0]);
  std::vector<std::uint8_t> bytes(sel.size() * rb);
  for (std::size_t r = 0; r < sel.size(); ++r) {
    require(static_cast<std::uint64_t>(sel[r]) < t.ne[1], "tensor '{}' has {} rows", t.name,
            t.ne[1]);
    std::memcpy(bytes.data() + r * rb, t.data + static_cast<std::uint64_t>(sel[r]) * rb, rb);
  }
  return bytes;
}

/// True when `sel` is runs of whole blocks of `block` columns starting on block boundaries.
bool whole_blocks(const std::vector<int>& sel, std::size_t block) {
  if (sel.size() % block != 0) return false;
  for (std::size_t k = 0; k < sel.size(); ++k)
    if (static_cast<std::size_t>(sel[k]) % block != k % block ||
        (k % block != 0 && sel[k] != sel[k - 1] + 1))
      return false;
  return true;
}

/// The stored blocks of every row holding the columns `sel` (whole_blocks(sel, block_size)).
std::vector<std::uint8_t> copy_column_blocks(const gguf::TensorInfo& t,
                                             const std::vector<int>& sel) {
  const std::size_t B = gguf::block_size(t.type), bs = gguf::type_size(t.type);
  const std::uint64_t rb = gguf::row_bytes(t.type, t.ne[0]), ob = sel.size() / B * bs;
  std::vector<std::uint8_t> bytes(t.ne[1] * ob);
  for (std::uint64_t r = 0; r < t.ne[1]; ++r)
    for (std::size_t k = 0; k < sel.size(); k += B)
      std::memcpy(bytes.data() + r * ob + k / B * bs, t.data + r * rb + sel[k] / B * bs, bs);
  return bytes;
}

/// The loader's fp32 values of the columns `sel` of every row, [rows][sel.size()].
std::vector<float> kept_columns(const gguf::TensorInfo& t, const std::vector<int>& sel) {
  const std::uint64_t ne0 = t.ne[0], rb = gguf::row_bytes(t.type, ne0);
  std::vector<float> row(ne0), x(t.ne[1] * sel.size());
  for (std::uint64_t r = 0; r < t.ne[1]; ++r) {
    gguf::dequantize(t.type, t.data + r * rb, row.data(), ne0);
    for (std::size_t k = 0; k < sel.size(); ++k) x[r * sel.size() + k] = row[sel[k]];
  }
  return x;
}

struct Encoded {
  gguf::GGMLType type;
  std::vector<std::uint8_t> bytes;
  bool exact;  ///< decodes to the bits of the input
};

Encoded encode(gguf::GGMLType type, const std::vector<float>& x) {
  Encoded e{type, std::vector<std::uint8_t>(gguf::row_bytes(type, x.size())), false};
  gguf::quantize(type, x.data(), e.bytes.data(), x.size());
  std::vector<float> back(x.size());
  gguf::dequantize(type, e.bytes.data(), back.data(), x.size());
  e.exact = std::memcmp(back.data(), x.data(), x.size() * sizeof(float)) == 0;
  return e;
}

/// x ([rows][ne0] values of tensor `name`, source type `from`) in the type `cut` asks for.
Encoded encode_cut(const CutType& cut, gguf::GGMLType from, const std::vector<float>& x,
                   std::uint64_t ne0, const std::string& name) {
  using T = gguf::GGMLType;
  if (cut.mode == CutType::Mode::Auto) {
    for (T t : {T::F16, T::BF16}) {
      Encoded e = encode(t, x);
      if (e.exact) return e;
    }
    return encode(T::F32, x);
  }
  const T to = cut.mode == CutType::Mode::Source ? from : cut.type;
  const std::size_t B = gguf::block_size(to);
  require_setting(ne0 % B == 0, "prune.type", "the pruned model's tensor type",
                  "{}: tensor '{}' keeps rows of {} values, not a multiple of the {}-value "
                  "blocks of {}; the types auto, f16, bf16 and f32 write any row length",
                  cut.name(), name, ne0, B, gguf::to_string(to));
  return encode(to, x);
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

void copy_metadata(const gguf::File& f, gguf::Writer& w) {
  for (const gguf::KeyValue& kv : f.metadata()) {
    if (kv.key.rfind("sparsim.", 0) == 0) continue;
    if (kv.key == "general.alignment") {
      w.set_alignment(static_cast<std::uint32_t>(f.alignment()));
      continue;
    }
    w.set(kv.key, kv.value);
  }
}

void check_shape(const std::string& source, const Config& full, const Config& pruned) {
  require(!full.pruned() && !full.structured() && !full.low_rank_kv(),
          "{}: the source model is already pruned", source);
  require(full.n_layer == pruned.n_layer && full.n_head == pruned.n_head &&
              full.d_ff == pruned.d_ff && full.n_kv_head == pruned.n_kv_head &&
              full.head_dim == pruned.head_dim && full.d_model == pruned.d_model &&
              full.rope_layout == pruned.rope_layout,
          "{}: the pruning plan was made for another model shape", source);
}

}  // namespace

CutType CutType::parse(const std::string& s) {
  CutType c;
  if (s == "auto") return c;
  if (s == "source") {
    c.mode = Mode::Source;
    return c;
  }
  const std::optional<gguf::GGMLType> t = gguf::supported_type_named(s);
  require_setting(t.has_value(), "prune.type", "the pruned model's tensor type",
                  "'{}' is not auto, source or a tensor type sparsim writes ({}; any case)", s,
                  lower(gguf::supported_types_list()));
  c.mode = Mode::Fixed;
  c.type = *t;
  return c;
}

std::string CutType::name() const {
  if (mode == Mode::Auto) return "auto";
  if (mode == Mode::Source) return "source";
  return lower(gguf::to_string(type));
}

nlohmann::json WrittenModel::json() const {
  nlohmann::json ch = nlohmann::json::array();
  for (const TypeChange& c : changed)
    ch.push_back({{"name", c.name},
                  {"from", gguf::to_string(c.from)},
                  {"to", gguf::to_string(c.to)},
                  {"exact", c.exact}});
  return {{"tensor_types", {{"option", type_option}, {"changed", ch}, {"kept", kept}}},
          {"file_bytes", {{"output", output_bytes}, {"source", source_bytes}}}};
}

WrittenModel write_pruned_gguf(const std::string& source, const Config& pruned,
                               const std::string& out, const CutType& cut,
                               const OutputBiases* biases, const KeptColumnValues* values) {
  require(pruned.pruned() || pruned.structured(), "write_pruned_gguf: the config is not pruned");
  pruned.validate();
  const auto L = static_cast<std::size_t>(pruned.n_layer);
  require(!pruned.structured() || (biases && biases->o.size() == L && biases->down.size() == L),
          "write_pruned_gguf: a structurally pruned model needs the biases of every layer");
  require(!values || (pruned.structured() && values->o.size() == L && values->down.size() == L),
          "write_pruned_gguf: new W_o / W_down values belong to a structurally pruned model and "
          "cover every layer");
  gguf::File f = gguf::File::open(source);
  const Config full = config_from_gguf(f);
  check_shape(source, full, pruned);
  gguf::Writer w;
  copy_metadata(f, w);
  write_pruned_layout(w, pruned);
  WrittenModel rep;
  rep.type_option = cut.name();
  for (const gguf::TensorInfo& t : f.tensors()) {
    int l = -1;
    std::string which;
    if (!cut_tensor(t.name, pruned, l, which) || l < 0 || l >= full.n_layer) {
      w.add_tensor(t.name, t.ne, t.type, t.data, t.nbytes);
      ++rep.kept;
      continue;
    }
    require(t.ne.size() == 2, "{}: tensor '{}' is not 2-D", source, t.name);
    const std::vector<int> sel = kept_indices(full, pruned, l, which);
    const std::uint64_t n = sel.size(), rows = t.ne[1];
    if (pruned.structured() && cuts_columns(which)) {  // the output's bias beside it
      const std::vector<float>& b = which == "attn_output"
                                        ? biases->o[static_cast<std::size_t>(l)]
                                        : biases->down[static_cast<std::size_t>(l)];
      require(b.size() == rows,
              "write_pruned_gguf: layer {} bias of {} has {} entries, expected {}", l, which,
              b.size(), rows);
      std::vector<std::uint8_t> bytes(b.size() * sizeof(float));
      std::memcpy(bytes.data(), b.data(), bytes.size());
      w.add_tensor(fmt::format("blk.{}.{}.bias", l, which), {rows}, gguf::GGMLType::F32,
                   std::move(bytes));
    }
    if (!cuts_columns(which)) {  // whole rows, byte for byte
      w.add_tensor(t.name, {t.ne[0], n}, t.type, copy_rows(t, sel));
      ++rep.kept;
      continue;
    }
    // W_o [d_model][n_head·D], W_down [d_model][d_ff]: the kept columns of every row
    require(sel.back() < static_cast<int>(t.ne[0]), "{}: tensor '{}' has {} columns", source,
            t.name, t.ne[0]);
    if (values) {  // the kept columns' new values (as the source's when they are its own bits)
      const std::vector<float>& x = which == "attn_output"
                                        ? values->o[static_cast<std::size_t>(l)]
                                        : values->down[static_cast<std::size_t>(l)];
      require(x.size() == rows * n,
              "write_pruned_gguf: layer {} new values of {} are {}, expected {} × {}", l, which,
              x.size(), rows, n);
      const std::vector<float> own = kept_columns(t, sel);
      if (std::memcmp(own.data(), x.data(), x.size() * sizeof(float)) != 0) {
        Encoded e = encode_cut(cut, t.type, x, n, t.name);
        rep.changed.push_back({t.name, t.type, e.type, e.exact, n});
        w.add_tensor(t.name, {n, rows}, e.type, std::move(e.bytes));
        continue;
      }
    }
    if (whole_blocks(sel, gguf::block_size(t.type))) {
      w.add_tensor(t.name, {n, rows}, t.type, copy_column_blocks(t, sel));
      ++rep.kept;
      continue;
    }
    Encoded e = encode_cut(cut, t.type, kept_columns(t, sel), n, t.name);
    rep.changed.push_back({t.name, t.type, e.type, e.exact, n});
    w.add_tensor(t.name, {n, rows}, e.type, std::move(e.bytes));
  }
  std::vector<std::string> retyped;
  for (const TypeChange& c : rep.changed)
    retyped.push_back(fmt::format("{} {}->{} {}", c.name, gguf::to_string(c.from),
                                  gguf::to_string(c.to), c.exact ? "exact" : "lossy"));
  w.set(prune_keys::kTensorType, rep.type_option);
  w.set(prune_keys::kRetyped, retyped);
  w.write(out);
  rep.output_bytes = std::filesystem::file_size(out);
  rep.source_bytes = std::filesystem::file_size(source);
  return rep;
}

}  // namespace sparsim::pruning
