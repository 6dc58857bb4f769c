#include "engine/kv_cache.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"

#include <algorithm>

namespace sparsim {

template <class E>
KVCache<E>::KVCache(const Config& c, int max_seqs, int max_ctx)
    : max_seqs_(max_seqs), max_ctx_(max_ctx) {
  require(max_seqs > 0 && max_ctx > 0, "KV cache: {} sequences × {} positions", max_seqs, max_ctx);
  for (int l = 0; l < c.n_layer; ++l) {
    shapes_.push_back(attn_shape(c, l));
    KVLayer<E> kl;
    // a low-rank layer caches its latents (Config::k_cache_width)
    kl.k = Cache<E>("sparsim::kcache", max_seqs, max_ctx, c.k_cache_width(l));
    kl.v = Cache<E>("sparsim::vcache", max_seqs, max_ctx, c.v_cache_width(l));
    layers_.push_back(kl);
  }
  kept_counts_.resize(static_cast<std::size_t>(c.n_layer));
  kept_tokens_.resize(static_cast<std::size_t>(c.n_layer));
  evict_len_.assign(static_cast<std::size_t>(c.n_layer), 0);
  const std::size_t L = static_cast<std::size_t>(c.n_layer), S = static_cast<std::size_t>(max_seqs);
  written_.assign(L, std::vector<int>(S, 0));
  n_dropped_.assign(L, std::vector<int>(S, 0));
  h_dropped_.resize(L);
  slot_pos_.assign(L, std::vector<std::vector<int>>(S));
}

template <class E>
void KVCache<E>::forget_from(int l, int s, int p0) {
  const std::size_t lu = static_cast<std::size_t>(l), su = static_cast<std::size_t>(s);
  int& w = written_[lu][su];
  if (p0 < w) {
    if (layer(l).tokens_compact) {
      auto& sp = slot_pos_[lu][su];
      while (!sp.empty() && sp.back() >= p0) sp.pop_back();
    } else if (!h_dropped_[lu].empty()) {
      std::uint8_t* f = h_dropped_[lu].data() + su * static_cast<std::size_t>(max_ctx_);
      for (int p = p0; p < w; ++p)
        if (f[p]) f[p] = 0, --n_dropped_[lu][su];
    }
  }
  w = p0;
}

template <class E>
void KVCache<E>::note_written(int l, int n_seq, int T, int p0) {
  for (int s = 0; s < n_seq; ++s) {
    forget_from(l, s, p0);
    written_[static_cast<std::size_t>(l)][static_cast<std::size_t>(s)] = p0 + T;
  }
}

template <class E>
int KVCache<E>::held(int l, int s) const {
  const std::size_t lu = static_cast<std::size_t>(l), su = static_cast<std::size_t>(s);
  if (layer(l).tokens_compact) return static_cast<int>(slot_pos_[lu][su].size());
  return written_[lu][su] - n_dropped_[lu][su];
}

template <class E>
void KVCache<E>::reset_tokens(int l) {
  const std::size_t lu = static_cast<std::size_t>(l);
  std::fill(written_[lu].begin(), written_[lu].end(), 0);
  std::fill(n_dropped_[lu].begin(), n_dropped_[lu].end(), 0);
  std::fill(h_dropped_[lu].begin(), h_dropped_[lu].end(), std::uint8_t{0});
  for (auto& sp : slot_pos_[lu]) sp.clear();
  KVLayer<E>& kl = layers_[lu];
  if (kl.tokens_compact) {  // a new prompt: the buffers grow again from nothing
    kl.k = Cache<E>();
    kl.v = Cache<E>();
  }
}

template <class E>
void KVCache<E>::set_token_compaction(int l, bool on) {
  KVLayer<E>& kl = layers_[static_cast<std::size_t>(l)];
  if (kl.tokens_compact == on) return;
  require(!kl.compacted() && !kl.has_evictions(),
          "KV cache: layer {} has compacted keys or evicts tokens; token compaction needs the "
          "dense layout",
          l);
  kl.tokens_compact = on;
  kl.dropped = IMat<E>();  // (a masked layer's flags; positions are slots from here on)
  kl.k = Cache<E>();
  kl.v = Cache<E>();
  if (!on) {
    kl.k = Cache<E>("sparsim::kcache", max_seqs_, max_ctx_, shape(l).k_width());
    kl.v = Cache<E>("sparsim::vcache", max_seqs_, max_ctx_, shape(l).v_width());
  }
  reset_tokens(l);
}

template <class E>
std::vector<int> KVCache<E>::store_kept(const E& exec, int l, const CMat<E>& k, const CMat<E>& v,
                                        const int* h_skip, int n_seq, int T, int p0) {
  KVLayer<E>& kl = layers_[static_cast<std::size_t>(l)];
  require(kl.tokens_compact, "KV cache: layer {} is not token-compacted", l);
  require(p0 >= 0 && p0 + T <= max_ctx_ && n_seq <= max_seqs_, "KV cache: rows beyond the cache");
  const int n = n_seq * T;
  std::vector<int> slot(static_cast<std::size_t>(n), -1);
  int need = 0;
  for (int s = 0; s < n_seq; ++s) {
    forget_from(l, s, p0);
    written_[static_cast<std::size_t>(l)][static_cast<std::size_t>(s)] = p0 + T;
    auto& sp = slot_pos_[static_cast<std::size_t>(l)][static_cast<std::size_t>(s)];
    for (int t = 0; t < T; ++t) {
      const int r = s * T + t;
      if (h_skip && h_skip[r]) continue;
      slot[static_cast<std::size_t>(r)] = static_cast<int>(sp.size());
      sp.push_back(p0 + t);
    }
    need = std::max(need, static_cast<int>(sp.size()));
  }
  const int cap = capacity(l);
  if (need > cap) {
    // grow to whole pages; the held slots move, the rest is never read before it is written
    const int nc = std::min(max_ctx_, (need + kTokenPage - 1) / kTokenPage * kTokenPage);
    const int kw = shape(l).k_width(), vw = shape(l).v_width();
    Cache<E> nk(
        Kokkos::view_alloc(std::string("sparsim::kcache_tokens"), Kokkos::WithoutInitializing),
        max_seqs_, nc, kw),
        nv(Kokkos::view_alloc(std::string("sparsim::vcache_tokens"), Kokkos::WithoutInitializing),
           max_seqs_, nc, vw);
    if (cap > 0) {
      const auto cut = std::make_pair(0, cap);
      Kokkos::deep_copy(exec, Kokkos::subview(nk, Kokkos::ALL, cut, Kokkos::ALL), kl.k);
      Kokkos::deep_copy(exec, Kokkos::subview(nv, Kokkos::ALL, cut, Kokkos::ALL), kl.v);
      exec.fence();
    }
    kl.k = nk;
    kl.v = nv;
  }
  if (n == 0) return slot;
  if (slot_dev_.extent(0) < static_cast<std::size_t>(n))
    slot_dev_ = IVec<E>("sparsim::kv_slots", n);
  const IVec<E> dst(slot_dev_.data(), n);
  auto hd = Kokkos::create_mirror_view(dst);
  for (int r = 0; r < n; ++r) hd(r) = slot[static_cast<std::size_t>(r)];
  Kokkos::deep_copy(exec, dst, hd);
  const auto K = kl.k, V = kl.v;
  const int kd = static_cast<int>(k.extent(1)), vd = static_cast<int>(v.extent(1));
  const int wd = kd > vd ? kd : vd;
  Kokkos::parallel_for(
      "sparsim::engine::kv_store_kept",
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>(exec, {0, 0}, {n, wd})),
      KOKKOS_LAMBDA(const int r, const int j) {
        const int p = dst(r);
        if (p < 0) return;
        const int s = r / T;
        if (j < kd) K(s, p, j) = k(r, j);
        if (j < vd) V(s, p, j) = v(r, j);
      });
  return slot;
}

