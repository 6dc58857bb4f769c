// Output paths, temporary files and model consistency checks, below the command line: the path
// guard (file identity, collisions, folders), temporary names and their clean-up, and the
// hyper-parameter vs tensor checks with the key each message must name.
#include "core/error.hpp"
#include "helpers.hpp"
#include "io/run_guard.hpp"
#include "io/temp_file.hpp"
#include "model/consistency.hpp"
#include "model/gguf_config.hpp"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

namespace sparsim::test {
namespace {

namespace fs = std::filesystem;

void touch(const std::string& p, const std::string& text = "x") {
  std::ofstream(p) << text;
}

/// The UsageError message of check_run_paths, or "" when it accepts.
std::string refusal(const std::vector<io::InputPath>& in, const std::vector<io::OutputPath>& out) {
  try {
    io::check_run_paths(in, out);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(RunGuard, AcceptsOrdinaryOutputs) {
  TempDir d;
  touch(d.file("model.gguf"));
  touch(d.file("old.h5"));  // an existing output is replaced: allowed
  EXPECT_EQ(refusal({{"--model", d.file("model.gguf")}},
                    {{"--out", d.file("old.h5")}, {"--json", d.file("s.json")}, {"--plot", ""}}),
            "");
}

TEST(RunGuard, OutputThatIsAnInputByNameLinkOrSpelling) {
  TempDir d;
  const std::string m = d.file("model.gguf");
  touch(m);
  fs::create_hard_link(m, d.file("hard.gguf"));
  fs::create_symlink(m, d.file("soft.gguf"));
  fs::create_directories(d.path() / "sub");
  for (const std::string& o :
       {m, d.file("hard.gguf"), d.file("soft.gguf"), d.file("sub/../model.gguf")}) {
    const std::string r = refusal({{"--model", m}}, {{"--out", o}});
    EXPECT_NE(r.find("--out"), std::string::npos) << o << ": " << r;
    EXPECT_NE(r.find("--model"), std::string::npos) << o << ": " << r;
    EXPECT_NE(r.find("destroy an input"), std::string::npos) << o << ": " << r;
  }
}

TEST(RunGuard, OutputInsideAFolderInput) {
  TempDir d;
  fs::create_directories(d.path() / "texts");
  touch(d.file("texts/a.txt"));
  const std::string r = refusal({{"--corpus", d.file("texts")}}, {{"--out", d.file("texts/r.h5")}});
  EXPECT_NE(r.find("inside the --corpus folder"), std::string::npos) << r;
  // a folder output that holds an input
  const std::string s =
      refusal({{"--model", d.file("texts/a.txt")}}, {{"--out", d.file("texts"), true}});
  EXPECT_NE(s.find("holds the --model"), std::string::npos) << s;
}

TEST(RunGuard, TwoOutputsOneFile) {
  TempDir d;
  const std::string r =
      refusal({}, {{"--out", d.file("x")}, {"--json", d.path().string() + "/./x"}});
  EXPECT_NE(r.find("--out"), std::string::npos) << r;
  EXPECT_NE(r.find("--json"), std::string::npos) << r;
  EXPECT_NE(r.find("name the same file"), std::string::npos) << r;
  touch(d.file("y"));
  fs::create_hard_link(d.file("y"), d.file("y2"));
  EXPECT_NE(refusal({}, {{"--out", d.file("y")}, {"--plot", d.file("y2")}}).find("same file"),
            std::string::npos);
}

TEST(RunGuard, FoldersMustExistAndOutputsMustBeFiles) {
  TempDir d;
  std::string r = refusal({}, {{"--json", d.file("missing/s.json")}});
  EXPECT_NE(r.find("'" + d.file("missing") + "' does not exist"), std::string::npos) << r;
  r = refusal({}, {{"--out", d.path().string()}});
  EXPECT_NE(r.find("is a folder"), std::string::npos) << r;
  r = refusal({}, {{"--out", d.file("newdir/")}});
  EXPECT_NE(r.find("names a folder"), std::string::npos) << r;
  r = refusal({}, {{"--out", "/dev/null"}});
  EXPECT_NE(r.find("not a regular file"), std::string::npos) << r;
  touch(d.file("f"));
  r = refusal({}, {{"--out", d.file("f"), true}});
  EXPECT_NE(r.find("not a folder"), std::string::npos) << r;
  r = refusal({}, {{"--out", d.file("f/x.h5")}});
  EXPECT_NE(r.find("is not a folder"), std::string::npos) << r;
  if (::geteuid() != 0) {  // root may write anywhere
    fs::create_directories(d.path() / "ro");
    fs::permissions(d.path() / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    r = refusal({}, {{"--out", d.file("ro/x.h5")}});
    EXPECT_NE(r.find("not writable"), std::string::npos) << r;
    fs::permissions(d.path() / "ro", fs::perms::owner_all);
  }
}

TEST(TempFiles, NamesCarryPidAndHostAndParseBack) {
  const std::string t = io::temp_path_for("/a/b/run.h5");
  EXPECT_EQ(t.rfind("/a/b/run.h5.sparsim-" + std::to_string(::getpid()) + "-", 0), 0u) << t;
  io::TempOwner o;
  ASSERT_TRUE(io::parse_temp_name(t.substr(5), o)) << t;
  EXPECT_EQ(o.pid, ::getpid());
  EXPECT_EQ(o.final_name, "run.h5");
  EXPECT_FALSE(o.host.empty());
  for (const char* other : {"run.h5", "run.h5.tmp.123", "x.sparsim-12-.tmp", "x.sparsim--h.tmp",
                            "x.sparsim-1a-h.tmp", ".sparsim-1-h.tmp", "x.sparsim-1-h.h.tmp"})
    EXPECT_FALSE(io::parse_temp_name(other, o)) << other;
}

TEST(TempFiles, StaleOnesOfDeadProcessesAreRemovedOthersKept) {
  TempDir d;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  int st = 0;
  ::waitpid(child, &st, 0);  // `child` is now a pid whose process is gone
  const std::string mine = io::temp_path_for(d.file("live.h5"));
  std::string dead = mine;
  dead.replace(dead.find(".sparsim-") + 9, std::to_string(::getpid()).size(),
               std::to_string(child));
  dead.replace(dead.find("live.h5"), 7, "dead.h5");
  const std::string other_host = d.file("x.h5.sparsim-" + std::to_string(child) + "-elsewhere.tmp");
  for (const auto& p : {mine, dead, other_host, d.file("keep.tmp")}) touch(p);
  const auto removed = io::remove_stale_temps(d.path().string());
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], dead);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(mine)) << "the file of a live process was removed";
  EXPECT_TRUE(fs::exists(other_host)) << "the file of another host was removed";
  EXPECT_TRUE(fs::exists(d.file("keep.tmp")));
}

TEST(TempFiles, CommitPublishesDiscardRemoves) {
  TempDir d;
  {
    io::TempFile t(d.file("a.txt"));
    touch(t.path(), "hello");
    t.commit();
  }
  EXPECT_TRUE(fs::exists(d.file("a.txt")));
  {
    io::TempFile t(d.file("b.txt"));
    touch(t.path(), "partial");
  }
  EXPECT_FALSE(fs::exists(d.file("b.txt")));
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path()), fs::directory_iterator()), 1);
}

