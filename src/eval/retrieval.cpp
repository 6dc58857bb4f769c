#include "eval/retrieval.hpp"

#include "core/backends.hpp"
#include "core/error.hpp"
#include "eval/greedy.hpp"
#include "model/synth.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

namespace sparsim {

namespace {
constexpr const char* kLengths = "the retrieval prompt lengths";
}  // namespace

void RetrievalOptions::check_values() const {
  require_setting(kind == "passkey" || kind == "kv", "retrieval.kind", "the retrieval task",
                  "must be passkey or kv, got '{}'", kind);
  require_setting(!lengths.empty(), "retrieval.lengths", kLengths, ": give at least one length");
  require_setting(!depths.empty(), "retrieval.depths", "the needle depths",
                  ": give at least one depth");
  for (int L : lengths)
    require_setting(L >= 64, "retrieval.lengths", kLengths,
                    ": {} tokens is too short for a retrieval prompt", L);
  for (double d : depths)
    require_setting(std::isfinite(d) && d >= 0 && d <= 1, "retrieval.depths", "the needle depths",
                    ": {} is outside [0, 1]", d);
  require_setting(samples >= 1, "retrieval.samples", "the prompts per cell",
                  "must be positive, got {}", samples);
  require_setting(digits >= 1 && digits <= 12, "retrieval.digits", "the needle's digits",
                  "must be 1 … 12, got {}", digits);
  require_setting(batch >= 1, "retrieval.batch", "the prompts per forward pass",
                  "must be positive, got {}", batch);
}

void RetrievalOptions::validate(int model_context) const {
  check_values();
  for (int L : lengths)
    require_setting(L + answer_tokens() <= model_context, "retrieval.lengths", kLengths,
                    ": a prompt of {} tokens plus its {}-token answer exceeds the model's context "
                    "of {} tokens",
                    L, answer_tokens(), model_context);
}

std::string first_number(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size() && !std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  std::size_t j = i;
  while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
  return text.substr(i, j - i);
}

namespace {

std::string digits_of(SynthRng& r, int n) {
  std::string s;
  s.push_back(static_cast<char>('1' + r.next() % 9));  // no leading zero
  while (static_cast<int>(s.size()) < n) s.push_back(static_cast<char>('0' + r.next() % 10));
  return s;
}

std::string key_name(SynthRng& r) {
  static const char* const kSyl[] = {"ka", "lo", "mi",  "ru",  "te",  "vo", "zen", "pa",
                                     "di", "su", "bor", "qui", "nax", "fe", "gul", "yor"};
  std::string s;
  for (int i = 0; i < 3; ++i) s += kSyl[r.next() % 16];
  return s + "-" + std::to_string(10 + r.next() % 90);
}

}  // namespace

std::vector<RetrievalItem> build_retrieval(const RetrievalOptions& o, const Tokenizer& tok,
                                           const std::vector<int>& filler, bool add_bos) {
  std::vector<RetrievalItem> items;
  SynthRng rng(o.seed * 0x9e3779b97f4a7c15ull + 17);
  for (int L : o.lengths)
    for (double depth : o.depths)
      for (int k = 0; k < o.samples; ++k) {
        RetrievalItem it;
        it.length = L;
        it.depth = depth;
        it.sample = k;
        it.answer = digits_of(rng, o.digits);
        std::string intro, needle, question;
        if (o.kind == "passkey") {
          intro =
              "A pass key is hidden somewhere in the long text below. Find it and keep it in "
              "mind: the question at the end asks for it.\n\n";
          needle = fmt::format("\nThe pass key is {0}. Keep it in mind: {0} is the pass key.\n",
                               it.answer);
          question = "\n\nWhat is the pass key? The pass key is";
        } else {
          it.key = key_name(rng);
          intro =
              "A key and its value are hidden somewhere in the long text below. Find them and "
              "keep them in mind: the question at the end asks for the value.\n\n";
          needle = fmt::format(
              "\nThe value of the key \"{0}\" is {1}. Again: \"{0}\" has the "
              "value {1}.\n",
              it.key, it.answer);
          question = fmt::format(
              "\n\nWhat is the value of the key \"{0}\"? The value of the key "
              "\"{0}\" is",
              it.key);
        }
        const std::vector<int> ti = tok.encode(intro, add_bos), tn = tok.encode(needle, false),
                               tq = tok.encode(question, false);
        const int n = L - static_cast<int>(ti.size() + tn.size() + tq.size());
        require(n >= 1, "retrieval: a length of {} tokens leaves no room for filler text", L);
        require(filler.size() > static_cast<std::size_t>(n),
                "retrieval: the corpus has {} tokens, fewer than the {} filler tokens a prompt of "
                "{} needs (a longer corpus)",
                filler.size(), n, L);
        const std::size_t off = rng.next() % (filler.size() - static_cast<std::size_t>(n));
        int a = static_cast<int>(std::lround(depth * n));
        for (int j = a; j > 0 && j > a - 32; --j) {  // just after a line or sentence end
          const std::string& s = tok.decode_token(filler[off + static_cast<std::size_t>(j) - 1]);
          if (!s.empty() && (s.find('\n') != std::string::npos || s.back() == '.')) {
            a = j;
            break;
          }
        }
        it.placed = static_cast<double>(a) / n;
        it.prompt = ti;
        it.prompt.insert(it.prompt.end(), filler.begin() + static_cast<std::ptrdiff_t>(off),
                         filler.begin() + static_cast<std::ptrdiff_t>(off + a));
        it.prompt.insert(it.prompt.end(), tn.begin(), tn.end());
        it.prompt.insert(it.prompt.end(), filler.begin() + static_cast<std::ptrdiff_t>(off + a),
                         filler.begin() + static_cast<std::ptrdiff_t>(off + n));
        it.prompt.insert(it.prompt.end(), tq.begin(), tq.end());
        items.push_back(std::move(it));
      }
  return items;
}

template <class E>
RetrievalResult run_retrieval(Engine<E>& eng, const Tokenizer& tok,
                              const std::vector<RetrievalItem>& items, const RetrievalOptions& o,
                              const std::function<void(int, int)>& progress) {
  RetrievalResult res;
  res.correct.assign(items.size(), 0);
  res.output.assign(items.size(), "");
  const int G = o.answer_tokens();
  std::size_t i = 0;
  while (i < items.size()) {
    std::size_t j = i;  // a batch: up to o.batch items of one length
    while (j < items.size() && j - i < static_cast<std::size_t>(o.batch) &&
           items[j].length == items[i].length)
      ++j;
    const int nb = static_cast<int>(j - i), L = items[i].length;
    require(L + G <= eng.max_ctx() && nb <= eng.max_seqs(),
            "retrieval: the engine holds {} × {} tokens, need {} × {}", eng.max_seqs(),
            eng.max_ctx(), nb, L + G);
    std::vector<std::vector<int>> seqs;
    for (std::size_t k = i; k < j; ++k) seqs.push_back(items[k].prompt);
    const std::vector<std::vector<int>> out = greedy_continuations(
        eng, seqs, G, tok.eos_id(), [](std::size_t, const std::vector<int>&) { return false; });
    for (int b = 0; b < nb; ++b) {
      const std::size_t k = i + static_cast<std::size_t>(b);
      res.output[k] = tok.decode_text(out[static_cast<std::size_t>(b)]);
      res.correct[k] = first_number(res.output[k]) == items[k].answer ? 1 : 0;
    }
    i = j;
    if (progress) progress(static_cast<int>(i), static_cast<int>(items.size()));
  }
  const std::size_t nl = o.lengths.size(), nd = o.depths.size();
  res.cell_accuracy.assign(nl * nd, 0.0);
  std::vector<int> cnt(nl * nd, 0);
  int hits = 0;
  for (std::size_t k = 0; k < items.size(); ++k) {
    const std::size_t li = static_cast<std::size_t>(
        std::find(o.lengths.begin(), o.lengths.end(), items[k].length) - o.lengths.begin());
    const std::size_t di = static_cast<std::size_t>(
        std::find(o.depths.begin(), o.depths.end(), items[k].depth) - o.depths.begin());
    res.cell_accuracy[li * nd + di] += res.correct[k];
    ++cnt[li * nd + di];
    hits += res.correct[k];
  }
  for (std::size_t c = 0; c < cnt.size(); ++c)
    if (cnt[c]) res.cell_accuracy[c] /= cnt[c];
  res.accuracy = items.empty() ? 0.0 : static_cast<double>(hits) / items.size();
  return res;
}

#define SPARSIM_INSTANTIATE_RETRIEVAL(E)                                                        \
  template RetrievalResult run_retrieval<E>(                                                    \
      Engine<E>&, const Tokenizer&, const std::vector<RetrievalItem>&, const RetrievalOptions&, \
      const std::function<void(int, int)>&);
SPARSIM_FOR_EACH_BACKEND(SPARSIM_INSTANTIATE_RETRIEVAL)

}  // namespace sparsim
