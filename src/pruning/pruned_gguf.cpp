#include "pruning/pruned_gguf.hpp"

#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/loader.hpp"
#include "model/pruned_layout.hpp"

#include <fmt/format.h>

#include <cstring>

namespace sparsim::pruning {

namespace {

/// Layer and projection of a tensor name "blk.<l>.attn_{q,k,v,output}.weight"; false otherwise.
bool attention_tensor(const std::string& name, int& layer, std::string& which) {
  int l = -1;
  char buf[32] = {};
  if (std::sscanf(name.c_str(), "blk.%d.attn_%31[a-z].weight", &l, buf) != 2) return false;
  const std::string w = buf;
  if (name != fmt::format("blk.{}.attn_{}.weight", l, w)) return false;
  if (w != "q" && w != "k" && w != "v" && w != "output") return false;
  layer = l;
  which = w;
  return true;
}

}  // namespace

void write_pruned_gguf(const std::string& source, const Config& pruned, const std::string& out) {
  require(pruned.pruned(), "write_pruned_gguf: the config is not pruned");
  pruned.validate();
  gguf::File f = gguf::File::open(source);
  const Config full = config_from_gguf(f);
  require(!full.pruned(), "{}: the source model is already pruned", source);
  require(full.n_layer == pruned.n_layer && full.n_head == pruned.n_head &&
              full.n_kv_head == pruned.n_kv_head && full.head_dim == pruned.head_dim &&
              full.d_model == pruned.d_model && full.rope_layout == pruned.rope_layout,
          "{}: the pruning plan was made for another model shape", source);
  gguf::Writer w;
  for (const gguf::KeyValue& kv : f.metadata()) {
    if (kv.key.rfind("sparsim.", 0) == 0) continue;
    if (kv.key == "general.alignment") {
      w.set_alignment(static_cast<std::uint32_t>(f.alignment()));
      continue;
    }
    w.set(kv.key, kv.value);
  }
  write_pruned_layout(w, pruned);
  const int D = full.head_dim, group = full.n_head / full.n_kv_head;
  for (const gguf::TensorInfo& t : f.tensors()) {
    int l = -1;
    std::string which;
    if (!attention_tensor(t.name, l, which) || l < 0 || l >= full.n_layer) {
      w.add_tensor(t.name, t.ne, t.type, t.data, t.nbytes);
      continue;
    }
    require(t.ne.size() == 2, "{}: tensor '{}' is not 2-D", source, t.name);
    const std::uint64_t ne0 = t.ne[0], rows = t.ne[1];
    const std::uint64_t rb = gguf::row_bytes(t.type, ne0);
    std::vector<int> sel;
    if (which == "q") {
      for (int h = 0; h < full.n_head; ++h)
        for (int i = 0; i < pruned.qk_head_dim(l); ++i)
          sel.push_back(h * D + pruned.k_channel(l, h / group, i));
    } else if (which == "k") {
      for (int h = 0; h < full.n_kv_head; ++h)
        for (int i = 0; i < pruned.qk_head_dim(l); ++i)
          sel.push_back(h * D + pruned.k_channel(l, h, i));
    } else if (which == "v") {
      for (int h = 0; h < full.n_kv_head; ++h)
        for (int i = 0; i < pruned.v_head_dim(l); ++i)
          sel.push_back(h * D + pruned.v_channel(l, h, i));
    } else {
      for (int h = 0; h < full.n_head; ++h)
        for (int i = 0; i < pruned.v_head_dim(l); ++i)
          sel.push_back(h * D + pruned.v_channel(l, h / group, i));
    }
    if (which != "output") {  // whole rows, byte for byte
      std::vector<std::uint8_t> bytes(sel.size() * rb);
      for (std::size_t r = 0; r < sel.size(); ++r) {
        require(static_cast<std::uint64_t>(sel[r]) < rows, "{}: tensor '{}' has {} rows", source,
                t.name, rows);
        std::memcpy(bytes.data() + r * rb, t.data + static_cast<std::uint64_t>(sel[r]) * rb, rb);
      }
      w.add_tensor(t.name, {ne0, sel.size()}, t.type, std::move(bytes));
      continue;
    }
    // W_o [d_model][n_head·D]: the kept columns of every row
    const bool elementwise = gguf::block_size(t.type) == 1;
    const gguf::GGMLType ot = elementwise ? t.type : gguf::GGMLType::F32;
    const std::size_t es = elementwise ? gguf::type_size(t.type) : sizeof(float);
    std::vector<std::uint8_t> bytes(rows * sel.size() * es);
    std::vector<float> row(ne0);
    for (std::uint64_t r = 0; r < rows; ++r) {
      const std::uint8_t* src = t.data + r * rb;
      std::uint8_t* dst = bytes.data() + r * sel.size() * es;
      if (!elementwise) gguf::dequantize(t.type, src, row.data(), ne0);
      for (std::size_t k = 0; k < sel.size(); ++k) {
        require(static_cast<std::uint64_t>(sel[k]) < ne0, "{}: tensor '{}' has {} columns", source,
                t.name, ne0);
        if (elementwise)
          std::memcpy(dst + k * es, src + static_cast<std::size_t>(sel[k]) * es, es);
        else
          std::memcpy(dst + k * es, &row[static_cast<std::size_t>(sel[k])], es);
      }
    }
    w.add_tensor(t.name, {sel.size(), rows}, ot, std::move(bytes));
  }
  w.write(out);
}

}  // namespace sparsim::pruning
