#include "model/synth_hf.hpp"

#include "core/error.hpp"
#include "io/temp_file.hpp"

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace sparsim {

namespace {

/// Row r_dst of the result is row src_row(h, i) of `w`, per head h and in-head index i.
template <class F>
std::vector<float> permute_rows(const std::vector<float>& w, int n_heads, int head_dim, int cols,
                                F src_index) {
  require(head_dim > 0 && head_dim % 2 == 0, "RoPE row permutation: head_dim {} must be even",
          head_dim);
  require(w.size() == static_cast<std::size_t>(n_heads) * head_dim * cols,
          "RoPE row permutation: {} values, expected {} heads × {} × {}", w.size(), n_heads,
          head_dim, cols);
  std::vector<float> out(w.size());
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < head_dim; ++i) {
      const std::size_t dst = static_cast<std::size_t>(h) * head_dim + i;
      const std::size_t src = static_cast<std::size_t>(h) * head_dim + src_index(i);
      std::copy_n(w.begin() + src * cols, cols, out.begin() + dst * cols);
    }
  return out;
}

/// A float as the shortest decimal that reads back as the same float.
double json_float(float f) {
  return std::stod(fmt::format("{}", f));
}

}  // namespace

std::vector<float> qk_rows_gguf_to_hf(const std::vector<float>& w, int n_heads, int head_dim,
                                      int cols) {
  const int half = head_dim / 2;
  // HF (h, j) ← GGUF (h, 2j); HF (h, j + D/2) ← GGUF (h, 2j + 1).
  return permute_rows(w, n_heads, head_dim, cols,
                      [half](int i) { return i < half ? 2 * i : 2 * (i - half) + 1; });
}

std::vector<float> qk_rows_hf_to_gguf(const std::vector<float>& w, int n_heads, int head_dim,
                                      int cols) {
  const int half = head_dim / 2;
  // GGUF (h, 2j + b) ← HF (h, j + b·D/2).
  return permute_rows(w, n_heads, head_dim, cols, [half](int i) { return i / 2 + (i % 2) * half; });
}

std::string hf_tensor_name(const std::string& g) {
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  static const std::pair<const char*, const char*> kBlock[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  if (g.rfind("blk.", 0) == 0) {
    const auto dot = g.find('.', 4);
    if (dot != std::string::npos) {
      const std::string layer = g.substr(4, dot - 4), rest = g.substr(dot + 1);
      for (const auto& [from, to] : kBlock)
        if (rest == from) return "model.layers." + layer + "." + to;
    }
  }
  fail("no Hugging Face name for tensor '{}'", g);
}

void write_synth_safetensors(const SynthSpec& spec, const std::string& dir,
                             safetensors::Dtype dtype) {
  namespace fs = std::filesystem;
  using json = nlohmann::json;
  const Config& c = spec.cfg;
  c.validate();
  require(safetensors::is_loadable(dtype),
          "synth: safetensors dtype {} is not supported (F32, F16, BF16)",
          safetensors::to_string(dtype));
  require(gguf::is_supported(spec.type), "synth: tensor type {} is not supported",
          gguf::to_string(spec.type));
  const std::size_t bs = gguf::block_size(spec.type);
  for (int cols : {c.d_model, c.q_dim(), c.d_ff})
    require(cols % static_cast<int>(bs) == 0,
            "synth: row length {} is not a multiple of the {} block size {}", cols,
            gguf::to_string(spec.type), bs);
  fs::create_directories(dir);

  std::vector<safetensors::WriteTensor> out;
  for (const SynthTensor& t : synth_tensors(c)) {
    std::vector<float> v = synth_values(spec.seed, t);
    if (t.matrix && spec.type != gguf::GGMLType::F32) {
      // The values the GGUF twin holds: through spec.type and back.
      std::vector<std::uint8_t> q(gguf::row_bytes(spec.type, t.cols) * t.rows);
      gguf::quantize(spec.type, v.data(), q.data(), v.size());
      gguf::dequantize(spec.type, q.data(), v.data(), v.size());
    }
    const bool is_q =
        t.name.size() > 13 && t.name.compare(t.name.size() - 13, 13, "attn_q.weight") == 0;
    const bool is_k =
        t.name.size() > 13 && t.name.compare(t.name.size() - 13, 13, "attn_k.weight") == 0;
    if (is_q) v = qk_rows_gguf_to_hf(v, c.n_head, c.head_dim, t.cols);
    if (is_k) v = qk_rows_gguf_to_hf(v, c.n_kv_head, c.head_dim, t.cols);
    safetensors::WriteTensor w;
    w.name = hf_tensor_name(t.name);
    w.dtype = dtype;
    if (t.matrix)
      w.shape = {static_cast<std::uint64_t>(t.rows), static_cast<std::uint64_t>(t.cols)};
    else
      w.shape = {static_cast<std::uint64_t>(t.cols)};
    w.bytes = safetensors::encode(dtype, v.data(), v.size());
    out.push_back(std::move(w));
  }
  safetensors::write_file(
      (fs::path(dir) / "model.safetensors").string(), out,
      {{"format", "pt"}, {"source", "sparsim synth, seed " + std::to_string(spec.seed)}});

  json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["_name_or_path"] = c.name.empty() ? "sparsim-synth" : c.name;
  j["hidden_size"] = c.d_model;
  j["intermediate_size"] = c.d_ff;
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.n_kv_head;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.context_length;
  j["rms_norm_eps"] = json_float(c.rms_eps);
  j["rope_theta"] = json_float(c.rope_theta);
  j["vocab_size"] = c.vocab;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["torch_dtype"] = dtype == safetensors::Dtype::F32    ? "float32"
                     : dtype == safetensors::Dtype::BF16 ? "bfloat16"
                                                         : "float16";
  if (spec.with_tokenizer) {
    j["bos_token_id"] = 1;
    j["eos_token_id"] = 2;
  }
  if (spec.rope_freqs || c.rope_scaling.enabled) {
    const RopeScaling& s = c.rope_scaling;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", json_float(s.factor)},
                         {"low_freq_factor", json_float(s.low_freq_factor)},
                         {"high_freq_factor", json_float(s.high_freq_factor)},
                         {"original_max_position_embeddings", s.original_context}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  const std::string cfg = (fs::path(dir) / "config.json").string();
  io::TempFile tmp(cfg);
  {
    std::ofstream f(tmp.path(), std::ios::trunc);
    require(static_cast<bool>(f), "{}: cannot create: {}", tmp.path(), std::strerror(errno));
    f << j.dump(2) << "\n";
    f.close();
    require(static_cast<bool>(f), "{}: write failed", tmp.path());
  }
  tmp.commit();
}

}  // namespace sparsim
