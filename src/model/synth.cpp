#include "model/synth.hpp"

#include "core/blas_core.hpp"
#include "core/error.hpp"
#include "model/gguf_writer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace sparsim {

std::uint64_t SynthRng::next() {  // splitmix64
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double SynthRng::uniform() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

double SynthRng::normal() {
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

namespace {

std::uint64_t stream_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a of the tensor name
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return seed * 0x9e3779b97f4a7c15ULL ^ h;
}

}  // namespace

std::vector<SynthTensor> synth_tensors(const Config& c) {
  std::vector<SynthTensor> v;
  auto add = [&](const std::string& name, int rows, int cols, double stddev, double mean,
                 bool matrix) {
    v.push_back(SynthTensor{name, rows, cols, stddev, mean, matrix});
  };
  const int d = c.d_model;
  add("token_embd.weight", c.vocab, d, 1.0, 0.0, true);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", 1, d, 0.1, 1.0, false);
    add(p + "attn_q.weight", c.q_dim(), d, 1.0 / std::sqrt(d), 0.0, true);
    add(p + "attn_k.weight", c.kv_dim(), d, 1.0 / std::sqrt(d), 0.0, true);
    add(p + "attn_v.weight", c.kv_dim(), d, 1.0 / std::sqrt(d), 0.0, true);
    add(p + "attn_output.weight", d, c.q_dim(), 1.0 / std::sqrt(c.q_dim()), 0.0, true);
    add(p + "ffn_norm.weight", 1, d, 0.1, 1.0, false);
    add(p + "ffn_gate.weight", c.d_ff, d, 1.0 / std::sqrt(d), 0.0, true);
    add(p + "ffn_up.weight", c.d_ff, d, 1.0 / std::sqrt(d), 0.0, true);
    add(p + "ffn_down.weight", d, c.d_ff, 1.0 / std::sqrt(c.d_ff), 0.0, true);
  }
  add("output_norm.weight", 1, d, 0.1, 1.0, false);
  if (!c.tied_embeddings) add("output.weight", c.vocab, d, 1.0 / std::sqrt(d), 0.0, true);
  return v;
}

std::vector<float> synth_values(std::uint64_t seed, const SynthTensor& t) {
  const std::uint64_t s0 = stream_seed(seed, t.name);
  const std::size_t n = static_cast<std::size_t>(t.rows) * t.cols;
  std::vector<float> v(n);
  // Value i takes draws 2i and 2i+1 of the stream (unless an earlier draw was rejected, which
  // happens with probability 2^-53 per value), and draw k starts from s0 + k·step: chunks are
  // generated in parallel from their own start; a chunk that ends elsewhere than expected saw
  // a rejection, and then the whole stream is generated in order.
  constexpr std::uint64_t kStep = 0x9e3779b97f4a7c15ULL;
  constexpr std::size_t kChunk = std::size_t(1) << 16;
  const long long chunks = static_cast<long long>((n + kChunk - 1) / kChunk);
  int regular = 1;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) num_threads(host_threads()) reduction(&& : regular)
#endif
  for (long long c = 0; c < chunks; ++c) {
    const std::size_t i0 = static_cast<std::size_t>(c) * kChunk;
    const std::size_t i1 = std::min(n, i0 + kChunk);
    SynthRng rng(s0 + 2 * static_cast<std::uint64_t>(i0) * kStep);
    for (std::size_t i = i0; i < i1; ++i)
      v[i] = static_cast<float>(t.mean + t.stddev * rng.normal());
    regular = regular && rng.state == s0 + 2 * static_cast<std::uint64_t>(i1) * kStep;
  }
  if (!regular) {
    SynthRng rng(s0);
    for (auto& x : v) x = static_cast<float>(t.mean + t.stddev * rng.normal());
  }
  return v;
}

