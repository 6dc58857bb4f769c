#include "eval/ruler.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "eval/greedy.hpp"
#include "io/hdf5.hpp"
#include "model/synth.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

namespace sparsim {

namespace {

bool is_niah(const std::string& t) {
  return t.rfind("niah_", 0) == 0;
}

/// splitmix64 step: the per-item seeds.
std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  std::uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// An item's generator seed depends on (seed, task, length, sample) only, so that a subset of
/// the suite builds the same prompts as the whole suite.
std::uint64_t item_seed(std::uint64_t seed, const std::string& task, int length, int sample) {
  std::uint64_t h = mix(0x5eed, seed);
  for (unsigned char ch : task) h = mix(h, ch);
  h = mix(h, static_cast<std::uint64_t>(length));
  return mix(h, static_cast<std::uint64_t>(sample));
}

std::string number(SynthRng& r, int digits) {
  std::string s(1, static_cast<char>('1' + r.next() % 9));  // no leading zero
  while (static_cast<int>(s.size()) < digits) s.push_back(static_cast<char>('0' + r.next() % 10));
  return s;
}

std::string letters(SynthRng& r, int n, char base) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(base + r.next() % 26));
  return s;
}

std::string key_name(SynthRng& r) {
  static const char* const kSyl[] = {"ka", "lo", "mi",  "ru",  "te",  "vo", "zen", "pa",
                                     "di", "su", "bor", "qui", "nax", "fe", "gul", "yor"};
  std::string s;
  for (int i = 0; i < 3; ++i) s += kSyl[r.next() % 16];
  return s;
}

/// `n` distinct strings from `gen`.
template <class F>
std::vector<std::string> distinct(int n, F gen) {
  std::vector<std::string> v;
  std::set<std::string> seen;
  while (static_cast<int>(v.size()) < n) {
    std::string s = gen();
    if (seen.insert(s).second) v.push_back(std::move(s));
  }
  return v;
}

std::string join_keys(const std::vector<std::string>& k) {
  if (k.size() == 1) return k[0];
  std::string s;
  for (std::size_t i = 0; i + 1 < k.size(); ++i) s += (i ? ", " : "") + k[i];
  return s + " and " + k.back();
}

void append(std::vector<int>& a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
}

/// n filler tokens from a random offset of the stream with `pieces` inserted at `depths` of it
/// (each moved back by at most 32 tokens to just after a line or sentence end when one is near).
/// in_order: the pieces keep their order in the text (the positions are sorted); otherwise each
/// piece stays at its own depth. Returns the placed fraction of piece 0.
double place(const std::vector<int>& stream, int n, const std::vector<std::vector<int>>& pieces,
             std::vector<double> depths, bool in_order, SynthRng& rng, const Tokenizer& tok,
             std::vector<int>& out) {
  const std::size_t off = rng.next() % (stream.size() - static_cast<std::size_t>(n));
  std::vector<int> pos;
  for (double d : depths) {
    int a = static_cast<int>(std::lround(d * n));
    for (int j = a; j > 0 && j > a - 32; --j) {
      const std::string& s = tok.decode_token(stream[off + static_cast<std::size_t>(j) - 1]);
      if (!s.empty() && (s.find('\n') != std::string::npos || s.back() == '.')) {
        a = j;
        break;
      }
    }
    pos.push_back(a);
  }
  std::vector<std::size_t> order(pieces.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (in_order) {
    std::sort(pos.begin(), pos.end());
  } else {
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t x, std::size_t y) { return pos[x] < pos[y]; });
  }
  int at = 0;
  for (std::size_t r = 0; r < order.size(); ++r) {
    const int p = in_order ? pos[r] : pos[order[r]];
    out.insert(out.end(), stream.begin() + static_cast<std::ptrdiff_t>(off + at),
               stream.begin() + static_cast<std::ptrdiff_t>(off + p));
    append(out, pieces[order[r]]);
    at = p;
  }
  out.insert(out.end(), stream.begin() + static_cast<std::ptrdiff_t>(off + at),
             stream.begin() + static_cast<std::ptrdiff_t>(off + n));
  return static_cast<double>(pos[0]) / n;
}

