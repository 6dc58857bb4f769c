#include "model/loader.hpp"

#include "core/backends.hpp"
#include "core/device_blas.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "gemm_bf16/bf16_gemm.hpp"
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
    lw.wk = L.mat(p + "attn_k.weight", c.k_cache_width(l), d);
    lw.wv = L.mat(p + "attn_v.weight", c.v_cache_width(l), d);
    if (c.low_rank_kv()) {
      lw.k_up = L.mat(p + "attn_k_up.weight", c.k_dim(l), c.k_cache_width(l));
      lw.v_up = L.mat(p + "attn_v_up.weight", c.v_dim(l), c.v_cache_width(l));
    }
    lw.wo = L.mat(p + "attn_output.weight", d, c.att_dim(l));
    lw.ffn_norm = L.vec(p + "ffn_norm.weight", d);
    lw.w_gate = L.mat(p + "ffn_gate.weight", c.d_ff_at(l), d);
    lw.w_up = L.mat(p + "ffn_up.weight", c.d_ff_at(l), d);
    lw.w_down = L.mat(p + "ffn_down.weight", d, c.d_ff_at(l));
    if (c.structured()) {
      lw.o_bias = L.vec(p + "attn_output.bias", d);
      lw.down_bias = L.vec(p + "ffn_down.bias", d);
    }
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

namespace {
constexpr const char* kBf16Key = "load.bf16_compute";
constexpr const char* kBf16Name = "bf16 prefill arithmetic";
}  // namespace

void check_load_options(const LoadOptions& o) {
  if (!o.bf16_compute) return;
  // usage errors: a setting that cannot work, refused (exit 2) before any work starts
  if (o.storage != DType::BF16)
    throw OptionError(kBf16Key, kBf16Name,
                      fmt::format("multiplies bf16 weights in bf16: it needs the weights stored "
                                  "as bf16, not {}",
                                  to_string(o.storage)),
                      true, SettingFix{"load.storage", "weight storage", "bf16"});
  // a CUDA build multiplies on the GPU (cuBLAS); the host backends need oneDNN's bf16 matmul
  if (!host::bf16_gemm_available() && !device_blas::available())
    throw OptionError(kBf16Key, kBf16Name,
                      fmt::format("is unavailable: {}", host::bf16_gemm_unavailable_reason()),
                      true);
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
  check_load_options(opt);
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename E::memory_space>::accessible) {
    if (opt.bf16_compute && !host::bf16_gemm_available())
      throw OptionError(kBf16Key, kBf16Name,
                        fmt::format("is unavailable on the host backends: {}{}",
                                    host::bf16_gemm_unavailable_reason(),
                                    device_blas::available() ? " (the cuda backend has it)" : ""),
                        true);
  } else {
    if (opt.bf16_compute && !device_blas::available())
      throw OptionError(kBf16Key, kBf16Name,
                        "is unavailable on this device backend (it needs cuBLAS)", true);
  }
  std::shared_ptr<Weights<E>> w = detect_model_format(path) == ModelFormat::HfDirectory
                                      ? load_safetensors<E>(path, opt, info)
                                      : load_gguf<E>(path, opt, info);
  w->bf16_compute = opt.bf16_compute;
  return w;
}

#define SPARSIM_INSTANTIATE_LOADER(E)                                                        \
  template std::shared_ptr<Weights<E>> load_gguf<E>(const std::string&, const LoadOptions&,  \
                                                    ModelInfo*);                             \
  template std::shared_ptr<Weights<E>> load_model<E>(const std::string&, const LoadOptions&, \
                                                     ModelInfo*);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_LOADER)

}  // namespace sparsim
