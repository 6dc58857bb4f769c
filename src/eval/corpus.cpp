#include "eval/corpus.hpp"

#include "core/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace sparsim {

namespace fs = std::filesystem;

std::size_t invalid_utf8_offset(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    int len;
    std::uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    const std::uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::string::npos;
}

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  require(static_cast<bool>(f), "corpus: cannot read '{}'", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void check_text(const std::string& s, const std::string& where) {
  require(s.find('\0') == std::string::npos,
          "corpus: '{}' contains NUL bytes: it looks binary, not text", where);
  const std::size_t bad = invalid_utf8_offset(s);
  require(bad == std::string::npos, "corpus: '{}' is not valid UTF-8 (byte offset {})", where, bad);
}

bool is_jsonl(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".jsonl" || e == ".ndjson";
}

void load_jsonl(const fs::path& p, const CorpusOptions& opt, Corpus& c) {
  std::ifstream f(p, std::ios::binary);
  require(static_cast<bool>(f), "corpus: cannot read '{}'", p.string());
  std::string line;
  std::size_t lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", p.string(), lineno);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("corpus: {}: malformed JSON ({})", where, e.what());
    }
    require(j.is_object() && j.contains(opt.text_field) && j[opt.text_field].is_string(),
            "corpus: {}: no string field '{}'", where, opt.text_field);
    std::string t = j[opt.text_field].get<std::string>();
    check_text(t, where);
    c.bytes += t.size();
    c.documents.push_back(std::move(t));
  }
}

void load_one(const fs::path& p, const CorpusOptions& opt, Corpus& c) {
  c.files.push_back(p.string());
  if (is_jsonl(p)) {
    load_jsonl(p, opt, c);
    return;
  }
  std::string t = read_file(p);
  check_text(t, p.string());
  c.bytes += t.size();
  c.documents.push_back(std::move(t));
}

}  // namespace

std::optional<std::string> find_default_corpus() {
  if (const char* e = std::getenv("SPARSIM_CORPUS"); e && *e) return std::string(e);
  std::vector<fs::path> roots;
  if (const char* d = std::getenv("SPARSIM_DEPS"); d && *d) roots.emplace_back(d);
  if (const char* h = std::getenv("HOME"); h && *h)
    roots.push_back(fs::path(h) / ".cache/sparsim-deps");
  for (const auto& r : roots) {
    const fs::path p = r / "corpus" / "shakespeare";
    std::error_code ec;
    if (fs::is_directory(p, ec) && !fs::is_empty(p, ec)) return p.string();
  }
  return std::nullopt;
}

Corpus load_corpus(const std::string& spec, const CorpusOptions& opt) {
  Corpus c;
  std::string path = spec;
  if (spec == "default") {
    auto d = find_default_corpus();
    if (!d)
      throw OptionError("corpus.path", "the corpus",
                        "'default' is not installed: run scripts/setup.sh, set SPARSIM_CORPUS, or "
                        "name a text file, a directory of them or a JSONL file");
    path = *d;
  }
  c.source = path;
  std::error_code ec;
  require(fs::exists(path, ec), "corpus: '{}' does not exist", path);
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(path))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    require(!files.empty(), "corpus: directory '{}' holds no files", path);
    for (const auto& f : files) load_one(f, opt, c);
  } else {
    load_one(path, opt, c);
  }
  c.documents.erase(std::remove_if(c.documents.begin(), c.documents.end(),
                                   [](const std::string& d) { return d.empty(); }),
                    c.documents.end());
  require(!c.documents.empty() && c.bytes > 0, "corpus: '{}' is empty", path);
  std::uint64_t h = 1469598103934665603ULL;
  for (const auto& d : c.documents) {
    for (unsigned char ch : d) h = (h ^ ch) * 1099511628211ULL;
    h = (h ^ 0xffu) * 1099511628211ULL;  // document boundary
  }
  c.fingerprint = fmt::format("{:016x}", h);
  return c;
}

}  // namespace sparsim
