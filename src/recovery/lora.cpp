#include "recovery/lora.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "model/synth.hpp"
#include "recovery/hash.hpp"

#include <fmt/format.h>

#include <cmath>

namespace sparsim::recovery {

namespace {

constexpr Proj kAll[] = {Proj::Q, Proj::K, Proj::V, Proj::O, Proj::Gate, Proj::Up, Proj::Down};

/// Whether dropout removes entry (t, i) under `key`: hash < p·2⁶⁴.
KOKKOS_INLINE_FUNCTION bool dropped(std::uint64_t key, int t, int i, std::uint64_t threshold) {
  const std::uint64_t ti = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(t)) << 32) |
                           static_cast<std::uint32_t>(i);
  return mix64(key ^ mix64(ti)) < threshold;
}

}  // namespace

const char* target_name(Proj p) {
  switch (p) {
    case Proj::Q:
      return "q";
    case Proj::K:
      return "k";
    case Proj::V:
      return "v";
    case Proj::O:
      return "o";
    case Proj::Gate:
      return "gate";
    case Proj::Up:
      return "up";
    case Proj::Down:
      break;
  }
  return "down";
}

std::string tensor_name(int layer, Proj p) {
  static const char* const kTensor[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                        "ffn_gate", "ffn_up", "ffn_down"};
  return fmt::format("blk.{}.{}.weight", layer, kTensor[static_cast<int>(p)]);
}

std::vector<Proj> parse_targets(const std::string& list) {
  std::vector<Proj> out;
  std::size_t b = 0;
  while (b <= list.size()) {
    std::size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    const std::string item = list.substr(b, e - b);
    b = e + 1;
    if (item.empty()) continue;
    bool found = false;
    for (Proj p : kAll)
      if (item == target_name(p)) {
        for (Proj q : out) require(q != p, "LoRA targets: '{}' is named twice in '{}'", item, list);
        out.push_back(p);
        found = true;
      }
    require(found,
            "LoRA targets: unknown projection '{}' in '{}' (known: q, k, v, o, gate, up, down)",
            item, list);
  }
  require(!out.empty(), "LoRA targets: none given ('{}')", list);
  return out;
}

std::string targets_string(const std::vector<Proj>& t) {
  std::string s;
  for (Proj p : t) s += (s.empty() ? "" : ",") + std::string(target_name(p));
  return s;
}

void LoraSpec::validate() const {
  require(rank >= 1, "LoRA rank must be at least 1, got {}", rank);
  require(std::isfinite(alpha) && alpha > 0, "LoRA alpha must be a positive number, got {}", alpha);
  require(std::isfinite(dropout) && dropout >= 0 && dropout <= 0.9,
          "LoRA dropout must be in [0, 0.9], got {}", dropout);
  require(std::isfinite(init_b_std) && init_b_std >= 0,
          "LoRA initial B deviation must be >= 0, got {}", init_b_std);
  require(!targets.empty(), "LoRA: no target projections");
}

std::string Adapter::name() const {
  std::string t = tensor_name(layer, proj);
  return t.substr(0, t.size() - std::string(".weight").size());
}

template <class E>
std::vector<Adapter> init_adapters(const Weights<E>& w, const LoraSpec& spec) {
  spec.validate();
  std::vector<Adapter> out;
  for (int l = 0; l < static_cast<int>(w.layers.size()); ++l)
    for (Proj p : spec.targets) {
      const Matrix<E>& m = w.layers[static_cast<std::size_t>(l)].proj(p);
      require(!m.empty(), "LoRA target '{}': layer {} has no such projection", target_name(p), l);
      require(spec.rank <= std::min(m.rows, m.cols),
              "LoRA rank {} exceeds the {}×{} projection '{}' of layer {} (at most {})", spec.rank,
              m.rows, m.cols, target_name(p), l, std::min(m.rows, m.cols));
      Adapter a;
      a.layer = l;
      a.proj = p;
      a.in = m.cols;
      a.out = m.rows;
      a.rank = spec.rank;
      SynthRng rng(mix64(spec.seed * 0x100000001B3ull + static_cast<std::uint64_t>(l) * 8 +
                         static_cast<std::uint64_t>(p)));
      const double bound = 1.0 / std::sqrt(static_cast<double>(a.in));
      a.a.resize(static_cast<std::size_t>(a.rank) * a.in);
      for (double& x : a.a) x = (2 * rng.uniform() - 1) * bound;
      a.b.assign(static_cast<std::size_t>(a.out) * a.rank, 0.0);
      if (spec.init_b_std > 0)
        for (double& x : a.b) x = rng.normal() * spec.init_b_std;
      out.push_back(std::move(a));
    }
  return out;
}

