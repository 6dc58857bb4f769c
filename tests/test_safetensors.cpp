// Hugging Face checkpoints: the safetensors reader, config.json, the HF-layout synthetic model
// (same logits as its GGUF twin on every backend), sharding, dispatch and corrupt inputs.
#include "backends.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "helpers.hpp"
#include "model/loader.hpp"
#include "model/safetensors.hpp"
#include "model/synth_hf.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;
using json = nlohmann::json;

std::vector<int> prompt_tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 97 + seed * 31) % (vocab - 3);
  return t;
}

/// max |a − b| / max |b|
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, err = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, double(std::fabs(b[i])));
    err = std::max(err, double(std::fabs(a[i] - b[i])));
  }
  return err / scale;
}

template <class E>
std::vector<float> logits_of(const std::string& path, const std::vector<int>& toks,
                             ModelInfo* info = nullptr, LoadOptions lo = {}) {
  auto w = load_model<E>(path, lo, info);
  Engine<E> eng(w, 1, static_cast<int>(toks.size()) + 4);
  return to_host(eng.forward({toks}, 0, true));
}

/// Expects `f` to throw sparsim::Error whose message holds every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << parts.front() << "'";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "message: " << m;
  }
}

std::string read_text(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_text(const std::string& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

/// Writes a raw safetensors file: the 8-byte length, `header` verbatim, then `data`.
void write_raw(const std::string& p, const std::string& header, std::size_t data_bytes,
               std::uint64_t stated_len = UINT64_MAX) {
  std::string s(8, '\0');
  const std::uint64_t n = stated_len == UINT64_MAX ? header.size() : stated_len;
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  s += header;
  s.append(data_bytes, '\0');
  write_text(p, s);
}

/// Rewrites a safetensors file through `edit` of its tensors.
void rewrite(const std::string& in, const std::string& out,
             const std::function<void(std::vector<st::WriteTensor>&)>& edit) {
  std::vector<st::WriteTensor> ts;
  {
    const st::File f = st::File::open(in);
    for (const auto& t : f.tensors())
      ts.push_back(
          {t.name, t.dtype, t.shape, std::vector<std::uint8_t>(t.data, t.data + t.nbytes())});
  }
  edit(ts);
  st::write_file(out, ts);
}

void edit_config(const std::string& dir, const std::function<void(json&)>& edit) {
  const std::string p = dir + "/config.json";
  json j = json::parse(read_text(p));
  edit(j);
  write_text(p, j.dump(2));
}

// ------------------------------------------------------------------ the same model, two layouts

template <class E>
class SafetensorsEngine : public ::testing::Test {};
TYPED_TEST_SUITE(SafetensorsEngine, Backends, BackendName);

template <class E>
void expect_same_logits(const SynthSpec& spec, const std::string& tag) {
  TempDir dir;
  const std::string gguf_path = make_model(dir, tag + ".gguf", spec);
  const std::string hf_dir = dir.file(tag + "-hf");
  write_synth_safetensors(spec, hf_dir);
  const auto toks = prompt_tokens(14, spec.cfg.vocab, 2);
  ModelInfo gi, hi;
  const auto a = logits_of<E>(gguf_path, toks, &gi);
  const auto b = logits_of<E>(hf_dir, toks, &hi);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LE(rel_diff(b, a), 1e-5) << tag;
  EXPECT_EQ(gi.format, "gguf");
  EXPECT_EQ(hi.format, "safetensors");
  EXPECT_EQ(hi.fingerprint.size(), 16u);
  EXPECT_EQ(hi.tensor_types, std::vector<std::string>{"F32"});
  EXPECT_EQ(hi.file_bytes, fs::file_size(hf_dir + "/model.safetensors"));
}

TYPED_TEST(SafetensorsEngine, GqaTiedMatchesGguf) {
  expect_same_logits<TypeParam>(tiny_spec(11), "gqa_tied");
}

TYPED_TEST(SafetensorsEngine, GqaUntiedLlama3MatchesGguf) {
  SynthSpec s = tiny_spec(12);
  s.cfg.tied_embeddings = false;
  s.cfg.rope_scaling.enabled = true;
  s.cfg.rope_scaling.factor = 8;
  s.cfg.rope_scaling.original_context = 16;
  s.rope_freqs = true;
  expect_same_logits<TypeParam>(s, "gqa_untied_llama3");
}

TYPED_TEST(SafetensorsEngine, MhaUntiedWideHeadsMatchesGguf) {
  SynthSpec s = tiny_spec(13);
  s.cfg.n_kv_head = 4;
  s.cfg.n_head = 4;
  s.cfg.head_dim = 32;  // q_dim 128 ≠ d_model 64
  s.cfg.tied_embeddings = false;
  expect_same_logits<TypeParam>(s, "mha_untied_hd32");
}

TYPED_TEST(SafetensorsEngine, QuantizedTwinHoldsTheSameValues) {
  // A Q8_0 GGUF and the HF directory written from the same spec (values through Q8_0 and back).
  SynthSpec s = tiny_spec(14);
  s.type = gguf::GGMLType::Q8_0;
  expect_same_logits<TypeParam>(s, "q8_0");
}

TYPED_TEST(SafetensorsEngine, SixteenBitFilesLoad) {
  using E = TypeParam;
  TempDir dir;
  const SynthSpec spec = tiny_spec(15);
  const std::string gguf_path = make_model(dir, "m.gguf", spec);
  const auto toks = prompt_tokens(10, spec.cfg.vocab, 3);
  const auto ref = logits_of<E>(gguf_path, toks);
  for (st::Dtype dt : {st::Dtype::BF16, st::Dtype::F16}) {
    const std::string hf = dir.file("hf-" + st::to_string(dt));
    write_synth_safetensors(spec, hf, dt);
    const st::File f = st::File::open(hf + "/model.safetensors");
    for (const auto& t : f.tensors()) EXPECT_EQ(t.dtype, dt) << t.name;
    ModelInfo mi;
    const auto got = logits_of<E>(hf, toks, &mi);
    EXPECT_EQ(mi.tensor_types, std::vector<std::string>{st::to_string(dt)});
    EXPECT_LT(rel_diff(got, ref), dt == st::Dtype::BF16 ? 0.05 : 0.01) << st::to_string(dt);
    // bf16 storage of a bf16 file is exact: the same logits as f32 storage of it.
    if (dt == st::Dtype::BF16) {
      const auto b16 = logits_of<E>(hf, toks, nullptr, LoadOptions{DType::BF16, false});
      EXPECT_LE(rel_diff(b16, got), 1e-5);
    }
  }
}

// ------------------------------------------------------------------ the permutation

TEST(SafetensorsPermutation, PairsMapAsDerived) {
  const int H = 2, D = 8, C = 3;
  std::vector<float> g(H * D * C);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
  const auto hf = qk_rows_gguf_to_hf(g, H, D, C);
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < D / 2; ++j)
      for (int c = 0; c < C; ++c) {
        EXPECT_EQ(hf[((h * D) + j) * C + c], g[((h * D) + 2 * j) * C + c]);
        EXPECT_EQ(hf[((h * D) + j + D / 2) * C + c], g[((h * D) + 2 * j + 1) * C + c]);
      }
  EXPECT_EQ(qk_rows_hf_to_gguf(hf, H, D, C), g);
  EXPECT_EQ(qk_rows_gguf_to_hf(qk_rows_hf_to_gguf(g, H, D, C), H, D, C), g);
}

TEST(SafetensorsPermutation, RotateHalfOfHfRowsEqualsAdjacentRopeOfGgufRows) {
  // One head, x = W·v: rotating GGUF rows as adjacent pairs and HF rows as halves gives the same
  // numbers, moved by the permutation.
  const int D = 8;
  std::vector<float> g(D);
  for (int i = 0; i < D; ++i) g[i] = 0.5f + i;
  const auto hf = qk_rows_gguf_to_hf(g, 1, D, 1);
  const double pos = 3;
  std::vector<double> ga(g.begin(), g.end()), ha(hf.begin(), hf.end());
  for (int j = 0; j < D / 2; ++j) {
    const double a = pos * std::pow(10000.0, -2.0 * j / D);
    const double g0 = ga[2 * j], g1 = ga[2 * j + 1];
    ga[2 * j] = g0 * std::cos(a) - g1 * std::sin(a);
    ga[2 * j + 1] = g0 * std::sin(a) + g1 * std::cos(a);
    const double h0 = ha[j], h1 = ha[j + D / 2];
    ha[j] = h0 * std::cos(a) - h1 * std::sin(a);
    ha[j + D / 2] = h0 * std::sin(a) + h1 * std::cos(a);
  }
  for (int j = 0; j < D / 2; ++j) {
    EXPECT_DOUBLE_EQ(ha[j], ga[2 * j]);
    EXPECT_DOUBLE_EQ(ha[j + D / 2], ga[2 * j + 1]);
  }
}

// ------------------------------------------------------------------ the reader

class SafetensorsReader : public ::testing::Test {
 protected:
  std::string path(const std::string& n) const { return dir_.file(n); }
  TempDir dir_;
};

TEST_F(SafetensorsReader, RoundTripWithMetadata) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1, 0.5f};
  st::write_file(path("x.safetensors"),
                 {{"a", st::Dtype::F32, {2, 3}, st::encode(st::Dtype::F32, a.data(), 6)},
                  {"b", st::Dtype::BF16, {2}, st::encode(st::Dtype::BF16, b.data(), 2)}},
                 {{"format", "pt"}});
  const st::File f = st::File::open(path("x.safetensors"));
  EXPECT_EQ(f.data_offset() % 8, 0u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), 2u);
  const st::TensorInfo* t = f.find_tensor("a");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(t->data, a.data(), 24), 0);
  EXPECT_EQ(f.find_tensor("b")->dtype, st::Dtype::BF16);
  EXPECT_EQ(f.find_tensor("c"), nullptr);
  f.release(*t);
}

