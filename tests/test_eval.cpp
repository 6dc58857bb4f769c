// Evaluation: window arithmetic, perplexity and task log-likelihoods against the
// double-precision reference, and the eval command's outputs and bad-input handling.
#include "backends.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "eval/corpus.hpp"
#include "eval/perplexity.hpp"
#include "eval/tasks.hpp"
#include "helpers.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/loader.hpp"
#include "model/tokenizer.hpp"
#include "reference_llama.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

double ref_nll(const std::vector<double>& logits, int target) {
  double mx = *std::max_element(logits.begin(), logits.end()), z = 0;
  for (double v : logits) z += std::exp(v - mx);
  return std::log(z) + mx - logits[target];
}

TEST(EvalWindows, StartsMatchBruteForce) {
  for (int n : {0, 10, 99, 100, 101, 257}) {
    for (int C : {10, 16, 32})
      for (int R : {1, 5, 16})
        for (int bos : {-1, 1}) {
          PplOptions o;
          o.context = C;
          o.stride = R;
          o.score = std::min(R, C - 1);
          o.bos_id = bos;
          const auto s = window_starts(n, o);
          std::vector<std::size_t> expect;
          const int body = C - (bos >= 0 ? 1 : 0);
          for (int st = 0; st + body <= n; st += R) expect.push_back(st);
          EXPECT_EQ(s, expect) << n << " " << C << " " << R << " " << bos;
        }
  }
  PplOptions o;
  o.context = 8;
  o.stride = 2;
  o.score = 2;
  o.max_windows = 3;
  EXPECT_EQ(window_starts(100, o).size(), 3u);
}

template <class E>
class EvalTest : public ::testing::Test {};
TYPED_TEST_SUITE(EvalTest, Backends, BackendName);

TYPED_TEST(EvalTest, PerplexityMatchesReference) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(31));
  auto w = load_model<E>(path, LoadOptions{});
  std::vector<int> stream;
  for (int i = 0; i < 90; ++i) stream.push_back(3 + (i * 37 + 11) % 500);
  PplOptions o;
  o.context = 24;
  o.stride = 16;
  o.score = 9;
  o.batch = 2;
  o.bos_id = 1;
  Engine<E> eng(w, 2, 24);
  const PplResult r = perplexity(eng, stream, o);
  const auto starts = window_starts(stream.size(), o);
  ASSERT_EQ(r.window_nll.size(), starts.size());
  double total = 0;
  for (std::size_t wi = 0; wi < starts.size(); ++wi) {
    ReferenceLlama ref(path);
    std::vector<int> win = {1};
    win.insert(win.end(), stream.begin() + starts[wi], stream.begin() + starts[wi] + 23);
    double wsum = 0;
    for (int p = 0; p < 24; ++p) {
      const auto lg = ref.step(win[p]);
      if (p >= 24 - 9 - 1 && p + 1 < 24) wsum += ref_nll(lg, win[p + 1]);
    }
    EXPECT_NEAR(r.window_nll[wi], wsum, 1e-4 * wsum) << "window " << wi;
    total += wsum;
  }
  EXPECT_EQ(r.tokens_scored, starts.size() * 9);
  EXPECT_NEAR(r.perplexity(), std::exp(total / (starts.size() * 9)), 1e-4 * r.perplexity());
}

TYPED_TEST(EvalTest, TaskLoglikelihoodAndAccuracyAgainstReference) {
  using E = TypeParam;
  TempDir dir;
  const std::string path = make_model(dir, "m.gguf", tiny_spec(32));
  auto w = load_model<E>(path, LoadOptions{});
  const Tokenizer tok = Tokenizer::from_gguf(gguf::File::open(path));
  Engine<E> eng(w, 1, 64);
  // Items whose answer is known: gold is the choice the reference model scores highest.
  std::vector<TaskItem> items;
  const char* ctxs[] = {"the cab fed a dog", "ab ba cd dc", "hello world"};
  const char* choices[] = {" a", " bab", " cdc", " ef"};
  std::vector<std::vector<double>> ref_ll;
  for (const char* c : ctxs) {
    TaskItem it;
    it.context = c;
    std::vector<double> lls;
    for (const char* ch : choices) {
      it.choices.push_back(ch);
      const auto whole = tok.encode(std::string(c) + ch, true);
      const std::size_t nctx = tok.encode(c, true).size();
      ReferenceLlama ref(path);
      double ll = 0;
      for (std::size_t p = 0; p + 1 < whole.size(); ++p) {
        const auto lg = ref.step(whole[p]);
        if (p + 1 >= nctx) ll -= ref_nll(lg, whole[p + 1]);
      }
      lls.push_back(ll);
    }
    it.gold = static_cast<int>(std::max_element(lls.begin(), lls.end()) - lls.begin());
    ref_ll.push_back(lls);
    items.push_back(it);
  }
  const TaskResult r = score_tasks(eng, tok, items, true);
  EXPECT_DOUBLE_EQ(r.acc, 1.0);
  for (std::size_t i = 0; i < items.size(); ++i)
    for (std::size_t c = 0; c < 4; ++c)
      EXPECT_NEAR(r.loglik[r.choice_offset[i] + c], ref_ll[i][c], 1e-4 * std::fabs(ref_ll[i][c]));
}

