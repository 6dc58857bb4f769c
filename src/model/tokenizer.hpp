#pragma once
/// Text ↔ token ids for Llama-family models: byte-level BPE ("gpt2") and SentencePiece BPE
/// ("llama"), loaded from GGUF metadata (tokenizer.ggml.*) or a Hugging Face tokenizer.json.
///
/// Encoding follows llama.cpp's llama_tokenize(text, add_special=add_bos, parse_special=true),
/// which is the reference the golden tests compare against:
///
///  * Input policy: the text is read as UTF-8; every byte that does not start a well-formed
///    UTF-8 sequence (stray continuation bytes, truncated sequences, overlong forms, surrogates,
///    values above U+10FFFF) is replaced by U+FFFD before anything else happens. This is what
///    llama.cpp does too, so encoding never fails on user text.
///  * Special tokens: every token of type unknown (2), control (3) or user-defined (4) — for
///    tokenizer.json, every entry of added_tokens — that appears verbatim in the text is taken as
///    that single token before pre-tokenization. Candidates are tried longest text first (ties:
///    lower id first); each one splits every remaining plain-text fragment at all of its
///    non-overlapping leftmost occurrences. So "<|im_start|>user" gives [<|im_start|>, user]
///    rather than the pieces of "<|im_start|>" spelled out. The plain-text fragments between
///    specials are tokenized independently.
///  * "gpt2" (byte-level BPE): each fragment is split by the pre-tokenizer regexes of
///    tokenizer.ggml.pre (applied one after the other, each to every piece of the previous one,
///    the text between matches kept as pieces of its own), the bytes of each piece are mapped to
///    the GPT-2 byte alphabet, and the merges are applied lowest rank first (ties: leftmost).
///    Supported pre-tokenizers: "default", "gpt-2" (also "gpt2", "mpt", "olmo"), "llama-bpe" (also
///    "llama3", "llama-v3"), "smollm" (also "starcoder", "refact", "command-r", "codeshell",
///    "exaone", "minerva": digits split one by one, then the GPT-2 regex), "qwen2".
///    For llama-bpe a piece that is itself a vocabulary entry is emitted whole (ignore_merges).
///  * "llama" (SentencePiece BPE): a space is prepended to each fragment that starts the text or
///    follows a special token when add_space_prefix holds (tokenizer.ggml.add_space_prefix,
///    default true), spaces become U+2581 "▁", and adjacent symbols are merged whenever their
///    concatenation is a vocabulary entry, highest score first (ties: leftmost). Characters that
///    end up outside the vocabulary are spelled with the <0xXX> byte tokens (or <unk> if the
///    vocabulary has none).
///  * Regex classes run in PCRE2 UTF + UCP mode, so \s, \p{L}, \p{N} use PCRE2's Unicode tables
///    (\s there also matches U+180E, which llama.cpp does not count as whitespace).
///
/// Decoding is the inverse: byte-level pieces are mapped back to bytes, "▁" becomes a space,
/// <0xXX> tokens become their byte, special tokens are rendered as their text. For "llama" with
/// add_space_prefix, the one space that encode prepends (at the start and after each special
/// token) is removed again, so decode(encode(s)) == s for every valid UTF-8 s. No other clean-up
/// is done. The result of decode may be invalid UTF-8 (a token can hold part of a character).
/// Exceptions to the round trip: a literal "▁" in SentencePiece text (it reads back as a space),
/// bytes a byte-level vocabulary has no symbol for (dropped when encoding, as in llama.cpp;
/// SmolLM2 lacks several C0 control bytes), and tokenizer.json Metaspace layouts, where " x" and
/// "x" encode alike.
///
/// Merging: symbols are token ids, merge candidates sit in a binary heap keyed by (rank, position)
/// and are checked for staleness when popped, so a piece of n symbols costs O(n log n).
/// SentencePiece merges are precomputed from the vocabulary (every split of an entry into two
/// entries or single characters) and ranked by the entry's score.
///
/// A Tokenizer is immutable after loading; encode/decode are safe to call from several threads.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sparsim {

namespace gguf {
class File;
}

namespace detail {
struct TokenizerData;
}

class Tokenizer {
 public:
  /// Reads tokenizer.ggml.model / tokens / token_type / merges / scores / pre / bos_token_id /
  /// eos_token_id / add_bos_token / add_space_prefix. Throws sparsim::Error naming the key at
  /// fault, e.g. "tokenizer.ggml.model 'xyz' is not supported (gpt2, llama)".
  static Tokenizer from_gguf(const gguf::File& f);

  /// Reads a Hugging Face tokenizer.json with a BPE model (vocab, merges as "a b" strings or
  /// [a, b] pairs). Supported: pre-tokenizers ByteLevel, Split (regex or string; behaviours
  /// Isolated, Removed, MergedWithPrevious, MergedWithNext), Digits, Metaspace, Whitespace,
  /// Sequence; normalizers Prepend, Replace, Sequence; added_tokens as specials. The model type
  /// is "gpt2" when a ByteLevel pre-tokenizer is present, else "llama" (SentencePiece style).
  /// BOS/EOS and add_bos come from a tokenizer_config.json beside the file when there is one
  /// (bos_token, eos_token, add_bos_token), else from a TemplateProcessing post-processor, else
  /// from well-known token texts. Anything else throws sparsim::Error naming the component.
  static Tokenizer from_hf_json(const std::string& path);

  std::vector<int> encode(std::string_view text, bool add_bos) const;
  std::string decode(const std::vector<int>& ids) const;
  /// decode() made well-formed UTF-8 for reports: every byte that does not belong to a
  /// well-formed sequence (a character cut at the end of a generation) becomes U+FFFD.
  std::string decode_text(const std::vector<int>& ids) const;
  /// The bytes of one token (no leading-space removal). Throws for an id out of range.
  std::string decode_token(int id) const;

  int vocab_size() const;
  int bos_id() const;  ///< -1 when the vocabulary has none
  int eos_id() const;  ///< -1 when the vocabulary has none
  /// tokenizer.ggml.add_bos_token, or the model type's default (llama: true, gpt2: true only for
  /// llama-bpe).
  bool add_bos_default() const;
  const std::string& model_type() const;  ///< "gpt2" or "llama"
  /// tokenizer.ggml.pre, e.g. "smollm" ("default" if absent); "hf" for a tokenizer.json.
  const std::string& pre_type() const;
  /// The vocabulary entry of `id` as stored (byte-level / "▁" form). Throws when out of range.
  const std::string& token_text(int id) const;
  /// The id of a vocabulary entry, -1 if absent.
  int token_id(std::string_view text) const;

  /// Builds a tokenizer from prepared tables (used by the loaders and by tests).
  explicit Tokenizer(std::shared_ptr<const detail::TokenizerData> d);

 private:
  std::shared_ptr<const detail::TokenizerData> d_;
};

}  // namespace sparsim
