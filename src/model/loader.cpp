#include "model/loader.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "model/detail/weight_builder.hpp"
#include "model/gguf.hpp"
#include "model/pruned_layout.hpp"
#include "model/quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace sparsim {

namespace {

std::string key(const std::string& arch, const char* k) {
  return arch + "." + k;
}

int as_int(std::uint64_t v, const std::string& what) {
  require(v <= 0x7fffffffULL, "metadata key '{}' value {} is too large", what, v);
  return static_cast<int>(v);
}

}  // namespace

Config config_from_gguf(const gguf::File& f) {
  const std::string arch = f.require_string("general.architecture");
  require(arch == "llama", "{}: architecture '{}' is not supported (sparsim runs 'llama' models)",
          f.path(), arch);
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
  if (auto rd = f.get_uint(key(arch, "rope.dimension_count")))
    require(static_cast<int>(*rd) == c.head_dim,
            "{}: metadata key '{}' = {} differs from the head dimension {} (partial RoPE is not "
            "supported)",
            f.path(), key(arch, "rope.dimension_count"), *rd, c.head_dim);
  c.rope_theta = static_cast<float>(f.get_float(key(arch, "rope.freq_base")).value_or(10000.0));
  c.rms_eps =
      static_cast<float>(f.get_float(key(arch, "attention.layer_norm_rms_epsilon")).value_or(1e-5));
  if (auto st = f.get_string(key(arch, "rope.scaling.type"))) {
    require(*st == "none" || *st == "llama3" || (*st == "linear" && false),
            "{}: RoPE scaling type '{}' ('{}') is not supported", f.path(), *st,
            key(arch, "rope.scaling.type"));
  }
  c.rope_layout = RopeLayout::Adjacent;
  const gguf::TensorInfo* emb = f.find_tensor("token_embd.weight");
  require(emb != nullptr, "{}: missing tensor 'token_embd.weight'", f.path());
  require(emb->ne.size() == 2, "{}: tensor 'token_embd.weight' must be 2-D", f.path());
  c.vocab = as_int(emb->ne[1], "token_embd.weight ne[1]");
  if (auto vs = f.get_uint(key(arch, "vocab_size")))
    require(static_cast<int>(*vs) == c.vocab,
            "{}: metadata key '{}' = {} contradicts tensor 'token_embd.weight' with {} rows",
            f.path(), key(arch, "vocab_size"), *vs, c.vocab);
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

namespace {

/// Looks tensors of a GGUF file up by name, checks their shapes against the metadata and hands
/// them to the shared WeightBuilder.
template <class E>
class GgufLoader {
 public:
  GgufLoader(const gguf::File& f, detail::WeightBuilder<E>& b) : f_(f), b_(b) {}

  detail::RawTensor raw(const gguf::TensorInfo& t) const {
    detail::RawTensor r;
    r.file = f_.path();
    r.name = t.name;
    r.hash_dims = t.ne;
    r.type = t.type;
    r.data = t.data;
    r.nbytes = t.nbytes;
    r.cols = t.ne[0];
    r.rows = t.n_elements() / t.ne[0];
    r.release = [this, &t] { f_.release(t); };
    return r;
  }

  const gguf::TensorInfo& find(const std::string& name, std::vector<std::uint64_t> ne) {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    require(t != nullptr, "{}: missing tensor '{}'", f_.path(), name);
    require(t->ne == ne, "{}: tensor '{}' has shape {}, expected {} from the model metadata",
            f_.path(), name, fmt::join(t->ne, "x"), fmt::join(ne, "x"));
    require(gguf::is_supported(t->type), "{}: tensor '{}' has unsupported type {} (supported: {})",
            f_.path(), name, gguf::to_string(t->type), gguf::supported_types_list());
    return *t;
  }

  Kokkos::View<float*, DeviceOf<E>> vec(const std::string& name, int n) {
    return b_.vec(raw(find(name, {static_cast<std::uint64_t>(n)})), n);
  }

  Matrix<E> mat(const std::string& name, int rows, int cols) {
    const auto& t =
        find(name, {static_cast<std::uint64_t>(cols), static_cast<std::uint64_t>(rows)});
    return b_.mat(raw(t), rows, cols);
  }

  std::vector<float> host_vec(const gguf::TensorInfo& t) { return b_.host_vec(raw(t)); }

 private:
  const gguf::File& f_;
  detail::WeightBuilder<E>& b_;
};

}  // namespace

template <class E>
std::shared_ptr<Weights<E>> load_gguf(const std::string& path, const LoadOptions& opt,
                                      ModelInfo* info) {
  gguf::File f = gguf::File::open(path);
  Config c = config_from_gguf(f);
  auto w = std::make_shared<Weights<E>>();
  w->cfg = c;
  w->storage = opt.storage;
  detail::WeightBuilder<E> B(opt);
  GgufLoader<E> L(f, B);
  const int d = c.d_model;
  w->tok_embd = L.mat("token_embd.weight", c.vocab, d);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    LayerWeights<E> lw;
    lw.attn_norm = L.vec(p + "attn_norm.weight", d);
    lw.wq = L.mat(p + "attn_q.weight", c.q_dim(l), d);
    lw.wk = L.mat(p + "attn_k.weight", c.k_dim(l), d);
    lw.wv = L.mat(p + "attn_v.weight", c.v_dim(l), d);
    lw.wo = L.mat(p + "attn_output.weight", d, c.att_dim(l));
    lw.ffn_norm = L.vec(p + "ffn_norm.weight", d);
    lw.w_gate = L.mat(p + "ffn_gate.weight", c.d_ff, d);
    lw.w_up = L.mat(p + "ffn_up.weight", c.d_ff, d);
    lw.w_down = L.mat(p + "ffn_down.weight", d, c.d_ff);
    w->layers.push_back(std::move(lw));
  }
  w->out_norm = L.vec("output_norm.weight", d);
  w->output = c.tied_embeddings ? w->tok_embd : L.mat("output.weight", c.vocab, d);
  if (const gguf::TensorInfo* rf = f.find_tensor("rope_freqs.weight")) {
    require(rf->ne.size() == 1 && static_cast<int>(rf->ne[0]) == c.head_dim / 2,
            "{}: tensor 'rope_freqs.weight' has {} entries, expected head_dim/2 = {}", path,
            rf->n_elements(), c.head_dim / 2);
    w->rope_freq_factors = L.host_vec(*rf);
  }
  if (info) {
    info->path = path;
    info->format = "gguf";
    info->file_bytes = f.file_size();
    B.finish(*info);
  }
  return w;
}

