#include "gemm_bf16/bf16_gemm.hpp"

#include <stdexcept>

#ifdef SPARSIM_HAVE_DNNL
#include <omp.h>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>
#endif

namespace sparsim::host {

#ifdef SPARSIM_HAVE_DNNL
namespace {

using dt = dnnl::memory::data_type;
using Key = std::tuple<int, int, int, std::size_t, std::size_t, std::size_t>;

struct Prim {
  dnnl::memory::desc src, wei, dst, scratch;
  dnnl::matmul mm;
  std::string impl;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

Prim make(int nt, int nr, int K, std::size_t ldx, std::size_t ldw, std::size_t ldy) {
  using dims = dnnl::memory::dims;
  Prim p;
  const auto d = [](std::size_t v) { return static_cast<dnnl::memory::dim>(v); };
  p.src = dnnl::memory::desc({nt, K}, dt::bf16, dims{d(ldx), 1});
  // W is row-major [nr][K]: the (K × nr) weight operand with strides (1, ldw).
  p.wei = dnnl::memory::desc({K, nr}, dt::bf16, dims{1, d(ldw)});
  p.dst = dnnl::memory::desc({nt, nr}, dt::f32, dims{d(ldy), 1});
  // A user scratchpad, one per calling thread: the library-managed one belongs to the primitive,
  // and two threads running the same tile shape at once would share it.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.src, p.wei, p.dst), attr,
                                        cpu_engine());
  p.impl = pd.impl_info_str();
  p.scratch = pd.scratchpad_desc();
  p.mm = dnnl::matmul(pd);
  return p;
}

// One primitive per tile shape: a prefill uses a handful (full tiles and the edges).
const Prim& primitive(int nt, int nr, int K, std::size_t ldx, std::size_t ldw, std::size_t ldy) {
  static std::mutex m;
  static std::map<Key, Prim> cache;
  const Key k{nt, nr, K, ldx, ldw, ldy};
  std::lock_guard<std::mutex> lock(m);
  auto it = cache.find(k);
  if (it == cache.end()) it = cache.emplace(k, make(nt, nr, K, ldx, ldw, ldy)).first;
  return it->second;  // std::map nodes do not move
}

struct Probe {
  bool ok = false;
  std::string reason, impl;
  Probe() {
    try {
      impl = primitive(16, 16, 32, 32, 32, 16).impl;
    } catch (const dnnl::error& e) {
      reason = std::string("oneDNN has no bf16 matmul here: ") + e.what();
      return;
    }
    // Reference implementations (oneDNN's choice below AVX-512) are correct but far slower
    // than widening to fp32 and SGEMM.
    if (impl.find("ref") != std::string::npos) {
      reason = "oneDNN has only its reference bf16 matmul (" + impl +
               ") on this CPU; its fast ones need AVX-512";
      return;
    }
    ok = true;
  }
};

const Probe& probe() {
  static const Probe p;
  return p;
}

}  // namespace

bool bf16_gemm_available() {
  return probe().ok;
}
std::string bf16_gemm_unavailable_reason() {
  return probe().reason;
}
std::string bf16_gemm_implementation() {
  return probe().ok ? probe().impl : std::string();
}

void bf16_gemm_tile(const std::uint16_t* x, std::size_t ldx, const std::uint16_t* w,
                    std::size_t ldw, float* y, std::size_t ldy, int nt, int nr, int K) {
  if (nt <= 0 || nr <= 0) return;
  const Prim& p = primitive(nt, nr, K, ldx, ldw, ldy);
  // oneDNN's OpenMP runtime: a region it opens from here gets this one thread even where
  // nested parallelism is enabled, so a tile's arithmetic never depends on the thread count.
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  thread_local dnnl::stream s(cpu_engine());
  thread_local std::vector<unsigned char> pad;
  if (pad.size() < p.scratch.get_size()) pad.resize(p.scratch.get_size());
  dnnl::memory src(p.src, cpu_engine(), const_cast<std::uint16_t*>(x));
  dnnl::memory wei(p.wei, cpu_engine(), const_cast<std::uint16_t*>(w));
  dnnl::memory dst(p.dst, cpu_engine(), y);
  dnnl::memory scratch(p.scratch, cpu_engine(), pad.data());
  p.mm.execute(s, {{DNNL_ARG_SRC, src},
                   {DNNL_ARG_WEIGHTS, wei},
                   {DNNL_ARG_DST, dst},
                   {DNNL_ARG_SCRATCHPAD, scratch}});
  s.wait();
  omp_set_num_threads(before);
}

#else

bool bf16_gemm_available() {
  return false;
}
std::string bf16_gemm_unavailable_reason() {
  return "this build has no oneDNN (Debian: libdnnl-dev; CMake found no 'dnnl' package)";
}
std::string bf16_gemm_implementation() {
  return {};
}
void bf16_gemm_tile(const std::uint16_t*, std::size_t, const std::uint16_t*, std::size_t, float*,
                    std::size_t, int, int, int) {
  throw std::logic_error("bf16_gemm_tile called in a build without oneDNN");
}

#endif

}  // namespace sparsim::host