std::vector<float> merged_weight(const std::vector<float>& w, const Adapter& a, double scale) {
  require(w.size() == static_cast<std::size_t>(a.out) * a.in,
          "merging adapter {}: the weight holds {} values, the adapter is {}×{}", a.name(),
          w.size(), a.out, a.in);
  std::vector<float> out(w.size());
  for (int o = 0; o < a.out; ++o)
    for (int i = 0; i < a.in; ++i) {
      double d = 0;
      for (int j = 0; j < a.rank; ++j)
        d += a.b[static_cast<std::size_t>(o) * a.rank + j] *
             a.a[static_cast<std::size_t>(j) * a.in + i];
      const std::size_t k = static_cast<std::size_t>(o) * a.in + i;
      out[k] = static_cast<float>(static_cast<double>(w[k]) + scale * d);
    }
  return out;
}

template <class E>
std::shared_ptr<Weights<E>> merge_adapters(const Weights<E>& w, const std::vector<Adapter>& ad,
                                           double scale) {
  auto out = std::make_shared<Weights<E>>(w);
  for (const Adapter& a : ad) {
    require(a.layer >= 0 && a.layer < static_cast<int>(w.layers.size()),
            "merging adapter {}: the model has {} layers", a.name(), w.layers.size());
    const Matrix<E>& m = w.layers[static_cast<std::size_t>(a.layer)].proj(a.proj);
    require(m.rows == a.out && m.cols == a.in, "merging adapter {}: the weight is {}×{}, not {}×{}",
            a.name(), m.rows, m.cols, a.out, a.in);
    std::vector<float> host(static_cast<std::size_t>(m.rows) * m.cols);
    if (m.dtype == DType::F32) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.f32);
      for (int r = 0; r < m.rows; ++r)
        for (int c = 0; c < m.cols; ++c) host[static_cast<std::size_t>(r) * m.cols + c] = h(r, c);
    } else if (m.dtype == DType::BF16) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.bf16);
      for (int r = 0; r < m.rows; ++r)
        for (int c = 0; c < m.cols; ++c)
          host[static_cast<std::size_t>(r) * m.cols + c] = to_f32(h(r, c));
    } else {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m.f16);
      for (int r = 0; r < m.rows; ++r)
        for (int c = 0; c < m.cols; ++c)
          host[static_cast<std::size_t>(r) * m.cols + c] = to_f32(h(r, c));
    }
    const std::vector<float> merged = merged_weight(host, a, scale);
    Matrix<E> nm;
    nm.dtype = DType::F32;
    nm.rows = m.rows;
    nm.cols = m.cols;
    nm.f32 =
        Kokkos::View<float**, Layout, DeviceOf<E>>("sparsim::recovery::merged", m.rows, m.cols);
    auto hm = Kokkos::create_mirror_view(nm.f32);
    for (int r = 0; r < m.rows; ++r)
      for (int c = 0; c < m.cols; ++c) hm(r, c) = merged[static_cast<std::size_t>(r) * m.cols + c];
    Kokkos::deep_copy(nm.f32, hm);
    out->layers[static_cast<std::size_t>(a.layer)].proj(a.proj) = nm;
  }
  return out;
}

template <class E, class T>
struct LoraHook<E, T>::Slot {
  int rank = 0, in = 0, out = 0;
  MatT<E, T> a, b, u;  // A [r][in], B [out][r], u = drop(x)·Aᵀ [max_tokens][r]
  Kokkos::View<double**, Layout, DeviceOf<E>> ga, gb;
};

