// libFuzzer target for the host-only part of the model loader: every input is written to an
// in-memory file and goes through what `sparsim eval` does with a GGUF file before the weights
// reach the device: the reader (header, metadata, tensor table), the consistency checks of the
// hyper-parameters against the tensors (config_from_gguf), the dequantization of every tensor,
// and the tokenizer built from the metadata.
//
// The only acceptable outcome for a malformed input is a sparsim::Error; anything else (a crash,
// a sanitizer report, another exception type, a hang or runaway allocation) is a bug. One more
// oracle: when config_from_gguf accepts a file, every tensor the loader then looks up must be
// there with the shape it expects (the checks must leave nothing for the loader to trip on).
#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/gguf_config.hpp"
#include "model/quant.hpp"
#include "model/tokenizer.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

int memfd() {
  static const int fd = [] {
    const int f = ::memfd_create("fuzz_gguf", MFD_CLOEXEC);
    if (f < 0) std::abort();
    return f;
  }();
  return fd;
}

void walk_value(const sparsim::gguf::Value& v, int depth) {
  (void)v.describe();
  if (v.type() != sparsim::gguf::ValueType::ARRAY) return;
  const std::size_t n = std::min<std::size_t>(v.array_size(), 16);
  for (std::size_t i = 0; i < n; ++i) walk_value(v.array_element(i), depth + 1);
}

template <class F>
void tolerate(F&& f) {
  try {
    f();
  } catch (const sparsim::Error&) {
  }
}

void walk(const sparsim::gguf::File& f) {
  using namespace sparsim::gguf;
  for (const auto& kv : f.metadata()) {
    walk_value(kv.value, 0);
    const std::string& k = kv.key;
    tolerate([&] { (void)f.get_uint(k); });
    tolerate([&] { (void)f.get_int(k); });
    tolerate([&] { (void)f.get_float(k); });
    tolerate([&] { (void)f.get_string(k); });
    tolerate([&] { (void)f.get_bool(k); });
    tolerate([&] { (void)f.get_string_array(k); });
    tolerate([&] { (void)f.get_float_array(k); });
    tolerate([&] { (void)f.get_int_array(k); });
  }
  std::vector<float> buf;
  for (const auto& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) std::abort();
    if (t.data == nullptr || t.nbytes == 0) std::abort();
    if (!is_supported(t.type)) continue;
    // The first rows, at most 64 Ki elements (always whole rows, so whole blocks).
    const std::uint64_t row = t.ne[0];
    if (row > (1u << 16)) continue;
    const std::uint64_t rows =
        std::max<std::uint64_t>(1, std::min<std::uint64_t>(t.n_rows(), (1u << 16) / row));
    const std::uint64_t n = row * rows;
    buf.resize(n);
    dequantize(t.type, t.data, buf.data(), n);
    // Dropping the pages and reading them again must give the same bytes.
    const float first = buf[0];
    f.release(t);
    dequantize(t.type, t.data, buf.data(), t.ne[0]);
    if (!(buf[0] == first) && !(first != first)) std::abort();
  }
}

/// What load_gguf looks up, with the shapes it requires (innermost first, as GGUF lists them).
void check_loader_view(const sparsim::gguf::File& f, const sparsim::Config& c) {
  using U = std::uint64_t;
  auto need = [&](const std::string& name, std::vector<U> ne) {
    const sparsim::gguf::TensorInfo* t = f.find_tensor(name);
    if (t == nullptr || t->ne != ne) std::abort();  // accepted, but the loader would fail
  };
  if (c.n_layer <= 0 || c.d_model <= 0 || c.n_head <= 0 || c.n_kv_head <= 0 || c.head_dim <= 0 ||
      c.d_ff <= 0 || c.vocab <= 0)
    std::abort();
  const U d = static_cast<U>(c.d_model), q = static_cast<U>(c.q_dim()),
          kv = static_cast<U>(c.kv_dim()), ff = static_cast<U>(c.d_ff), v = static_cast<U>(c.vocab);
  need("token_embd.weight", {d, v});
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    need(p + "attn_norm.weight", {d});
    need(p + "attn_q.weight", {d, q});
    need(p + "attn_k.weight", {d, kv});
    need(p + "attn_v.weight", {d, kv});
    need(p + "attn_output.weight", {q, d});
    need(p + "ffn_norm.weight", {d});
    need(p + "ffn_gate.weight", {d, ff});
    need(p + "ffn_up.weight", {d, ff});
    need(p + "ffn_down.weight", {ff, d});
  }
  need("output_norm.weight", {d});
  if (!c.tied_embeddings) need("output.weight", {d, v});
}

void load_like_eval(const sparsim::gguf::File& f) {
  tolerate([&] { (void)sparsim::check_gguf_model(f); });
  tolerate([&] { check_loader_view(f, sparsim::config_from_gguf(f)); });
  tolerate([&] {
    const sparsim::Tokenizer tok = sparsim::Tokenizer::from_gguf(f);
    const std::vector<int> ids = tok.encode("The quick brown fox, 12 <s> caf\xc3\xa9!", true);
    for (int id : ids)
      if (id < 0 || id >= tok.vocab_size()) std::abort();
    (void)tok.decode(ids);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = memfd();
  if (::ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    sparsim::gguf::File f = sparsim::gguf::File::open(path);
    load_like_eval(f);
    walk(f);
    sparsim::gguf::File moved = std::move(f);  // moving must keep tensor pointers valid
    walk(moved);
  } catch (const sparsim::Error&) {
  }
  return 0;
}
