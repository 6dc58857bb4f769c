// Tokenizer::from_hf_json: the BPE subset of the Hugging Face tokenizer.json format.
#include "core/error.hpp"
#include "model/detail/tokenizer_data.hpp"
#include "model/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace sparsim {

namespace {

using detail::NormStep;
using detail::PreStep;
using detail::SplitBehavior;
using detail::TokenizerData;
using nlohmann::json;

const char* const kByteLevelRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "{}: cannot open the tokenizer file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
}

/// A literal string as a PCRE2 pattern.
std::string regex_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

class HfLoader {
 public:
  HfLoader(std::string path, TokenizerData& d) : path_(std::move(path)), d_(d) {}

  std::string str(const json& j, const char* key, const std::string& dflt = "") const {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    require(j[key].is_string(), "{}: '{}' must be a string", path_, key);
    return j[key].get<std::string>();
  }
  bool boolean(const json& j, const char* key, bool dflt) const {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    require(j[key].is_boolean(), "{}: '{}' must be true or false", path_, key);
    return j[key].get<bool>();
  }

  std::shared_ptr<const detail::Regex> pattern(const json& p, const char* where) const {
    require(p.is_object(), "{}: {}: 'pattern' must be an object", path_, where);
    if (p.contains("Regex")) return std::make_shared<detail::Regex>(p["Regex"].get<std::string>());
    if (p.contains("String"))
      return std::make_shared<detail::Regex>(regex_escape(p["String"].get<std::string>()));
    fail("{}: {}: pattern {} is not supported (Regex, String)", path_, where, p.dump());
  }

  void normalizer(const json& n) {
    if (n.is_null()) return;
    const std::string type = str(n, "type");
    if (type == "Sequence") {
      for (const json& s : n.at("normalizers")) normalizer(s);
    } else if (type == "Prepend") {
      d_.normalizers.push_back({NormStep::Kind::Prepend, str(n, "prepend"), nullptr, ""});
    } else if (type == "Replace") {
      NormStep st{NormStep::Kind::Replace, "", nullptr, str(n, "content")};
      const json& p = n.at("pattern");
      if (p.contains("String"))
        st.text = p["String"].get<std::string>();
      else
        st.re = pattern(p, "normalizer Replace");
      d_.normalizers.push_back(std::move(st));
    } else {
      fail("{}: normalizer '{}' is not supported (Sequence, Prepend, Replace)", path_, type);
    }
  }

  void split(const std::string& re, SplitBehavior b, bool invert) {
    PreStep st;
    st.re = std::make_shared<detail::Regex>(re);
    st.behavior = b;
    st.invert = invert;
    d_.pre_steps.push_back(std::move(st));
  }