template <class E, class T>
LoraHook<E, T>::LoraHook(const std::vector<Adapter>& adapters, int n_layer, double scale,
                         double dropout, int max_tokens, E exec)
    : index_(static_cast<std::size_t>(n_layer) * kNumProj, -1),
      scale_(scale),
      dropout_(dropout),
      exec_(exec) {
  require(std::isfinite(dropout) && dropout >= 0 && dropout <= 0.9, "LoRA dropout {} invalid",
          dropout);
  int max_rank = 1, max_in = 1;
  std::size_t max_size = 1;
  for (const Adapter& a : adapters) {
    require(a.layer >= 0 && a.layer < n_layer, "adapter {}: layer outside the model", a.name());
    int& ix = index_[static_cast<std::size_t>(a.layer) * kNumProj + static_cast<int>(a.proj)];
    require(ix < 0, "adapter {} given twice", a.name());
    ix = static_cast<int>(slots_.size());
    Slot s;
    s.rank = a.rank;
    s.in = a.in;
    s.out = a.out;
    s.a = MatT<E, T>("sparsim::lora::A", a.rank, a.in);
    s.b = MatT<E, T>("sparsim::lora::B", a.out, a.rank);
    s.u = MatT<E, T>("sparsim::lora::u", max_tokens, a.rank);
    s.ga = Kokkos::View<double**, Layout, DeviceOf<E>>("sparsim::lora::dA", a.rank, a.in);
    s.gb = Kokkos::View<double**, Layout, DeviceOf<E>>("sparsim::lora::dB", a.out, a.rank);
    slots_.push_back(s);
    max_rank = std::max(max_rank, a.rank);
    max_in = std::max(max_in, a.in);
    max_size = std::max(max_size, static_cast<std::size_t>(a.rank) * std::max(a.in, a.out));
  }
  g_ = MatT<E, T>("sparsim::lora::g", max_tokens, max_rank);
  acc_ = Kokkos::View<double*, DeviceOf<E>>("sparsim::lora::grad_sums", max_size);
  if (dropout > 0) xd_ = MatT<E, T>("sparsim::lora::dropped_x", max_tokens, max_in);
  upload(adapters);
}

template <class E, class T>
LoraHook<E, T>::~LoraHook() = default;

template <class E, class T>
int LoraHook<E, T>::slot(int layer, Proj p) const {
  const std::size_t i = static_cast<std::size_t>(layer) * kNumProj + static_cast<int>(p);
  return i < index_.size() ? index_[i] : -1;
}

template <class E, class T>
bool LoraHook<E, T>::active(int layer, Proj p) const {
  return slot(layer, p) >= 0;
}

template <class E, class T>
void LoraHook<E, T>::upload(const std::vector<Adapter>& adapters) {
  require(adapters.size() == slots_.size(), "LoRA: {} adapters, the hook holds {}", adapters.size(),
          slots_.size());
  for (const Adapter& ad : adapters) {
    const int ix = slot(ad.layer, ad.proj);
    require(ix >= 0, "LoRA: adapter {} is not one of the hook's", ad.name());
    Slot& s = slots_[static_cast<std::size_t>(ix)];
    require(s.rank == ad.rank && s.in == ad.in && s.out == ad.out, "LoRA: adapter {} changed shape",
            ad.name());
    auto ha = Kokkos::create_mirror_view(s.a);
    auto hb = Kokkos::create_mirror_view(s.b);
    for (int j = 0; j < s.rank; ++j)
      for (int i = 0; i < s.in; ++i)
        ha(j, i) = static_cast<T>(ad.a[static_cast<std::size_t>(j) * s.in + i]);
    for (int o = 0; o < s.out; ++o)
      for (int j = 0; j < s.rank; ++j)
        hb(o, j) = static_cast<T>(ad.b[static_cast<std::size_t>(o) * s.rank + j]);
    Kokkos::deep_copy(s.a, ha);
    Kokkos::deep_copy(s.b, hb);
  }
}

