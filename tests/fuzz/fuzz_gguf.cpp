// libFuzzer target for the GGUF reader: every input is written to an in-memory file and opened.
// The only acceptable outcome for a malformed input is a sparsim::Error; anything else (a crash,
// a sanitizer report, another exception type, a hang or runaway allocation) is a bug.
#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/quant.hpp"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = memfd();
  if (::ftruncate(fd, 0) != 0) std::abort();
  if (size > 0 && ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    sparsim::gguf::File f = sparsim::gguf::File::open(path);
    walk(f);
    sparsim::gguf::File moved = std::move(f);  // moving must keep tensor pointers valid
    walk(moved);
  } catch (const sparsim::Error&) {
  }
  return 0;
}
