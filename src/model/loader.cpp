#include "model/loader.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "model/gguf.hpp"
#include "model/quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace sparsim {

namespace {

std::string key(const std::string& arch, const char* k) { return arch + "." + k; }

int as_int(std::uint64_t v, const std::string& what) {
  require(v <= 0x7fffffffULL, "metadata key '{}' value {} is too large", what, v);
  return static_cast<int>(v);
}

/// A 64-bit streaming hash (multiply-xorshift over 8-byte words); identifies tensor data.
struct Hasher {
  std::uint64_t h = 0x9e3779b97f4a7c15ULL;
  void mix(std::uint64_t w) {
    h ^= w + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
  }
  void bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, c + i, 8);
      mix(w);
    }
    std::uint64_t tail = 0;
    std::memcpy(&tail, c + i, n - i);
    mix(tail ^ (static_cast<std::uint64_t>(n) << 56));
  }
  std::string hex() const { return fmt::format("{:016x}", h); }
};

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
  c.d_ff = as_int(f.require_uint(key(arch, "feed_forward_length")),
                  key(arch, "feed_forward_length"));
  c.context_length =
      as_int(f.require_uint(key(arch, "context_length")), key(arch, "context_length"));
  require(c.n_head > 0, "{}: metadata key '{}' is zero", f.path(), key(arch, "attention.head_count"));
  c.head_dim = c.d_model / c.n_head;
  if (auto kl = f.get_uint(key(arch, "attention.key_length")))
    c.head_dim = as_int(*kl, key(arch, "attention.key_length"));
  if (auto rd = f.get_uint(key(arch, "rope.dimension_count")))
    require(static_cast<int>(*rd) == c.head_dim,
            "{}: metadata key '{}' = {} differs from the head dimension {} (partial RoPE is not "
            "supported)",
            f.path(), key(arch, "rope.dimension_count"), *rd, c.head_dim);
  c.rope_theta = static_cast<float>(f.get_float(key(arch, "rope.freq_base")).value_or(10000.0));
  c.rms_eps = static_cast<float>(
      f.get_float(key(arch, "attention.layer_norm_rms_epsilon")).value_or(1e-5));
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
  return c;
}

namespace {

template <class E>
class GgufLoader {
 public:
  GgufLoader(const gguf::File& f, const Config& c, const LoadOptions& o, Hasher& h,
             std::set<std::string>& types, std::uint64_t& nonfinite)
      : f_(f), c_(c), o_(o), h_(h), types_(types), nonfinite_(nonfinite) {}

  const gguf::TensorInfo& find(const std::string& name, std::vector<std::uint64_t> ne) {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    require(t != nullptr, "{}: missing tensor '{}'", f_.path(), name);
    require(t->ne == ne, "{}: tensor '{}' has shape {}, expected {} from the model metadata",
            f_.path(), name, fmt::join(t->ne, "x"), fmt::join(ne, "x"));
    require(gguf::is_supported(t->type), "{}: tensor '{}' has unsupported type {} (supported: {})",
            f_.path(), name, gguf::to_string(t->type), gguf::supported_types_list());
    return *t;
  }

  // Dequantizes a tensor into fp32 chunk by chunk, handing each chunk to `sink`.
  template <class Sink>
  void stream(const gguf::TensorInfo& t, Sink&& sink) {
    types_.insert(gguf::to_string(t.type));
    h_.bytes(t.name.data(), t.name.size());
    for (auto d : t.ne) h_.mix(d);
    h_.mix(static_cast<std::uint64_t>(t.type));
    h_.bytes(t.data, t.nbytes);
    const std::uint64_t cols = t.ne[0];
    const std::uint64_t rows = t.n_elements() / cols;
    const std::uint64_t rb = gguf::row_bytes(t.type, cols);
    const std::uint64_t chunk_rows = std::max<std::uint64_t>(1, (1u << 16) / cols);
    buf_.resize(chunk_rows * cols);
    std::uint64_t bad = 0;
    for (std::uint64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const std::uint64_t nr = std::min(chunk_rows, rows - r0);
      gguf::dequantize(t.type, t.data + r0 * rb, buf_.data(), nr * cols);
      for (std::uint64_t i = 0; i < nr * cols; ++i)
        if (!std::isfinite(buf_[i])) ++bad;
      sink(r0, nr, buf_.data());
    }
    if (bad) {
      nonfinite_ += bad;
      if (o_.strict) fail("{}: tensor '{}' holds {} NaN/Inf values", f_.path(), t.name, bad);
      log().warn("{}: tensor '{}' holds {} NaN/Inf values", f_.path(), t.name, bad);
    }
    f_.release(t);
  }

