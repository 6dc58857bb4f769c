#include "model/gguf_config.hpp"

#include "core/error.hpp"
#include "model/consistency.hpp"
#include "model/gguf.hpp"
#include "model/pruned_layout.hpp"

namespace sparsim {

namespace {

std::string key(const std::string& arch, const char* k) {
  return arch + "." + k;
}

int as_int(std::uint64_t v, const std::string& what) {
  require(v <= 0x7fffffffULL, "metadata key '{}' value {} is too large", what, v);
  return static_cast<int>(v);
}

std::string architecture(const gguf::File& f) {
  const std::string arch = f.require_string("general.architecture");
  require(arch == "llama", "{}: architecture '{}' is not supported (sparsim runs 'llama' models)",
          f.path(), arch);
  return arch;
}

std::optional<std::int64_t> stated(const gguf::File& f, const std::string& k) {
  const auto v = f.get_uint(k);
  if (!v) return std::nullopt;
  return as_int(*v, k);
}

}  // namespace

std::vector<std::string> check_gguf_model(const gguf::File& f) {
  const std::string arch = architecture(f);
  const LlamaNames n = LlamaNames::gguf(arch);
  for (const std::string* k : {&n.n_layer, &n.d_model, &n.n_head, &n.d_ff})
    (void)f.require_uint(*k);
  (void)f.require_uint(key(arch, "context_length"));
  StatedShape s;
  s.n_layer = stated(f, n.n_layer);
  s.d_model = stated(f, n.d_model);
  s.n_head = stated(f, n.n_head);
  s.n_kv_head = stated(f, n.n_kv_head);
  s.head_dim = stated(f, n.head_dim);
  s.value_dim = stated(f, n.value_dim);
  s.rope_dims = stated(f, n.rope_dims);
  s.d_ff = stated(f, n.d_ff);
  s.vocab = stated(f, n.vocab);
  s.output_required = false;  // no output.weight: the embedding is tied
  for (auto [k, dst] : {std::pair{prune_keys::kKeyWidths, &s.qk_widths},
                        std::pair{prune_keys::kValueWidths, &s.v_widths}})
    if (f.has(k)) *dst = f.require_int_array(k);  // entry count: read_pruned_layout
  if (f.has(prune_keys::kLowRankGroup)) {
    s.lr_group = static_cast<std::int64_t>(f.require_uint(prune_keys::kLowRankGroup));
    for (auto [k, dst] : {std::pair{prune_keys::kLowRankKeyRanks, &s.k_ranks},
                          std::pair{prune_keys::kLowRankValueRanks, &s.v_ranks}})
      *dst = f.require_int_array(k);
  }
  if (s.n_layer && *s.n_layer > 0 && *s.n_layer < (1 << 20)) {
    read_structure_counts(f, static_cast<int>(*s.n_layer), s.head_counts, s.ffn_widths);
    if (!s.head_counts.empty()) {
      // KV heads of each layer: the groups its kept query heads fall in
      const std::int64_t nh = s.n_head.value_or(0), nkv = s.n_kv_head.value_or(nh);
      const std::vector<std::int64_t> qh = f.require_int_array(prune_keys::kQueryHeads);
      std::size_t o = 0;
      for (std::int64_t cnt : s.head_counts) {
        std::int64_t kv = 0, last = -1;
        for (std::int64_t i = 0; i < cnt && o < qh.size() && nkv > 0 && nh % nkv == 0; ++i, ++o) {
          const std::int64_t g = qh[o] / (nh / nkv);
          if (g != last) ++kv;
          last = g;
        }
        s.kv_counts.push_back(kv);
      }
    }
  }
  TensorShapes shapes;
  for (const auto& t : f.tensors()) shapes[t.name] = t.ne;
  return check_llama_shapes(s, shapes, n);
}

Config config_from_gguf(const gguf::File& f) {
  const std::vector<std::string> problems = check_gguf_model(f);
  if (!problems.empty()) fail("{}", describe_problems(f.path(), problems));
  const std::string arch = architecture(f);
  Config c;
  c.name = f.get_string("general.name").value_or("");
  c.n_layer = as_int(f.require_uint(key(arch, "block_count")), key(arch, "block_count"));
  c.d_model = as_int(f.require_uint(key(arch, "embedding_length")), key(arch, "embedding_length"));
  c.n_head =
      as_int(f.require_uint(key(arch, "attention.head_count")), key(arch, "attention.head_count"));
  c.n_kv_head = as_int(f.get_uint(key(arch, "attention.head_count_kv")).value_or(c.n_head),
                       key(arch, "attention.head_count_kv"));
  c.d_ff =
      as_int(f.require_uint(key(arch, "feed_forward_length")), key(arch, "feed_forward_length"));
  c.context_length =
      as_int(f.require_uint(key(arch, "context_length")), key(arch, "context_length"));
  require(c.n_head > 0, "{}: metadata key '{}' is zero", f.path(),
          key(arch, "attention.head_count"));
  c.head_dim = c.d_model / c.n_head;
  if (auto kl = f.get_uint(key(arch, "attention.key_length")))
    c.head_dim = as_int(*kl, key(arch, "attention.key_length"));
  c.rope_theta = static_cast<float>(f.get_float(key(arch, "rope.freq_base")).value_or(10000.0));
  c.rms_eps =
      static_cast<float>(f.get_float(key(arch, "attention.layer_norm_rms_epsilon")).value_or(1e-5));
  if (auto st = f.get_string(key(arch, "rope.scaling.type"))) {
    require(*st == "none" || *st == "llama3", "{}: RoPE scaling type '{}' ('{}') is not supported",
            f.path(), *st, key(arch, "rope.scaling.type"));
  }
  c.rope_layout = RopeLayout::Adjacent;
  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  c.vocab = as_int(emb->ne[1], "token_embd.weight ne[1]");
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  if (auto b = f.get_uint("tokenizer.ggml.bos_token_id")) c.bos_id = static_cast<int>(*b);
  if (auto e = f.get_uint("tokenizer.ggml.eos_token_id")) c.eos_id = static_cast<int>(*e);
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", f.path(), e.what());
  }
  read_pruned_layout(f, c);  // per-layer widths of a RAP / KVPruner model; dense otherwise
  return c;
}

}  // namespace sparsim