/// Filler tokens left once the fixed pieces are in; throws when none or the corpus is short.
int filler_room(const RulerItem& it, int prompt_tokens, std::size_t fixed, std::size_t stream) {
  const int n = prompt_tokens - static_cast<int>(fixed);
  require(n >= 16, "ruler: {} at length {} leaves no room for filler text (use a longer length)",
          it.task, it.length);
  require(stream > static_cast<std::size_t>(n),
          "ruler: the corpus has {} tokens, fewer than the {} filler tokens a {} prompt of length "
          "{} needs (a longer corpus)",
          stream, n, it.task, it.length);
  return n;
}

/// Token counts of pieces, cached.
struct PieceCost {
  const Tokenizer& tok;
  std::map<std::string, std::vector<int>> cache;
  const std::vector<int>& operator()(const std::string& s) {
    auto f = cache.find(s);
    if (f == cache.end()) f = cache.emplace(s, tok.encode(s, false)).first;
    return f->second;
  }
};

void build_niah(RulerItem& it, SynthRng& rng, const Tokenizer& tok, const std::vector<int>& stream,
                bool add_bos) {
  const bool multikey = it.task == "niah_multikey", multivalue = it.task == "niah_multivalue",
             multiquery = it.task == "niah_multiquery";
  const int nk = (multikey || multiquery) ? 4 : 1, nneedle = (nk > 1 || multivalue) ? 4 : 1;
  const std::vector<std::string> keys = distinct(nk, [&] { return key_name(rng); });
  const std::vector<std::string> values = distinct(nneedle, [&] { return number(rng, 7); });
  std::vector<std::vector<int>> pieces;
  std::vector<double> depths;
  for (int i = 0; i < nneedle; ++i) {
    const std::string& key = keys[static_cast<std::size_t>(multivalue ? 0 : i)];
    pieces.push_back(tok.encode(fmt::format("\nOne of the special numbers for {} is {}.\n", key,
                                            values[static_cast<std::size_t>(i)]),
                                false));
    depths.push_back(i == 0 ? it.depth : rng.uniform());
  }
  const std::vector<std::string> asked = multiquery ? keys : std::vector<std::string>{keys[0]};
  if (multivalue || multiquery)
    it.answers = values;
  else
    it.answers = {values[0]};
  const std::string ks = join_keys(asked);
  const std::vector<int> ti = tok.encode(
      "Some special numbers are hidden in the text below. Memorise them: a question about them "
      "follows the text.\n",
      add_bos);
  const std::vector<int> tq = tok.encode(
      fmt::format("\nWhat are all the special numbers for {0} in the text above? Answer: the "
                  "special numbers for {0} in the text above are:",
                  ks),
      false);
  std::size_t fixed = ti.size() + tq.size();
  for (const auto& p : pieces) fixed += p.size();
  const int n = filler_room(it, it.length - it.gen_tokens, fixed, stream.size());
  it.prompt = ti;
  it.placed = place(stream, n, pieces, depths, false, rng, tok, it.prompt);
  append(it.prompt, tq);
}

void build_vt(RulerItem& it, SynthRng& rng, const Tokenizer& tok, const std::vector<int>& stream,
              bool add_bos) {
  constexpr int kHops = 4;
  const std::vector<std::string> names = distinct(kHops + 1, [&] { return letters(rng, 5, 'A'); });
  const std::string value = number(rng, 5);
  std::vector<std::vector<int>> pieces;
  std::vector<double> depths;
  for (int i = 0; i <= kHops; ++i) {
    const std::string rhs = i == 0 ? value : "VAR " + names[static_cast<std::size_t>(i - 1)];
    pieces.push_back(tok.encode(
        fmt::format("\nVAR {} = {}.\n", names[static_cast<std::size_t>(i)], rhs), false));
    depths.push_back(rng.uniform());
  }
  it.answers = names;
  const std::vector<int> ti = tok.encode(
      "Keep track of the chain of variable assignments hidden in the text below.\n", add_bos);
  const std::vector<int> tq = tok.encode(
      fmt::format("\nQuestion: which variables in the text above are assigned the value {0}? "
                  "Answer: following the assignments above, {1} variables hold the value {0}, "
                  "namely:",
                  value, kHops + 1),
      false);
  std::size_t fixed = ti.size() + tq.size();
  for (const auto& p : pieces) fixed += p.size();
  const int n = filler_room(it, it.length - it.gen_tokens, fixed, stream.size());
  it.prompt = ti;
  place(stream, n, pieces, depths, true, rng, tok, it.prompt);
  append(it.prompt, tq);
}