template <class E>
void KVCache<E>::store(const E& exec, int l, const CMat<E>& k, const CMat<E>& v, int n_seq, int T,
                       int p0) {
  const KVLayer<E>& kl = layer(l);
  require(p0 >= kl.k_base,
          "KV cache: layer {} holds compacted keys up to position {}; cannot write position {}", l,
          kl.k_base - 1, p0);
  require(!kl.tokens_compact,
          "KV cache: layer {} holds only the kept tokens of its sequences (store_kept writes it)",
          l);
  require(p0 + T <= max_ctx_ && n_seq <= max_seqs_, "KV cache: rows beyond the cache");
  note_written(l, n_seq, T, p0);
  kv_store(exec, k, v, kl.k, kl.v, n_seq, T, p0, kl.k_base);
}

template <class E>
void KVCache<E>::set_dropped(const E& exec, int l, const IVec<E>& skip, const int* h_skip,
                             int n_seq, int T, int p0) {
  KVLayer<E>& kl = layers_[static_cast<std::size_t>(l)];
  const std::size_t lu = static_cast<std::size_t>(l);
  if (h_skip) {
    auto& hd = h_dropped_[lu];
    if (hd.empty()) hd.assign(static_cast<std::size_t>(max_seqs_) * max_ctx_, 0);
    for (int s = 0; s < n_seq; ++s)
      for (int t = 0; t < T; ++t) {
        std::uint8_t& f = hd[static_cast<std::size_t>(s) * max_ctx_ + p0 + t];
        const std::uint8_t now = h_skip[s * T + t] ? 1 : 0;
        n_dropped_[lu][static_cast<std::size_t>(s)] += now - f;
        f = now;
      }
  }
  if (!kl.has_drops()) kl.dropped = IMat<E>("sparsim::kv_dropped", max_seqs_, max_ctx_);
  auto d = kl.dropped;
  Kokkos::parallel_for(
      "sparsim::engine::kv_set_dropped", light(Kokkos::RangePolicy<E>(exec, 0, n_seq * T)),
      KOKKOS_LAMBDA(const int r) { d(r / T, p0 + r % T) = skip(r) ? 1 : 0; });
}