TEST(Corpus, FormatsAndBadInput) {
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir.file(name), std::ios::binary) << content;
    return dir.file(name);
  };
  const Corpus a = load_corpus(write("a.txt", "Hello there.\nGeneral Kenobi."));
  EXPECT_EQ(a.documents.size(), 1u);
  const Corpus j = load_corpus(write("b.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\"}\n"));
  EXPECT_EQ(j.documents, (std::vector<std::string>{"one", "two"}));
  fs::create_directories(dir.path() / "d/sub");
  std::ofstream(dir.path() / "d/z.txt") << "last";
  std::ofstream(dir.path() / "d/sub/a.txt") << "first";
  const Corpus d = load_corpus((dir.path() / "d").string());
  EXPECT_EQ(d.documents.size(), 2u);
  EXPECT_NE(a.fingerprint, j.fingerprint);
  auto expect_error = [](const std::string& spec, const std::string& needle) {
    try {
      load_corpus(spec);
      ADD_FAILURE() << "no error for " << spec;
    } catch (const sparsim::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(dir.file("missing.txt"), "does not exist");
  expect_error(write("empty.txt", ""), "empty");
  expect_error(write("bin.txt", std::string("ab\0cd", 5)), "binary");
  expect_error(write("latin1.txt", "caf\xe9 au lait"), "byte offset 3");
  expect_error(write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": oops}\n"), "bad.jsonl:2");
  expect_error(write("field.jsonl", "{\"body\": \"x\"}\n"), "field.jsonl:1");
}

class EvalCli : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = make_model(dir_, "tiny.gguf", tiny_spec(33));
    std::string text;
    for (int i = 0; i < 200; ++i)
      text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
    std::ofstream(dir_.file("corpus.txt")) << text;
  }
  RunResult eval(const std::string& extra) {
    const std::string window = extra.find("--context") == std::string::npos
                                   ? " --context 64 --stride 32 --max-windows 3 "
                                   : " ";
    return run_cmd(sparsim_bin() + " eval --model " + model_ + " --corpus " +
                   dir_.file("corpus.txt") + window + "--log-level error --progress never " +
                   extra);
  }
  void expect_failure(const std::string& extra, const std::string& needle) {
    const RunResult r =
        eval(extra + " --out " + dir_.file("o.h5") + " --json " + dir_.file("o.json"));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos)
        << "expected '" << needle << "' in " << r.output;
    EXPECT_FALSE(fs::exists(dir_.file("o.h5")));
    EXPECT_FALSE(fs::exists(dir_.file("o.json")));
  }
  TempDir dir_;
  std::string model_;
};

TEST_F(EvalCli, JsonSummaryAndRunFile) {
  std::ofstream(dir_.file("tasks.jsonl"))
      << "{\"context\": \"the quick\", \"choices\": [\" brown\", \" dog\"], \"gold\": 0}\n"
      << "{\"context\": \"over the\", \"choices\": [\" lazy\", \" fox\", \" a\"], \"gold\": 0}\n";
  const RunResult r = eval("--tasks " + dir_.file("tasks.jsonl") + " --out " + dir_.file("r.h5") +
                           " --json " + dir_.file("r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("perplexity"), std::string::npos);
  std::ifstream jf(dir_.file("r.json"));
  const auto j = nlohmann::json::parse(jf);
  for (const char* k : {"perplexity", "tokens_scored", "windows", "method", "model", "corpus",
                        "flops", "threads", "backend", "wall_seconds", "tasks"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_TRUE(j["model"].contains("path") && j["model"].contains("fingerprint"));
  EXPECT_TRUE(j["corpus"].contains("fingerprint"));
  EXPECT_TRUE(j["flops"].contains("dense") && j["flops"].contains("realised"));
  EXPECT_EQ(j["windows"].get<int>(), 3);
  EXPECT_EQ(j["tokens_scored"].get<int>(), 3 * 32);
  EXPECT_GT(j["perplexity"].get<double>(), 1.0);
  EXPECT_TRUE(fs::exists(dir_.file("r.h5")));
}

TEST_F(EvalCli, BadInput) {
  expect_failure("--context 100000", "longer than the model supports");
  std::ofstream(dir_.file("empty.txt")).close();
  const RunResult e = run_cmd(sparsim_bin() + " eval --model " + model_ + " --corpus " +
                              dir_.file("empty.txt") + " --out " + dir_.file("o.h5"));
  EXPECT_NE(e.exit_code, 0);
  EXPECT_NE(e.output.find("empty"), std::string::npos) << e.output;
  EXPECT_FALSE(fs::exists(dir_.file("o.h5")));
  std::ofstream(dir_.file("t.jsonl"))
      << "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"gold\": 0}\n"
      << "{\"context\": \"a\", \"choices\": [\"b\"], \"gold\": 0}\n";
  expect_failure("--tasks " + dir_.file("t.jsonl"), "t.jsonl:2");
  expect_failure("--stride 0", "stride");
  expect_failure("--method teal", "teal");
  const RunResult u = run_cmd(sparsim_bin() + " eval --model nosuchmodel");
  EXPECT_NE(u.exit_code, 0);
  EXPECT_NE(u.output.find("unknown model 'nosuchmodel'"), std::string::npos) << u.output;
}

TEST_F(EvalCli, UnsupportedTokenizerType) {
  // A copy of the model whose vocabulary claims a tokenizer type sparsim does not implement.
  gguf::File f = gguf::File::open(model_);
  gguf::Writer w;
  for (const auto& kv : f.metadata())
    w.set(kv.key, kv.key == "tokenizer.ggml.model" ? gguf::Value::string("wordpiece") : kv.value);
  for (const auto& t : f.tensors()) w.add_tensor(t.name, t.ne, t.type, t.data, t.nbytes);
  const std::string bad = dir_.file("wp.gguf");
  w.write(bad);
  const RunResult r = run_cmd(sparsim_bin() + " eval --model " + bad + " --corpus " +
                              dir_.file("corpus.txt") + " --out " + dir_.file("o.h5"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("wordpiece"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_.file("o.h5")));
}

}  // namespace
}  // namespace sparsim::test
