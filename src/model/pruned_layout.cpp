#include "model/pruned_layout.hpp"

#include "core/error.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"

namespace sparsim {

namespace {

std::vector<int> int_array(const gguf::File& f, const char* key, std::size_t want) {
  const std::vector<std::int64_t> v = f.require_int_array(key);
  require(v.size() == want, "{}: metadata key '{}' has {} entries, expected {}", f.path(), key,
          v.size(), want);
  std::vector<int> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    require(v[i] >= 0 && v[i] <= 0x7fffffff, "{}: metadata key '{}' entry {} is {}", f.path(), key,
            i, v[i]);
    out[i] = static_cast<int>(v[i]);
  }
  return out;
}

/// sparsim.prune.* of f into c.prune (a pruned or low-rank layout was found).
void read_record(const gguf::File& f, Config& c) {
  using namespace prune_keys;
  c.prune = PruneRecord{};
  c.prune.method = f.get_string(kMethod).value_or("");
  require(!c.prune.method.empty(), "{}: pruned layout without '{}'", f.path(), kMethod);
  c.prune.retain = f.get_float(kRetain).value_or(0.0);
  require(c.prune.retain > 0 && c.prune.retain <= 1, "{}: metadata key '{}' = {} is outside (0, 1]",
          f.path(), kRetain, c.prune.retain);
  c.prune.flops_context = static_cast<int>(f.get_uint(kFlopsContext).value_or(0));
  c.prune.source_fingerprint = f.get_string(kSource).value_or("");
  c.prune.calibration = f.get_string(kCalibration).value_or("");
  c.prune.recipe = f.get_string(kRecipe).value_or("");
}

void write_record(gguf::Writer& w, const Config& c) {
  using namespace prune_keys;
  w.set(kMethod, c.prune.method);
  w.set(kRetain, c.prune.retain);
  w.set(kFlopsContext, static_cast<std::uint32_t>(c.prune.flops_context));
  w.set(kSource, c.prune.source_fingerprint);
  w.set(kCalibration, c.prune.calibration);
  if (!c.prune.recipe.empty()) w.set(kRecipe, c.prune.recipe);
}

/// The low-rank K/V layout (sparsim.low_rank.*) of f into c.low_rank; false when absent.
bool read_low_rank(const gguf::File& f, Config& c) {
  using namespace prune_keys;
  if (!f.has(kLowRankGroup) && !f.has(kLowRankKeyRanks) && !f.has(kLowRankValueRanks)) return false;
  const auto g = f.get_uint(kLowRankGroup);
  require(g && *g >= 1 && c.n_kv_head % static_cast<int>(*g) == 0,
          "{}: metadata key '{}' must divide the {} KV heads", f.path(), kLowRankGroup,
          c.n_kv_head);
  c.lr_group = static_cast<int>(*g);
  const std::size_t G = static_cast<std::size_t>(c.n_kv_head / c.lr_group);
  const auto L = static_cast<std::size_t>(c.n_layer);
  const std::vector<int> kr = int_array(f, kLowRankKeyRanks, L * G);
  const std::vector<int> vr = int_array(f, kLowRankValueRanks, L * G);
  c.low_rank.assign(L, LayerLowRank{});
  for (std::size_t l = 0; l < L; ++l) {
    c.low_rank[l].k_ranks.assign(kr.begin() + static_cast<std::ptrdiff_t>(l * G),
                                 kr.begin() + static_cast<std::ptrdiff_t>((l + 1) * G));
    c.low_rank[l].v_ranks.assign(vr.begin() + static_cast<std::ptrdiff_t>(l * G),
                                 vr.begin() + static_cast<std::ptrdiff_t>((l + 1) * G));
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: inconsistent low-rank layout: {}", f.path(), e.what());
  }
  read_record(f, c);
  return true;
}

bool any_structure(const gguf::File& f) {
  using namespace prune_keys;
  return f.has(kHeadCounts) || f.has(kQueryHeads) || f.has(kFfnWidths) || f.has(kFfnChannels);
}

/// The structural layout (sparsim.structure.*) of f into c.structure; false when absent.
bool read_structure(const gguf::File& f, Config& c) {
  using namespace prune_keys;
  if (!any_structure(f)) return false;
  const auto L = static_cast<std::size_t>(c.n_layer);
  const std::vector<int> hc = int_array(f, kHeadCounts, L);
  const std::vector<int> fc = int_array(f, kFfnWidths, L);
  std::size_t nh = 0, nf = 0;
  for (std::size_t l = 0; l < L; ++l) {
    require(hc[l] >= 1 && hc[l] <= c.n_head && fc[l] >= 1 && fc[l] <= c.d_ff,
            "{}: layer {} keeps {} query heads ('{}') and {} FFN channels ('{}'); they must be in "
            "1 … {} and 1 … {}",
            f.path(), l, hc[l], kHeadCounts, fc[l], kFfnWidths, c.n_head, c.d_ff);
    nh += static_cast<std::size_t>(hc[l]);
    nf += static_cast<std::size_t>(fc[l]);
  }
  const std::vector<int> qh = int_array(f, kQueryHeads, nh);
  const std::vector<int> fch = int_array(f, kFfnChannels, nf);
  c.structure.assign(L, LayerStructure{});
  std::size_t oh = 0, of = 0;
  for (std::size_t l = 0; l < L; ++l) {
    const auto h = static_cast<std::ptrdiff_t>(oh), g = static_cast<std::ptrdiff_t>(of);
    c.structure[l].q_heads.assign(qh.begin() + h, qh.begin() + h + hc[l]);
    c.structure[l].ffn.assign(fch.begin() + g, fch.begin() + g + fc[l]);
    oh += static_cast<std::size_t>(hc[l]);
    of += static_cast<std::size_t>(fc[l]);
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: inconsistent structural layout: {}", f.path(), e.what());
  }
  read_record(f, c);
  return true;
}

}  // namespace