TEST_F(SafetensorsReader, AcceptsUnpaddedHeaderAndOtherDtypes) {
  write_raw(path("ok.safetensors"),
            R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
            R"("x":{"dtype":"F16","shape":[],"data_offsets":[16,18]}})",
            18);
  const st::File f = st::File::open(path("ok.safetensors"));
  EXPECT_EQ(f.find_tensor("ids")->dtype, st::Dtype::I64);
  EXPECT_EQ(f.find_tensor("x")->n_elements(), 1u);
}

struct Corrupt {
  const char* tag;
  std::string header;
  std::size_t data;
  std::vector<std::string> expect;
  std::uint64_t stated = UINT64_MAX;
};

TEST_F(SafetensorsReader, CorruptFilesNameTheProblem) {
  const std::string one = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::vector<Corrupt> cases = {
      {"header_past_eof", one, 16, {"header length 1000", "runs past the end"}, 1000},
      {"header_huge",
       one,
       16,
       {"header length 18446744073709551614", "runs past the end"},
       UINT64_MAX - 1},
      {"not_an_object", "[1,2]", 0, {"does not start with '{'"}},
      {"json_string", R"({"w": "F32"})", 0, {"tensor 'w'", "expected an object"}},
      {"bad_json",
       R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})",
       16,
       {"malformed JSON"}},
      {"offsets_past_data", one, 8, {"tensor 'w'", "data_offsets [0, 16]", "past the end"}},
      {"size_mismatch",
       R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})",
       16,
       {"tensor 'w'", "hold 16 bytes", "needs 24"}},
      {"reversed",
       R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})",
       16,
       {"tensor 'w'", "end before they begin"}},
      {"unknown_dtype",
       R"({"w":{"dtype":"Q4","shape":[2,2],"data_offsets":[0,16]}})",
       16,
       {"tensor 'w'", "unknown dtype 'Q4'"}},
      {"duplicate",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8,
       {"duplicate entry 'w'"}},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12,
       {"'a'", "'b'", "overlap"}},
      {"missing_field",
       R"({"w":{"dtype":"F32","shape":[1]}})",
       4,
       {"tensor 'w'", "missing 'data_offsets'"}},
      {"negative_dim",
       R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
       4,
       {"tensor 'w'", "non-negative integer"}},
      {"metadata_not_strings", R"({"__metadata__":{"n":1}})", 0, {"__metadata__", "'n'"}},
  };
  for (const auto& c : cases) {
    const std::string p = path(std::string(c.tag) + ".safetensors");
    write_raw(p, c.header, c.data, c.stated);
    auto parts = c.expect;
    parts.push_back(p);
    SCOPED_TRACE(c.tag);
    expect_error([&] { st::File::open(p); }, parts);
  }
  write_text(path("tiny.safetensors"), "abc");
  expect_error([&] { st::File::open(path("tiny.safetensors")); }, {"too small"});
}

