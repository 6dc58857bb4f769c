#pragma once
// Shared test utilities: temporary directories, synthetic models, running the CLI.
#include "core/types.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/synth.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace sparsim::test {

/// A fresh directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "t";
    for (auto& ch : name)
      if (ch == '/') ch = '_';
    path_ = std::filesystem::temp_directory_path() /
            ("sparsim-test-" + std::to_string(::getpid()) + "-" + name);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// The tiny model shape used across tests (GQA 4:2, vocab with tokenizer).
inline Config tiny_config() {
  Config c;
  c.name = "tiny";
  c.n_layer = 2;
  c.d_model = 64;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.head_dim = 16;
  c.d_ff = 128;
  c.vocab = 512;
  c.context_length = 256;
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-5f;
  c.tied_embeddings = true;
  return c;
}

/// Writes a tiny synthetic model and returns its path.
inline std::string make_model(const TempDir& dir, const std::string& name, SynthSpec spec) {
  const std::string p = dir.file(name);
  write_synth_gguf(spec, p);
  return p;
}

inline SynthSpec tiny_spec(std::uint64_t seed = 7) {
  SynthSpec s;
  s.cfg = tiny_config();
  s.seed = seed;
  return s;
}

/// Writes generated text to `path`: `words` words over a–z (1–7 letters), a sentence ending
/// every `sentence` words. A corpus for calibration and perplexity tests.
inline void write_word_corpus(const std::string& path, std::uint64_t seed, int words = 6000,
                              int sentence = 11) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  SynthRng r(seed);
  for (int i = 0; i < words; ++i) {
    const int len = 1 + static_cast<int>(r.next() % 7);
    for (int k = 0; k < len; ++k) std::fputc('a' + static_cast<int>(r.next() % 26), f);
    std::fputs(i % sentence == sentence - 1 ? ".\n" : " ", f);
  }
  std::fclose(f);
}

/// Result of running a command line through the shell.
struct RunResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr together
};

inline RunResult run_cmd(const std::string& cmd) {
  RunResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// One tensor of a GGUF file, copied out so that a test can change it.
struct TensorCopy {
  std::string name;
  std::vector<std::uint64_t> ne;
  gguf::GGMLType type;
  std::vector<std::uint8_t> data;
};

/// Copies a GGUF file, letting `edit` change its metadata and tensors on the way.
inline void rewrite_gguf(
    const std::string& src, const std::string& dst,
    const std::function<void(std::vector<gguf::KeyValue>&, std::vector<TensorCopy>&)>& edit) {
  gguf::File f = gguf::File::open(src);
  std::vector<gguf::KeyValue> kv = f.metadata();
  std::vector<TensorCopy> ts;
  for (const auto& t : f.tensors())
    ts.push_back({t.name, t.ne, t.type, std::vector<std::uint8_t>(t.data, t.data + t.nbytes)});
  edit(kv, ts);
  gguf::Writer w;
  for (auto& k : kv) w.set(k.key, k.value);
  for (auto& t : ts) w.add_tensor(t.name, t.ne, t.type, std::move(t.data));
  w.write(dst);
}

/// Sets (or adds) an unsigned metadata key of a GGUF file being rewritten.
inline void set_u32(std::vector<gguf::KeyValue>& kv, const std::string& key, std::uint32_t v) {
  for (auto& k : kv)
    if (k.key == key) {
      k.value = gguf::Value::u32(v);
      return;
    }
  kv.push_back({key, gguf::Value::u32(v)});
}

/// The sparsim binary built alongside the tests.
inline std::string sparsim_bin() {
  return SPARSIM_BINARY;
}

/// The fp32 value that storing v as T (float, bf16_t, f16_t) keeps.
template <class T>
float stored(float v) {
  return to_f32(from_f32<T>(v));
}

inline std::vector<float> random_vec(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  SynthRng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.normal()) * scale;
  return v;
}

}  // namespace sparsim::test