// ---------------------------------------------------------------------------------------------
// Consistency of the hyper-parameters with the tensors

class Consistency : public ::testing::Test {
 protected:
  void SetUp() override { model_ = make_model(dir_, "tiny.gguf", tiny_spec(5)); }
  /// The problems check_gguf_model finds in the tiny model after `edit`.
  std::vector<std::string> problems(
      const std::function<void(std::vector<gguf::KeyValue>&, std::vector<TensorCopy>&)>& edit) {
    const std::string p = dir_.file("edited.gguf");
    rewrite_gguf(model_, p, edit);
    return check_gguf_model(gguf::File::open(p));
  }
  TempDir dir_;
  std::string model_;
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

TEST_F(Consistency, TheTinyModelIsConsistent) {
  EXPECT_TRUE(check_gguf_model(gguf::File::open(model_)).empty());
}

TEST_F(Consistency, BlockCountAgainstTheBlocksPresent) {
  auto p = problems([](auto& kv, auto&) { set_u32(kv, "llama.block_count", 1000); });
  ASSERT_EQ(p.size(), 1u) << joined(p);
  EXPECT_NE(p[0].find("'llama.block_count' = 1000"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("2 blocks only"), std::string::npos) << p[0];
  p = problems([](auto& kv, auto&) { set_u32(kv, "llama.block_count", 1); });
  ASSERT_EQ(p.size(), 1u) << joined(p);
  EXPECT_NE(p[0].find("tensors for 2 blocks"), std::string::npos) << p[0];
}

TEST_F(Consistency, EmbeddingLengthIsBlamedNotTheRopeWidth) {
  // As in llama.cpp's conversions of SmolLM2: no key_length, so the head width would be
  // embedding_length / head_count if the wrong key were believed.
  auto p = problems([](auto& kv, auto&) {
    kv.erase(std::remove_if(kv.begin(), kv.end(),
                            [](const gguf::KeyValue& k) {
                              return k.key == "llama.attention.key_length" ||
                                     k.key == "llama.attention.value_length";
                            }),
             kv.end());
    set_u32(kv, "llama.embedding_length", 12345);
  });
  ASSERT_EQ(p.size(), 1u) << joined(p);
  EXPECT_NE(p[0].find("'llama.embedding_length' = 12345"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("'token_embd.weight'"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("64 entries"), std::string::npos) << p[0];
}

TEST_F(Consistency, EachKeyAgainstTheTensorThatShowsIt) {
  struct Case {
    const char* key;
    std::uint32_t value;
    const char* tensor;
  };
  for (const Case& c : {Case{"llama.attention.head_count", 8, "blk.0.attn_q.weight"},
                        Case{"llama.attention.head_count_kv", 4, "blk.0.attn_k.weight"},
                        Case{"llama.attention.key_length", 8, "blk.0.attn_q.weight"},
                        Case{"llama.feed_forward_length", 96, "blk.0.ffn_gate.weight"},
                        Case{"llama.vocab_size", 600, "token_embd.weight"},
                        Case{"llama.rope.dimension_count", 8, "blk.0.attn_q.weight"},
                        Case{"llama.attention.value_length", 32, "blk.0.attn_q.weight"}}) {
    const auto p = problems([&](auto& kv, auto&) { set_u32(kv, c.key, c.value); });
    ASSERT_FALSE(p.empty()) << c.key;
    EXPECT_NE(p[0].find(std::string("'") + c.key + "' = " + std::to_string(c.value)),
              std::string::npos)
        << c.key << ": " << joined(p);
    EXPECT_NE(p[0].find(c.tensor), std::string::npos) << c.key << ": " << joined(p);
  }
}

TEST_F(Consistency, EveryTensorOfEveryBlockIsChecked) {
  auto p = problems([](auto&, auto& ts) {
    for (auto& t : ts)
      if (t.name == "blk.1.ffn_down.weight") {
        t.ne = {64, 128};  // transposed
      }
    ts.erase(std::remove_if(ts.begin(), ts.end(),
                            [](const TensorCopy& t) { return t.name == "output_norm.weight"; }),
             ts.end());
  });
  const std::string all = joined(p);
  EXPECT_NE(all.find("tensor 'blk.1.ffn_down.weight' has shape [64, 128], expected [128, 64]"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("missing tensor 'output_norm.weight'"), std::string::npos) << all;
  EXPECT_EQ(p.size(), 2u) << all;
}

TEST_F(Consistency, LoadingThrowsWithEveryProblem) {
  const std::string p = dir_.file("two.gguf");
  rewrite_gguf(model_, p, [](auto& kv, auto&) {
    set_u32(kv, "llama.block_count", 7);
    set_u32(kv, "llama.feed_forward_length", 100);
  });
  try {
    (void)config_from_gguf(gguf::File::open(p));
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("2 problems"), std::string::npos) << m;
    EXPECT_NE(m.find("llama.block_count"), std::string::npos) << m;
    EXPECT_NE(m.find("llama.feed_forward_length"), std::string::npos) << m;
  }
}

TEST(ConsistencyHf, NamesTheConfigKeys) {
  StatedShape s;
  s.n_layer = 2;
  s.d_model = 48;  // the embedding says 64
  s.n_head = 4;
  s.d_ff = 128;
  s.vocab = 512;
  TensorShapes t;
  t["model.embed_tokens.weight"] = {512, 64};
  t["model.norm.weight"] = {64};
  const LlamaNames n = LlamaNames::hugging_face();
  for (int l = 0; l < 2; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    t[b + "input_layernorm.weight"] = {64};
    t[b + "post_attention_layernorm.weight"] = {64};
    t[b + "self_attn.q_proj.weight"] = {64, 64};
    t[b + "self_attn.k_proj.weight"] = {64, 64};
    t[b + "self_attn.v_proj.weight"] = {64, 64};
    t[b + "self_attn.o_proj.weight"] = {64, 64};
    t[b + "mlp.gate_proj.weight"] = {128, 64};
    t[b + "mlp.up_proj.weight"] = {128, 64};
    t[b + "mlp.down_proj.weight"] = {64, 128};
  }
  auto p = check_llama_shapes(s, t, n);
  ASSERT_EQ(p.size(), 1u) << joined(p);
  EXPECT_NE(p[0].find("'hidden_size' = 48"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("[512, 64]"), std::string::npos) << p[0];
  s.d_model = 64;
  s.output_required = true;  // untied, but no lm_head.weight
  p = check_llama_shapes(s, t, n);
  ASSERT_EQ(p.size(), 1u) << joined(p);
  EXPECT_NE(p[0].find("missing tensor 'lm_head.weight'"), std::string::npos) << p[0];
}

}  // namespace
}  // namespace sparsim::test