// ------------------------------------------------------------------ model directories

class SafetensorsModel : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = tiny_spec(21);
    spec_.cfg.tied_embeddings = false;
    hf_ = dir_.file("hf");
    write_synth_safetensors(spec_, hf_);
  }
  /// A copy of the model directory to corrupt.
  std::string copy(const std::string& name) const {
    const std::string d = dir_.file(name);
    fs::copy(hf_, d, fs::copy_options::recursive);
    return d;
  }
  TempDir dir_;
  SynthSpec spec_;
  std::string hf_;
};

using Host = Kokkos::DefaultHostExecutionSpace;

TEST_F(SafetensorsModel, ConfigJsonIsReadAsWritten) {
  const Config c = config_from_hf_json(hf_ + "/config.json");
  EXPECT_EQ(c.n_layer, spec_.cfg.n_layer);
  EXPECT_EQ(c.d_model, spec_.cfg.d_model);
  EXPECT_EQ(c.n_head, spec_.cfg.n_head);
  EXPECT_EQ(c.n_kv_head, spec_.cfg.n_kv_head);
  EXPECT_EQ(c.head_dim, spec_.cfg.head_dim);
  EXPECT_EQ(c.d_ff, spec_.cfg.d_ff);
  EXPECT_EQ(c.vocab, spec_.cfg.vocab);
  EXPECT_EQ(c.context_length, spec_.cfg.context_length);
  EXPECT_EQ(c.rms_eps, spec_.cfg.rms_eps);
  EXPECT_EQ(c.rope_theta, spec_.cfg.rope_theta);
  EXPECT_EQ(c.rope_layout, RopeLayout::Half);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.rope_scaling.enabled);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_id, 2);
}