template <class E>
void KVCache<E>::clear_dropped(int l) {
  KVLayer<E>& kl = layers_[static_cast<std::size_t>(l)];
  if (kl.has_drops()) Kokkos::deep_copy(kl.dropped, 0);
}

template <class E>
void KVCache<E>::evict(const E& exec, int l, const KeptTokens& kept) {
  KVLayer<E>& kl = layers_[static_cast<std::size_t>(l)];
  const AttnShape& sh = shape(l);
  require(!kl.has_evictions(), "KV cache: layer {} already evicts tokens", l);
  require(!kl.tokens_compact, "KV cache: layer {} holds only kept tokens; it cannot evict", l);
  const int P = kept.positions;
  require(P >= 1 && P <= max_ctx_, "KV cache: cannot evict from {} positions of {}", P, max_ctx_);
  require(static_cast<int>(kept.idx.size()) <= max_seqs_,
          "KV cache: kept tokens for {} sequences, the cache holds {}", kept.idx.size(), max_seqs_);
  if (kl.evicted.extent(0) == 0)
    kl.evicted = IMat3<E>("sparsim::kv_evicted", max_seqs_, sh.n_kv_head, max_ctx_);
  auto hm = Kokkos::create_mirror_view(kl.evicted);
  Kokkos::deep_copy(hm, 0);
  for (std::size_t s = 0; s < kept.idx.size(); ++s) {
    require(static_cast<int>(kept.idx[s].size()) == sh.n_kv_head,
            "KV cache: sequence {} has kept tokens for {} heads, layer {} has {}", s,
            kept.idx[s].size(), l, sh.n_kv_head);
    for (int h = 0; h < sh.n_kv_head; ++h) {
      const auto& pos = kept.idx[s][static_cast<std::size_t>(h)];
      for (std::size_t i = 0; i < pos.size(); ++i)
        require(pos[i] >= 0 && pos[i] < P && (i == 0 || pos[i] > pos[i - 1]),
                "KV cache: kept positions of head {} must be ascending, distinct and below {}", h,
                P);
      std::size_t i = 0;
      for (int p = 0; p < P; ++p) {
        const bool keep = i < pos.size() && pos[i] == p;
        if (keep) ++i;
        hm(static_cast<int>(s), h, p) = keep ? 0 : 1;
      }
    }
  }
  Kokkos::deep_copy(exec, kl.evicted, hm);
  exec.fence();
  kl.evicts = true;
  kept_tokens_[static_cast<std::size_t>(l)] = kept.idx;
  evict_len_[static_cast<std::size_t>(l)] = P;
}

