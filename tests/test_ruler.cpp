// The generated long-context suite (eval --task ruler): every prompt's answer recomputed from
// the decoded prompt text alone, seeded reproducibility, scoring, bad input, and an end-to-end
// run on a tiny model.
#include "cli_fixture.hpp"
#include "core/error.hpp"
#include "eval/corpus.hpp"
#include "eval/ruler.hpp"
#include "io/hdf5.hpp"
#include "model/gguf.hpp"
#include "model/model_registry.hpp"
#include "model/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

std::set<std::string> as_set(const std::vector<std::string>& v) {
  return {v.begin(), v.end()};
}

/// The answer of a prompt, found from its text only (no generator state).
std::set<std::string> recompute(const std::string& task, const std::string& text) {
  std::set<std::string> ans;
  if (task.rfind("niah_", 0) == 0) {
    std::multimap<std::string, std::string> needles;
    const std::regex nd(R"(One of the special numbers for ([a-z]+) is ([0-9]+)\.)");
    for (auto m = std::sregex_iterator(text.begin(), text.end(), nd); m != std::sregex_iterator();
         ++m)
      needles.emplace((*m)[1].str(), (*m)[2].str());
    std::smatch q;
    const std::regex qr(R"(What are all the special numbers for (.+?) in the text above\?)");
    EXPECT_TRUE(std::regex_search(text, q, qr)) << text.substr(text.size() - 200);
    std::string keys = q[1].str();
    keys = std::regex_replace(keys, std::regex(" and "), ", ");
    std::stringstream ks(keys);
    for (std::string k; std::getline(ks, k, ',');) {
      k.erase(0, k.find_first_not_of(' '));
      auto [a, b] = needles.equal_range(k);
      EXPECT_NE(a, b) << "no needle for the asked key " << k;
      for (auto it = a; it != b; ++it) ans.insert(it->second);
    }
  } else if (task == "vt") {
    std::map<std::string, std::string> rhs;
    const std::regex st(R"(VAR ([A-Z]{5}) = (VAR [A-Z]{5}|[0-9]+)\.)");
    for (auto m = std::sregex_iterator(text.begin(), text.end(), st); m != std::sregex_iterator();
         ++m)
      rhs[(*m)[1].str()] = (*m)[2].str();
    std::smatch q;
    EXPECT_TRUE(std::regex_search(text, q, std::regex(R"(assigned the value ([0-9]+)\?)")));
    for (const auto& [name, r0] : rhs) {
      std::string r = r0;
      for (int hop = 0; hop < 100 && r.rfind("VAR ", 0) == 0; ++hop) r = rhs.at(r.substr(4));
      if (r == q[1].str()) ans.insert(name);
    }
  } else if (task == "cwe" || task == "fwe") {
    const std::size_t a = text.find('\n'), b = text.rfind("\nQuestion:");
    EXPECT_NE(a, std::string::npos);
    EXPECT_NE(b, std::string::npos);
    const std::string body = text.substr(a + 1, b - a - 1);
    std::map<std::string, int> count;
    if (task == "cwe") {
      const std::regex ent(R"(([0-9]+)\.\s+([a-z]+))");
      int expect = 1;
      for (auto m = std::sregex_iterator(body.begin(), body.end(), ent);
           m != std::sregex_iterator(); ++m, ++expect) {
        EXPECT_EQ(std::stoi((*m)[1].str()), expect);  // numbered 1, 2, 3, … without gaps
        ++count[(*m)[2].str()];
      }
    } else {
      std::stringstream ws(body);
      for (std::string w; ws >> w;)
        if (w != "....") ++count[w];
    }
    std::vector<std::pair<int, std::string>> byc;
    for (const auto& [w, c] : count) byc.push_back({c, w});
    std::sort(byc.rbegin(), byc.rend());
    const std::size_t top = task == "cwe" ? 10 : 3;
    EXPECT_GT(byc.size(), top);
    if (byc.size() > top) {
      EXPECT_GT(byc[top - 1].first, byc[top].first) << "ambiguous top";
    }
    for (std::size_t i = 0; i < std::min(top, byc.size()); ++i) ans.insert(byc[i].second);
  }
  return ans;
}

