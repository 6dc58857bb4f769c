#include "model/config.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>

namespace sparsim {

void Config::validate() const {
  auto pos = [](const char* what, long v) {
    require(v > 0, "model config: {} must be positive, got {}", what, v);
  };
  pos("n_layer (block_count)", n_layer);
  pos("d_model (embedding_length)", d_model);
  pos("n_head (attention.head_count)", n_head);
  pos("n_kv_head (attention.head_count_kv)", n_kv_head);
  pos("head_dim", head_dim);
  pos("d_ff (feed_forward_length)", d_ff);
  pos("vocab", vocab);
  pos("context_length", context_length);
  require(n_head % n_kv_head == 0,
          "model config: head_count {} is not a multiple of head_count_kv {}", n_head, n_kv_head);
  require(head_dim % 2 == 0, "model config: head dimension {} must be even for RoPE", head_dim);
  require(rope_theta > 0 && std::isfinite(rope_theta), "model config: rope.freq_base {} invalid",
          rope_theta);
  require(rms_eps > 0 && std::isfinite(rms_eps),
          "model config: attention.layer_norm_rms_epsilon {} invalid", rms_eps);
  if (!attn.empty()) {
    require(static_cast<int>(attn.size()) == n_layer,
            "model config: attention widths given for {} layers, the model has {}", attn.size(),
            n_layer);
    for (int l = 0; l < n_layer; ++l) {
      const LayerAttention& a = attn[static_cast<std::size_t>(l)];
      require(a.qk_dim >= 1 && a.qk_dim <= head_dim && a.v_dim >= 1 && a.v_dim <= head_dim,
              "model config: layer {} has q/k head width {} and v head width {}; both must be in "
              "1 … head_dim = {}",
              l, a.qk_dim, a.v_dim, head_dim);
      auto check = [&](const std::vector<int>& ch, int w, const char* what) {
        require(ch.size() == static_cast<std::size_t>(n_kv_head) * w,
                "model config: layer {} lists {} kept {} channels, expected n_kv_head × width = "
                "{} × {}",
                l, ch.size(), what, n_kv_head, w);
        for (int h = 0; h < n_kv_head; ++h)
          for (int i = 0; i < w; ++i) {
            const int c = ch[static_cast<std::size_t>(h) * w + i];
            require(c >= 0 && c < head_dim,
                    "model config: layer {} KV head {} kept {} channel {} is {}, outside 0 … {}", l,
                    h, what, i, c, head_dim - 1);
            require(i == 0 || c > ch[static_cast<std::size_t>(h) * w + i - 1],
                    "model config: layer {} KV head {} kept {} channels are not strictly "
                    "ascending at position {}",
                    l, h, what, i);
          }
      };
      check(a.k_channels, a.qk_dim, "K");
      check(a.v_channels, a.v_dim, "V");
    }
  }
  if (!low_rank.empty()) {
    require(attn.empty(), "model config: low-rank K/V factors on a model with pruned head widths");
    require(static_cast<int>(low_rank.size()) == n_layer,
            "model config: low-rank factors given for {} layers, the model has {}", low_rank.size(),
            n_layer);
    require(lr_group >= 1 && n_kv_head % lr_group == 0,
            "model config: low-rank group of {} KV heads does not divide the {} KV heads", lr_group,
            n_kv_head);
    const int groups = n_kv_head / lr_group, gd = lr_group * head_dim;
    for (int l = 0; l < n_layer; ++l)
      for (const auto* r : {&low_rank[static_cast<std::size_t>(l)].k_ranks,
                            &low_rank[static_cast<std::size_t>(l)].v_ranks}) {
        require(static_cast<int>(r->size()) == groups,
                "model config: layer {} lists {} low-rank groups, expected {}", l, r->size(),
                groups);
        for (int x : *r)
          require(x >= 1 && x <= gd,
                  "model config: layer {} has a low-rank group of rank {}; ranks must be in 1 … "
                  "{} (the group's {} KV heads × {})",
                  l, x, gd, lr_group, head_dim);
      }
  }
  if (!structure.empty()) {
    require(attn.empty() && low_rank.empty(),
            "model config: removed heads and FFN channels together with pruned head widths or "
            "low-rank K/V factors");
    require(static_cast<int>(structure.size()) == n_layer,
            "model config: kept heads and FFN channels given for {} layers, the model has {}",
            structure.size(), n_layer);
    const int group = n_head / n_kv_head;
    for (int l = 0; l < n_layer; ++l) {
      const LayerStructure& s = structure[static_cast<std::size_t>(l)];
      auto check = [&](const std::vector<int>& v, int n, const char* what) {
        require(!v.empty(), "model config: layer {} keeps no {}", l, what);
        for (std::size_t i = 0; i < v.size(); ++i) {
          require(v[i] >= 0 && v[i] < n, "model config: layer {} keeps {} {}, outside 0 … {}", l,
                  what, v[i], n - 1);
          require(i == 0 || v[i] > v[i - 1],
                  "model config: layer {} kept {} are not strictly ascending at position {}", l,
                  what, i);
        }
      };
      check(s.q_heads, n_head, "query heads");
      check(s.ffn, d_ff, "FFN channels");
      std::vector<int> per(static_cast<std::size_t>(n_kv_head), 0);
      for (int h : s.q_heads) ++per[static_cast<std::size_t>(h / group)];
      int m = 0;
      for (int x : per)
        if (x > 0) {
          require(m == 0 || x == m,
                  "model config: layer {} keeps {} and {} query heads of two KV heads; the kept "
                  "KV heads of a layer must keep the same number of query heads",
                  l, m, x);
          m = x;
        }
    }
  }
  if (rope_scaling.enabled) {
    require(rope_scaling.factor >= 1 && rope_scaling.original_context > 0 &&
                rope_scaling.high_freq_factor > rope_scaling.low_freq_factor,
            "model config: llama3 rope scaling parameters invalid (factor {}, low {}, high {}, "
            "original context {})",
            rope_scaling.factor, rope_scaling.low_freq_factor, rope_scaling.high_freq_factor,
            rope_scaling.original_context);
  }
}

int Config::n_kv_head_at(int l) const {
  return structure.empty() ? n_kv_head : static_cast<int>(kv_heads_at(l).size());
}

std::vector<int> Config::kv_heads_at(int l) const {
  std::vector<int> kv;
  if (structure.empty()) {
    for (int h = 0; h < n_kv_head; ++h) kv.push_back(h);
    return kv;
  }
  const int group = n_head / n_kv_head;
  for (int h : structure[static_cast<std::size_t>(l)].q_heads)
    if (kv.empty() || kv.back() != h / group) kv.push_back(h / group);
  return kv;
}

int Config::max_d_ff() const {
  int m = 0;
  for (int l = 0; l < n_layer; ++l) m = std::max(m, d_ff_at(l));
  return m;
}

int LayerLowRank::k_rank() const {
  int r = 0;
  for (int x : k_ranks) r += x;
  return r;
}
int LayerLowRank::v_rank() const {
  int r = 0;
  for (int x : v_ranks) r += x;
  return r;
}

int Config::k_cache_width(int l) const {
  return low_rank.empty() ? k_dim(l) : low_rank[static_cast<std::size_t>(l)].k_rank();
}
int Config::v_cache_width(int l) const {
  return low_rank.empty() ? v_dim(l) : low_rank[static_cast<std::size_t>(l)].v_rank();
}

std::uint64_t Config::kv_params(int l) const {
  const std::uint64_t d = d_model;
  if (low_rank.empty()) return d * static_cast<std::uint64_t>(k_dim(l) + v_dim(l));
  const LayerLowRank& r = low_rank[static_cast<std::size_t>(l)];
  const std::uint64_t gd = static_cast<std::uint64_t>(lr_group) * head_dim;
  return (d + gd) * static_cast<std::uint64_t>(r.k_rank() + r.v_rank());
}

std::uint64_t Config::n_params() const {
  const std::uint64_t d = d_model, v = vocab;
  std::uint64_t n = v * d * (tied_embeddings ? 1 : 2) + d;
  for (int l = 0; l < n_layer; ++l)
    n += 2 * d                                                                   // norms
         + d * static_cast<std::uint64_t>(q_dim(l) + att_dim(l)) + kv_params(l)  // q o, k v
         + 3 * d * static_cast<std::uint64_t>(d_ff_at(l))                        // gate, up, down
         + (structure.empty() ? 0 : 2 * d);                                      // o, down biases
  return n;
}

namespace {
template <class F>
int widest(int n_layer, F&& f) {
  int m = 0;
  for (int l = 0; l < n_layer; ++l) m = std::max(m, f(l));
  return m;
}
}  // namespace

int Config::max_q_dim() const {
  return widest(n_layer, [this](int l) { return q_dim(l); });
}
int Config::max_k_dim() const {
  return widest(n_layer, [this](int l) { return k_dim(l); });
}
int Config::max_v_dim() const {
  return widest(n_layer, [this](int l) { return v_dim(l); });
}
int Config::max_att_dim() const {
  return widest(n_layer, [this](int l) { return att_dim(l); });
}

namespace {
/// The distinct reduced K widths of a naive-RoPE model, ascending (their frequency blocks follow
/// the full head's in rope_inv_freq), and the first table column of width w's block.
std::vector<int> naive_widths(const Config& c) {
  std::vector<int> ws;
  for (int l = 0; l < c.n_layer; ++l) ws.push_back(c.qk_head_dim(l));
  std::sort(ws.begin(), ws.end());
  ws.erase(std::unique(ws.begin(), ws.end()), ws.end());
  return ws;
}
int naive_block(const Config& c, int w) {
  int col = c.head_dim / 2;
  for (int x : naive_widths(c)) {
    if (x == w) return col;
    col += x / 2;
  }
  fail("no naive RoPE block of width {}", w);
}
}  // namespace

RopeUnits Config::rope_units(int l) const {
  const int w = qk_head_dim(l);
  if (naive_rope()) {  // the pairs of a head of width w, in this model's layout
    RopeUnits u;
    u.units = w / 2;
    const int col = naive_block(*this, w);
    for (int h = 0; h < n_kv_head; ++h)
      for (int i = 0; i < w / 2; ++i) {
        u.i0.push_back(rope_layout == RopeLayout::Adjacent ? 2 * i : i);
        u.i1.push_back(rope_layout == RopeLayout::Adjacent ? 2 * i + 1 : i + w / 2);
        u.freq.push_back(col + i);
      }
    return u;
  }
  std::vector<std::vector<int>> i0(static_cast<std::size_t>(n_kv_head)), i1(i0), fr(i0);
  std::size_t most = 0;
  for (int h = 0; h < n_kv_head; ++h) {
    // position of every kept full-head channel in the reduced head (−1: cut)
    std::vector<int> at(static_cast<std::size_t>(head_dim), -1);
    for (int i = 0; i < w; ++i) at[static_cast<std::size_t>(k_channel(l, h, i))] = i;
    // units in the order of their first kept channel, so a dense head lists its pairs by j
    for (int i = 0; i < w; ++i) {
      const int c = k_channel(l, h, i);
      const int partner = at[static_cast<std::size_t>(rope_partner(c))];
      if (partner >= 0 && !rope_first(c)) continue;  // listed with its first member
      i0[h].push_back(i);
      i1[h].push_back(partner);
      fr[h].push_back(rope_freq_index(c));
    }
    most = std::max(most, i0[h].size());
  }
  RopeUnits u;
  u.units = static_cast<int>(most);
  for (int h = 0; h < n_kv_head; ++h) {
    i0[h].resize(most, -1);
    i1[h].resize(most, -1);
    fr[h].resize(most, 0);
    u.i0.insert(u.i0.end(), i0[h].begin(), i0[h].end());
    u.i1.insert(u.i1.end(), i1[h].begin(), i1[h].end());
    u.freq.insert(u.freq.end(), fr[h].begin(), fr[h].end());
  }
  return u;
}

std::vector<double> Config::rope_inv_freq(const std::vector<float>& freq_factors) const {
  const int half = head_dim / 2;
  require(freq_factors.empty() || static_cast<int>(freq_factors.size()) == half,
          "rope_freqs has {} entries, expected head_dim/2 = {}", freq_factors.size(), half);
  std::vector<double> inv(half);
  for (int j = 0; j < half; ++j) {
    double f = std::pow(static_cast<double>(rope_theta), -2.0 * j / head_dim);
    if (rope_scaling.enabled) {
      // Llama-3: long wavelengths are divided by `factor`, short ones kept, a smooth ramp between.
      const double pi = 3.14159265358979323846;
      const double wavelen = 2 * pi / f;
      const double lo_wl = rope_scaling.original_context / rope_scaling.low_freq_factor;
      const double hi_wl = rope_scaling.original_context / rope_scaling.high_freq_factor;
      if (wavelen > lo_wl) {
        f = f / rope_scaling.factor;
      } else if (wavelen >= hi_wl) {
        const double smooth =
            (rope_scaling.original_context / wavelen - rope_scaling.low_freq_factor) /
            (rope_scaling.high_freq_factor - rope_scaling.low_freq_factor);
        f = (1 - smooth) * f / rope_scaling.factor + smooth * f;
      }
    }
    if (!freq_factors.empty()) f /= freq_factors[j];
    inv[j] = f;
  }
  if (naive_rope()) {
    require(!rope_scaling.enabled && freq_factors.empty(),
            "a naively re-paired pruned model (kvpruner-naive) needs plain RoPE: this model scales "
            "its frequencies (Llama-3 rope_scaling or rope_freqs)");
    for (int w : naive_widths(*this))
      for (int i = 0; i < w / 2; ++i)
        inv.push_back(std::pow(static_cast<double>(rope_theta), -2.0 * i / w));
  }
  return inv;
}

}  // namespace sparsim
