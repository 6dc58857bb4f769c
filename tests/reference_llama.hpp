#pragma once
// A deliberately plain Llama forward pass in double precision on the host: one token at a time,
// straight loops, no Kokkos. It is the mathematical reference the engine is checked against.
#include "model/config.hpp"
#include "model/gguf.hpp"
#include "model/loader.hpp"

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace sparsim::test {

class ReferenceLlama {
 public:
  explicit ReferenceLlama(const std::string& path) {
    gguf::File f = gguf::File::open(path);
    cfg_ = config_from_gguf(f);
    for (const auto& t : f.tensors()) {
      std::vector<float> v(t.n_elements());
      gguf::dequantize(t.type, t.data, v.data(), v.size());
      w_[t.name] = std::vector<double>(v.begin(), v.end());
    }
    freq_factors_.clear();
    if (w_.count("rope_freqs.weight"))
      for (double x : w_["rope_freqs.weight"]) freq_factors_.push_back(static_cast<float>(x));
    inv_freq_ = cfg_.rope_inv_freq(freq_factors_);
    kc_.resize(cfg_.n_layer);
    vc_.resize(cfg_.n_layer);
  }

  const Config& cfg() const { return cfg_; }

  /// Token gate: skip(layer, pos) true makes that token's attention output zero (its K and V
  /// are still cached). Key mask: keep(layer, pos, kv_head, channel) false leaves that cached
  /// key channel out of every later score (K-cache channel pruning).
  std::function<bool(int, int)> skip;
  std::function<bool(int, int, int, int)> keep;
  /// Token eviction: evicted(layer, pos, kv_head) true leaves that cached token out of every
  /// later score and value mix of the head.
  std::function<bool(int, int, int)> evicted;
  /// Called with each layer's query [n_head·head_dim] and key [n_kv_head·head_dim] of the fed
  /// position, after RoPE (the vectors attention scores), as (layer, pos, q, k).
  std::function<void(int, int, const std::vector<double>&, const std::vector<double>&)> on_qk;

  /// The full model with channels removed, as a pruned model computes it: per layer, flags
  /// [n_kv_head·head_dim] of the K and V channels that survive. A removed K channel has its rows
  /// of W_k and of W_q (every query head of the group) zeroed, and its rotated value zeroed after
  /// RoPE, so a surviving channel whose RoPE partner was removed only keeps its own component of
  /// the rotation; a removed V channel has its W_v row zeroed.
  struct ChannelMask {
    std::vector<std::vector<char>> k_keep, v_keep;
  };
  void set_mask(ChannelMask m) { mask_ = std::move(m); }

  /// Logits after feeding `token` at the next position.
  std::vector<double> step(int token) {
    const Config& c = cfg_;
    const int d = c.d_model, hd = c.head_dim, pos = static_cast<int>(kc_[0].size());
    std::vector<double> x(d);
    for (int j = 0; j < d; ++j) x[j] = w_["token_embd.weight"][token * d + j];
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      auto h = norm(x, w_[p + "attn_norm.weight"]);
      auto q = matvec(w_[p + "attn_q.weight"], h, c.q_dim());
      auto k = matvec(w_[p + "attn_k.weight"], h, c.kv_dim());
      auto v = matvec(w_[p + "attn_v.weight"], h, c.kv_dim());
      const bool masked = !mask_.k_keep.empty();
      const int group = c.n_head / c.n_kv_head;
      auto cut = [&](bool post) {
        if (!masked) return;
        for (int i = 0; i < c.kv_dim(); ++i) {
          if (mask_.v_keep[l][i] == 0 && !post) v[i] = 0;
          if (mask_.k_keep[l][i] != 0) continue;
          k[i] = 0;
          const int kvh = i / hd, ch = i % hd;
          for (int g = 0; g < group; ++g) q[(kvh * group + g) * hd + ch] = 0;
        }
      };
      cut(false);
      rotate(q, pos);
      rotate(k, pos);
      cut(true);
      if (on_qk) on_qk(l, pos, q, k);
      kc_[l].push_back(k);
      vc_[l].push_back(v);
      if (skip && skip(l, pos)) {  // the residual passes through; the MLP still runs
        mlp(l, x);
        continue;
      }
      std::vector<double> att(c.q_dim(), 0.0);
      for (int hh = 0; hh < c.n_head; ++hh) {
        const int kvh = hh / group;
        std::vector<double> s(pos + 1);
        double mx = -1e300;
        for (int t = 0; t <= pos; ++t) {
          if (evicted && evicted(l, t, kvh)) {
            s[t] = -1e300;  // weight exactly 0
            continue;
          }
          double a = 0;
          for (int i = 0; i < hd; ++i)
            if (!keep || keep(l, t, kvh, i)) a += q[hh * hd + i] * kc_[l][t][kvh * hd + i];
          s[t] = a / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[t]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (int t = 0; t <= pos; ++t)
          for (int i = 0; i < hd; ++i) att[hh * hd + i] += s[t] / z * vc_[l][t][kvh * hd + i];
      }
      auto o = matvec(w_[p + "attn_output.weight"], att, d);
      for (int j = 0; j < d; ++j) x[j] += o[j];
      mlp(l, x);
    }
    auto h = norm(x, w_["output_norm.weight"]);
    const auto& head = w_.count("output.weight") ? w_["output.weight"] : w_["token_embd.weight"];
    return matvec(head, h, c.vocab);
  }

 private:
  void mlp(int l, std::vector<double>& x) {
    const Config& c = cfg_;
    const int d = c.d_model;
    const std::string p = "blk." + std::to_string(l) + ".";
    auto h = norm(x, w_[p + "ffn_norm.weight"]);
    auto g = matvec(w_[p + "ffn_gate.weight"], h, c.d_ff);
    auto u = matvec(w_[p + "ffn_up.weight"], h, c.d_ff);
    for (int j = 0; j < c.d_ff; ++j) g[j] = g[j] / (1 + std::exp(-g[j])) * u[j];
    auto dn = matvec(w_[p + "ffn_down.weight"], g, d);
    for (int j = 0; j < d; ++j) x[j] += dn[j];
  }
  std::vector<double> norm(const std::vector<double>& x, const std::vector<double>& g) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double s = 1.0 / std::sqrt(ss / x.size() + cfg_.rms_eps);
    std::vector<double> y(x.size());
    for (std::size_t j = 0; j < x.size(); ++j) y[j] = x[j] * s * g[j];
    return y;
  }
  static std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x,
                                    int rows) {
    const std::size_t cols = x.size();
    std::vector<double> y(rows, 0.0);
    for (int r = 0; r < rows; ++r)
      for (std::size_t i = 0; i < cols; ++i) y[r] += w[r * cols + i] * x[i];
    return y;
  }
  void rotate(std::vector<double>& v, int pos) const {
    const int hd = cfg_.head_dim, half = hd / 2;
    const bool adj = cfg_.rope_layout == RopeLayout::Adjacent;
    for (std::size_t b = 0; b < v.size(); b += hd)
      for (int j = 0; j < half; ++j) {
        const double a = pos * inv_freq_[j];
        const std::size_t i0 = adj ? b + 2 * j : b + j, i1 = adj ? b + 2 * j + 1 : b + j + half;
        const double x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * std::cos(a) - x1 * std::sin(a);
        v[i1] = x0 * std::sin(a) + x1 * std::cos(a);
      }
  }

  Config cfg_;
  std::map<std::string, std::vector<double>> w_;
  std::vector<float> freq_factors_;
  std::vector<double> inv_freq_;
  std::vector<std::vector<std::vector<double>>> kc_, vc_;
  ChannelMask mask_;
};

}  // namespace sparsim::test
