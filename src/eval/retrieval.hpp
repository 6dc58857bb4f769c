#pragma once
/// A generated long-context retrieval task: a pass key (or a key–value pair) placed at a depth
/// of 0–100% inside filler text taken from the corpus, followed by a question; scored by exact
/// match of the greedy continuation. Every prompt is built here from the corpus token stream
/// and a seeded random generator: no data set is read.
///
///   [BOS] intro  filler[0 … a)  needle  filler[a … n)  question   → greedy answer
///
/// The prompt holds exactly `length` tokens; the needle starts at filler offset a ≈ depth·n,
/// moved back (by at most 32 tokens) to just after a line or sentence end when one is near.
#include "engine/engine.hpp"
#include "model/tokenizer.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sparsim {

struct RetrievalOptions {
  std::string kind = "passkey";  ///< passkey (a number) or kv (the value of a named key)
  std::vector<int> lengths = {2048, 4096, 8192};
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  int samples = 1;         ///< prompts per (length, depth) cell
  std::uint64_t seed = 1;  ///< keys, key names and filler offsets
  int digits = 5;          ///< digits of the pass key / value
  int batch = 1;           ///< prompts per forward pass
  /// What needs no model: throws OptionError naming the quantity for an unknown kind, empty
  /// lists, too short lengths, depths outside [0, 1], samples, digits or batch out of range.
  void check_values() const;
  /// check_values(), and a length the model's context cannot hold with the answer.
  void validate(int model_context) const;
  /// Greedy tokens generated per prompt.
  int answer_tokens() const { return digits + 3; }
};

struct RetrievalItem {
  int length = 0;
  double depth = 0;   ///< requested
  double placed = 0;  ///< needle start / filler length, as placed
  int sample = 0;
  std::string key;     ///< kv: the key's name
  std::string answer;  ///< the digits to retrieve
  std::vector<int> prompt;
};

/// Builds every (length, depth, sample) prompt. `filler`: the corpus token stream.
std::vector<RetrievalItem> build_retrieval(const RetrievalOptions& o, const Tokenizer& tok,
                                           const std::vector<int>& filler, bool add_bos);

struct RetrievalResult {
  double accuracy = 0;
  std::vector<double> cell_accuracy;  ///< [length][depth]
  std::vector<int> correct;           ///< per item
  std::vector<std::string> output;    ///< decoded greedy continuation per item
};

/// The first run of digits in `text` ("" when none).
std::string first_number(const std::string& text);

/// Runs every item greedily (o.batch prompts of one length per pass) and scores exact matches
/// of the first number in the continuation.
template <class E>
RetrievalResult run_retrieval(Engine<E>& eng, const Tokenizer& tok,
                              const std::vector<RetrievalItem>& items, const RetrievalOptions& o,
                              const std::function<void(int, int)>& progress = {});

}  // namespace sparsim