class RulerGen : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string m = make_model(*dir_, "m.gguf", tiny_spec(5));
    tok_ = new Tokenizer(Tokenizer::from_gguf(gguf::File::open(m)));
    const std::string cp = dir_->file("c.txt");
    write_word_corpus(cp, 3, 12000, 9);
    corpus_ = new Corpus(load_corpus(cp));
    stream_ = new std::vector<int>();
    for (const auto& d : corpus_->documents) {
      const auto t = tok_->encode(d, false);
      stream_->insert(stream_->end(), t.begin(), t.end());
    }
    words_ = new std::vector<std::string>(ruler_words(corpus_->documents));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete corpus_;
    delete stream_;
    delete words_;
    delete dir_;
  }
  static RulerOptions opts() {
    RulerOptions o;
    o.lengths = {2048, 3072};
    o.samples = 5;
    o.seed = 11;
    return o;
  }
  static void check_answers(const Tokenizer& tok, const std::vector<RulerItem>& items) {
    for (const auto& it : items) {
      SCOPED_TRACE(it.task + " length " + std::to_string(it.length));
      const std::string text = tok.decode(it.prompt);
      EXPECT_EQ(recompute(it.task, text), as_set(it.answers));
      const int budget = it.length - it.gen_tokens;
      if (it.task == "cwe" || it.task == "fwe") {
        EXPECT_LE(static_cast<int>(it.prompt.size()), budget);
        EXPECT_GE(static_cast<int>(it.prompt.size()), budget * 9 / 10);
      } else {
        EXPECT_EQ(static_cast<int>(it.prompt.size()), budget);
      }
      if (it.task.rfind("niah_", 0) == 0) {
        EXPECT_GE(it.depth, 0.0);
        EXPECT_NEAR(it.placed, it.depth, 0.1);  // moved back by at most 32 filler tokens
      }
    }
  }

  static TempDir* dir_;
  static Tokenizer* tok_;
  static Corpus* corpus_;
  static std::vector<int>* stream_;
  static std::vector<std::string>* words_;
};
TempDir* RulerGen::dir_ = nullptr;
Tokenizer* RulerGen::tok_ = nullptr;
Corpus* RulerGen::corpus_ = nullptr;
std::vector<int>* RulerGen::stream_ = nullptr;
std::vector<std::string>* RulerGen::words_ = nullptr;

TEST_F(RulerGen, AnswersFollowFromThePromptText) {
  const RulerOptions o = opts();
  const auto items = build_ruler(o, *tok_, *stream_, *words_, true);
  ASSERT_EQ(items.size(), o.tasks.size() * o.lengths.size() * 5);
  check_answers(*tok_, items);
  // niah depths cycle over the samples of a cell
  for (const auto& it : items)
    if (it.task == "niah_single") {
      EXPECT_EQ(it.depth, o.depths[static_cast<std::size_t>(it.sample) % o.depths.size()]);
    }
}

TEST_F(RulerGen, AnswersFollowFromThePromptTextWithSmolLM2sTokenizer) {
  const auto p = find_smollm2_gguf();
  if (!p) GTEST_SKIP() << "SmolLM2-135M-Instruct GGUF not found (scripts/setup.sh installs it)";
  const Tokenizer tok = Tokenizer::from_gguf(gguf::File::open(*p));
  std::vector<int> stream;
  for (const auto& d : corpus_->documents) {
    const auto t = tok.encode(d, false);
    stream.insert(stream.end(), t.begin(), t.end());
  }
  RulerOptions o = opts();
  o.lengths = {1024, 4096};
  o.samples = 3;
  check_answers(tok, build_ruler(o, tok, stream, *words_, true));
}