TEST_F(SafetensorsModel, ConfigDefaultsAndVariants) {
  edit_config(hf_, [](json& j) {
    j.erase("head_dim");
    j.erase("num_key_value_heads");
    j["eos_token_id"] = {7, 8};
    j["rope_scaling"] = {{"type", "llama3"},
                         {"factor", 32.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  });
  const Config c = config_from_hf_json(hf_ + "/config.json");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_kv_head, c.n_head);
  EXPECT_EQ(c.eos_id, 7);
  EXPECT_TRUE(c.rope_scaling.enabled);
  EXPECT_EQ(c.rope_scaling.factor, 32.0f);
  EXPECT_EQ(c.rope_scaling.original_context, 64);
  edit_config(hf_, [](json& j) { j["rope_scaling"] = {{"rope_type", "default"}}; });
  EXPECT_FALSE(config_from_hf_json(hf_ + "/config.json").rope_scaling.enabled);
}

TEST_F(SafetensorsModel, EveryPathFormLoadsTheSameWeights) {
  ModelInfo a, b, c;
  load_model<Host>(hf_, LoadOptions{}, &a);
  load_model<Host>(hf_ + "/model.safetensors", LoadOptions{}, &b);
  load_model<Host>(hf_ + "/config.json", LoadOptions{}, &c);
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.fingerprint, c.fingerprint);
  // A safetensors file without the extension is recognised by its header.
  const std::string d = copy("noext");
  fs::rename(d + "/model.safetensors", d + "/weights");
  ModelInfo e;
  load_model<Host>(d + "/weights", LoadOptions{}, &e);
  EXPECT_EQ(e.fingerprint, a.fingerprint);
  EXPECT_EQ(detect_model_format(d + "/weights"), ModelFormat::HfDirectory);
  EXPECT_EQ(detect_model_format(hf_), ModelFormat::HfDirectory);
}

TEST_F(SafetensorsModel, ShardedCheckpointLoads) {
  ModelInfo one;
  load_model<Host>(hf_, LoadOptions{}, &one);
  const std::string d = copy("sharded");
  json index;
  index["metadata"] = {{"total_size", 0}};
  rewrite(d + "/model.safetensors", d + "/model-00001-of-00002.safetensors",
          [&](std::vector<st::WriteTensor>& ts) {
            ts.erase(std::remove_if(ts.begin(), ts.end(),
                                    [](const st::WriteTensor& t) {
                                      return t.name.find("layers.1.") != std::string::npos ||
                                             t.name == "lm_head.weight";
                                    }),
                     ts.end());
            for (const auto& t : ts)
              index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
          });
  rewrite(d + "/model.safetensors", d + "/model-00002-of-00002.safetensors",
          [&](std::vector<st::WriteTensor>& ts) {
            ts.erase(std::remove_if(ts.begin(), ts.end(),
                                    [&](const st::WriteTensor& t) {
                                      return index["weight_map"].contains(t.name);
                                    }),
                     ts.end());
            for (const auto& t : ts)
              index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
          });
  fs::remove(d + "/model.safetensors");
  write_text(d + "/model.safetensors.index.json", index.dump(2));
  ModelInfo sh;
  load_model<Host>(d, LoadOptions{}, &sh);
  EXPECT_EQ(sh.fingerprint, one.fingerprint);
  EXPECT_EQ(sh.file_bytes, fs::file_size(d + "/model-00001-of-00002.safetensors") +
                               fs::file_size(d + "/model-00002-of-00002.safetensors"));
  // An index pointing a tensor to the wrong shard.
  index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors";
  write_text(d + "/model.safetensors.index.json", index.dump(2));
  expect_error([&] { load_model<Host>(d, LoadOptions{}); },
               {"lm_head.weight", "model-00001-of-00002.safetensors", "does not hold it"});
  index["weight_map"]["lm_head.weight"] = "../elsewhere.safetensors";
  write_text(d + "/model.safetensors.index.json", index.dump(2));
  expect_error([&] { load_model<Host>(d, LoadOptions{}); }, {"not a plain file name"});
}

