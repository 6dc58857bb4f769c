// Writes a small seed corpus for fuzz_gguf into the directory given as argv[1]: valid GGUF files
// covering every metadata value type, every supported tensor type, both format versions and a
// non-default alignment, and small complete Llama models (with a tokenizer) that the loader
// accepts, so that mutations reach the consistency checks and the tokenizer.
#include "core/error.hpp"
#include "model/gguf_writer.hpp"
#include "model/quant.hpp"
#include "model/synth.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

using namespace sparsim::gguf;

namespace {

std::vector<std::uint8_t> quantized(GGMLType t, std::size_t n, float phase) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = static_cast<float>((i * 37 + 11) % 97) / 48.0f - 1.0f + phase;
  std::vector<std::uint8_t> q(row_bytes(t, n));
  quantize(t, x.data(), q.data(), n);
  return q;
}

void metadata(Writer& w) {
  w.set("general.architecture", "llama");
  w.set("seed.u8", std::uint8_t{200});
  w.set("seed.i8", std::int8_t{-5});
  w.set("seed.u16", std::uint16_t{60000});
  w.set("seed.i16", std::int16_t{-30000});
  w.set("seed.u32", std::uint32_t{4000000000u});
  w.set("seed.i32", std::int32_t{-2000000000});
  w.set("seed.u64", std::uint64_t{1} << 40);
  w.set("seed.i64", -(std::int64_t{1} << 40));
  w.set("seed.f32", 1.5f);
  w.set("seed.f64", -2.25);
  w.set("seed.bool", true);
  w.set("seed.strings", std::vector<std::string>{"a", "bc", ""});
  w.set("seed.floats", std::vector<float>{0.5f, -1.0f});
  w.set("seed.ints", std::vector<std::int32_t>{1, -2, 3});
  w.set("seed.bools", std::vector<bool>{true, false});
  w.set("seed.nested",
        Value::array_of_arrays({Value::array_u8({1, 2}), Value::string_array({"x"})}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    const GGMLType types[] = {GGMLType::F32,  GGMLType::F16,  GGMLType::BF16, GGMLType::Q8_0,
                              GGMLType::Q4_0, GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1,
                              GGMLType::Q4_K, GGMLType::Q6_K};
    int k = 0;
    for (GGMLType t : types) {
      Writer w;
      w.set("general.architecture", "llama");
      const std::size_t n = block_size(t) == 1 ? 8 : block_size(t);
      w.add_tensor("a", {n, 2}, t, quantized(t, 2 * n, 0.0f));
      w.add_tensor("b", {n}, t, quantized(t, n, 0.25f));
      w.write(dir + "/seed_" + std::to_string(k++) + "_" + to_string(t) + ".gguf");
    }
    {
      Writer w;
      metadata(w);
      w.add_tensor("w", {32, 2}, GGMLType::Q8_0, quantized(GGMLType::Q8_0, 64, 0.1f));
      w.write(dir + "/seed_metadata.gguf");
    }
    {
      Writer w;
      w.set_alignment(64);
      metadata(w);
      w.add_tensor("x", {4, 3}, GGMLType::F32, quantized(GGMLType::F32, 12, 0.0f));
      w.add_tensor("y", {8, 1, 1, 2}, GGMLType::F16, quantized(GGMLType::F16, 16, 0.0f));
      w.write(dir + "/seed_align64.gguf");
    }
    {
      // Version 2 has the same layout as version 3: patch the version field of a v3 file.
      Writer w;
      metadata(w);
      w.add_tensor("v2", {32}, GGMLType::Q4_0, quantized(GGMLType::Q4_0, 32, 0.0f));
      const std::string p = dir + "/seed_v2.gguf";
      w.write(p);
      std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(4);
      const char v2[4] = {2, 0, 0, 0};
      f.write(v2, 4);
    }
    {
      Writer w;
      w.write(dir + "/seed_empty.gguf");
    }
    // Llama models small enough for the fuzzer: 2 blocks, width 32, 2 query heads, 1 KV head.
    for (const auto& [t, untied, seed] :
         {std::tuple{GGMLType::F32, false, 1}, std::tuple{GGMLType::Q8_0, true, 2},
          std::tuple{GGMLType::Q4_0, false, 3}}) {
      sparsim::SynthSpec sp;
      sparsim::Config& c = sp.cfg;
      c.name = "fuzz";
      c.n_layer = 2;
      c.d_model = 32;
      c.n_head = 2;
      c.n_kv_head = 1;
      c.head_dim = c.d_model / 2;
      c.d_ff = 64;
      c.vocab = 272;
      c.context_length = 64;
      c.tied_embeddings = !untied;
      sp.type = t;
      sp.seed = static_cast<std::uint64_t>(seed);
      sparsim::write_synth_gguf(sp, dir + "/seed_llama_" + to_string(t) + ".gguf");
    }
  } catch (const sparsim::Error& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