/// Shuffles v with rng (Fisher–Yates).
template <class T>
void shuffle(std::vector<T>& v, SynthRng& rng) {
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.next() % i]);
}

void build_cwe(RulerItem& it, SynthRng& rng, const Tokenizer& tok,
               const std::vector<std::string>& words, bool add_bos, PieceCost& cost) {
  constexpr int kCommon = 10;
  // RULER's repeat counts: 30 and 3, or 6 and 1 for lengths under 4096.
  const int fc = it.length < 4096 ? 6 : 30, fu = it.length < 4096 ? 1 : 3;
  const std::vector<int> ti = tok.encode(
      "Below is a numbered list of words. Some words occur more often than others: memorise the "
      "most frequent ones.\n",
      add_bos);
  const std::vector<int> tq = tok.encode(
      "\nQuestion: which 10 words occur most often in the list above? Answer: the 10 most "
      "frequent words of the list are:",
      false);
  const int budget = it.length - it.gen_tokens - static_cast<int>(ti.size() + tq.size());
  require(words.size() >= static_cast<std::size_t>(kCommon + 1),
          "ruler: cwe needs at least {} distinct words of 3–12 letters in the corpus, it has {}",
          kCommon + 1, words.size());
  // A random order of the corpus words; a list of N words uses its first N (the first ten are
  // the common ones), so the token count grows with N and the largest N that fits is searched.
  const int cap = std::min<int>(static_cast<int>(words.size()),
                                kCommon + std::max(1, (budget / 2 - kCommon * fc) / fu) + 1);
  std::vector<std::size_t> perm(words.size());
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  for (int i = 0; i < cap; ++i)
    std::swap(perm[static_cast<std::size_t>(i)],
              perm[static_cast<std::size_t>(i) +
                   rng.next() % (perm.size() - static_cast<std::size_t>(i))]);
  auto tokens = [&](int N) {
    long t = 0;
    int idx = 0;
    for (int w = 0; w < N; ++w) {
      const long per =
          static_cast<long>(cost(" " + words[perm[static_cast<std::size_t>(w)]]).size());
      t += per * (w < kCommon ? fc : fu);
    }
    const int count = kCommon * fc + (N - kCommon) * fu;
    for (idx = 1; idx <= count; ++idx)
      t += static_cast<long>(cost(fmt::format(idx == 1 ? "{}." : " {}.", idx)).size());
    return t;
  };
  require(tokens(kCommon + 1) <= budget, "ruler: cwe at length {} leaves no room for the list",
          it.length);
  int lo = kCommon + 1, hi = cap;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tokens(mid) <= budget)
      lo = mid;
    else
      hi = mid - 1;
  }
  require(tokens(lo) * 10 >= static_cast<long>(budget) * 9,
          "ruler: the corpus has too few distinct words ({}) for a cwe prompt of length {} (a "
          "longer corpus or a shorter length)",
          words.size(), it.length);
  std::vector<std::string> list;
  for (int w = 0; w < lo; ++w)
    for (int r = 0; r < (w < kCommon ? fc : fu); ++r)
      list.push_back(words[perm[static_cast<std::size_t>(w)]]);
  shuffle(list, rng);
  for (int w = 0; w < kCommon; ++w) it.answers.push_back(words[perm[static_cast<std::size_t>(w)]]);
  it.prompt = ti;
  for (std::size_t i = 0; i < list.size(); ++i) {
    append(it.prompt, cost(fmt::format(i == 0 ? "{}." : " {}.", i + 1)));
    append(it.prompt, cost(" " + list[i]));
  }
  append(it.prompt, tq);
}