void read_structure_counts(const gguf::File& f, int n_layer, std::vector<std::int64_t>& heads,
                           std::vector<std::int64_t>& ffn) {
  heads.clear();
  ffn.clear();
  if (!any_structure(f)) return;
  const auto L = static_cast<std::size_t>(n_layer);
  for (const int x : int_array(f, prune_keys::kHeadCounts, L)) heads.push_back(x);
  for (const int x : int_array(f, prune_keys::kFfnWidths, L)) ffn.push_back(x);
}

void read_pruned_layout(const gguf::File& f, Config& c) {
  using namespace prune_keys;
  const bool any = f.has(kKeyWidths) || f.has(kValueWidths) || f.has(kKeyChannels) ||
                   f.has(kValueChannels) || f.has(kFreqIndex);
  if (!any) {
    require(!(any_structure(f) && f.has(kLowRankGroup)),
            "{}: both a structural layout and low-rank K/V factors", f.path());
    if (read_structure(f, c)) return;
    if (read_low_rank(f, c)) return;
    require(!f.has(kMethod), "{}: metadata key '{}' is set but the per-layer widths ('{}') are not",
            f.path(), kMethod, kKeyWidths);
    return;
  }
  require(!f.has(kLowRankGroup), "{}: both a pruned layout and low-rank K/V factors", f.path());
  require(!any_structure(f), "{}: both pruned head widths and a structural layout", f.path());
  const auto L = static_cast<std::size_t>(c.n_layer);
  const std::vector<int> kw = int_array(f, kKeyWidths, L);
  const std::vector<int> vw = int_array(f, kValueWidths, L);
  std::size_t nk = 0, nv = 0;
  for (std::size_t l = 0; l < L; ++l) {
    require(kw[l] >= 1 && kw[l] <= c.head_dim && vw[l] >= 1 && vw[l] <= c.head_dim,
            "{}: layer {} has q/k head width {} ('{}') and v head width {} ('{}'); both must be in "
            "1 … {} (llama.attention.key_length)",
            f.path(), l, kw[l], kKeyWidths, vw[l], kValueWidths, c.head_dim);
    nk += static_cast<std::size_t>(c.n_kv_head) * kw[l];
    nv += static_cast<std::size_t>(c.n_kv_head) * vw[l];
  }
  const std::vector<int> kc = int_array(f, kKeyChannels, nk);
  const std::vector<int> vc = int_array(f, kValueChannels, nv);
  const std::vector<int> fi = int_array(f, kFreqIndex, nk);
  c.attn.assign(L, LayerAttention{});
  std::size_t ok = 0, ov = 0;
  for (std::size_t l = 0; l < L; ++l) {
    LayerAttention& a = c.attn[l];
    a.qk_dim = kw[l];
    a.v_dim = vw[l];
    const std::size_t k_n = static_cast<std::size_t>(c.n_kv_head) * kw[l];
    const std::size_t v_n = static_cast<std::size_t>(c.n_kv_head) * vw[l];
    a.k_channels.assign(kc.begin() + static_cast<std::ptrdiff_t>(ok),
                        kc.begin() + static_cast<std::ptrdiff_t>(ok + k_n));
    a.v_channels.assign(vc.begin() + static_cast<std::ptrdiff_t>(ov),
                        vc.begin() + static_cast<std::ptrdiff_t>(ov + v_n));
    ok += k_n;
    ov += v_n;
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: inconsistent pruned layout: {}", f.path(), e.what());
  }
  ok = 0;
  for (std::size_t l = 0; l < L; ++l)
    for (int i = 0; i < c.n_kv_head * c.attn[l].qk_dim; ++i, ++ok) {
      const int ch = c.attn[l].k_channels[static_cast<std::size_t>(i)];
      require(fi[ok] == c.rope_freq_index(ch),
              "{}: metadata key '{}' gives frequency index {} to kept K channel {} of layer {}, "
              "whose RoPE frequency index is {}",
              f.path(), kFreqIndex, fi[ok], ch, l, c.rope_freq_index(ch));
    }
  read_record(f, c);
}

