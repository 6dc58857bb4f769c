// Hugging Face Llama checkpoints: config.json + safetensors weights (one file or shards).
#include "core/backends.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "model/consistency.hpp"
#include "model/detail/weight_builder.hpp"
#include "model/loader.hpp"
#include "model/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <climits>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

namespace sparsim {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// Typed access to config.json keys with messages naming the file and key.
class HfConfigReader {
 public:
  HfConfigReader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  /// The value, or nullptr when the key is absent or null.
  const json* get(const char* k) const {
    auto it = j_.find(k);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  int req_int(const char* k) const {
    const json* v = get(k);
    require(v != nullptr, "{}: missing key '{}'", path_, k);
    return to_int(*v, k);
  }
  int opt_int(const char* k, int dflt) const {
    const json* v = get(k);
    return v ? to_int(*v, k) : dflt;
  }
  double opt_float(const char* k, double dflt) const {
    const json* v = get(k);
    return v ? to_float(*v, k) : dflt;
  }
  bool opt_bool(const char* k, bool dflt) const {
    const json* v = get(k);
    if (!v) return dflt;
    require(v->is_boolean(), "{}: key '{}' must be true or false, got {}", path_, k, v->dump());
    return v->get<bool>();
  }
  std::optional<std::string> opt_string(const char* k) const {
    const json* v = get(k);
    if (!v) return std::nullopt;
    require(v->is_string(), "{}: key '{}' must be a string, got {}", path_, k, v->dump());
    return v->get<std::string>();
  }
  int to_int(const json& v, const std::string& k) const {
    require(v.is_number_integer() && v.get<std::int64_t>() >= 0 && v.get<std::int64_t>() <= INT_MAX,
            "{}: key '{}' must be a non-negative integer, got {}", path_, k, v.dump());
    return static_cast<int>(v.get<std::int64_t>());
  }
  double to_float(const json& v, const std::string& k) const {
    require(v.is_number(), "{}: key '{}' must be a number, got {}", path_, k, v.dump());
    return v.get<double>();
  }
  /// A token id given as an integer or a list of integers (the first one is taken); -1 when
  /// absent or null.
  int token_id(const char* k) const {
    const json* v = get(k);
    if (!v) return -1;
    if (v->is_array()) {
      if (v->empty()) return -1;
      return to_int((*v)[0], std::string(k) + "[0]");
    }
    return to_int(*v, k);
  }

 private:
  const json& j_;
  std::string path_;
};

json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  require(static_cast<bool>(in), "{}: cannot open {}", path, what);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    std::string m = e.what();
    if (auto p = m.find("] "); p != std::string::npos) m = m.substr(p + 2);
    fail("{}: malformed JSON in {}: {}", path, what, m);
  }
}

/// Where the pieces of a Hugging Face checkpoint are.
struct HfPaths {
  std::string config;   ///< config.json
  std::string weights;  ///< model.safetensors or model.safetensors.index.json
  bool sharded = false;
};

HfPaths resolve_hf_paths(const std::string& path) {
  require(fs::exists(path), "model path '{}' does not exist", path);
  HfPaths p;
  fs::path dir;
  if (fs::is_directory(path)) {
    dir = path;
  } else {
    dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    const std::string fname = fs::path(path).filename().string();
    const auto ends_with = [&](const std::string& suf) {
      return fname.size() >= suf.size() &&
             fname.compare(fname.size() - suf.size(), suf.size(), suf) == 0;
    };
    if (ends_with(".index.json")) {
      p.weights = path;
      p.sharded = true;
    } else if (!ends_with(".json")) {
      p.weights = path;  // a .safetensors file (or one recognised by its header)
    }
  }
  p.config = (dir / "config.json").string();
  require(fs::exists(p.config),
          "{}: no config.json beside the weights (a Hugging Face model directory holds "
          "config.json and model.safetensors)",
          dir.string());
  if (p.weights.empty()) {
    const fs::path index = dir / "model.safetensors.index.json";
    const fs::path single = dir / "model.safetensors";
    if (fs::exists(index)) {
      p.weights = index.string();
      p.sharded = true;
    } else if (fs::exists(single)) {
      p.weights = single.string();
    } else {
      fail("{}: neither model.safetensors nor model.safetensors.index.json is there", dir.string());
    }
  }
  return p;
}