template <class E>
void KVCache<E>::compact_evicted(const E& exec, int l) {
  KVLayer<E>& kl = layers_[static_cast<std::size_t>(l)];
  const AttnShape& sh = shape(l);
  const auto& toks = kept_tokens_[static_cast<std::size_t>(l)];
  const int P = evict_len_[static_cast<std::size_t>(l)];
  require(kl.has_evictions() && !kl.tokens_compact && !kl.has_gap(),
          "KV cache: layer {} cannot move its kept tokens together", l);
  const int n_seq = static_cast<int>(toks.size()), nkv = sh.n_kv_head;
  const int base = kl.k_base;
  // per head: the kept tokens it attends to (a token gate's dropped positions left out: the
  // evictor's recent window and sinks keep positions whatever the gate did), and of those the
  // ones with compact keys (below k_base)
  const auto& hdrop = h_dropped_[static_cast<std::size_t>(l)];
  std::vector<std::vector<int>> moved(static_cast<std::size_t>(n_seq * nkv));
  std::vector<int> kept(moved.size()), compact(moved.size());
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < nkv; ++h) {
      const auto& kp = toks[static_cast<std::size_t>(s)][static_cast<std::size_t>(h)];
      const std::size_t i = static_cast<std::size_t>(s * nkv + h);
      for (int p : kp)
        if (hdrop.empty() || !hdrop[static_cast<std::size_t>(s) * max_ctx_ + p])
          moved[i].push_back(p);
      kept[i] = static_cast<int>(moved[i].size());
      compact[i] = static_cast<int>(std::lower_bound(moved[i].begin(), moved[i].end(), base) -
                                    moved[i].begin());
    }
  // the region whose tokens go to its first slots: the compact keys' when there are any (the
  // full-width recent window after them keeps its own region), else the whole prompt
  const std::vector<int>& in_region = base > 0 ? compact : kept;
  const int region = base > 0 ? std::min(base, P) : P;
  const int widest = kept.empty() ? 0 : *std::max_element(kept.begin(), kept.end());
  const int widest_in_region =
      in_region.empty() ? 0 : *std::max_element(in_region.begin(), in_region.end());
  IMat3<E> pos("sparsim::kv_evict_kept", std::max(1, n_seq), nkv, std::max(1, widest));
  IMat<E> cnt("sparsim::kv_evict_count", std::max(1, n_seq),
              2 * nkv);  // [s][h]: kept, [s][nkv + h]: compact
  auto hp = Kokkos::create_mirror_view(pos);
  auto hc = Kokkos::create_mirror_view(cnt);
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < nkv; ++h) {
      const std::size_t i = static_cast<std::size_t>(s * nkv + h);
      const auto& kp = moved[i];
      hc(s, h) = kept[i];
      hc(s, nkv + h) = compact[i];
      for (std::size_t j = 0; j < kp.size(); ++j) hp(s, h, static_cast<int>(j)) = kp[j];
    }
  Kokkos::deep_copy(exec, pos, hp);
  Kokkos::deep_copy(exec, cnt, hc);
  const auto K = kl.k, V = kl.v, KC = kl.kc, koff = kl.koff;
  const auto ev = kl.evicted;
  const int qk = sh.qk_dim, vd = sh.v_dim, width = std::max(qk, vd);
  using R2 = Kokkos::MDRangePolicy<E, Kokkos::Rank<2>>;
  // One thread per (sequence, head, channel): the head's kept tokens in ascending order, each
  // moved down to the next slot of its region (compact keys below k_base, full-width keys from
  // k_base on; a slot is never after the token's position, so nothing is overwritten before it
  // is moved). Threads own disjoint columns.
  Kokkos::parallel_for(
      "sparsim::kv_cache::compact_evicted", R2(exec, {0, 0}, {n_seq * nkv, width}),
      KOKKOS_LAMBDA(const int i, const int c) {
        const int s = i / nkv, h = i % nkv, n = cnt(s, h), na = cnt(s, nkv + h);
        const int c0 = base > 0 ? koff(s, h) : 0, nc = base > 0 ? koff(s, h + 1) - c0 : 0;
        for (int j = 0; j < n; ++j) {
          const int p = pos(s, h, j);
          const int q = j < na ? j : base + (j - na);
          if (p == q) continue;
          if (c < vd) V(s, q, h * vd + c) = V(s, p, h * vd + c);
          if (p < base) {
            if (c < nc)
              compact_key_row(KC, s, base, c0, nc, q)[c] =
                  compact_key_row(KC, s, base, c0, nc, p)[c];
          } else if (c < qk) {
            K(s, q - base, h * qk + c) = K(s, p - base, h * qk + c);
          }
        }
      });
  // the head's other prompt slots are evicted
  Kokkos::parallel_for(
      "sparsim::kv_cache::compact_evicted_mask", R2(exec, {0, 0}, {n_seq * nkv, P}),
      KOKKOS_LAMBDA(const int i, const int q) {
        const int s = i / nkv, h = i % nkv, n = cnt(s, h), na = cnt(s, nkv + h);
        ev(s, h, q) = q < base ? (q >= na ? 1 : 0) : (q >= base + n - na ? 1 : 0);
      });
  // After the move every slot below a head's count holds a token it attends to and the rest are
  // evicted: the prompt's dropped flags (per position, not per head) no longer describe the
  // slots and are cleared. Later calls set the flags of their own positions, past the prompt.
  if (kl.has_drops()) {
    const auto dropped = kl.dropped;
    Kokkos::parallel_for(
        "sparsim::kv_cache::compact_evicted_drops", R2(exec, {0, 0}, {n_seq, P}),
        KOKKOS_LAMBDA(const int s, const int q) { dropped(s, q) = 0; });
  }
  exec.fence();
  constexpr int C = detail::kAttnChunk;
  const int g0 = (widest_in_region + C - 1) / C * C, g1 = region / C * C;
  if (g1 > g0) {
    kl.gap_begin = g0;
    kl.gap_end = g1;
  }
}