void write_synth_gguf(const SynthSpec& spec, const std::string& path) {
  const Config& c = spec.cfg;
  c.validate();
  using gguf::GGMLType;
  using gguf::Value;
  const std::size_t bs = gguf::block_size(spec.type);
  auto check_cols = [&](int cols, const char* what) {
    require(cols % static_cast<int>(bs) == 0,
            "synth: {} = {} is not a multiple of the {} block size {}", what, cols,
            gguf::to_string(spec.type), bs);
  };
  require(gguf::is_supported(spec.type), "synth: tensor type {} is not supported",
          gguf::to_string(spec.type));
  check_cols(c.d_model, "d_model");
  check_cols(c.q_dim(), "n_head*head_dim");
  check_cols(c.d_ff, "d_ff");

  gguf::Writer w;
  const std::string a = "llama.";
  w.set("general.architecture", Value::string("llama"));
  w.set("general.name", Value::string(c.name.empty() ? "sparsim-synth" : c.name));
  w.set("general.description",
        Value::string("random weights from sparsim synth, seed " + std::to_string(spec.seed)));
  w.set(a + "context_length", Value::u32(c.context_length));
  w.set(a + "embedding_length", Value::u32(c.d_model));
  w.set(a + "block_count", Value::u32(c.n_layer));
  w.set(a + "feed_forward_length", Value::u32(c.d_ff));
  w.set(a + "attention.head_count", Value::u32(c.n_head));
  w.set(a + "attention.head_count_kv", Value::u32(c.n_kv_head));
  w.set(a + "attention.key_length", Value::u32(c.head_dim));
  w.set(a + "attention.value_length", Value::u32(c.head_dim));
  w.set(a + "rope.dimension_count", Value::u32(c.head_dim));
  w.set(a + "rope.freq_base", Value::f32(c.rope_theta));
  w.set(a + "attention.layer_norm_rms_epsilon", Value::f32(c.rms_eps));
  w.set(a + "vocab_size", Value::u32(c.vocab));

  if (spec.with_tokenizer) {
    require(c.vocab >= 259, "synth: a tokenizer needs a vocabulary of at least 259, got {}",
            c.vocab);
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<std::int32_t> types;
    tokens = {"<unk>", "<s>", "</s>"};
    types = {2, 3, 3};
    scores = {0.0f, 0.0f, 0.0f};
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(fmt::format("<0x{:02X}>", b));
      types.push_back(6);
      scores.push_back(0.0f);
    }
    // Word pieces: "▁" + a base-26 spelling of the index; unique, ordered by score.
    for (int i = 0; static_cast<int>(tokens.size()) < c.vocab; ++i) {
      std::string piece = (i % 2 == 0) ? "\xE2\x96\x81" : "";
      int k = i / 2;
      do {
        piece += static_cast<char>('a' + k % 26);
        k /= 26;
      } while (k > 0);
      tokens.push_back(piece);
      types.push_back(1);
      scores.push_back(-static_cast<float>(i + 1));
    }
    w.set("tokenizer.ggml.model", Value::string("llama"));
    w.set("tokenizer.ggml.tokens", Value::string_array(tokens));
    w.set("tokenizer.ggml.scores", Value::array_f32(scores));
    w.set("tokenizer.ggml.token_type", Value::array_i32(types));
    w.set("tokenizer.ggml.bos_token_id", Value::u32(1));
    w.set("tokenizer.ggml.eos_token_id", Value::u32(2));
    w.set("tokenizer.ggml.unknown_token_id", Value::u32(0));
    w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
  }

  for (const SynthTensor& t : synth_tensors(c)) {
    std::vector<float> v = synth_values(spec.seed, t);
    const GGMLType tt = t.matrix ? spec.type : GGMLType::F32;
    const std::size_t rb = gguf::row_bytes(tt, t.cols);
    std::vector<std::uint8_t> bytes(rb * t.rows);
    // rows are independent blocks: converted in parallel, the same bytes
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) num_threads(host_threads())
#endif
    for (int r = 0; r < t.rows; ++r)
      gguf::quantize(tt, v.data() + static_cast<std::size_t>(r) * t.cols, bytes.data() + r * rb,
                     static_cast<std::size_t>(t.cols));
    std::vector<std::uint64_t> ne = {static_cast<std::uint64_t>(t.cols)};
    if (t.matrix) ne.push_back(static_cast<std::uint64_t>(t.rows));
    w.add_tensor(t.name, ne, tt, std::move(bytes));
  }
  if (spec.rope_freqs) {
    // Llama-3 scaling expressed as per-frequency divisors, the way GGUF files carry it.
    Config plain = c;
    plain.rope_scaling.enabled = false;
    Config scaled = c;
    scaled.rope_scaling.enabled = true;
    const auto f0 = plain.rope_inv_freq(), f1 = scaled.rope_inv_freq();
    std::vector<float> div(f0.size());
    for (std::size_t j = 0; j < f0.size(); ++j) div[j] = static_cast<float>(f0[j] / f1[j]);
    std::vector<std::uint8_t> bytes(div.size() * 4);
    std::memcpy(bytes.data(), div.data(), bytes.size());
    w.add_tensor("rope_freqs.weight", {div.size()}, GGMLType::F32, std::move(bytes));
  }
  w.write(path);
}

}  // namespace sparsim