ModelFormat detect_model_format(const std::string& path) {
  namespace fs = std::filesystem;
  require(fs::exists(path), "model file '{}' does not exist", path);
  if (fs::is_directory(path)) return ModelFormat::HfDirectory;
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".safetensors" || ext == ".json") return ModelFormat::HfDirectory;
  unsigned char b[9] = {};
  std::ifstream in(path, std::ios::binary);
  require(static_cast<bool>(in), "{}: cannot open model file", path);
  in.read(reinterpret_cast<char*>(b), sizeof b);
  const auto n = static_cast<std::size_t>(in.gcount());
  // A .gguf name goes to the GGUF reader whatever it holds: it names what is wrong in detail.
  if ((n >= 4 && std::memcmp(b, "GGUF", 4) == 0) || ext == ".gguf") return ModelFormat::Gguf;
  if (n == 9 && b[8] == '{' && b[6] == 0 && b[7] == 0) return ModelFormat::HfDirectory;
  std::string first;
  for (std::size_t i = 0; i < std::min<std::size_t>(n, 8); ++i)
    first += fmt::format("{}{:02x}", i ? " " : "", b[i]);
  fail(
      "{}: unrecognised model file format (first bytes: {}): expected a GGUF file (magic "
      "'GGUF'), a .safetensors file or a Hugging Face model directory",
      path, n ? first : std::string("none, the file is empty"));
}

template <class E>
std::shared_ptr<Weights<E>> load_model(const std::string& path, const LoadOptions& opt,
                                       ModelInfo* info) {
  switch (detect_model_format(path)) {
    case ModelFormat::HfDirectory:
      return load_safetensors<E>(path, opt, info);
    case ModelFormat::Gguf:
      break;
  }
  return load_gguf<E>(path, opt, info);
}

#define SPARSIM_INSTANTIATE_LOADER(E)                                                        \
  template std::shared_ptr<Weights<E>> load_gguf<E>(const std::string&, const LoadOptions&,  \
                                                    ModelInfo*);                             \
  template std::shared_ptr<Weights<E>> load_model<E>(const std::string&, const LoadOptions&, \
                                                     ModelInfo*);
#ifdef KOKKOS_ENABLE_SERIAL
SPARSIM_INSTANTIATE_LOADER(Kokkos::Serial)
#endif
#ifdef KOKKOS_ENABLE_OPENMP
SPARSIM_INSTANTIATE_LOADER(Kokkos::OpenMP)
#endif
#ifdef KOKKOS_ENABLE_CUDA
SPARSIM_INSTANTIATE_LOADER(Kokkos::Cuda)
#endif

}  // namespace sparsim
