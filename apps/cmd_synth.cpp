// sparsim synth: a seeded random Llama model in a GGUF file.
#include "common.hpp"
#include "io/run_guard.hpp"
#include "model/synth.hpp"
#include "model/synth_hf.hpp"

#include <filesystem>
#include <iostream>

namespace sparsim::app {

namespace {
gguf::GGMLType parse_ggml_type(const std::string& s) {
  const std::optional<gguf::GGMLType> t = gguf::supported_type_named(s);
  require(t.has_value(),
          "--type '{}' is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k)",
          s);
  return *t;
}
}  // namespace

int cmd_synth(int argc, char** argv) {
  SynthSpec s;
  Config& c = s.cfg;
  std::string out, type, preset, format;
  bool untied = false, llama3 = false;
  po::options_description d("sparsim synth options");
  d.add_options()("out,o", po::value(&out)->required(),
                  "output GGUF path (written atomically), or the directory with --format hf")(
      "format", po::value(&format)->default_value("gguf"),
      "gguf, or hf: a Hugging Face directory (config.json + model.safetensors) holding the "
      "same model; --type then is the safetensors dtype (f32, bf16 or f16)")(
      "preset", po::value(&preset)->default_value("tiny"),
      "starting shape: tiny (2 layers, d 64), smollm2-135m or llama2-7b (32 layers, d 4096, MHA, "
      "untied); options below override it")("layers", po::value<int>(), "transformer blocks")(
      "d-model", po::value<int>(), "hidden size")("heads", po::value<int>(), "query heads")(
      "kv-heads", po::value<int>(), "key/value heads")("head-dim", po::value<int>(),
                                                       "head dimension (default d-model / heads)")(
      "ff", po::value<int>(), "SwiGLU inner size")("vocab", po::value<int>(),
                                                   "vocabulary size (>= 259 with the tokenizer)")(
      "context", po::value<int>(), "context length")("rope-theta", po::value<float>(), "RoPE base")(
      "rms-eps", po::value<float>(), "RMSNorm epsilon")(
      "untied", po::bool_switch(&untied), "write a separate output.weight (default: tied)")(
      "llama3-rope", po::bool_switch(&llama3),
      "write Llama-3 rope scaling as rope_freqs.weight (factor 8, low 1, high 4, original 64)")(
      "type", po::value(&type)->default_value("f32"),
      "type of the 2-D tensors: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q6_k")(
      "seed", po::value(&s.seed)->default_value(1), "random seed");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: sparsim synth --out FILE [shape options]", d, vm)) return 0;
  if (preset == "tiny") {
    c.n_layer = 2;
    c.d_model = 64;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_ff = 128;
    c.vocab = 512;
    c.context_length = 256;
  } else if (preset == "smollm2-135m") {
    c.n_layer = 30;
    c.d_model = 576;
    c.n_head = 9;
    c.n_kv_head = 3;
    c.d_ff = 1536;
    c.vocab = 49152;
    c.context_length = 8192;
    c.rope_theta = 100000.0f;
  } else if (preset == "llama2-7b") {
    c.n_layer = 32;
    c.d_model = 4096;
    c.n_head = 32;
    c.n_kv_head = 32;
    c.d_ff = 11008;
    c.vocab = 32000;
    c.context_length = 4096;
    c.rope_theta = 10000.0f;
    untied = true;
  } else {
    fail("--preset '{}' is unknown (tiny, smollm2-135m, llama2-7b)", preset);
  }
  if (vm.count("layers")) c.n_layer = vm["layers"].as<int>();
  if (vm.count("d-model")) c.d_model = vm["d-model"].as<int>();
  if (vm.count("heads")) c.n_head = vm["heads"].as<int>();
  if (vm.count("kv-heads")) c.n_kv_head = vm["kv-heads"].as<int>();
  if (vm.count("ff")) c.d_ff = vm["ff"].as<int>();
  if (vm.count("vocab")) c.vocab = vm["vocab"].as<int>();
  if (vm.count("context")) c.context_length = vm["context"].as<int>();
  if (vm.count("rope-theta")) c.rope_theta = vm["rope-theta"].as<float>();
  if (vm.count("rms-eps")) c.rms_eps = vm["rms-eps"].as<float>();
  require(c.n_head > 0, "--heads must be positive");
  c.head_dim = vm.count("head-dim") ? vm["head-dim"].as<int>() : c.d_model / c.n_head;
  c.tied_embeddings = !untied;
  if (llama3) {
    c.rope_scaling.enabled = true;
    c.rope_scaling.factor = 8.0f;
    c.rope_scaling.low_freq_factor = 1.0f;
    c.rope_scaling.high_freq_factor = 4.0f;
    c.rope_scaling.original_context = 64;
    s.rope_freqs = true;
  }
  s.type = parse_ggml_type(type);
  require(format == "gguf" || format == "hf", "--format '{}' is unknown (gguf, hf)", format);
  io::guard_run({}, {{"--out", out, format == "hf"}});
  c.name = "sparsim-synth-" + preset;
  if (format == "hf") {
    using D = safetensors::Dtype;
    D dt = D::F32;
    if (s.type == gguf::GGMLType::BF16)
      dt = D::BF16;
    else if (s.type == gguf::GGMLType::F16)
      dt = D::F16;
    else
      require(s.type == gguf::GGMLType::F32,
              "--type '{}' cannot be written with --format hf (f32, bf16, f16)", type);
    s.type = gguf::GGMLType::F32;
    // A folder this run creates is removed again if the run stops before filling it (an
    // interruption or an error): the files in it are published one by one, by rename.
    namespace fs = std::filesystem;
    const bool made = !fs::exists(out);
    try {
      write_synth_safetensors(s, out, dt);
    } catch (...) {
      std::error_code ec;
      if (made && fs::is_empty(out, ec)) fs::remove(out, ec);
      throw;
    }
  } else {
    require(format == "gguf", "--format '{}' is unknown (gguf, hf)", format);
    write_synth_gguf(s, out);
  }
  std::cout << fmt::format(
      "wrote {} ({} parameters, {} layers, d {}, vocab {}, type {}, seed {})\n", out, c.n_params(),
      c.n_layer, c.d_model, c.vocab, type, s.seed);
  return 0;
}

}  // namespace sparsim::app
