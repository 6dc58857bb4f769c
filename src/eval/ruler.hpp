#pragma once
/// A generated long-context suite in the spirit of RULER (Hsieh et al., 2024; NVIDIA/RULER):
/// synthetic prompts whose answers are fixed by construction, at chosen lengths, scored by
/// matching the greedy continuation. The templates are sparsim's own; the task logic follows
/// the reference generator:
///
///   niah_single      one "special number" needle for a key; asked: that key
///   niah_multikey    four needles with different keys; asked: one of them
///   niah_multivalue  four needles for the same key; asked: that key (all four values)
///   niah_multiquery  four needles with different keys; asked: all four keys
///   vt               variable tracking: a chain VAR A = n, VAR B = VAR A, … (4 hops) hidden
///                    in the filler; asked: every variable that holds n
///   cwe              common words: a numbered list of corpus words, 10 of them repeated more
///                    often than the rest; asked: the 10 most common
///   fwe              frequent words: coded words drawn with Zipf frequencies (α = 2, the most
///                    frequent one is "...." and ignored); asked: the next three
///
/// Filler (niah, vt) is a window of the corpus token stream; cwe draws its words from the
/// corpus's distinct words. A length L is the whole budget, as in RULER's max_seq_length: the
/// prompt plus the task's generation budget (gen_tokens). niah and vt prompts have exactly
/// L − gen_tokens tokens; cwe and fwe prompts are the longest list that fits. Prompts are the
/// concatenation of separately encoded pieces (intro, filler, needles, question).
///
/// Scoring: an item is correct when every expected answer occurs in the continuation as a whole
/// word (case-insensitive; neighbours are not letters or digits); recall is the fraction found
/// (RULER's string_match_all averages recall with substring matching).
#include "engine/engine.hpp"
#include "model/tokenizer.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sparsim {

namespace io {
class Group;
}

/// The suite's tasks, in run order.
const std::vector<std::string>& ruler_tasks();

/// "" or "all": every task; else a comma-separated list of task names, where "niah" stands for
/// the four niah tasks. Throws naming an unknown name or a repeated one.
std::vector<std::string> parse_ruler_subset(const std::string& spec);

/// Tokens generated per prompt of `task`.
int ruler_gen_tokens(const std::string& task);

struct RulerOptions {
  std::vector<std::string> tasks = ruler_tasks();
  std::vector<int> lengths;  ///< prompt + generation budget, tokens; empty: default_lengths()
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};  ///< cycled over a cell's samples
  int samples = 20;                                          ///< per (task, length) cell
  std::uint64_t seed = 1;
  int batch = 1;  ///< prompts per forward pass (equal prompt lengths only)
  /// What needs no model: throws OptionError naming the quantity for no task, a length under
  /// 256, unsorted or repeated lengths, depths outside [0, 1], samples < 1, batch < 1.
  void check_values() const;
  /// check_values(), and no length (the default lengths the model's context leaves) or a
  /// length above `model_context`.
  void validate(int model_context) const;
  /// 1024, 2048, … up to the model's context (empty when the context is under 1024).
  static std::vector<int> default_lengths(int model_context);
};

struct RulerItem {
  std::string task;
  int length = 0;      ///< the cell's length (prompt + gen_tokens)
  double depth = -1;   ///< requested depth of the first needle; -1 for vt, cwe, fwe
  double placed = -1;  ///< first needle's start / filler length, as placed
  int sample = 0;
  int gen_tokens = 0;
  std::vector<std::string> answers;  ///< every one must appear in the continuation
  std::vector<int> prompt;
};

/// Builds every (task, length, sample) prompt. `filler`: the corpus token stream; `words`: the
/// corpus's distinct words (cwe). Throws when the corpus is too small for a prompt.
std::vector<RulerItem> build_ruler(const RulerOptions& o, const Tokenizer& tok,
                                   const std::vector<int>& filler,
                                   const std::vector<std::string>& words, bool add_bos);

/// Distinct lowercase words of 3–12 ASCII letters in `documents`, sorted.
std::vector<std::string> ruler_words(const std::vector<std::string>& documents);

/// Whether `word` occurs in `text` as a whole word, ignoring ASCII case.
bool contains_word(const std::string& text, const std::string& word);

struct RulerResult {
  std::vector<int> correct;         ///< per item: 1 when every answer was found
  std::vector<double> recall;       ///< per item: answers found / answers
  std::vector<std::string> output;  ///< decoded greedy continuation
};

/// Greedy decoding of every item: up to o.batch consecutive items with equal prompt lengths and
/// budgets per pass; a sequence stops at EOS, a batch once every sequence has stopped or found
/// all its answers (which cannot change its score).
template <class E>
RulerResult run_ruler(Engine<E>& eng, const Tokenizer& tok, const std::vector<RulerItem>& items,
                      const RulerOptions& o, const std::function<void(int, int)>& progress = {});

/// Summary: overall accuracy, per task, per (task, length) and per (task, length, depth) cells,
/// and every item (task, length, depth, sample, correct, recall, answers, output) for paired
/// comparisons between runs of the same seed.
nlohmann::json ruler_json(const RulerOptions& o, const std::vector<RulerItem>& items,
                          const RulerResult& r);

/// The same into a run file group (per-item datasets and the cells).
void write_ruler(io::Group& g, const RulerOptions& o, const std::vector<RulerItem>& items,
                 const RulerResult& r);

}  // namespace sparsim