  void pre_tokenizer(const json& p) {
    if (p.is_null()) return;
    const std::string type = str(p, "type");
    if (type == "Sequence") {
      for (const json& s : p.at("pretokenizers")) pre_tokenizer(s);
    } else if (type == "ByteLevel") {
      byte_level_ = true;
      if (boolean(p, "add_prefix_space", true)) {
        PreStep st;
        st.kind = PreStep::Kind::PrefixSpace;
        d_.pre_steps.push_back(std::move(st));
      }
      if (boolean(p, "use_regex", true)) split(kByteLevelRegex, SplitBehavior::Isolated, false);
    } else if (type == "Split") {
      PreStep st;
      st.re = pattern(p.at("pattern"), "pre_tokenizer Split");
      const std::string b = str(p, "behavior", "Isolated");
      if (b == "Isolated")
        st.behavior = SplitBehavior::Isolated;
      else if (b == "Removed")
        st.behavior = SplitBehavior::Removed;
      else if (b == "MergedWithPrevious")
        st.behavior = SplitBehavior::MergedWithPrevious;
      else if (b == "MergedWithNext")
        st.behavior = SplitBehavior::MergedWithNext;
      else
        fail(
            "{}: Split behavior '{}' is not supported (Isolated, Removed, MergedWithPrevious, "
            "MergedWithNext)",
            path_, b);
      st.invert = boolean(p, "invert", false);
      d_.pre_steps.push_back(std::move(st));
    } else if (type == "Digits") {
      split(boolean(p, "individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)",
            SplitBehavior::Isolated, false);
    } else if (type == "Whitespace") {
      split(R"(\w+|[^\w\s]+)", SplitBehavior::Removed, true);
    } else if (type == "WhitespaceSplit") {
      split(R"(\s+)", SplitBehavior::Removed, false);
    } else if (type == "Metaspace") {
      PreStep st;
      st.kind = PreStep::Kind::Metaspace;
      st.replacement = str(p, "replacement", "\xE2\x96\x81");
      require(!st.replacement.empty(), "{}: Metaspace replacement is empty", path_);
      std::string scheme = str(p, "prepend_scheme", "");
      if (scheme.empty()) scheme = boolean(p, "add_prefix_space", true) ? "always" : "never";
      if (scheme == "always")
        st.prepend = 1;
      else if (scheme == "first")
        st.prepend = 2;
      else if (scheme == "never")
        st.prepend = 0;
      else
        fail("{}: Metaspace prepend_scheme '{}' is not supported (always, first, never)", path_,
             scheme);
      st.split = boolean(p, "split", true);
      metaspace_prepend_ = st.prepend;
      d_.pre_steps.push_back(std::move(st));
    } else {
      fail(
          "{}: pre_tokenizer '{}' is not supported (ByteLevel, Split, Digits, Metaspace, "
          "Whitespace, WhitespaceSplit, Sequence)",
          path_, type);
    }
  }

  /// Finds the first SpecialToken of a TemplateProcessing "single" template.
  void post_processor(const json& p) {
    if (p.is_null()) return;
    const std::string type = str(p, "type");
    if (type == "Sequence") {
      for (const json& s : p.at("processors")) post_processor(s);
    } else if (type == "TemplateProcessing" && p.contains("single") && p["single"].is_array() &&
               !p["single"].empty()) {
      const json& first = p["single"][0];
      if (!first.contains("SpecialToken")) return;
      const std::string name = first["SpecialToken"].value("id", "");
      if (p.contains("special_tokens") && p["special_tokens"].contains(name)) {
        const json& ids = p["special_tokens"][name]["ids"];
        if (ids.is_array() && ids.size() == 1) template_bos_ = ids[0].get<int>();
      }
      if (template_bos_ < 0) template_bos_ = id_of(name);
    }
  }

  int id_of(const std::string& text) const {
    auto it = std::find(d_.tokens.begin(), d_.tokens.end(), text);
    return it == d_.tokens.end() ? -1 : static_cast<int>(it - d_.tokens.begin());
  }

  void load() {
    const json j = read_json(path_);
    require(j.is_object() && j.contains("model"), "{}: no 'model' in the tokenizer file", path_);
    const json& m = j["model"];
    const std::string type = str(m, "type", m.contains("merges") ? "BPE" : "");
    if (type != "BPE") fail("{}: model type '{}' is not supported (BPE)", path_, type);
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() > 0)
      fail("{}: BPE dropout is not supported", path_);
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (!str(m, k).empty()) fail("{}: BPE {} is not supported", path_, k);

    // Vocabulary: model.vocab plus added_tokens (which may extend it).
    const json& vocab = m.at("vocab");
    require(vocab.is_object(), "{}: model.vocab must be an object", path_);
    int max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it)
      max_id = std::max(max_id, it->get<int>());
    const json added = j.contains("added_tokens") && j["added_tokens"].is_array()
                           ? j["added_tokens"]
                           : json::array();
    for (const json& a : added) max_id = std::max(max_id, a.at("id").get<int>());
    require(max_id >= 0, "{}: the vocabulary is empty", path_);
    d_.tokens.assign(max_id + 1, std::string());
    d_.types.assign(max_id + 1, detail::kTokUnused);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int id = it->get<int>();
      require(id >= 0, "{}: negative id for '{}'", path_, it.key());
      d_.tokens[id] = it.key();
      d_.types[id] = detail::kTokNormal;
    }
    for (const json& a : added) {
      const int id = a.at("id").get<int>();
      require(id >= 0, "{}: negative added token id", path_);
      d_.tokens[id] = a.at("content").get<std::string>();
      d_.types[id] = a.value("special", false) ? detail::kTokControl : detail::kTokUserDefined;
    }

    const json& merges = m.at("merges");
    require(merges.is_array(), "{}: model.merges must be an array", path_);
    d_.merge_rules.reserve(merges.size());
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const json& r = merges[i];
      if (r.is_string()) {
        const std::string s = r.get<std::string>();
        const std::size_t sp = s.size() > 1 ? s.find(' ', 1) : std::string::npos;
        require(sp != std::string::npos, "{}: merges[{}] '{}' is not of the form 'left right'",
                path_, i, s);
        d_.merge_rules.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {
        require(r.is_array() && r.size() == 2 && r[0].is_string() && r[1].is_string(),
                "{}: merges[{}] must be \"a b\" or [\"a\", \"b\"]", path_, i);
        d_.merge_rules.emplace_back(r[0].get<std::string>(), r[1].get<std::string>());
      }
    }

    normalizer(j.value("normalizer", json()));
    pre_tokenizer(j.value("pre_tokenizer", json()));
    post_processor(j.value("post_processor", json()));

    d_.byte_level = byte_level_;
    d_.model_type = byte_level_ ? "gpt2" : "llama";
    d_.pre_type = "hf";
    d_.ignore_merges = boolean(m, "ignore_merges", false);
    d_.byte_fallback = !byte_level_ && boolean(m, "byte_fallback", false);
    d_.fuse_unk = boolean(m, "fuse_unk", false);
    const std::string unk = str(m, "unk_token");
    d_.unk = unk.empty() ? -1 : id_of(unk);

    // Decoding drops the space that encoding put in front.
    bool prepends = false;
    for (const NormStep& n : d_.normalizers)
      if (n.kind == NormStep::Kind::Prepend && n.text == "\xE2\x96\x81") prepends = true;
    if (prepends)
      d_.decode_strip = 1;
    else if (metaspace_prepend_ == 1)
      d_.decode_strip = 1;
    else if (metaspace_prepend_ == 2)
      d_.decode_strip = 2;

    // BOS / EOS: tokenizer_config.json beside the file, else the post-processor template, else
    // well-known texts.
    d_.add_bos = template_bos_ >= 0;
    d_.bos = template_bos_;
    const auto cfg_path = std::filesystem::path(path_).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(cfg_path)) {
      const json c = read_json(cfg_path.string());
      auto token_of = [&](const char* key) {
        if (!c.contains(key) || c[key].is_null()) return -1;
        const json& v = c[key];
        return id_of(v.is_string() ? v.get<std::string>() : v.value("content", ""));
      };
      if (int b = token_of("bos_token"); b >= 0) d_.bos = b;
      if (int e = token_of("eos_token"); e >= 0) d_.eos = e;
      if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean())
        d_.add_bos = c["add_bos_token"].get<bool>();
    }
    auto first_of = [&](std::initializer_list<const char*> names) {
      for (const char* nm : names)
        if (int id = id_of(nm); id >= 0) return id;
      return -1;
    };
    if (d_.bos < 0) d_.bos = first_of({"<s>", "<|begin_of_text|>", "<|endoftext|>"});
    if (d_.eos < 0) d_.eos = first_of({"</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>"});
    d_.source = path_;
    d_.finalize();
  }

 private:
  std::string path_;
  TokenizerData& d_;
  bool byte_level_ = false;
  int metaspace_prepend_ = -1;
  int template_bos_ = -1;
};

}  // namespace

Tokenizer Tokenizer::from_hf_json(const std::string& path) {
  auto d = std::make_shared<TokenizerData>();
  try {
    HfLoader(path, *d).load();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed tokenizer.json: {}", path, e.what());
  }
  return Tokenizer(std::move(d));
}

}  // namespace sparsim