TEST_F(SafetensorsModel, MissingTensor) {
  const std::string d = copy("missing");
  rewrite(d + "/model.safetensors", d + "/model.safetensors", [](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(),
                            [](const st::WriteTensor& t) {
                              return t.name == "model.layers.1.mlp.up_proj.weight";
                            }),
             ts.end());
  });
  expect_error([&] { load_model<Host>(d, LoadOptions{}); },
               {"missing tensor 'model.layers.1.mlp.up_proj.weight'"});
  const std::string e = copy("missing_head");
  rewrite(e + "/model.safetensors", e + "/model.safetensors", [](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(),
                            [](const st::WriteTensor& t) { return t.name == "lm_head.weight"; }),
             ts.end());
  });
  edit_config(e, [](json& j) { j.erase("tie_word_embeddings"); });
  expect_error([&] { load_model<Host>(e, LoadOptions{}); },
               {"missing tensor 'lm_head.weight'", "tie_word_embeddings"});
}

TEST_F(SafetensorsModel, ShapeMismatchAgainstConfig) {
  const std::string d = copy("shape");
  edit_config(d, [](json& j) { j["intermediate_size"] = 96; });
  expect_error([&] { load_model<Host>(d, LoadOptions{}); },
               {"'intermediate_size' = 96", "model.layers.0.mlp.gate_proj.weight",
                "shape [128, 64]", "config.json"});
}

TEST_F(SafetensorsModel, UnsupportedDtypeInModel) {
  const std::string d = copy("dtype");
  rewrite(d + "/model.safetensors", d + "/model.safetensors", [](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.norm.weight") {
        t.dtype = st::Dtype::I32;  // same byte count
      }
  });
  expect_error([&] { load_model<Host>(d, LoadOptions{}); },
               {"model.norm.weight", "dtype I32", "F32, F16, BF16"});
}

