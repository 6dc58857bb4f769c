// The run-time methods' settings are checked in two steps, by the library: what needs no model
// (check_values, at parse time) and what needs one (validate, once it is loaded). The library's
// errors name the quantity and carry its key; the command line maps the key to its option (the
// CLI tests check those messages).
#include "core/error.hpp"
#include "eval/perplexity.hpp"
#include "eval/retrieval.hpp"
#include "eval/ruler.hpp"
#include "policies/channel_scoring.hpp"
#include "policies/probe_pruning.hpp"
#include "policies/token_eviction.hpp"
#include "policies/token_filter.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace sparsim::test {
namespace {

/// The OptionError `f` throws: its key, and a message that names no command-line option.
void expect_setting_error(const std::function<void()>& f, const std::string& key,
                          const std::string& name_part) {
  try {
    f();
    ADD_FAILURE() << "no error for " << key;
  } catch (const OptionError& e) {
    EXPECT_EQ(e.key(), key) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find(name_part), std::string::npos) << what;
    EXPECT_EQ(what.find("--"), std::string::npos) << "names an option: " << what;
    // the message is the name, then what the command line puts after the option
    ASSERT_GE(what.size(), e.rest().size()) << what;
    EXPECT_EQ(what.substr(what.size() - e.rest().size()), e.rest()) << what;
  }
}

TEST(Settings, TokenFilterValuesBeforeTheModelAndLayersAfter) {
  gating::TokenFilterOptions o;
  o.ratio = 1.5;
  expect_setting_error([&] { o.check_values(); }, "token_filter.ratio", "skip ratio r");
  o.ratio = 0.5;
  o.warmup = 1;
  expect_setting_error([&] { o.check_values(); }, "token_filter.warmup", "warm-up");
  o.warmup = 16;
  o.gamma = 1.0;
  expect_setting_error([&] { o.check_values(); }, "token_filter.gamma", "γ");
  o.gamma = 0.9;
  // one gated layer of four cannot skip half of all (token, layer) blocks: r·L/N = 2
  o.num_layers = 1;
  EXPECT_NO_THROW(o.check_values());
  expect_setting_error([&] { o.validate(4); }, "token_filter.ratio", "r·L/N");
  o.num_layers = 5;
  expect_setting_error([&] { o.validate(4); }, "token_filter.num_layers", "gated layers");
  o.num_layers = 4;
  EXPECT_NO_THROW(o.validate(4));
  expect_setting_error([] { gating::parse_layer_set("middle"); }, "token_filter.layers",
                       "tail, head or uniform");
}

TEST(Settings, KChannelPruningValuesBeforeTheModelAndHeadWidthAfter) {
  pruning::KvPruneOptions o;
  o.lambda = 1.0;
  expect_setting_error([&] { o.check_values(); }, "k_channels.lambda", "pruned fraction λ");
  o.lambda = 0.97;  // ⌊0.97·16⌋ = 15 of 16 leaves one; of 64, 62 leave two; of 32, 31 leave one
  EXPECT_NO_THROW(o.check_values());
  EXPECT_NO_THROW(o.validate(16));
  o.lambda = 0.5;
  o.window = 0;
  expect_setting_error([&] { o.check_values(); }, "k_channels.window", "observation window");
  o.window = 8;
  o.method = pruning::KvMethod::Grace;
  o.protect_lo = 0.6;
  o.protect_hi = 0.7;
  EXPECT_NO_THROW(o.check_values());  // a ≤ b < 1 holds; a needs more channels than λ leaves
  expect_setting_error([&] { o.validate(16); }, "k_channels.protect", "protected range");
}

TEST(Settings, EvictionAndProbePruningNameTheirQuantities) {
  pruning::EvictOptions e;
  e.budget = 16.5;
  expect_setting_error([&] { e.validate(); }, "eviction.budget", "eviction budget");
  e.budget = 0.5;
  e.kernel = 4;
  expect_setting_error([&] { e.validate(); }, "eviction.kernel", "pooling kernel");
  expect_setting_error([] { pruning::parse_evict_method("lru"); }, "eviction.method",
                       "streaming, h2o, snapkv or pyramidkv");
  pruning::ProbePruningOptions p;
  p.probe = 0;
  expect_setting_error([&] { p.validate(); }, "probe_pruning.probe", "probe share");
}

TEST(Settings, EvaluationWindowsAndPromptsBeforeTheModelAndItsContextAfter) {
  PplOptions p;
  p.context = 4096;
  p.stride = 512;
  p.score = 512;
  EXPECT_NO_THROW(p.check_values());
  expect_setting_error([&] { p.validate(2048); }, "perplexity.context", "window length");
  p.score = 4096;
  expect_setting_error([&] { p.check_values(); }, "perplexity.score", "scored tokens");

  RetrievalOptions r;
  r.lengths = {8192};
  EXPECT_NO_THROW(r.check_values());
  expect_setting_error([&] { r.validate(8192); }, "retrieval.lengths", "exceeds the model's");
  r.lengths = {32};
  expect_setting_error([&] { r.check_values(); }, "retrieval.lengths", "too short");

  RulerOptions u;
  u.tasks = parse_ruler_subset("niah");
  u.lengths = {1024, 4096};
  EXPECT_NO_THROW(u.check_values());
  expect_setting_error([&] { u.validate(2048); }, "ruler.lengths", "exceeds the model's");
  u.lengths.clear();  // the default lengths of a model under 1,024 tokens: none
  EXPECT_NO_THROW(u.check_values());
  expect_setting_error([&] { u.validate(512); }, "ruler.lengths", "at least one length");
  u.lengths = {1024};
  u.samples = 0;
  expect_setting_error([&] { u.check_values(); }, "ruler.samples", "items per cell");
}

}  // namespace
}  // namespace sparsim::test