std::vector<std::uint64_t> dims(std::initializer_list<int> d) {
  std::vector<std::uint64_t> v;
  for (int x : d) v.push_back(static_cast<std::uint64_t>(x));
  return v;
}

/// Looks tensors of a checkpoint up by name, checks them against config.json and hands them to
/// the shared WeightBuilder.
template <class E>
class HfLoader {
 public:
  HfLoader(const safetensors::Checkpoint& ck, detail::WeightBuilder<E>& b) : ck_(ck), b_(b) {}

  detail::RawTensor find(const std::string& name, const std::vector<std::uint64_t>& shape,
                         const char* hint = "") {
    const auto e = ck_.find(name);
    require(e.tensor != nullptr, "{}: missing tensor '{}'{}", ck_.path(), name, hint);
    const safetensors::TensorInfo& t = *e.tensor;
    used_.insert(name);
    require(t.shape == shape, "{}: tensor '{}' has shape {}, expected [{}] from config.json",
            e.file->path(), name, t.shape_string(), fmt::join(shape, ", "));
    require(safetensors::is_loadable(t.dtype),
            "{}: tensor '{}' has dtype {}, which sparsim cannot load (supported: F32, F16, BF16)",
            e.file->path(), name, safetensors::to_string(t.dtype));
    detail::RawTensor r;
    r.file = e.file->path();
    r.name = name;
    r.hash_dims = t.shape;
    r.type = safetensors::to_ggml(t.dtype);
    r.data = t.data;
    r.nbytes = t.nbytes();
    r.cols = t.shape.back();
    r.rows = t.n_elements() / r.cols;
    const safetensors::File* f = e.file;
    const safetensors::TensorInfo* tp = e.tensor;
    r.release = [f, tp] { f->release(*tp); };
    return r;
  }

  Kokkos::View<float*, DeviceOf<E>> vec(const std::string& name, int n) {
    return b_.vec(find(name, dims({n})), n);
  }
  Matrix<E> mat(const std::string& name, int rows, int cols, const char* hint = "") {
    return b_.mat(find(name, dims({rows, cols}), hint), rows, cols);
  }
  const std::set<std::string>& used() const { return used_; }

 private:
  const safetensors::Checkpoint& ck_;
  detail::WeightBuilder<E>& b_;
  std::set<std::string> used_;
};

}  // namespace