void build_fwe(RulerItem& it, SynthRng& rng, const Tokenizer& tok, bool add_bos, PieceCost& cost) {
  constexpr double kAlpha = 2.0;
  const double zeta = 1.6449340668482264;      // ζ(2) = π²/6
  const int V = std::max(16, it.length / 50);  // RULER: vocabulary of max_seq_length / 50
  std::vector<std::string> vocab = distinct(V, [&] { return letters(rng, 5, 'a'); });
  vocab[0] = "....";  // the most frequent word is noise, as in RULER
  const std::vector<int> ti = tok.encode(
      "Below is a text of code words. Count how often each code word occurs, ignoring the dots "
      "'....'.\n",
      add_bos);
  const std::vector<int> tq = tok.encode(
      "\nQuestion: not counting the dots, which three code words occur most often in the text "
      "above? Answer: the three most frequent code words are:",
      false);
  const int budget = it.length - it.gen_tokens - static_cast<int>(ti.size() + tq.size());
  auto counts = [&](long M) {
    std::vector<long> c(static_cast<std::size_t>(V));
    for (int k = 1; k <= V; ++k)
      c[static_cast<std::size_t>(k - 1)] =
          static_cast<long>(std::floor(M * std::pow(k, -kAlpha) / zeta));
    return c;
  };
  auto tokens = [&](long M) {
    const std::vector<long> c = counts(M);
    long t = 0;
    for (int k = 0; k < V; ++k)
      t += c[static_cast<std::size_t>(k)] *
           static_cast<long>(cost(" " + vocab[static_cast<std::size_t>(k)]).size());
    return t;
  };
  long lo = 0, hi = std::max(1, budget);
  while (lo < hi) {
    const long mid = (lo + hi + 1) / 2;
    if (tokens(mid) <= budget)
      lo = mid;
    else
      hi = mid - 1;
  }
  // The answer must be unique: the fourth rank strictly above the fifth.
  while (lo > 0 && counts(lo)[3] <= counts(lo)[4]) --lo;
  require(lo > 0 && counts(lo)[3] >= 1,
          "ruler: fwe at length {} leaves no room for a text with a unique answer", it.length);
  const std::vector<long> c = counts(lo);
  std::vector<std::string> text;
  for (int k = 0; k < V; ++k)
    for (long r = 0; r < c[static_cast<std::size_t>(k)]; ++r)
      text.push_back(vocab[static_cast<std::size_t>(k)]);
  shuffle(text, rng);
  it.answers = {vocab[1], vocab[2], vocab[3]};
  it.prompt = ti;
  for (const auto& w : text) append(it.prompt, cost(" " + w));
  append(it.prompt, tq);
}

}  // namespace

const std::vector<std::string>& ruler_tasks() {
  static const std::vector<std::string> k = {
      "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe"};
  return k;
}

std::vector<std::string> parse_ruler_subset(const std::string& spec) {
  if (spec.empty() || spec == "all") return ruler_tasks();
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i <= spec.size()) {
    const std::size_t j = std::min(spec.find(',', i), spec.size());
    const std::string name = spec.substr(i, j - i);
    std::vector<std::string> add;
    if (name == "niah") {
      for (const auto& t : ruler_tasks())
        if (is_niah(t)) add.push_back(t);
    } else {
      require(std::find(ruler_tasks().begin(), ruler_tasks().end(), name) != ruler_tasks().end(),
              "RULER task list '{}': unknown task '{}' (known: niah, niah_single, niah_multikey, "
              "niah_multivalue, niah_multiquery, vt, cwe, fwe, all)",
              spec, name);
      add.push_back(name);
    }
    for (const auto& t : add) {
      require(std::find(out.begin(), out.end(), t) == out.end(),
              "RULER task list '{}': task '{}' is named twice", spec, t);
      out.push_back(t);
    }
    i = j + 1;
  }
  // Run order: the suite's.
  std::vector<std::string> sorted;
  for (const auto& t : ruler_tasks())
    if (std::find(out.begin(), out.end(), t) != out.end()) sorted.push_back(t);
  return sorted;
}

int ruler_gen_tokens(const std::string& task) {
  if (task == "niah_single" || task == "niah_multikey") return 16;
  if (task == "niah_multivalue" || task == "niah_multiquery") return 48;
  if (task == "vt") return 32;
  if (task == "cwe") return 64;
  if (task == "fwe") return 32;
  fail("ruler: unknown task '{}'", task);
}

std::vector<int> RulerOptions::default_lengths(int model_context) {
  std::vector<int> v;
  for (int L = 1024; L <= model_context; L *= 2) v.push_back(L);
  return v;
}

namespace {
constexpr const char* kRulerLengths = "the suite's prompt lengths";
constexpr const char* kRulerDepths = "the suite's needle depths";
}  // namespace