template <class E>
void KVCache<E>::clear_evicted(int l) {
  KVLayer<E>& kl = layers_[static_cast<std::size_t>(l)];
  kl.evicts = false;
  kl.gap_begin = kl.gap_end = 0;
  kept_tokens_[static_cast<std::size_t>(l)].clear();
  evict_len_[static_cast<std::size_t>(l)] = 0;
}

template <class E>
void KVCache<E>::prompt_bytes(int l, int n_seq, int T, double& dense, double& kept) const {
  const AttnShape& sh = shape(l);
  const KVLayer<E>& kl = layer(l);
  const auto& toks = kept_tokens(l);
  const auto& chans = kept_counts(l);
  dense = 4.0 * n_seq * T * (sh.k_width() + sh.v_width());
  kept = 0;
  for (int s = 0; s < n_seq; ++s)
    for (int h = 0; h < sh.n_kv_head; ++h) {
      const std::size_t su = static_cast<std::size_t>(s), hu = static_cast<std::size_t>(h);
      // key width of a compacted position: the head's kept channels
      const int kc = kl.compacted() && su < chans.size() ? chans[su][hu] : sh.qk_dim;
      auto add = [&](int p) { kept += 4.0 * ((p < kl.k_base ? kc : sh.qk_dim) + sh.v_dim); };
      if (kl.has_evictions() && su < toks.size()) {
        for (int p : toks[su][hu]) add(p);
        for (int p = evicted_positions(l); p < T; ++p) add(p);
      } else {
        for (int p = 0; p < T; ++p) add(p);
      }
    }
}

