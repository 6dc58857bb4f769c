#include "model/consistency.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

namespace sparsim {

LlamaNames LlamaNames::gguf(const std::string& arch) {
  LlamaNames n;
  auto k = [&](const char* s) { return arch + "." + s; };
  n.n_layer = k("block_count");
  n.d_model = k("embedding_length");
  n.n_head = k("attention.head_count");
  n.n_kv_head = k("attention.head_count_kv");
  n.head_dim = k("attention.key_length");
  n.value_dim = k("attention.value_length");
  n.rope_dims = k("rope.dimension_count");
  n.d_ff = k("feed_forward_length");
  n.vocab = k("vocab_size");
  n.embd = "token_embd.weight";
  n.out_norm = "output_norm.weight";
  n.output = "output.weight";
  n.rope_freqs = "rope_freqs.weight";
  n.block_prefix = "blk.";
  n.block = {"attn_norm.weight", "attn_q.weight",      "attn_k.weight",
             "attn_v.weight",    "attn_output.weight", "ffn_norm.weight",
             "ffn_gate.weight",  "ffn_up.weight",      "ffn_down.weight"};
  n.inner_first = true;
  return n;
}

LlamaNames LlamaNames::hugging_face() {
  LlamaNames n;
  n.n_layer = "num_hidden_layers";
  n.d_model = "hidden_size";
  n.n_head = "num_attention_heads";
  n.n_kv_head = "num_key_value_heads";
  n.head_dim = "head_dim";
  n.d_ff = "intermediate_size";
  n.vocab = "vocab_size";
  n.tied = "tie_word_embeddings";
  n.embd = "model.embed_tokens.weight";
  n.out_norm = "model.norm.weight";
  n.output = "lm_head.weight";
  n.block_prefix = "model.layers.";
  n.block = {
      "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
  n.inner_first = false;
  return n;
}

namespace {

using Shape = std::vector<std::uint64_t>;

class Checker {
 public:
  Checker(const TensorShapes& t, const LlamaNames& n) : t_(t), n_(n) {}

  /// Outermost-first shape of a tensor, nullopt when absent.
  std::optional<Shape> shape(const std::string& name) const {
    auto it = t_.find(name);
    if (it == t_.end()) return std::nullopt;
    Shape s = it->second;
    if (n_.inner_first) std::reverse(s.begin(), s.end());
    return s;
  }
  /// An outermost-first shape as the file lists it.
  std::string str(Shape s) const {
    if (n_.inner_first) std::reverse(s.begin(), s.end());
    return fmt::format("[{}]", fmt::join(s, ", "));
  }
  std::string key(const std::string& k, std::int64_t v) const {
    return fmt::format("key '{}' = {}", k, v);
  }
  std::string block(int l, int i) const {
    return n_.block_prefix + std::to_string(l) + "." + n_.block[static_cast<std::size_t>(i)];
  }
  /// Missing / wrong shape of one tensor against its expected outermost-first shape.
  void expect(const std::string& name, const Shape& want, const char* from) {
    const auto s = shape(name);
    if (!s) {
      add(fmt::format("missing tensor '{}'", name));
    } else if (*s != want) {
      add(fmt::format("tensor '{}' has shape {}, expected {} from {}", name, str(*s), str(want),
                      from));
    }
  }
  void add(std::string p) { problems_.push_back(std::move(p)); }
  std::vector<std::string>& problems() { return problems_; }

 private:
  const TensorShapes& t_;
  const LlamaNames& n_;
  std::vector<std::string> problems_;
};

}  // namespace

std::vector<std::string> check_llama_shapes(const StatedShape& s, const TensorShapes& tensors,
                                            const LlamaNames& n) {
  Checker c(tensors, n);
  const auto embd = c.shape(n.embd);
  if (!embd) {
    c.add(fmt::format("missing tensor '{}' (the token embedding)", n.embd));
    return c.problems();
  }
  if (embd->size() != 2) {
    c.add(fmt::format("tensor '{}' has shape {}, expected 2 dimensions (tokens × embedding width)",
                      n.embd, c.str(*embd)));
    return c.problems();
  }
  const auto vocab = static_cast<std::int64_t>((*embd)[0]);
  const auto d = static_cast<std::int64_t>((*embd)[1]);
  if (s.d_model && *s.d_model != d)
    c.add(
        fmt::format("{} contradicts tensor '{}' of shape {}, whose rows (the embeddings) have "
                    "{} entries",
                    c.key(n.d_model, *s.d_model), n.embd, c.str(*embd), d));
  if (s.vocab && *s.vocab != vocab)
    c.add(fmt::format("{} contradicts tensor '{}' of shape {}, which embeds {} tokens",
                      c.key(n.vocab, *s.vocab), n.embd, c.str(*embd), vocab));

  // Head width: the key that states it, or the embedding width over the head count. The query
  // projection of block 0 shows heads × width. When it disagrees, the key projection (kv heads
  // × width) and the RoPE width tell whether the head count or the width is wrong; the value
  // the tensors show is used from here on.
  std::int64_t heads = s.n_head.value_or(0);
  std::int64_t hd = 0;
  const std::int64_t kv_stated = s.n_kv_head.value_or(heads);
  if (heads > 0) {
    if (s.head_dim) {
      hd = *s.head_dim;
    } else if (d % heads == 0) {
      hd = d / heads;
    } else {
      c.add(
          fmt::format("the embedding width {} (tensor '{}') is not a multiple of {}, and no key "
                      "'{}' states the head width",
                      d, n.embd, c.key(n.n_head, heads), n.head_dim));
    }
    const auto q = c.shape(c.block(0, 1));
    const auto k = c.shape(c.block(0, 2));
    const std::int64_t rk = k && k->size() == 2 ? static_cast<std::int64_t>((*k)[0]) : -1;
    if (s.qk_widths.empty() && s.head_counts.empty() && q && q->size() == 2 && hd > 0 &&
        static_cast<std::int64_t>((*q)[0]) != heads * hd) {
      const auto rq = static_cast<std::int64_t>((*q)[0]);
      const std::string width_from =
          s.head_dim ? c.key(n.head_dim, *s.head_dim)
                     : fmt::format("the embedding width {} / {} heads", d, heads);
      // (a) the head count is wrong: the width fits the key projection and the RoPE width
      const bool a = rq % hd == 0 && (rk < 0 || rk % hd == 0) &&
                     (!s.n_kv_head || rk < 0 || rk == kv_stated * hd) &&
                     (!s.rope_dims || *s.rope_dims == hd);
      // (b) the width is wrong: the query rows over the head count fit the rest
      const std::int64_t hb = rq % heads == 0 ? rq / heads : 0;
      const bool b =
          hb > 0 && (rk < 0 || rk == kv_stated * hb) && (!s.rope_dims || *s.rope_dims == hb);
      if (a && !b) {
        c.add(fmt::format(
            "{} contradicts tensor '{}' of shape {}: its {} rows are {} heads of "
            "{} (the head width from {})",
            c.key(n.n_head, heads), c.block(0, 1), c.str(*q), rq, rq / hd, hd, width_from));
        heads = rq / hd;
      } else if (b && !a) {
        c.add(
            fmt::format("the head width {} (from {}) contradicts tensor '{}' of shape {}: its "
                        "{} rows are {} heads of {}{}",
                        hd, width_from, c.block(0, 1), c.str(*q), rq, heads, hb,
                        s.head_dim ? "" : fmt::format(" (key '{}' is absent)", n.head_dim)));
        hd = hb;
      } else {
        c.add(fmt::format(
            "{} heads of {} (the head width from {}) make {} query rows, but "
            "tensor '{}' has shape {} ({} rows)",
            c.key(n.n_head, heads), hd, width_from, heads * hd, c.block(0, 1), c.str(*q), rq));
        if (hb > 0) hd = hb;
      }
    }
  }
  std::int64_t kv = s.n_kv_head.value_or(heads);
  if (hd > 0 && kv > 0 && s.qk_widths.empty() && s.k_ranks.empty() && s.head_counts.empty()) {
    const auto k = c.shape(c.block(0, 2));
    if (k && k->size() == 2 && static_cast<std::int64_t>((*k)[0]) != kv * hd) {
      const auto rows = static_cast<std::int64_t>((*k)[0]);
      c.add(fmt::format("{} heads of {} make {} key rows, but tensor '{}' has shape {} ({} rows)",
                        s.n_kv_head ? c.key(n.n_kv_head, kv)
                                    : fmt::format("key '{}' (absent, so equal to the {} query "
                                                  "heads)",
                                                  n.n_kv_head, heads),
                        hd, kv * hd, c.block(0, 2), c.str(*k), rows));
      if (rows % hd == 0) kv = rows / hd;
    }
  }
  if (hd > 0 && s.value_dim && *s.value_dim != hd)
    c.add(
        fmt::format("{} differs from the key width {} (tensor '{}'): different key and value "
                    "widths are not supported",
                    c.key(n.value_dim, *s.value_dim), hd, c.block(0, 1)));
  if (hd > 0 && s.rope_dims && *s.rope_dims != hd)
    c.add(
        fmt::format("{} differs from the head width {} (tensor '{}'): partial RoPE is not "
                    "supported",
                    c.key(n.rope_dims, *s.rope_dims), hd, c.block(0, 1)));
  std::int64_t ff = s.d_ff.value_or(0);
  {
    const auto g = c.shape(c.block(0, 6));
    if (g && g->size() == 2 && static_cast<std::int64_t>((*g)[0]) != ff && s.ffn_widths.empty()) {
      const auto rows = static_cast<std::int64_t>((*g)[0]);
      c.add(fmt::format("{} contradicts tensor '{}' of shape {} ({} rows)",
                        s.d_ff ? c.key(n.d_ff, ff) : fmt::format("absent key '{}'", n.d_ff),
                        c.block(0, 6), c.str(*g), rows));
      ff = rows;
    }
  }

  // Blocks: which indices have tensors, against the stated count.
  std::set<std::int64_t> present;
  for (const auto& [name, shape] : tensors) {
    if (name.compare(0, n.block_prefix.size(), n.block_prefix) != 0) continue;
    std::size_t i = n.block_prefix.size(), j = i;
    std::int64_t l = 0;
    while (j < name.size() && j - i < 9 && name[j] >= '0' && name[j] <= '9')
      l = l * 10 + (name[j++] - '0');
    if (j > i && j < name.size() && name[j] == '.') present.insert(l);
  }
  const std::int64_t n_present = present.empty() ? 0 : *present.rbegin() + 1;
  std::int64_t layers = s.n_layer.value_or(0);
  if (s.n_layer) {
    if (present.empty())
      c.add(fmt::format("{}, but the file holds no block tensors ('{}0.*')",
                        c.key(n.n_layer, layers), n.block_prefix));
    else if (layers > n_present)
      c.add(fmt::format("{}, but the file holds tensors for {} blocks only ('{}0.*' … '{}{}.*')",
                        c.key(n.n_layer, layers), n_present, n.block_prefix, n.block_prefix,
                        n_present - 1));
    else if (layers < n_present)
      c.add(fmt::format("{}, but the file holds tensors for {} blocks (up to '{}{}.*')",
                        c.key(n.n_layer, layers), n_present, n.block_prefix, n_present - 1));
  }

  // Every tensor of the blocks both the key and the file have, with the values derived above.
  if (hd > 0 && kv > 0 && heads > 0 && ff > 0) {
    const auto D = static_cast<std::uint64_t>(d), Q = static_cast<std::uint64_t>(heads * hd),
               K = static_cast<std::uint64_t>(kv * hd), F = static_cast<std::uint64_t>(ff);
    const Shape want[9] = {{D}, {Q, D}, {K, D}, {K, D}, {D, Q}, {D}, {F, D}, {F, D}, {D, F}};
    const std::string from_width = fmt::format("the embedding width {}", d);
    const std::string from[9] = {from_width,
                                 fmt::format("{} query heads of {}", heads, hd),
                                 fmt::format("{} key/value heads of {}", kv, hd),
                                 fmt::format("{} key/value heads of {}", kv, hd),
                                 fmt::format("{} query heads of {}", heads, hd),
                                 from_width,
                                 fmt::format("the feed-forward width {}", ff),
                                 fmt::format("the feed-forward width {}", ff),
                                 fmt::format("the feed-forward width {}", ff)};
    const std::int64_t upto = std::min(layers, n_present);
    for (std::int64_t l = 0; l < upto; ++l) {
      if (!present.count(l)) {
        c.add(fmt::format("no tensors for block {} ('{}{}.*')", l, n.block_prefix, l));
        continue;
      }
      if (!s.k_ranks.empty()) {
        // a low-rank layer: the down factors' rows are the layer's ranks, the up factors map
        // them back to the n_kv·head_dim keys and values
        const std::int64_t groups = s.lr_group > 0 && kv % s.lr_group == 0 ? kv / s.lr_group : 0;
        const auto rank_of = [&](const std::vector<std::int64_t>& r) -> std::uint64_t {
          std::int64_t sum = 0;
          for (std::int64_t g = 0; g < groups; ++g) {
            const auto i = static_cast<std::size_t>(l * groups + g);
            if (i >= r.size() || r[i] < 1) return 0;
            sum += r[i];
          }
          return static_cast<std::uint64_t>(sum);
        };
        const std::uint64_t rk = rank_of(s.k_ranks), rv = rank_of(s.v_ranks);
        if (groups == 0 || rk == 0 || rv == 0) {
          c.add(
              fmt::format("the low-rank layout (group of {} KV heads, {} key and {} value "
                          "ranks) does not give layer {} its ranks",
                          s.lr_group, s.k_ranks.size(), s.v_ranks.size(), l));
          continue;
        }
        const std::string lk = fmt::format("a key rank of {} (the low-rank layout)", rk);
        const std::string lv = fmt::format("a value rank of {} (the low-rank layout)", rv);
        for (int i = 0; i < 9; ++i) {
          if (i == 2) {
            c.expect(c.block(static_cast<int>(l), i), {rk, D}, lk.c_str());
          } else if (i == 3) {
            c.expect(c.block(static_cast<int>(l), i), {rv, D}, lv.c_str());
          } else {
            c.expect(c.block(static_cast<int>(l), i), want[i], from[i].c_str());
          }
        }
        const std::string p = n.block_prefix + std::to_string(l);
        c.expect(p + ".attn_k_up.weight", {K, rk}, lk.c_str());
        c.expect(p + ".attn_v_up.weight", {K, rv}, lv.c_str());
        continue;
      }
      if (!s.head_counts.empty()) {
        // a structurally pruned layer: its own head counts and FFN width, and two biases
        const auto li = static_cast<std::size_t>(l);
        if (li >= s.head_counts.size() || li >= s.kv_counts.size() || li >= s.ffn_widths.size() ||
            s.head_counts[li] < 1 || s.kv_counts[li] < 1 || s.ffn_widths[li] < 1) {
          c.add(fmt::format("the structural layout does not give layer {} its heads and FFN width",
                            l));
          continue;
        }
        const auto H = static_cast<std::uint64_t>(s.head_counts[li] * hd),
                   KV = static_cast<std::uint64_t>(s.kv_counts[li] * hd),
                   FL = static_cast<std::uint64_t>(s.ffn_widths[li]);
        const Shape lw[9] = {want[0], {H, D},  {KV, D}, {KV, D}, {D, H},
                             want[5], {FL, D}, {FL, D}, {D, FL}};
        const std::string hf =
            fmt::format("{} kept query heads of {} (the structural layout)", s.head_counts[li], hd);
        const std::string kf = fmt::format("{} kept key/value heads of {} (the structural layout)",
                                           s.kv_counts[li], hd);
        const std::string ffs =
            fmt::format("{} kept FFN channels (the structural layout)", s.ffn_widths[li]);
        const std::string* sf[9] = {&from[0], &hf, &kf, &kf, &hf, &from[5], &ffs, &ffs, &ffs};
        for (int i = 0; i < 9; ++i)
          c.expect(c.block(static_cast<int>(l), i), lw[i], sf[i]->c_str());
        const std::string p = n.block_prefix + std::to_string(l);
        c.expect(p + ".attn_output.bias", {D}, from_width.c_str());
        c.expect(p + ".ffn_down.bias", {D}, from_width.c_str());
        continue;
      }
      if (s.qk_widths.empty()) {
        for (int i = 0; i < 9; ++i)
          c.expect(c.block(static_cast<int>(l), i), want[i], from[i].c_str());
        continue;
      }
      // a pruned layer: q/k heads qk_widths[l] wide, v heads v_widths[l] wide
      const auto at = [&](const std::vector<std::int64_t>& w) {
        return static_cast<std::size_t>(l) < w.size() ? static_cast<std::uint64_t>(w[l]) : 0;
      };
      const std::uint64_t wq = at(s.qk_widths), wv = at(s.v_widths);
      if (wq < 1 || wv < 1 || wq > static_cast<std::uint64_t>(hd) ||
          wv > static_cast<std::uint64_t>(hd)) {
        c.add(
            fmt::format("the pruned layout gives layer {} q/k heads {} and v heads {} wide; "
                        "both must be in 1 … {} (the head width)",
                        l, wq, wv, hd));
        continue;
      }
      const auto H = static_cast<std::uint64_t>(heads), KV = static_cast<std::uint64_t>(kv);
      Shape lw[9] = {want[0], {H * wq, D}, {KV * wq, D}, {KV * wv, D}, {D, H * wv},
                     want[5], want[6],     want[7],      want[8]};
      const std::string pf[4] = {
          fmt::format("{} query heads of {} (the pruned layer's q/k width)", heads, wq),
          fmt::format("{} key/value heads of {} (the pruned layer's q/k width)", kv, wq),
          fmt::format("{} key/value heads of {} (the pruned layer's v width)", kv, wv),
          fmt::format("{} query heads of {} (the pruned layer's v width)", heads, wv)};
      for (int i = 0; i < 9; ++i)
        c.expect(c.block(static_cast<int>(l), i), lw[i],
                 (i >= 1 && i <= 4 ? pf[i - 1] : from[i]).c_str());
    }
    c.expect(n.out_norm, {D}, from_width.c_str());
    if (s.output_required && !c.shape(n.output) && !n.tied.empty())
      c.add(
          fmt::format("missing tensor '{}' (the output head is separate: key '{}' is false or "
                      "absent)",
                      n.output, n.tied));
    else if (s.output_required || c.shape(n.output))
      c.expect(n.output, {static_cast<std::uint64_t>(vocab), D},
               fmt::format("the embedding '{}'", n.embd).c_str());
    if (!n.rope_freqs.empty()) {
      const auto rf = c.shape(n.rope_freqs);
      if (rf && *rf != Shape{static_cast<std::uint64_t>(hd / 2)})
        c.add(fmt::format("tensor '{}' has shape {}, expected [{}] (half the head width {})",
                          n.rope_freqs, c.str(*rf), hd / 2, hd));
    }
  }

  auto& p = c.problems();
  if (p.size() > kMaxProblems) {
    const std::size_t more = p.size() - kMaxProblems;
    p.resize(kMaxProblems);
    p.push_back(fmt::format("... and {} more", more));
  }
  return p;
}

std::string describe_problems(const std::string& where, const std::vector<std::string>& problems) {
  if (problems.size() == 1) return fmt::format("{}: {}", where, problems[0]);
  std::string m = fmt::format(
      "{}: the hyper-parameters contradict the tensors ({} problems):", where, problems.size());
  for (const auto& p : problems) m += "\n  - " + p;
  return m;
}

}  // namespace sparsim