TEST_F(SafetensorsModel, ConfigProblems) {
  struct Case {
    const char* tag;
    std::function<void(json&)> edit;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"mistral", [](json& j) { j["model_type"] = "mistral"; }, {"model_type 'mistral'"}},
      {"arch",
       [](json& j) { j["architectures"] = {"GPT2LMHeadModel"}; },
       {"GPT2LMHeadModel", "LlamaForCausalLM"}},
      {"untyped",
       [](json& j) {
         j.erase("model_type");
         j.erase("architectures");
       },
       {"model_type"}},
      {"yarn",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       {"rope_scaling type 'yarn'", "llama3"}},
      {"llama3_incomplete",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"}};
       },
       {"llama3", "factor"}},
      {"missing_key", [](json& j) { j.erase("hidden_size"); }, {"missing key 'hidden_size'"}},
      {"string_number",
       [](json& j) { j["num_hidden_layers"] = "2"; },
       {"num_hidden_layers", "integer"}},
      {"gqa", [](json& j) { j["num_key_value_heads"] = 3; }, {"not a multiple"}},
      {"act", [](json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act 'gelu'"}},
      {"bias", [](json& j) { j["attention_bias"] = true; }, {"attention_bias"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.tag);
    const std::string d = copy(c.tag);
    edit_config(d, c.edit);
    auto parts = c.expect;
    parts.push_back("config.json");
    expect_error([&] { load_model<Host>(d, LoadOptions{}); }, parts);
  }
  const std::string d = copy("badjson");
  write_text(d + "/config.json", "{\"model_type\": \"llama\",");
  expect_error([&] { load_model<Host>(d, LoadOptions{}); }, {"config.json", "malformed JSON"});
}

TEST_F(SafetensorsModel, MissingPiecesAndUnknownFormats) {
  const std::string d = copy("nocfg");
  fs::remove(d + "/config.json");
  expect_error([&] { load_model<Host>(d, LoadOptions{}); }, {"no config.json"});
  const std::string e = copy("noweights");
  fs::remove(e + "/model.safetensors");
  expect_error([&] { load_model<Host>(e, LoadOptions{}); },
               {"model.safetensors", "model.safetensors.index.json"});
  const std::string t = copy("truncated");
  fs::resize_file(t + "/model.safetensors", fs::file_size(t + "/model.safetensors") - 100);
  expect_error([&] { load_model<Host>(t, LoadOptions{}); }, {"model.safetensors", "past the end"});
  write_text(dir_.file("model.bin"), "PK\x03\x04 not a model");
  expect_error([&] { load_model<Host>(dir_.file("model.bin"), LoadOptions{}); },
               {"model.bin", "unrecognised model file format", "50 4b 03 04"});
  write_text(dir_.file("empty.bin"), "");
  expect_error([&] { load_model<Host>(dir_.file("empty.bin"), LoadOptions{}); },
               {"unrecognised", "empty"});
  expect_error([&] { load_model<Host>(dir_.file("nope"), LoadOptions{}); }, {"does not exist"});
}

// ------------------------------------------------------------------ command line

TEST(SafetensorsCli, SynthHfDirectoryRunsLikeItsGgufTwin) {
  TempDir dir;
  const std::string bin = sparsim_bin();
  const std::string g = dir.file("m.gguf"), h = dir.file("m-hf");
  auto r = run_cmd(bin + " synth --seed 5 --untied --llama3-rope -o " + g);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(bin + " synth --seed 5 --untied --llama3-rope --format hf -o " + h);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(h + "/config.json"));
  EXPECT_TRUE(fs::exists(h + "/model.safetensors"));
  const auto a = run_cmd(bin + " forward --model " + g + " --tokens 5,9,300 --greedy 6");
  const auto b = run_cmd(bin + " forward --model " + h + " --tokens 5,9,300 --greedy 6");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  auto greedy = [](const std::string& out) {
    const auto p = out.find("greedy tokens:");
    return p == std::string::npos ? std::string() : out.substr(p, out.find('\n', p) - p);
  };
  EXPECT_FALSE(greedy(a.output).empty()) << a.output;
  EXPECT_EQ(greedy(a.output), greedy(b.output));
  r = run_cmd(bin + " synth --format hf --type q4_0 -o " + dir.file("q"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--format hf"), std::string::npos) << r.output;
  r = run_cmd(bin + " synth --format onnx -o " + dir.file("x"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("onnx"), std::string::npos) << r.output;
}

// The NumPy transformers-semantics reference (rotate_half RoPE, Llama-3 scaling) on the HF
// directory agrees with sparsim's run file. Needs a Python with numpy and h5py: SPARSIM_PYTHON,
// or the environment scripts/setup.sh creates.
TEST(SafetensorsCli, NumpyHfReferenceAgrees) {
  std::string py;
  if (const char* e = std::getenv("SPARSIM_PYTHON")) py = e;
  if (py.empty()) {
    const char* home = std::getenv("HOME");
    const std::string v = std::string(home ? home : "") + "/.cache/sparsim-deps/venv/bin/python";
    if (fs::exists(v)) py = v;
  }
  if (py.empty() || run_cmd(py + " -c 'import numpy, h5py'").exit_code != 0)
    GTEST_SKIP() << "set SPARSIM_PYTHON to a Python with numpy and h5py (scripts/setup.sh)";
  TempDir dir;
  const std::string bin = sparsim_bin(), h = dir.file("hf"), run = dir.file("run.h5");
  auto r = run_cmd(bin + " synth --seed 8 --untied --llama3-rope --format hf -o " + h);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(bin + " forward --model " + h + " --tokens 5,9,300,17,42,77,100 --greedy 5 -o " +
              run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_cmd(py + " " SPARSIM_SOURCE_DIR "/scripts/reference/hf_reference.py --model " + h +
              " --compare " + run + " --tol 1e-4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace sparsim::test