void RulerOptions::check_values() const {
  require_setting(!tasks.empty(), "ruler.tasks", "the suite's task list", ": no task selected");
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    require_setting(lengths[i] >= 256, "ruler.lengths", kRulerLengths,
                    ": {} tokens is too short (at least 256)", lengths[i]);
    require_setting(i == 0 || lengths[i] > lengths[i - 1], "ruler.lengths", kRulerLengths,
                    ": give increasing lengths without repeats");
  }
  require_setting(!depths.empty(), "ruler.depths", kRulerDepths, ": give at least one depth");
  for (double d : depths)
    require_setting(std::isfinite(d) && d >= 0 && d <= 1, "ruler.depths", kRulerDepths,
                    ": {} is outside [0, 1]", d);
  require_setting(samples >= 1, "ruler.samples", "the suite's items per cell",
                  "must be at least 1, got {}", samples);
  require_setting(batch >= 1, "ruler.batch", "the prompts per forward pass",
                  "must be positive, got {}", batch);
}

void RulerOptions::validate(int model_context) const {
  check_values();
  require_setting(!lengths.empty(), "ruler.lengths", kRulerLengths,
                  ": give at least one length (the model's context of {} tokens is under the "
                  "default's 1024)",
                  model_context);
  for (int L : lengths)
    require_setting(L <= model_context, "ruler.lengths", kRulerLengths,
                    ": {} tokens exceeds the model's context of {} tokens", L, model_context);
}

std::vector<std::string> ruler_words(const std::vector<std::string>& documents) {
  std::set<std::string> s;
  for (const auto& d : documents) {
    std::size_t i = 0;
    while (i < d.size()) {
      while (i < d.size() && !std::isalpha(static_cast<unsigned char>(d[i]))) {
        // skip non-letters, and whole tokens that mix letters with other bytes
        ++i;
      }
      std::size_t j = i;
      while (j < d.size() && std::isalpha(static_cast<unsigned char>(d[j]))) ++j;
      const bool clean = (i == 0 || static_cast<unsigned char>(d[i - 1]) < 0x80) &&
                         (j == d.size() || static_cast<unsigned char>(d[j]) < 0x80);
      if (clean && j - i >= 3 && j - i <= 12) {
        std::string w = d.substr(i, j - i);
        for (auto& ch : w) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        s.insert(w);
      }
      i = j;
    }
  }
  return {s.begin(), s.end()};
}

bool contains_word(const std::string& text, const std::string& word) {
  if (word.empty()) return false;
  auto lower = [](std::string s) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  const std::string t = lower(text), w = lower(word);
  auto alnum = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) != 0; };
  for (std::size_t p = t.find(w); p != std::string::npos; p = t.find(w, p + 1)) {
    const bool left = p == 0 || !alnum(t[p - 1]) || !alnum(w.front());
    const bool right = p + w.size() == t.size() || !alnum(t[p + w.size()]) || !alnum(w.back());
    if (left && right) return true;
  }
  return false;
}

std::vector<RulerItem> build_ruler(const RulerOptions& o, const Tokenizer& tok,
                                   const std::vector<int>& filler,
                                   const std::vector<std::string>& words, bool add_bos) {
  std::vector<RulerItem> items;
  PieceCost cost{tok, {}};
  for (const auto& task : o.tasks)
    for (int L : o.lengths)
      for (int k = 0; k < o.samples; ++k) {
        RulerItem it;
        it.task = task;
        it.length = L;
        it.sample = k;
        it.gen_tokens = ruler_gen_tokens(task);
        SynthRng rng(item_seed(o.seed, task, L, k));
        if (is_niah(task)) {
          it.depth = o.depths[static_cast<std::size_t>(k) % o.depths.size()];
          build_niah(it, rng, tok, filler, add_bos);
        } else if (task == "vt") {
          build_vt(it, rng, tok, filler, add_bos);
        } else if (task == "cwe") {
          build_cwe(it, rng, tok, words, add_bos, cost);
        } else {
          build_fwe(it, rng, tok, add_bos, cost);
        }
        items.push_back(std::move(it));
      }
  return items;
}

