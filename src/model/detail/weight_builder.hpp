#pragma once
/// Internals of the model loaders (GGUF, safetensors): streaming a file tensor into device
/// weights chunk by chunk, counting NaN/Inf, and fingerprinting what was read. Not public API.
#include "core/error.hpp"
#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "model/loader.hpp"
#include "model/quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace sparsim::detail {

/// A 64-bit streaming hash (multiply-xorshift over 8-byte words); identifies tensor data.
struct Hasher {
  std::uint64_t h = 0x9e3779b97f4a7c15ULL;
  void mix(std::uint64_t w) {
    h ^= w + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
  }
  void bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, c + i, 8);
      mix(w);
    }
    std::uint64_t tail = 0;
    std::memcpy(&tail, c + i, n - i);
    mix(tail ^ (static_cast<std::uint64_t>(n) << 56));
  }
  std::string hex() const { return fmt::format("{:016x}", h); }
};

/// One tensor of a model file, as the builder streams it: `rows` rows of `cols` contiguous
/// elements in the byte encoding of a ggml type (F32/F16/BF16 cover safetensors as well).
struct RawTensor {
  std::string file;                      ///< for messages
  std::string name;                      ///< as in the file
  std::vector<std::uint64_t> hash_dims;  ///< the shape as the file states it
  gguf::GGMLType type = gguf::GGMLType::F32;
  const std::uint8_t* data = nullptr;
  std::uint64_t nbytes = 0;
  std::uint64_t rows = 0, cols = 0;
  std::function<void()> release;  ///< drop the pages once read (may be empty)
};

/// Turns RawTensors into device views and matrices of the requested storage type, hashing every
/// tensor read (name, stated shape, type id, bytes) into one fingerprint.
template <class E>
class WeightBuilder {
 public:
  explicit WeightBuilder(const LoadOptions& o) : o_(o) {}

  // Dequantizes a tensor into fp32 chunk by chunk, handing each chunk to `sink`.
  template <class Sink>
  void stream(const RawTensor& t, Sink&& sink) {
    interruption_point("load");  // between tensors: SIGINT / SIGTERM stop loading here
    types_.insert(gguf::to_string(t.type));
    h_.bytes(t.name.data(), t.name.size());
    for (auto d : t.hash_dims) h_.mix(d);
    h_.mix(static_cast<std::uint64_t>(t.type));
    h_.bytes(t.data, t.nbytes);
    const std::uint64_t cols = t.cols;
    const std::uint64_t rows = t.rows;
    const std::uint64_t rb = gguf::row_bytes(t.type, cols);
    const std::uint64_t chunk_rows = std::max<std::uint64_t>(1, (1u << 16) / cols);
    buf_.resize(chunk_rows * cols);
    std::uint64_t bad = 0;
    for (std::uint64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const std::uint64_t nr = std::min(chunk_rows, rows - r0);
      gguf::dequantize(t.type, t.data + r0 * rb, buf_.data(), nr * cols);
      for (std::uint64_t i = 0; i < nr * cols; ++i)
        if (!std::isfinite(buf_[i])) ++bad;
      sink(r0, nr, buf_.data());
    }
    if (bad) {
      nonfinite_ += bad;
      if (o_.strict) fail("{}: tensor '{}' holds {} NaN/Inf values", t.file, t.name, bad);
      log().warn("{}: tensor '{}' holds {} NaN/Inf values", t.file, t.name, bad);
    }
    if (t.release) t.release();
  }

  Kokkos::View<float*, DeviceOf<E>> vec(const RawTensor& t, int n) {
    Kokkos::View<float*, DeviceOf<E>> v(Kokkos::view_alloc(t.name, Kokkos::WithoutInitializing), n);
    auto h = Kokkos::create_mirror_view(v);
    stream(t, [&](std::uint64_t r0, std::uint64_t nr, const float* src) {
      std::copy(src, src + nr * t.cols, h.data() + r0 * t.cols);
    });
    Kokkos::deep_copy(v, h);
    return v;
  }

  template <class T>
  Kokkos::View<T**, Layout, DeviceOf<E>> fill(const RawTensor& t, int rows, int cols) {
    Kokkos::View<T**, Layout, DeviceOf<E>> v(
        Kokkos::view_alloc(t.name, Kokkos::WithoutInitializing), rows, cols);
    auto h = Kokkos::create_mirror_view(v);
    stream(t, [&](std::uint64_t r0, std::uint64_t nr, const float* src) {
      T* dst = h.data() + r0 * cols;
      for (std::uint64_t i = 0; i < nr * cols; ++i) dst[i] = from_f32<T>(src[i]);
    });
    Kokkos::deep_copy(v, h);
    return v;
  }

  /// A [rows][cols] matrix; the caller has checked t.rows == rows and t.cols == cols.
  Matrix<E> mat(const RawTensor& t, int rows, int cols) {
    Matrix<E> m;
    m.dtype = o_.storage;
    m.rows = rows;
    m.cols = cols;
    switch (o_.storage) {
      case DType::F32:
        m.f32 = fill<float>(t, rows, cols);
        break;
      case DType::BF16:
        m.bf16 = fill<bf16_t>(t, rows, cols);
        break;
      case DType::F16:
        m.f16 = fill<f16_t>(t, rows, cols);
        break;
    }
    return m;
  }

  std::vector<float> host_vec(const RawTensor& t) {
    std::vector<float> out(t.rows * t.cols);
    stream(t, [&](std::uint64_t r0, std::uint64_t nr, const float* src) {
      std::copy(src, src + nr * t.cols, out.data() + r0 * t.cols);
    });
    return out;
  }

  /// Fills the fingerprint, tensor types and NaN count of `info`.
  void finish(ModelInfo& info) const {
    info.fingerprint = h_.hex();
    info.tensor_types.assign(types_.begin(), types_.end());
    info.nonfinite = nonfinite_;
  }

 private:
  const LoadOptions& o_;
  Hasher h_;
  std::set<std::string> types_;
  std::uint64_t nonfinite_ = 0;
  std::vector<float> buf_;
};

}  // namespace sparsim::detail