template <class E, class T>
void LoraHook<E, T>::zero_grad() {
  for (Slot& s : slots_) {
    Kokkos::deep_copy(exec_, s.ga, 0.0);
    Kokkos::deep_copy(exec_, s.gb, 0.0);
  }
  exec_.fence();
}

template <class E, class T>
std::vector<double> LoraHook<E, T>::gradients() const {
  exec_.fence();
  std::vector<double> out;
  for (const Slot& s : slots_) {
    auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.ga);
    auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.gb);
    for (int j = 0; j < s.rank; ++j)
      for (int i = 0; i < s.in; ++i) out.push_back(ha(j, i));
    for (int o = 0; o < s.out; ++o)
      for (int j = 0; j < s.rank; ++j) out.push_back(hb(o, j));
  }
  return out;
}

template <class E, class T>
CMatT<E, T> LoraHook<E, T>::dropped_input(const E& exec, int ix, const CMatT<E, T>& x) const {
  if (!(training_ && dropout_ > 0)) return x;
  const int n = static_cast<int>(x.extent(0)), in = static_cast<int>(x.extent(1));
  const MatT<E, T> xd(xd_.data(), n, in);
  const std::uint64_t thr = static_cast<std::uint64_t>(std::ldexp(dropout_, 64));
  const std::uint64_t key = mix64(key_ + static_cast<std::uint64_t>(ix));
  const T inv_keep = static_cast<T>(1.0 / (1.0 - dropout_));
  Kokkos::parallel_for(
      "sparsim::lora::dropout", Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, in}),
      KOKKOS_LAMBDA(int t, int i) {
        xd(t, i) = dropped(key, t, i, thr) ? T(0) : x(t, i) * inv_keep;
      });
  return xd;
}

template <class E, class T>
void LoraHook<E, T>::forward(const E& exec, int layer, Proj p, const CMatT<E, T>& x,
                             const MatT<E, T>& y) {
  const int ix = slot(layer, p);
  const Slot& s = slots_[static_cast<std::size_t>(ix)];
  const int n = static_cast<int>(x.extent(0)), in = s.in, out = s.out, r = s.rank;
  require(static_cast<int>(x.extent(1)) == in && static_cast<int>(y.extent(1)) == out &&
              n <= static_cast<int>(s.u.extent(0)),
          "LoRA forward: shapes do not match adapter {}.{}", layer, target_name(p));
  const auto A = s.a;
  const auto B = s.b;
  const auto u = s.u;
  const T sc = static_cast<T>(scale_);
  using R2 = Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>;
  const CMatT<E, T> xd = dropped_input(exec, ix, x);
  Kokkos::parallel_for(
      "sparsim::lora::down", R2(exec, {0, 0}, {n, r}),
      KOKKOS_LAMBDA(int t, int j) { u(t, j) = bwd::dot(&xd(t, 0), &A(j, 0), in); });
  Kokkos::parallel_for(
      "sparsim::lora::up", R2(exec, {0, 0}, {n, out}), KOKKOS_LAMBDA(int t, int o) {
        T acc = 0;
        for (int j = 0; j < r; ++j) acc += u(t, j) * B(o, j);
        y(t, o) += sc * acc;
      });
}