void write_pruned_layout(gguf::Writer& w, const Config& c) {
  using namespace prune_keys;
  if (c.low_rank_kv()) {
    c.validate();
    std::vector<std::int32_t> kr, vr;
    for (const LayerLowRank& r : c.low_rank) {
      kr.insert(kr.end(), r.k_ranks.begin(), r.k_ranks.end());
      vr.insert(vr.end(), r.v_ranks.begin(), r.v_ranks.end());
    }
    w.set(kLowRankGroup, static_cast<std::uint32_t>(c.lr_group));
    w.set(kLowRankKeyRanks, kr);
    w.set(kLowRankValueRanks, vr);
    write_record(w, c);
    return;
  }
  if (c.structured()) {
    c.validate();
    std::vector<std::uint32_t> hc, fc;
    std::vector<std::int32_t> qh, fch;
    for (const LayerStructure& s : c.structure) {
      hc.push_back(static_cast<std::uint32_t>(s.q_heads.size()));
      fc.push_back(static_cast<std::uint32_t>(s.ffn.size()));
      qh.insert(qh.end(), s.q_heads.begin(), s.q_heads.end());
      fch.insert(fch.end(), s.ffn.begin(), s.ffn.end());
    }
    w.set(kHeadCounts, hc);
    w.set(kQueryHeads, qh);
    w.set(kFfnWidths, fc);
    w.set(kFfnChannels, fch);
    write_record(w, c);
    return;
  }
  if (!c.pruned()) return;
  c.validate();
  std::vector<std::uint32_t> kw, vw;
  std::vector<std::int32_t> kc, vc, fi;
  for (const LayerAttention& a : c.attn) {
    kw.push_back(static_cast<std::uint32_t>(a.qk_dim));
    vw.push_back(static_cast<std::uint32_t>(a.v_dim));
    for (int ch : a.k_channels) {
      kc.push_back(ch);
      fi.push_back(c.rope_freq_index(ch));
    }
    vc.insert(vc.end(), a.v_channels.begin(), a.v_channels.end());
  }
  w.set(kKeyWidths, kw);
  w.set(kValueWidths, vw);
  w.set(kKeyChannels, kc);
  w.set(kValueChannels, vc);
  w.set(kFreqIndex, fi);
  write_record(w, c);
}

}  // namespace sparsim