template <class E>
RulerResult run_ruler(Engine<E>& eng, const Tokenizer& tok, const std::vector<RulerItem>& items,
                      const RulerOptions& o, const std::function<void(int, int)>& progress) {
  RulerResult res;
  res.correct.assign(items.size(), 0);
  res.recall.assign(items.size(), 0.0);
  res.output.assign(items.size(), "");
  auto found = [&](const RulerItem& it, const std::string& text) {
    int f = 0;
    for (const auto& a : it.answers) f += contains_word(text, a) ? 1 : 0;
    return f;
  };
  std::size_t i = 0;
  while (i < items.size()) {
    std::size_t j = i;  // a batch: equal prompt lengths and budgets
    while (j < items.size() && j - i < static_cast<std::size_t>(o.batch) &&
           items[j].prompt.size() == items[i].prompt.size() &&
           items[j].gen_tokens == items[i].gen_tokens)
      ++j;
    const int nb = static_cast<int>(j - i), P = static_cast<int>(items[i].prompt.size()),
              G = items[i].gen_tokens;
    require(P + G <= eng.max_ctx() && nb <= eng.max_seqs(),
            "ruler: the engine holds {} × {} tokens, need {} × {}", eng.max_seqs(), eng.max_ctx(),
            nb, P + G);
    std::vector<std::vector<int>> seqs;
    for (std::size_t k = i; k < j; ++k) seqs.push_back(items[k].prompt);
    // a row stops once its output holds every answer
    const std::vector<std::vector<int>> out = greedy_continuations(
        eng, seqs, G, tok.eos_id(), [&](std::size_t b, const std::vector<int>& toks) {
          const RulerItem& it = items[i + b];
          return found(it, tok.decode(toks)) == static_cast<int>(it.answers.size());
        });
    for (int b = 0; b < nb; ++b) {
      const std::size_t k = i + static_cast<std::size_t>(b);
      res.output[k] = tok.decode_text(out[static_cast<std::size_t>(b)]);
      const int f = found(items[k], res.output[k]);
      res.recall[k] = static_cast<double>(f) / static_cast<double>(items[k].answers.size());
      res.correct[k] = f == static_cast<int>(items[k].answers.size()) ? 1 : 0;
    }
    i = j;
    if (progress) progress(static_cast<int>(i), static_cast<int>(items.size()));
  }
  return res;
}

namespace {

struct Cell {
  std::string task;
  int length = 0;
  double depth = -1;  ///< -1: every depth
  int items = 0, correct = 0;
  double recall = 0;
};

std::vector<Cell> cells_of(const RulerOptions& o, const std::vector<RulerItem>& items,
                           const RulerResult& r) {
  std::vector<Cell> cells;
  for (const auto& t : o.tasks)
    for (int L : o.lengths) {
      std::vector<double> ds = {-1};
      if (is_niah(t)) {
        std::vector<double> u = o.depths;
        std::sort(u.begin(), u.end());
        u.erase(std::unique(u.begin(), u.end()), u.end());
        ds.insert(ds.end(), u.begin(), u.end());
      }
      for (double d : ds) {
        Cell c{t, L, d};
        for (std::size_t k = 0; k < items.size(); ++k)
          if (items[k].task == t && items[k].length == L && (d < 0 || items[k].depth == d)) {
            ++c.items;
            c.correct += r.correct[k];
            c.recall += r.recall[k];
          }
        if (c.items) c.recall /= c.items;
        if (c.items) cells.push_back(c);
      }
    }
  return cells;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "|" : "") + v[i];
  return s;
}

}  // namespace

nlohmann::json ruler_json(const RulerOptions& o, const std::vector<RulerItem>& items,
                          const RulerResult& r) {
  nlohmann::json j;
  j["tasks"] = o.tasks;
  j["lengths"] = o.lengths;
  j["depths"] = o.depths;
  j["samples"] = o.samples;
  j["seed"] = o.seed;
  int hits = 0;
  for (int c : r.correct) hits += c;
  j["items_total"] = items.size();
  j["accuracy"] = items.empty() ? 0.0 : static_cast<double>(hits) / items.size();
  j["metric"] =
      "accuracy: share of items whose continuation holds every answer as a whole word "
      "(case-insensitive); recall: mean share of answers found";
  nlohmann::json by_task = nlohmann::json::object();
  for (const auto& t : o.tasks) {
    int n = 0, c = 0;
    double rec = 0;
    for (std::size_t k = 0; k < items.size(); ++k)
      if (items[k].task == t) ++n, c += r.correct[k], rec += r.recall[k];
    by_task[t] = {{"items", n},
                  {"correct", c},
                  {"accuracy", n ? static_cast<double>(c) / n : 0.0},
                  {"recall", n ? rec / n : 0.0},
                  {"gen_tokens", ruler_gen_tokens(t)}};
  }
  j["by_task"] = by_task;
  nlohmann::json cells = nlohmann::json::array();
  for (const Cell& c : cells_of(o, items, r))
    cells.push_back({{"task", c.task},
                     {"length", c.length},
                     {"depth", c.depth < 0 ? nlohmann::json(nullptr) : nlohmann::json(c.depth)},
                     {"items", c.items},
                     {"correct", c.correct},
                     {"accuracy", static_cast<double>(c.correct) / c.items},
                     {"recall", c.recall}});
  j["cells"] = cells;
  nlohmann::json per = nlohmann::json::array();
  for (std::size_t k = 0; k < items.size(); ++k) {
    const RulerItem& it = items[k];
    per.push_back({{"task", it.task},
                   {"length", it.length},
                   {"depth", it.depth < 0 ? nlohmann::json(nullptr) : nlohmann::json(it.depth)},
                   {"sample", it.sample},
                   {"prompt_tokens", it.prompt.size()},
                   {"correct", r.correct[k]},
                   {"recall", r.recall[k]},
                   {"answers", it.answers},
                   {"output", r.output[k]}});
  }
  j["items"] = per;
  return j;
}

