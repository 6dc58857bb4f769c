// Tokenizer: table preparation, the merge loop, encode/decode and the GGUF loader.
#include "model/tokenizer.hpp"

#include "core/error.hpp"
#include "model/detail/tokenizer_data.hpp"
#include "model/gguf.hpp"

#include <algorithm>
#include <map>
#include <queue>

namespace sparsim {

namespace detail {

namespace {

std::uint64_t pair_key(int a, int b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
         static_cast<std::uint32_t>(b);
}

/// "<0xAB>" → 0xAB, -1 for anything else.
int parse_byte_token(const std::string& t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

}  // namespace

void TokenizerData::finalize() {
  const std::string& src = source;
  const int n = static_cast<int>(tokens.size());
  require(n > 0, "{}: the tokenizer vocabulary is empty", src);
  if (types.empty()) types.assign(tokens.size(), kTokNormal);
  require(types.size() == tokens.size(), "{}: {} token types for {} tokens", src, types.size(),
          tokens.size());
  require(scores.empty() || scores.size() == tokens.size(), "{}: {} token scores for {} tokens",
          src, scores.size(), tokens.size());
  for (int id : {bos, eos, unk})
    require(id >= -1 && id < n, "{}: special token id {} is outside the vocabulary of {}", src, id,
            n);

  token_to_id.clear();
  token_to_id.reserve(tokens.size() * 2);
  for (int i = 0; i < n; ++i) token_to_id[tokens[i]] = i;

  is_special.assign(tokens.size(), false);
  specials.clear();
  for (int i = 0; i < n; ++i) {
    const int t = types[i];
    if ((t == kTokUnknown || t == kTokControl || t == kTokUserDefined) && !tokens[i].empty()) {
      is_special[i] = true;
      specials.push_back(i);
    }
  }
  std::stable_sort(specials.begin(), specials.end(),
                   [&](int a, int b) { return tokens[a].size() > tokens[b].size(); });

  for (int b = 0; b < 256; ++b) {
    auto it = token_to_id.find(fmt::format("<0x{:02X}>", b));
    byte_tok[b] = it == token_to_id.end() ? -1 : it->second;
    byte_sym[b] = -1;
    if (byte_level) {
      std::string ch;
      utf8_append(ch, gpt2_byte_to_cp()[b]);
      auto jt = token_to_id.find(ch);
      if (jt != token_to_id.end()) byte_sym[b] = jt->second;
    }
  }

  merges.clear();
  if (!merge_rules.empty()) {
    // Rank order; a rule whose parts or result are not in the vocabulary can never apply to
    // symbols that are tokens, so it is left out.
    merges.reserve(merge_rules.size() * 2);
    for (std::size_t r = 0; r < merge_rules.size(); ++r) {
      const auto& [l, rt] = merge_rules[r];
      auto il = token_to_id.find(l), ir = token_to_id.find(rt), im = token_to_id.find(l + rt);
      if (il == token_to_id.end() || ir == token_to_id.end() || im == token_to_id.end()) continue;
      merges.emplace(pair_key(il->second, ir->second), MergeInfo{static_cast<int>(r), im->second});
    }
  } else if (model_type == "llama") {
    // SentencePiece: two adjacent symbols merge when their concatenation is a vocabulary entry,
    // higher score first. Every split of every entry into two entries is a possible merge; the
    // rank is the position of the entry's score among all scores, highest first.
    std::vector<float> distinct;
    if (!scores.empty()) {
      distinct = scores;
      std::sort(distinct.begin(), distinct.end(), std::greater<float>());
      distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    }
    auto rank_of = [&](int id) {
      if (scores.empty()) return 0;
      auto it =
          std::lower_bound(distinct.begin(), distinct.end(), scores[id], std::greater<float>());
      return static_cast<int>(it - distinct.begin());
    };
    extra_chars.clear();
    int next_extra = n;
    for (const auto& [text, id] : token_to_id) {
      std::size_t k = 0;
      while (k < text.size()) {
        std::size_t len = utf8_valid_len(text, k);
        if (len == 0) len = 1;
        std::string ch = text.substr(k, len);
        if (!token_to_id.count(ch) && !extra_chars.count(ch)) extra_chars.emplace(ch, next_extra++);
        k += len;
      }
    }
    auto sym_id = [&](const std::string& t) {
      auto it = token_to_id.find(t);
      if (it != token_to_id.end()) return it->second;
      auto jt = extra_chars.find(t);
      return jt == extra_chars.end() ? -1 : jt->second;
    };
    for (const auto& [text, id] : token_to_id) {
      for (std::size_t cut = 1; cut < text.size(); ++cut) {
        if ((static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) continue;  // inside a char
        const int l = sym_id(text.substr(0, cut));
        if (l < 0) continue;
        const int r = sym_id(text.substr(cut));
        if (r < 0) continue;
        merges[pair_key(l, r)] = MergeInfo{rank_of(id), id};
      }
    }
  }

  pieces.assign(tokens.size(), std::string());
  for (int i = 0; i < n; ++i) {
    const std::string& t = tokens[i];
    std::string& p = pieces[i];
    if (is_special[i]) {
      p = t;
    } else if (byte_level) {
      std::size_t k = 0;
      while (k < t.size()) {
        const std::size_t start = k;
        if (utf8_valid_len(t, k) == 0) {
          p += t[k++];
          continue;
        }
        const int b = gpt2_cp_to_byte(utf8_next(t, k));
        if (b >= 0)
          p += static_cast<char>(b);
        else
          p.append(t, start, k - start);
      }
    } else if (int b = parse_byte_token(t); b >= 0) {
      p = std::string(1, static_cast<char>(b));
    } else {
      static const std::string kSpace = "\xE2\x96\x81";
      std::size_t k = 0;
      while (k < t.size()) {
        if (t.compare(k, kSpace.size(), kSpace) == 0) {
          p += ' ';
          k += kSpace.size();
        } else {
          p += t[k++];
        }
      }
    }
  }
}

namespace {

struct Symbol {
  int id;  // -1: not in the vocabulary
  int prev, next;
  std::uint32_t begin, len;  // bytes of the piece; len 0 once merged away
};

struct Candidate {
  int rank;
  int left, right;
  int lid, rid;
  int result;
  bool operator<(const Candidate& o) const {  // for a max-heap: "less" = lower priority
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

/// Scratch space reused across the pieces of one encode call.
struct Work {
  std::vector<Symbol> syms;
  std::vector<Candidate> heap;
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  std::string mapped;
};

const std::string kMeta = "\xE2\x96\x81";  // ▁

}  // namespace

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  if (pos == 0) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

/// The encoder: one object per encode call.
class Encoder {
 public:
  explicit Encoder(const TokenizerData& d) : d_(d) {}

  void encode(std::string_view text, std::vector<int>& out) {
    const std::string s = utf8_sanitize(text);
    struct Frag {
      int token;  // -1: plain text [b, e)
      std::size_t b, e;
    };
    std::vector<Frag> frags;
    if (!s.empty()) frags.push_back({-1, 0, s.size()});
    std::vector<Frag> next;
    for (int sp : d_.specials) {
      const std::string& st = d_.tokens[sp];
      if (s.find(st) == std::string::npos) continue;
      next.clear();
      for (const Frag& f : frags) {
        if (f.token >= 0 || f.e - f.b < st.size()) {
          next.push_back(f);
          continue;
        }
        std::size_t pos = f.b;
        while (true) {
          const std::size_t hit = s.find(st, pos);
          if (hit == std::string::npos || hit + st.size() > f.e) break;
          if (hit > pos) next.push_back({-1, pos, hit});
          next.push_back({sp, hit, hit + st.size()});
          pos = hit + st.size();
        }
        if (pos < f.e) next.push_back({-1, pos, f.e});
      }
      frags.swap(next);
    }

    bool prev_special = true;  // the start of the text counts as "after a special token"
    for (const Frag& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      std::string t = s.substr(f.b, f.e - f.b);
      if (d_.add_space_prefix && prev_special) t.insert(t.begin(), ' ');
      prev_special = false;
      normalize(t);
      if (d_.escape_spaces) replace_all(t, " ", kMeta);
      pre_tokenize(std::move(t), f.b == 0, out);
    }
  }

 private:
  void normalize(std::string& t) {
    for (const NormStep& n : d_.normalizers) {
      if (n.kind == NormStep::Kind::Prepend) {
        if (!t.empty()) t.insert(0, n.text);
      } else if (n.re) {
        w_.matches.clear();
        n.re->find_all(t, w_.matches);
        if (w_.matches.empty()) continue;
        std::string o;
        std::size_t pos = 0;
        for (auto [b, e] : w_.matches) {
          o.append(t, pos, b - pos);
          o += n.content;
          pos = e;
        }
        o.append(t, pos, std::string::npos);
        t = std::move(o);
      } else {
        replace_all(t, n.text, n.content);
      }
    }
  }

  void pre_tokenize(std::string text, bool at_start, std::vector<int>& out) {
    if (d_.pre_steps.empty()) {
      bpe(text, out);
      return;
    }
    std::vector<std::string> pieces{std::move(text)}, next;
    for (const PreStep& st : d_.pre_steps) {
      next.clear();
      for (std::string& p : pieces) apply(st, p, at_start, next);
      pieces.swap(next);
    }
    for (const std::string& p : pieces) bpe(p, out);
  }

  void apply(const PreStep& st, std::string& p, bool at_start, std::vector<std::string>& out) {
    if (p.empty()) return;
    switch (st.kind) {
      case PreStep::Kind::PrefixSpace:
        if (p[0] != ' ') p.insert(p.begin(), ' ');
        out.push_back(std::move(p));
        return;
      case PreStep::Kind::Metaspace: {
        replace_all(p, " ", st.replacement);
        if ((st.prepend == 1 || (st.prepend == 2 && at_start)) &&
            p.compare(0, st.replacement.size(), st.replacement) != 0)
          p.insert(0, st.replacement);
        if (!st.split) {
          out.push_back(std::move(p));
          return;
        }
        // Split before each replacement character (it starts the next piece).
        std::size_t start = 0, pos = p.find(st.replacement, 1);
        while (pos != std::string::npos) {
          out.push_back(p.substr(start, pos - start));
          start = pos;
          pos = p.find(st.replacement, pos + st.replacement.size());
        }
        out.push_back(p.substr(start));
        return;
      }
      case PreStep::Kind::Split:
        break;
    }
    w_.matches.clear();
    st.re->find_all(p, w_.matches);
    // With invert, the matches are the pieces and what lies between them the delimiters.
    std::vector<std::pair<std::size_t, std::size_t>> spans;  // (b, e) with flag below
    std::vector<bool> is_delim;
    std::size_t pos = 0;
    for (auto [b, e] : w_.matches) {
      if (b > pos) {
        spans.emplace_back(pos, b);
        is_delim.push_back(st.invert);
      }
      spans.emplace_back(b, e);
      is_delim.push_back(!st.invert);
      pos = e;
    }
    if (pos < p.size()) {
      spans.emplace_back(pos, p.size());
      is_delim.push_back(st.invert);
    }
    std::string pending;  // MergedWithNext: delimiter waiting for the next piece
    for (std::size_t k = 0; k < spans.size(); ++k) {
      std::string piece = p.substr(spans[k].first, spans[k].second - spans[k].first);
      if (!is_delim[k]) {
        if (!pending.empty()) {
          piece.insert(0, pending);
          pending.clear();
        }
        out.push_back(std::move(piece));
        continue;
      }
      switch (st.behavior) {
        case SplitBehavior::Isolated:
          out.push_back(std::move(piece));
          break;
        case SplitBehavior::Removed:
          break;
        case SplitBehavior::MergedWithPrevious:
          if (k > 0 && !is_delim[k - 1] && !out.empty())
            out.back() += piece;
          else
            out.push_back(std::move(piece));
          break;
        case SplitBehavior::MergedWithNext:
          if (!pending.empty()) out.push_back(std::move(pending));
          pending = std::move(piece);
          break;
      }
    }
    if (!pending.empty()) out.push_back(std::move(pending));
  }

  void bpe(const std::string& p, std::vector<int>& out) {
    if (p.empty()) return;
    if (d_.ignore_merges) {
      const std::string* key = &p;
      if (d_.byte_level) {
        w_.mapped.clear();
        for (unsigned char c : p) utf8_append(w_.mapped, gpt2_byte_to_cp()[c]);
        key = &w_.mapped;
      }
      auto it = d_.token_to_id.find(*key);
      if (it != d_.token_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    auto& syms = w_.syms;
    syms.clear();
    if (d_.byte_level) {
      for (std::size_t i = 0; i < p.size(); ++i)
        syms.push_back({d_.byte_sym[static_cast<unsigned char>(p[i])], 0, 0,
                        static_cast<std::uint32_t>(i), 1});
    } else {
      std::size_t i = 0;
      std::string ch;
      while (i < p.size()) {
        std::size_t len = utf8_valid_len(p, i);
        if (len == 0) len = 1;
        ch.assign(p, i, len);
        int id = -1;
        if (auto it = d_.token_to_id.find(ch); it != d_.token_to_id.end()) {
          id = it->second;
        } else if (auto jt = d_.extra_chars.find(ch); jt != d_.extra_chars.end()) {
          id = jt->second;
        }
        syms.push_back({id, 0, 0, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(len)});
        i += len;
      }
    }
    const int ns = static_cast<int>(syms.size());
    for (int i = 0; i < ns; ++i) {
      syms[i].prev = i - 1;
      syms[i].next = i + 1 < ns ? i + 1 : -1;
    }
    auto& heap = w_.heap;
    heap.clear();
    auto consider = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const int a = syms[l].id, b = syms[r].id;
      if (a < 0 || b < 0) return;
      auto it = d_.merges.find(pair_key(a, b));
      if (it == d_.merges.end()) return;
      heap.push_back({it->second.rank, l, r, a, b, it->second.result});
      std::push_heap(heap.begin(), heap.end());
    };
    for (int i = 0; i + 1 < ns; ++i) consider(i, i + 1);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      const Candidate c = heap.back();
      heap.pop_back();
      Symbol& L = syms[c.left];
      Symbol& R = syms[c.right];
      if (L.len == 0 || R.len == 0 || L.next != c.right || L.id != c.lid || R.id != c.rid)
        continue;  // stale: one side has merged with something else since
      L.id = c.result;
      L.len += R.len;
      R.len = 0;
      L.next = R.next;
      if (R.next >= 0) syms[R.next].prev = c.left;
      consider(L.prev, c.left);
      consider(c.left, L.next);
    }
    bool last_unk = false;
    const int n_tokens = static_cast<int>(d_.tokens.size());
    for (int i = ns > 0 ? 0 : -1; i >= 0; i = syms[i].next) {
      const Symbol& s = syms[i];
      if (s.id >= 0 && s.id < n_tokens) {
        out.push_back(s.id);
        last_unk = false;
        continue;
      }
      bool bytes_ok = d_.byte_fallback;
      for (std::uint32_t k = 0; bytes_ok && k < s.len; ++k)
        bytes_ok = d_.byte_tok[static_cast<unsigned char>(p[s.begin + k])] >= 0;
      if (bytes_ok) {
        for (std::uint32_t k = 0; k < s.len; ++k)
          out.push_back(d_.byte_tok[static_cast<unsigned char>(p[s.begin + k])]);
        last_unk = false;
      } else if (d_.unk >= 0 && !d_.byte_level) {
        if (!(d_.fuse_unk && last_unk)) out.push_back(d_.unk);
        last_unk = true;
      }
      // Otherwise the character is dropped: with neither byte tokens nor <unk>, and in
      // byte-level vocabularies that lack a byte's symbol (as llama.cpp does; SmolLM2 has no
      // symbol for several C0 control bytes).
    }
  }

  const TokenizerData& d_;
  Work w_;
};

// ---------------------------------------------------------------- pre-tokenizer presets

namespace {

const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama-3's pattern with its case-insensitive contractions spelled out, as llama.cpp runs it.
const char* const kLlama3Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PrePreset {
  std::vector<const char*> names;
  std::vector<const char*> regexes;
  bool ignore_merges;
  bool add_bos;
};

const std::vector<PrePreset>& pre_presets() {
  static const std::vector<PrePreset> presets = {
      {{"default"},
       {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"},
       false,
       false},
      {{"gpt-2", "gpt2", "mpt", "olmo"}, {kGpt2Regex}, false, false},
      {{"llama-bpe", "llama3", "llama-v3"}, {kLlama3Regex}, true, true},
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"},
       {R"(\p{N})", kGpt2Regex},
       false,
       false},
      {{"qwen2"}, {kQwen2Regex}, false, false},
  };
  return presets;
}

std::string preset_names() {
  std::string s;
  for (const auto& p : pre_presets())
    for (const char* n : p.names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

}  // namespace

}  // namespace detail

// ---------------------------------------------------------------- Tokenizer

using detail::TokenizerData;

namespace {
void detail_replace_meta(std::string& s) {
  detail::replace_all(s, "\xE2\x96\x81", " ");
}
}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerData> d) : d_(std::move(d)) {
  require(d_ != nullptr, "tokenizer: no tables");
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos) {
    require(d_->bos >= 0, "tokenizer ({}): a BOS token was asked for but the vocabulary has none",
            d_->source);
    out.push_back(d_->bos);
  }
  detail::Encoder(*d_).encode(text, out);
  return out;
}

std::string Tokenizer::decode_token(int id) const {
  require(id >= 0 && id < vocab_size(), "tokenizer: token id {} is outside the vocabulary of {}",
          id, vocab_size());
  return d_->pieces[id];
}

std::string Tokenizer::decode_text(const std::vector<int>& ids) const {
  return detail::utf8_sanitize(decode(ids));
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  // Plain tokens are collected into a segment that ends at a special token. In SentencePiece
  // vocabularies a "▁" that arrives through byte tokens is a space too (encode cannot tell the
  // two apart either), and the space encode put in front of the segment is dropped.
  std::string out, seg;
  bool at_start = true;
  auto flush = [&] {
    if (!d_->byte_level) detail_replace_meta(seg);
    const bool strip = d_->decode_strip == 1 || (d_->decode_strip == 2 && at_start);
    if (strip && !seg.empty() && seg[0] == ' ')
      out.append(seg, 1, std::string::npos);
    else
      out += seg;
    if (!seg.empty()) at_start = false;
    seg.clear();
  };
  for (int id : ids) {
    require(id >= 0 && id < vocab_size(), "tokenizer: token id {} is outside the vocabulary of {}",
            id, vocab_size());
    if (d_->is_special[id]) {
      flush();
      out += d_->pieces[id];
      at_start = false;
    } else {
      seg += d_->pieces[id];
    }
  }
  flush();
  return out;
}

int Tokenizer::vocab_size() const {
  return static_cast<int>(d_->tokens.size());
}
int Tokenizer::bos_id() const {
  return d_->bos;
}
int Tokenizer::eos_id() const {
  return d_->eos;
}
bool Tokenizer::add_bos_default() const {
  return d_->add_bos;
}
const std::string& Tokenizer::model_type() const {
  return d_->model_type;
}
const std::string& Tokenizer::pre_type() const {
  return d_->pre_type;
}

const std::string& Tokenizer::token_text(int id) const {
  require(id >= 0 && id < vocab_size(), "tokenizer: token id {} is outside the vocabulary of {}",
          id, vocab_size());
  return d_->tokens[id];
}

int Tokenizer::token_id(std::string_view text) const {
  auto it = d_->token_to_id.find(std::string(text));
  return it == d_->token_to_id.end() ? -1 : it->second;
}

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
  auto d = std::make_shared<TokenizerData>();
  d->source = f.path();
  const std::string model = f.require_string("tokenizer.ggml.model");
  if (model != "gpt2" && model != "llama")
    fail("{}: tokenizer.ggml.model '{}' is not supported (gpt2, llama)", f.path(), model);
  d->model_type = model;
  d->tokens = f.require_string_array("tokenizer.ggml.tokens");
  if (auto t = f.get_int_array("tokenizer.ggml.token_type")) {
    d->types.reserve(t->size());
    for (auto v : *t) d->types.push_back(static_cast<int>(v));
    require(d->types.size() == d->tokens.size(),
            "{}: tokenizer.ggml.token_type has {} entries for {} tokens", f.path(), d->types.size(),
            d->tokens.size());
  }
  d->pre_type = f.get_string("tokenizer.ggml.pre").value_or("default");

  if (model == "gpt2") {
    const auto merges = f.require_string_array("tokenizer.ggml.merges");
    d->merge_rules.reserve(merges.size());
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const std::string& m = merges[i];
      const std::size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      require(sp != std::string::npos,
              "{}: tokenizer.ggml.merges[{}] '{}' is not of the form 'left right'", f.path(), i, m);
      d->merge_rules.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    const detail::PrePreset* preset = nullptr;
    for (const auto& p : detail::pre_presets())
      for (const char* n : p.names)
        if (d->pre_type == n) preset = &p;
    if (!preset)
      fail("{}: tokenizer.ggml.pre '{}' is not supported ({})", f.path(), d->pre_type,
           detail::preset_names());
    for (const char* re : preset->regexes) {
      detail::PreStep st;
      st.re = std::make_shared<detail::Regex>(re);
      d->pre_steps.push_back(std::move(st));
    }
    d->byte_level = true;
    d->ignore_merges = preset->ignore_merges;
    d->add_bos = preset->add_bos;
    d->byte_fallback = false;
  } else {
    if (auto s = f.get_float_array("tokenizer.ggml.scores")) {
      d->scores = std::move(*s);
      require(d->scores.size() == d->tokens.size(),
              "{}: tokenizer.ggml.scores has {} entries for {} tokens", f.path(), d->scores.size(),
              d->tokens.size());
    } else {
      d->scores.assign(d->tokens.size(), 0.0f);
    }
    d->add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
    d->escape_spaces = true;
    d->add_bos = true;
    d->byte_fallback = true;
    d->decode_strip = d->add_space_prefix ? 1 : 0;
  }
  const int n = static_cast<int>(d->tokens.size());
  auto id_key = [&](const char* key, int dflt) {
    auto v = f.get_uint(key);
    if (!v) return dflt < n ? dflt : -1;
    require(*v < static_cast<std::uint64_t>(n), "{}: {} = {} is outside the vocabulary of {}",
            f.path(), key, *v, n);
    return static_cast<int>(*v);
  };
  const bool spm = model == "llama";
  d->bos = id_key("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  d->eos = id_key("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  d->unk = id_key("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  if (auto b = f.get_bool("tokenizer.ggml.add_bos_token")) d->add_bos = *b;
  d->finalize();
  return Tokenizer(std::move(d));
}

}  // namespace sparsim