Config config_from_hf_json(const std::string& config_json_path) {
  const json j = read_json_file(config_json_path, "the model configuration (config.json)");
  require(j.is_object(), "{}: expected a JSON object, got a JSON {}", config_json_path,
          j.type_name());
  const HfConfigReader r(j, config_json_path);
  const auto model_type = r.opt_string("model_type");
  std::vector<std::string> archs;
  if (const json* a = r.get("architectures")) {
    require(a->is_array(), "{}: key 'architectures' must be a list of strings, got {}",
            config_json_path, a->dump());
    for (const auto& x : *a) {
      require(x.is_string(), "{}: key 'architectures' must be a list of strings, got {}",
              config_json_path, a->dump());
      archs.push_back(x.get<std::string>());
    }
  }
  require(model_type || !archs.empty(),
          "{}: neither 'model_type' nor 'architectures' is given: cannot tell the model is a "
          "Llama",
          config_json_path);
  if (model_type)
    require(*model_type == "llama",
            "{}: model_type '{}' is not supported (sparsim runs 'llama' models)", config_json_path,
            *model_type);
  if (!archs.empty())
    require(std::find(archs.begin(), archs.end(), "LlamaForCausalLM") != archs.end(),
            "{}: architectures [{}] is not supported (sparsim runs LlamaForCausalLM)",
            config_json_path, fmt::join(archs, ", "));
  if (auto act = r.opt_string("hidden_act"))
    require(*act == "silu", "{}: hidden_act '{}' is not supported (Llama uses 'silu')",
            config_json_path, *act);
  for (const char* k : {"attention_bias", "mlp_bias"})
    require(!r.opt_bool(k, false), "{}: key '{}' is true: biased projections are not supported",
            config_json_path, k);

  Config c;
  c.name = r.opt_string("_name_or_path").value_or("");
  if (c.name.empty())
    c.name = fs::absolute(fs::path(config_json_path)).parent_path().filename().string();
  c.n_layer = r.req_int("num_hidden_layers");
  c.d_model = r.req_int("hidden_size");
  c.n_head = r.req_int("num_attention_heads");
  c.n_kv_head = r.opt_int("num_key_value_heads", c.n_head);
  c.d_ff = r.req_int("intermediate_size");
  c.vocab = r.req_int("vocab_size");
  c.context_length = r.opt_int("max_position_embeddings", 2048);
  require(c.n_head > 0, "{}: key 'num_attention_heads' is zero", config_json_path);
  if (r.get("head_dim")) {
    c.head_dim = r.req_int("head_dim");
  } else {
    require(c.d_model % c.n_head == 0,
            "{}: hidden_size {} is not a multiple of num_attention_heads {} (and no head_dim is "
            "given)",
            config_json_path, c.d_model, c.n_head);
    c.head_dim = c.d_model / c.n_head;
  }
  c.rope_theta = static_cast<float>(r.opt_float("rope_theta", 10000.0));
  c.rms_eps = static_cast<float>(r.opt_float("rms_norm_eps", 1e-6));
  c.rope_layout = RopeLayout::Half;
  c.tied_embeddings = r.opt_bool("tie_word_embeddings", false);
  c.bos_id = r.token_id("bos_token_id");
  c.eos_id = r.token_id("eos_token_id");
  if (const json* rs = r.get("rope_scaling")) {
    require(rs->is_object(), "{}: key 'rope_scaling' must be an object, got {}", config_json_path,
            rs->dump());
    const HfConfigReader s(*rs, config_json_path + ": rope_scaling");
    auto type = s.opt_string("rope_type");
    if (!type) type = s.opt_string("type");
    require(type.has_value(), "{}: rope_scaling has neither 'rope_type' nor 'type'",
            config_json_path);
    if (*type == "llama3") {
      auto need = [&](const char* k) {
        require(s.get(k) != nullptr, "{}: rope_scaling of type 'llama3' lacks '{}'",
                config_json_path, k);
      };
      for (const char* k :
           {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        need(k);
      c.rope_scaling.enabled = true;
      c.rope_scaling.factor = static_cast<float>(s.opt_float("factor", 1.0));
      c.rope_scaling.low_freq_factor = static_cast<float>(s.opt_float("low_freq_factor", 1.0));
      c.rope_scaling.high_freq_factor = static_cast<float>(s.opt_float("high_freq_factor", 4.0));
      c.rope_scaling.original_context = s.req_int("original_max_position_embeddings");
    } else {
      require(*type == "default",
              "{}: rope_scaling type '{}' is not supported (sparsim supports 'llama3' and "
              "'default')",
              config_json_path, *type);
    }
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", config_json_path, e.what());
  }
  return c;
}

namespace {

std::vector<std::string> check_hf(const HfPaths& hp, const safetensors::Checkpoint& ck) {
  const Config c = config_from_hf_json(hp.config);
  const json j = read_json_file(hp.config, "the model configuration (config.json)");
  const HfConfigReader r(j, hp.config);
  StatedShape s;
  s.n_layer = c.n_layer;
  s.d_model = c.d_model;
  s.n_head = c.n_head;
  if (r.get("num_key_value_heads")) s.n_kv_head = c.n_kv_head;
  if (r.get("head_dim")) s.head_dim = c.head_dim;
  s.d_ff = c.d_ff;
  s.vocab = c.vocab;
  s.output_required = !c.tied_embeddings;
  TensorShapes shapes;
  for (const auto& name : ck.names()) shapes[name] = ck.find(name).tensor->shape;
  return check_llama_shapes(s, shapes, LlamaNames::hugging_face());
}

safetensors::Checkpoint open_checkpoint(const HfPaths& hp) {
  return hp.sharded ? safetensors::Checkpoint::open_index(hp.weights)
                    : safetensors::Checkpoint::open_file(hp.weights);
}

}  // namespace

std::vector<std::string> check_hf_model(const std::string& path) {
  const HfPaths hp = resolve_hf_paths(path);
  return check_hf(hp, open_checkpoint(hp));
}

template <class E>
std::shared_ptr<Weights<E>> load_safetensors(const std::string& path, const LoadOptions& opt,
                                             ModelInfo* info) {
  const HfPaths hp = resolve_hf_paths(path);
  const Config c = config_from_hf_json(hp.config);
  const safetensors::Checkpoint ck = open_checkpoint(hp);
  const std::vector<std::string> problems = check_hf(hp, ck);
  if (!problems.empty()) fail("{}", describe_problems(hp.config, problems));
  auto w = std::make_shared<Weights<E>>();
  w->cfg = c;
  w->storage = opt.storage;
  detail::WeightBuilder<E> B(opt);
  HfLoader<E> L(ck, B);
  const int d = c.d_model;
  w->tok_embd = L.mat("model.embed_tokens.weight", c.vocab, d);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights<E> lw;
    lw.attn_norm = L.vec(p + "input_layernorm.weight", d);
    lw.wq = L.mat(p + "self_attn.q_proj.weight", c.q_dim(), d);
    lw.wk = L.mat(p + "self_attn.k_proj.weight", c.kv_dim(), d);
    lw.wv = L.mat(p + "self_attn.v_proj.weight", c.kv_dim(), d);
    lw.wo = L.mat(p + "self_attn.o_proj.weight", d, c.q_dim());
    lw.ffn_norm = L.vec(p + "post_attention_layernorm.weight", d);
    lw.w_gate = L.mat(p + "mlp.gate_proj.weight", c.d_ff, d);
    lw.w_up = L.mat(p + "mlp.up_proj.weight", c.d_ff, d);
    lw.w_down = L.mat(p + "mlp.down_proj.weight", d, c.d_ff);
    w->layers.push_back(std::move(lw));
  }
  w->out_norm = L.vec("model.norm.weight", d);
  // Tied: Hugging Face ties lm_head to the embedding after loading, so a stored lm_head.weight
  // would be overwritten there; it is ignored here as well.
  w->output = c.tied_embeddings ? w->tok_embd
                                : L.mat("lm_head.weight", c.vocab, d,
                                        " (config.json has tie_word_embeddings false or absent)");
  std::size_t unused = 0;
  for (const auto& n : ck.names())
    if (!L.used().count(n)) {
      ++unused;
      log().debug("{}: tensor '{}' is not used", ck.path(), n);
    }
  if (unused) log().debug("{}: {} tensors not used by a Llama model", ck.path(), unused);
  if (info) {
    info->path = path;
    info->format = "safetensors";
    info->file_bytes = ck.total_bytes();
    B.finish(*info);
  }
  return w;
}

#define SPARSIM_INSTANTIATE_HF_LOADER(E)                                                           \
  template std::shared_ptr<Weights<E>> load_safetensors<E>(const std::string&, const LoadOptions&, \
                                                           ModelInfo*);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_HF_LOADER)

}  // namespace sparsim