void write_ruler(io::Group& g, const RulerOptions& o, const std::vector<RulerItem>& items,
                 const RulerResult& r) {
  int hits = 0;
  for (int c : r.correct) hits += c;
  g.set_attr("accuracy", items.empty() ? 0.0 : static_cast<double>(hits) / items.size());
  g.set_attr("samples", o.samples);
  g.set_attr("seed", static_cast<std::int64_t>(o.seed));
  g.set_attr("tasks", joined(o.tasks));
  std::vector<std::string> task, ans, outp;
  std::vector<std::int32_t> len, sample, ptok, ok;
  std::vector<double> depth, placed, recall;
  for (std::size_t k = 0; k < items.size(); ++k) {
    const RulerItem& it = items[k];
    task.push_back(it.task);
    len.push_back(it.length);
    depth.push_back(it.depth);
    placed.push_back(it.placed);
    sample.push_back(it.sample);
    ptok.push_back(static_cast<std::int32_t>(it.prompt.size()));
    ok.push_back(r.correct[k]);
    recall.push_back(r.recall[k]);
    ans.push_back(joined(it.answers));
    outp.push_back(r.output[k]);
  }
  g.write_strings("item_task", task, {"", "task of each item"});
  g.write<std::int32_t>("item_length", len, {"token", "cell length (prompt + generation budget)"});
  g.write<double>("item_depth", depth, {"1", "requested depth of the first needle (-1: none)"});
  g.write<double>("item_placed", placed, {"1", "first needle start / filler length (-1: none)"});
  g.write<std::int32_t>("item_sample", sample, {"", "sample index within the cell"});
  g.write<std::int32_t>("item_prompt_tokens", ptok, {"token", "prompt length"});
  g.write<std::int32_t>("item_correct", ok, {"", "1: every answer found"});
  g.write<double>("item_recall", recall, {"1", "share of the answers found"});
  g.write_strings("item_answers", ans, {"", "expected answers, '|' separated"});
  g.write_strings("item_output", outp, {"", "greedy continuation"});
  std::vector<std::string> ct;
  std::vector<std::int32_t> cl, cn, cc;
  std::vector<double> cd, ca, cr;
  for (const Cell& c : cells_of(o, items, r)) {
    ct.push_back(c.task);
    cl.push_back(c.length);
    cd.push_back(c.depth);
    cn.push_back(c.items);
    cc.push_back(c.correct);
    ca.push_back(static_cast<double>(c.correct) / c.items);
    cr.push_back(c.recall);
  }
  g.write_strings("cell_task", ct, {"", "task of each cell"});
  g.write<std::int32_t>("cell_length", cl, {"token", "cell length"});
  g.write<double>("cell_depth", cd, {"1", "needle depth (-1: every depth of the cell)"});
  g.write<std::int32_t>("cell_items", cn, {"", "items in the cell"});
  g.write<std::int32_t>("cell_correct", cc, {"", "items with every answer found"});
  g.write<double>("cell_accuracy", ca, {"1", "exact-match accuracy"});
  g.write<double>("cell_recall", cr, {"1", "mean share of answers found"});
}

#define SPARSIM_INSTANTIATE_RULER(E)                                                             \
  template RulerResult run_ruler<E>(Engine<E>&, const Tokenizer&, const std::vector<RulerItem>&, \
                                    const RulerOptions&, const std::function<void(int, int)>&);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_RULER)

}  // namespace sparsim