template <class E, class T>
void LoraHook<E, T>::backward(const E& exec, int layer, Proj p, const CMatT<E, T>& x,
                              const CMatT<E, T>& dy, const MatT<E, T>& dx) {
  const int ix = slot(layer, p);
  const Slot& s = slots_[static_cast<std::size_t>(ix)];
  const int n = static_cast<int>(x.extent(0)), in = s.in, out = s.out, r = s.rank;
  require(static_cast<int>(dy.extent(1)) == out && static_cast<int>(dx.extent(1)) == in,
          "LoRA backward: shapes do not match adapter {}.{}", layer, target_name(p));
  const auto A = s.a;
  const auto B = s.b;
  const auto u = s.u;
  const auto ga = s.ga;
  const auto gb = s.gb;
  const auto g = g_;
  const bool drop = training_ && dropout_ > 0;
  const std::uint64_t thr = drop ? static_cast<std::uint64_t>(std::ldexp(dropout_, 64)) : 0;
  const std::uint64_t key = mix64(key_ + static_cast<std::uint64_t>(ix));
  const T sc_x = static_cast<T>(drop ? scale_ / (1.0 - dropout_) : scale_);
  const double scd = scale_;
  using R2 = Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>;
  // g = dy·B
  Kokkos::parallel_for(
      "sparsim::lora::dy_B", R2(exec, {0, 0}, {n, r}), KOKKOS_LAMBDA(int t, int j) {
        T acc = 0;
        for (int o = 0; o < out; ++o) acc += dy(t, o) * B(o, j);
        g(t, j) = acc;
      });
  // The weight gradients are sums over the tokens, each element's in token order (0 … n−1) in
  // double. A work item owns a block of kBlock rows of ∂L/∂B (columns of ∂L/∂A) and walks the
  // tokens once, reading each token's row segment of dy (of drop(x)) contiguously.
  constexpr int kBlock = 16;
  const auto sums = acc_;
  // ∂L/∂B += s·dyᵀ·u
  Kokkos::parallel_for(
      "sparsim::lora::grad_B", Kokkos::RangePolicy<E>(exec, 0, (out + kBlock - 1) / kBlock),
      KOKKOS_LAMBDA(int blk) {
        const int o0 = blk * kBlock, o1 = o0 + kBlock < out ? o0 + kBlock : out;
        for (int i = o0 * r; i < o1 * r; ++i) sums(i) = 0;
        for (int t = 0; t < n; ++t)
          for (int o = o0; o < o1; ++o) {
            const double d = static_cast<double>(dy(t, o));
            for (int j = 0; j < r; ++j) sums(o * r + j) += d * static_cast<double>(u(t, j));
          }
        for (int o = o0; o < o1; ++o)
          for (int j = 0; j < r; ++j) gb(o, j) += scd * sums(o * r + j);
      });
  // ∂L/∂A += s·gᵀ·drop(x)
  const CMatT<E, T> xd = dropped_input(exec, ix, x);
  Kokkos::parallel_for(
      "sparsim::lora::grad_A", Kokkos::RangePolicy<E>(exec, 0, (in + kBlock - 1) / kBlock),
      KOKKOS_LAMBDA(int blk) {
        const int i0 = blk * kBlock, i1 = i0 + kBlock < in ? i0 + kBlock : in;
        for (int j = 0; j < r; ++j)
          for (int i = i0; i < i1; ++i) sums(static_cast<std::size_t>(j) * in + i) = 0;
        for (int t = 0; t < n; ++t)
          for (int j = 0; j < r; ++j) {
            const double gj = static_cast<double>(g(t, j));
            for (int i = i0; i < i1; ++i)
              sums(static_cast<std::size_t>(j) * in + i) += gj * static_cast<double>(xd(t, i));
          }
        for (int j = 0; j < r; ++j)
          for (int i = i0; i < i1; ++i)
            ga(j, i) += scd * sums(static_cast<std::size_t>(j) * in + i);
      });
  // ∂L/∂x += s·(g·A) ⊙ keep / (1 − p)
  Kokkos::parallel_for(
      "sparsim::lora::grad_x", R2(exec, {0, 0}, {n, in}), KOKKOS_LAMBDA(int t, int i) {
        if (drop && dropped(key, t, i, thr)) return;
        T acc = 0;
        for (int j = 0; j < r; ++j) acc += g(t, j) * A(j, i);
        dx(t, i) += sc_x * acc;
      });
}

#define SPARSIM_INSTANTIATE_LORA(E)                                                            \
  template std::vector<Adapter> init_adapters<E>(const Weights<E>&, const LoraSpec&);          \
  template std::shared_ptr<Weights<E>> merge_adapters<E>(const Weights<E>&,                    \
                                                         const std::vector<Adapter>&, double); \
  template class LoraHook<E, float>;                                                           \
  template class LoraHook<E, double>;
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_LORA)

}  // namespace sparsim::recovery