  Kokkos::View<float*, DeviceOf<E>> vec(const std::string& name, int n) {
    const auto& t = find(name, {static_cast<std::uint64_t>(n)});
    Kokkos::View<float*, DeviceOf<E>> v(Kokkos::view_alloc(name, Kokkos::WithoutInitializing), n);
    auto h = Kokkos::create_mirror_view(v);
    stream(t, [&](std::uint64_t r0, std::uint64_t nr, const float* src) {
      std::copy(src, src + nr * n, h.data() + r0 * n);
    });
    Kokkos::deep_copy(v, h);
    return v;
  }

  template <class T>
  Kokkos::View<T**, Layout, DeviceOf<E>> fill(const gguf::TensorInfo& t, int rows, int cols) {
    Kokkos::View<T**, Layout, DeviceOf<E>> v(
        Kokkos::view_alloc(t.name, Kokkos::WithoutInitializing), rows, cols);
    auto h = Kokkos::create_mirror_view(v);
    stream(t, [&](std::uint64_t r0, std::uint64_t nr, const float* src) {
      T* dst = h.data() + r0 * cols;
      for (std::uint64_t i = 0; i < nr * cols; ++i) dst[i] = from_f32<T>(src[i]);
    });
    Kokkos::deep_copy(v, h);
    return v;
  }

  Matrix<E> mat(const std::string& name, int rows, int cols) {
    const auto& t = find(name, {static_cast<std::uint64_t>(cols), static_cast<std::uint64_t>(rows)});
    Matrix<E> m;
    m.dtype = o_.storage;
    m.rows = rows;
    m.cols = cols;
    switch (o_.storage) {
      case DType::F32: m.f32 = fill<float>(t, rows, cols); break;
      case DType::BF16: m.bf16 = fill<bf16_t>(t, rows, cols); break;
      case DType::F16: m.f16 = fill<f16_t>(t, rows, cols); break;
    }
    return m;
  }

  std::vector<float> host_vec(const gguf::TensorInfo& t) {
    std::vector<float> out(t.n_elements());
    stream(t, [&](std::uint64_t r0, std::uint64_t nr, const float* src) {
      std::copy(src, src + nr * t.ne[0], out.data() + r0 * t.ne[0]);
    });
    return out;
  }

 private:
  const gguf::File& f_;
  const Config& c_;
  const LoadOptions& o_;
  Hasher& h_;
  std::set<std::string>& types_;
  std::uint64_t& nonfinite_;
  std::vector<float> buf_;
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
  Hasher h;
  std::set<std::string> types;
  std::uint64_t nonfinite = 0;
  GgufLoader<E> L(f, c, opt, h, types, nonfinite);
  const int d = c.d_model;
  w->tok_embd = L.mat("token_embd.weight", c.vocab, d);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    LayerWeights<E> lw;
    lw.attn_norm = L.vec(p + "attn_norm.weight", d);
    lw.wq = L.mat(p + "attn_q.weight", c.q_dim(), d);
    lw.wk = L.mat(p + "attn_k.weight", c.kv_dim(), d);
    lw.wv = L.mat(p + "attn_v.weight", c.kv_dim(), d);
    lw.wo = L.mat(p + "attn_output.weight", d, c.q_dim());
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
    info->fingerprint = h.hex();
    info->tensor_types.assign(types.begin(), types.end());
    info->nonfinite = nonfinite;
  }
  return w;
}

template <class E>
std::shared_ptr<Weights<E>> load_model(const std::string& path, const LoadOptions& opt,
                                       ModelInfo* info) {
  namespace fs = std::filesystem;
  require(fs::exists(path), "model file '{}' does not exist", path);
  require(!fs::is_directory(path), "model path '{}' is a directory, expected a model file", path);
  return load_gguf<E>(path, opt, info);
}

#define SPARSIM_INSTANTIATE_LOADER(E)                                                           \
  template std::shared_ptr<Weights<E>> load_gguf<E>(const std::string&, const LoadOptions&,    \
                                                    ModelInfo*);                               \
  template std::shared_ptr<Weights<E>> load_model<E>(const std::string&, const LoadOptions&,   \
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