TEST_F(RulerGen, SeededAndASubsetBuildsTheSamePrompts) {
  RulerOptions o = opts();
  const auto a = build_ruler(o, *tok_, *stream_, *words_, true);
  const auto b = build_ruler(o, *tok_, *stream_, *words_, true);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].answers, b[i].answers);
  }
  RulerOptions sub = o;
  sub.tasks = parse_ruler_subset("vt,niah_multikey");
  EXPECT_EQ(sub.tasks, (std::vector<std::string>{"niah_multikey", "vt"}));
  for (const auto& it : build_ruler(sub, *tok_, *stream_, *words_, true)) {
    const auto same = std::find_if(a.begin(), a.end(), [&](const RulerItem& x) {
      return x.task == it.task && x.length == it.length && x.sample == it.sample;
    });
    ASSERT_NE(same, a.end());
    EXPECT_EQ(same->prompt, it.prompt);
  }
  RulerOptions other = o;
  other.seed = 12;
  const auto c = build_ruler(other, *tok_, *stream_, *words_, true);
  int differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += a[i].prompt != c[i].prompt;
  EXPECT_EQ(differ, static_cast<int>(a.size()));
}

TEST(Ruler, WholeWordMatching) {
  EXPECT_TRUE(contains_word(" 1234567, 7654321", "7654321"));
  EXPECT_FALSE(contains_word(" 12345678", "1234567"));
  EXPECT_FALSE(contains_word(" 01234567", "1234567"));
  EXPECT_TRUE(contains_word("Answer: ABCDE.", "abcde"));
  EXPECT_FALSE(contains_word("xabcde", "abcde"));
  EXPECT_TRUE(contains_word("1. apple 2. pear", "pear"));
  EXPECT_FALSE(contains_word("pears", "pear"));
  EXPECT_FALSE(contains_word("anything", ""));
}

TEST(Ruler, SubsetsAndOptionsAreChecked) {
  EXPECT_EQ(parse_ruler_subset("").size(), 7u);
  EXPECT_EQ(parse_ruler_subset("niah").size(), 4u);
  EXPECT_EQ(parse_ruler_subset("fwe,cwe"), (std::vector<std::string>{"cwe", "fwe"}));
  auto throws_with = [](auto f, const std::string& msg) {
    try {
      f();
      ADD_FAILURE() << "no error, expected '" << msg << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
    }
  };
  throws_with([] { parse_ruler_subset("niah_double"); }, "unknown task 'niah_double'");
  throws_with([] { parse_ruler_subset("vt,vt"); }, "named twice");
  throws_with([] { parse_ruler_subset("niah,niah_single"); }, "named twice");
  RulerOptions o;
  o.lengths = {1024, 8192};
  o.validate(8192);
  throws_with([&] { o.validate(4096); }, "exceeds the model's context of 4096");
  o.lengths = {2048, 1024};
  throws_with([&] { o.validate(8192); }, "increasing");
  o.lengths = {1024};
  o.samples = 0;
  throws_with([&] { o.validate(8192); }, "items per cell");
  o.samples = 20;
  o.depths = {0.5, 1.2};
  throws_with([&] { o.validate(8192); }, "outside [0, 1]");
  EXPECT_EQ(RulerOptions::default_lengths(8192), (std::vector<int>{1024, 2048, 4096, 8192}));
  EXPECT_TRUE(RulerOptions::default_lengths(512).empty());
  EXPECT_EQ(RulerOptions().samples, 20);
}