template <class E>
void KVCache<E>::compact_keys(const E& exec, int l, const KeptChannels& kept) {
  KVLayer<E>& kl = layers_[static_cast<std::size_t>(l)];
  const AttnShape& sh = shape(l);
  require(!kl.compacted(), "KV cache: layer {} is already compacted", l);
  require(!kl.tokens_compact,
          "KV cache: layer {} holds only kept tokens; its key channels cannot be compacted", l);
  const int P = kept.positions;
  require(P >= 1 && P <= max_ctx_, "KV cache: cannot compact {} positions of {}", P, max_ctx_);
  require(static_cast<int>(kept.idx.size()) <= max_seqs_,
          "KV cache: kept channels for {} sequences, the cache holds {}", kept.idx.size(),
          max_seqs_);
  // Host tables: per sequence the head offsets and the channel of every compact column.
  std::vector<std::vector<int>> counts(static_cast<std::size_t>(max_seqs_),
                                       std::vector<int>(sh.n_kv_head, 0));
  int cap = 1;  // at least one column, so the views are never empty
  for (std::size_t s = 0; s < kept.idx.size(); ++s) {
    require(static_cast<int>(kept.idx[s].size()) == sh.n_kv_head,
            "KV cache: sequence {} has kept channels for {} heads, layer {} has {}", s,
            kept.idx[s].size(), l, sh.n_kv_head);
    int tot = 0;
    for (int h = 0; h < sh.n_kv_head; ++h) {
      const auto& ch = kept.idx[s][static_cast<std::size_t>(h)];
      for (std::size_t i = 0; i < ch.size(); ++i) {
        require(ch[i] >= 0 && ch[i] < sh.qk_dim,
                "KV cache: kept channel {} of head {} is outside 0 … {}", ch[i], h, sh.qk_dim - 1);
        require(i == 0 || ch[i] > ch[i - 1],
                "KV cache: kept channels of head {} must be ascending and distinct", h);
      }
      counts[s][static_cast<std::size_t>(h)] = static_cast<int>(ch.size());
      tot += static_cast<int>(ch.size());
    }
    cap = std::max(cap, tot);
  }
  IMat<E> kidx("sparsim::kcache_idx", max_seqs_, cap),
      koff("sparsim::kcache_off", max_seqs_, sh.n_kv_head + 1);
  auto hi = Kokkos::create_mirror_view(kidx);
  auto ho = Kokkos::create_mirror_view(koff);
  Kokkos::deep_copy(hi, 0);
  for (int s = 0; s < max_seqs_; ++s) {
    int c = 0;
    for (int h = 0; h < sh.n_kv_head; ++h) {
      ho(s, h) = c;
      if (s < static_cast<int>(kept.idx.size()))
        for (int ch : kept.idx[static_cast<std::size_t>(s)][static_cast<std::size_t>(h)])
          hi(s, c++) = ch;
    }
    ho(s, sh.n_kv_head) = c;
  }
  Kokkos::deep_copy(kidx, hi);
  Kokkos::deep_copy(koff, ho);

  const int qk = sh.qk_dim, nkv = sh.n_kv_head, kw = sh.k_width();
  // One block per head, positions × kept channels, so that a head's decode reads one
  // contiguous stream: sequence s's P·cap floats hold head h's block at koff(s, h)·P, row p of
  // it at + p·n_h (n_h = koff(s, h + 1) − koff(s, h) kept channels).
  Cache<E> kc(
      Kokkos::view_alloc(std::string("sparsim::kcache_compact"), Kokkos::WithoutInitializing),
      max_seqs_, P, cap);
  Cache<E> rest("sparsim::kcache", max_seqs_, max_ctx_ - P, kw);
  const Cache<E> old = kl.k;
  Kokkos::parallel_for(
      "sparsim::engine::kv_compact",
      light(Kokkos::MDRangePolicy<E, Kokkos::Rank<3>>(exec, {0, 0, 0}, {max_seqs_, nkv, P})),
      KOKKOS_LAMBDA(const int s, const int h, const int p) {
        const int c0 = koff(s, h), nc = koff(s, h + 1) - c0;
        float* dst = compact_key_row(kc, s, P, c0, nc, p);
        for (int j = 0; j < nc; ++j) dst[j] = old(s, p, h * qk + kidx(s, c0 + j));
      });
  const int n_rest = max_ctx_ - P;
  if (n_rest > 0)
    Kokkos::parallel_for(
        "sparsim::engine::kv_compact_rest",
        light(Kokkos::MDRangePolicy<E, Kokkos::Rank<3>>(exec, {0, 0, 0}, {max_seqs_, n_rest, kw})),
        KOKKOS_LAMBDA(const int s, const int p, const int j) { rest(s, p, j) = old(s, P + p, j); });
  exec.fence();
  kl.kc = kc;
  kl.kidx = kidx;
  kl.koff = koff;
  kl.k = rest;  // the dense key buffer is released here
  kl.k_base = P;
  kept_counts_[static_cast<std::size_t>(l)] = counts;
}

template <class E>
void KVCache<E>::reset_layout(int l) {
  KVLayer<E>& kl = layers_[static_cast<std::size_t>(l)];
  if (!kl.compacted()) return;
  kl.kc = Cache<E>();
  kl.kidx = IMat<E>();
  kl.koff = IMat<E>();
  kl.k = Cache<E>();  // release before allocating the dense buffer
  kl.k = Cache<E>("sparsim::kcache", max_seqs_, max_ctx_, shape(l).k_width());
  kl.k_base = 0;
  kept_counts_[static_cast<std::size_t>(l)].clear();
}

template <class E>
std::size_t KVCache<E>::k_bytes(int l) const {
  const KVLayer<E>& kl = layer(l);
  return sizeof(float) * (kl.k.span() + kl.kc.span()) +
         sizeof(int) * (kl.kidx.span() + kl.koff.span());
}

template <class E>
std::size_t KVCache<E>::v_bytes(int l) const {
  return sizeof(float) * layer(l).v.span();
}

template <class E>
std::size_t KVCache<E>::bytes() const {
  std::size_t b = 0;
  for (int l = 0; l < n_layer(); ++l) b += k_bytes(l) + v_bytes(l);
  return b;
}

#define SPARSIM_INSTANTIATE_K_V_CACHE(E) template class KVCache<E>;
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_K_V_CACHE)

}  // namespace sparsim
