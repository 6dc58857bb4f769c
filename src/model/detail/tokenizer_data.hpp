#pragma once
/// Internals of sparsim::Tokenizer: the tables a loader fills in, UTF-8 helpers and the PCRE2
/// regex wrapper. Not part of the public API.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sparsim::detail {

// ---------------------------------------------------------------- UTF-8

/// Length of the well-formed UTF-8 sequence at s[i], 0 if the bytes there are not one.
std::size_t utf8_valid_len(std::string_view s, std::size_t i);
/// Copy of `s` with each byte that does not start a well-formed sequence replaced by U+FFFD.
std::string utf8_sanitize(std::string_view s);
/// Appends the UTF-8 encoding of `cp`.
void utf8_append(std::string& out, std::uint32_t cp);
/// Decodes the (well-formed) sequence at s[i]; advances i.
std::uint32_t utf8_next(std::string_view s, std::size_t& i);

/// The GPT-2 byte alphabet: byte b is spelled as the code point byte_to_cp()[b].
const std::array<std::uint32_t, 256>& gpt2_byte_to_cp();
/// The inverse: code point → byte, -1 for code points outside the alphabet.
int gpt2_cp_to_byte(std::uint32_t cp);

// ---------------------------------------------------------------- regex

/// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Immutable and shareable.
class Regex {
 public:
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  /// Appends the [begin, end) byte ranges of the successive non-overlapping, non-empty matches
  /// in `s` (which must be valid UTF-8) to `out`.
  void find_all(std::string_view s, std::vector<std::pair<std::size_t, std::size_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

// ---------------------------------------------------------------- pipeline

/// How a Split step treats what its regex matches (Hugging Face SplitDelimiterBehavior).
enum class SplitBehavior { Isolated, Removed, MergedWithPrevious, MergedWithNext };

/// One pre-tokenization step, applied to every piece produced by the previous steps.
struct PreStep {
  enum class Kind {
    Split,        ///< regex split (pieces between matches kept unless Removed)
    PrefixSpace,  ///< prepend ' ' to a piece that does not start with one (HF ByteLevel)
    Metaspace,    ///< ' ' → replacement, optional prefix, optional split before each replacement
  };
  Kind kind = Kind::Split;
  std::shared_ptr<const Regex> re;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  // Metaspace
  std::string replacement = "\xE2\x96\x81";
  int prepend = 0;  ///< 0 never, 1 always, 2 first (only a fragment at offset 0 of the input)
  bool split = true;
};

/// One normalization step on each plain-text fragment (Hugging Face normalizers).
struct NormStep {
  enum class Kind { Prepend, Replace };
  Kind kind = Kind::Prepend;
  std::string text;  ///< Prepend: prefix; Replace: literal pattern (when re is null)
  std::shared_ptr<const Regex> re;
  std::string content;  ///< Replace: replacement
};

/// Token types as in GGUF tokenizer.ggml.token_type.
enum TokenType : int {
  kTokNormal = 1,
  kTokUnknown = 2,
  kTokControl = 3,
  kTokUserDefined = 4,
  kTokUnused = 5,
  kTokByte = 6,
};

struct MergeInfo {
  int rank;    ///< lower merges first
  int result;  ///< id of the merged token
};

/// Everything a Tokenizer needs. Loaders fill the "input" part and call finalize().
struct TokenizerData {
  // ---- input
  std::string model_type;  ///< "gpt2" or "llama"
  std::string pre_type = "default";
  std::vector<std::string> tokens;
  std::vector<int> types;     ///< TokenType per token (kTokNormal if empty)
  std::vector<float> scores;  ///< SentencePiece scores (merge priority when merges is empty)
  /// Merge rules as (left, right) token texts, in rank order. Empty → merge by score.
  std::vector<std::pair<std::string, std::string>> merge_rules;
  int bos = -1, eos = -1, unk = -1;
  bool add_bos = false;
  bool add_space_prefix = false;  ///< SentencePiece: prepend ' ' to fragments (GGUF llama)
  bool byte_level = false;        ///< pieces are spelled in the GPT-2 byte alphabet
  bool escape_spaces = false;     ///< ' ' → "▁" before merging (GGUF llama)
  bool ignore_merges = false;     ///< a piece that is a vocabulary entry is taken whole
  bool byte_fallback = true;      ///< unknown characters → <0xXX> tokens (else unk)
  bool fuse_unk = false;          ///< consecutive unk tokens become one
  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre_steps;
  /// decode: drop one leading ' ' 0: never, 1: at the start and after each special token,
  /// 2: at the start only (the inverse of the space prefix added when encoding).
  int decode_strip = 0;
  std::string source;  ///< file name, for messages

  // ---- derived by finalize()
  std::unordered_map<std::string, int> token_to_id;
  std::unordered_map<std::uint64_t, MergeInfo> merges;  ///< key: left id << 32 | right id
  /// Score-merged (SentencePiece) vocabularies: characters that occur inside entries without
  /// being entries themselves get ids from tokens.size() on, so that they can still merge
  /// ("▁" + "t" → "▁t" when "▁" alone is not in the vocabulary).
  std::unordered_map<std::string, int> extra_chars;
  std::vector<int> specials;        ///< longest text first
  std::array<int, 256> byte_sym{};  ///< byte-level: id of the byte's alphabet character
  std::array<int, 256> byte_tok{};  ///< id of <0xXX>, -1 if absent
  std::vector<std::string> pieces;  ///< decoded bytes of each token
  std::vector<bool> is_special;     ///< matched as a whole in the text

  /// Validates the input tables and builds the derived ones. Throws sparsim::Error.
  void finalize();
};

}  // namespace sparsim::detail