TEST_F(RulerGen, ASmallCorpusIsAnError) {
  RulerOptions o = opts();
  o.tasks = {"niah_single"};
  const std::vector<int> few(stream_->begin(), stream_->begin() + 300);
  try {
    build_ruler(o, *tok_, few, *words_, true);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("longer corpus"), std::string::npos) << e.what();
  }
  o.tasks = {"cwe"};
  const std::vector<std::string> w(words_->begin(), words_->begin() + 20);
  try {
    build_ruler(o, *tok_, *stream_, w, true);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too few distinct words"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ end to end

class CliRuler : public TinyModelCli<CliRuler> {
 protected:
  static void SetUpTestSuite() { make_tiny({41, 5, 6000, 13, 4096}); }
  static std::string eval(const std::string& extra) {
    return on_tiny("eval", "--no-perplexity --progress never", extra);
  }
};

TEST_F(CliRuler, RunsTheSuiteAndRecordsEveryItem) {
  const std::string js = dir_->file("r.json"), out = dir_->file("r.h5"),
                    js2 = dir_->file("r2.json");
  RunResult r =
      run_cmd(eval("--task ruler --ruler-lengths 2048,3072 --ruler-samples 2 --batch 2"
                   " --json " +
                   js + " --out " + out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(js);
  const auto summary = nlohmann::json::parse(f);
  const auto& j = summary.at("ruler");
  EXPECT_EQ(j.at("items").size(), 7u * 2 * 2);
  // the sweep table's columns of the suite are the block's figures
  EXPECT_EQ(summary.at("columns").at("ruler_accuracy").at("value"), j.at("accuracy"));
  EXPECT_EQ(summary.at("columns").at("ruler_items").at("value").get<double>(), 28.0);
  EXPECT_EQ(j.at("by_task").size(), 7u);
  int correct = 0;
  for (const auto& it : j.at("items")) {
    correct += it.at("correct").get<int>();
    const double rec = it.at("recall").get<double>();
    EXPECT_GE(rec, 0.0);
    EXPECT_LE(rec, 1.0);
    // the recorded score agrees with the recorded output and answers
    int found = 0;
    for (const auto& a : it.at("answers"))
      found += contains_word(it.at("output").get<std::string>(), a.get<std::string>());
    EXPECT_DOUBLE_EQ(rec, static_cast<double>(found) / it.at("answers").size());
  }
  EXPECT_NEAR(j.at("accuracy").get<double>(), correct / 28.0, 1e-12);
  // cells: one per (task, length), plus one per depth for the niah tasks (2 samples: depths
  // 0 and 0.25)
  EXPECT_EQ(j.at("cells").size(), 7u * 2 + 4u * 2 * 2);
  io::H5File h = io::H5File::open_read(out);
  const io::Group g = h.root().open_group("results").open_group("ruler");
  EXPECT_EQ(g.read_strings("item_task").size(), 28u);
  EXPECT_EQ(g.read<std::int32_t>("item_correct").size(), 28u);
  // the same run with batch 1 and another thread count: the same outputs
  r =
      run_cmd(eval("--task ruler --ruler-lengths 2048,3072 --ruler-samples 2 --batch 1 --threads 1"
                   " --json " +
                   js2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f2(js2);
  const auto j2 = nlohmann::json::parse(f2).at("ruler");
  for (std::size_t i = 0; i < j.at("items").size(); ++i)
    EXPECT_EQ(j.at("items")[i].at("output"), j2.at("items")[i].at("output")) << i;
}

TEST_F(CliRuler, BadInputFailsWithoutOutput) {
  const std::string js = dir_->file("bad.json"), out = dir_->file("bad.h5");
  const std::string sink = " --json " + js + " --out " + out;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--task ruler:niah_single,haystack", "unknown task 'haystack'"},
      {"--task rulers", "--task must be"},
      {"--task ruler --ruler-lengths 8192", "exceeds the model's context of 4096"},
      {"--task ruler --ruler-lengths 1024 --ruler-samples 0", "--ruler-samples"},
      {"--task ruler --ruler-lengths 100", "too short"},
      {"--task ruler --ruler-lengths 1024 --ruler-depths 0,2", "outside"},
      {"--task ruler:vt,vt --ruler-lengths 1024", "named twice"},
      {"--task passkey --ruler-samples 5", "--ruler-samples needs --task ruler"},
  };
  expect_each_fails(cases, [&](const std::string& a) { return eval(a + sink); }, {js, out});
}

}  // namespace
}  // namespace sparsim::test
