#pragma once
// The fixture of the command-line tests that run sparsim on a tiny model: a synthetic model and a
// generated word corpus made once per test suite in a temporary folder, the command lines on them,
// their JSON summaries, and the check that bad input fails, says why and writes nothing.
#include "helpers.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace sparsim::test {

/// A JSON file, parsed.
inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

/// A file's bytes.
inline std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// The options of the activation-sparsity calibration the suites make of their tiny model.
inline const std::string kTinyCalibOpts =
    " --context 128 --max-windows 4 --greedy-seqs 2 --greedy-tokens 32 --alpha 0.05";

/// The tiny model and corpus of a suite.
struct TinySetup {
  std::uint64_t model_seed = 7;   ///< tiny_spec's seed
  std::uint64_t corpus_seed = 5;  ///< write_word_corpus's seed
  int words = 6000;               ///< the corpus's words
  int sentence = 13;              ///< words per sentence
  int context_length = 0;         ///< the model's context (0: tiny_config's)
};

/// Base of the fixture of a suite that runs sparsim on a tiny model. `Suite` is the fixture itself
/// (each suite has its own folder, model and corpus); its SetUpTestSuite calls make_tiny.
template <class Suite>
class TinyModelCli : public ::testing::Test {
 protected:
  /// The suite's folder with the model m.gguf and the corpus corpus.txt.
  static void make_tiny(const TinySetup& s) {
    dir_ = new TempDir();
    SynthSpec spec = tiny_spec(s.model_seed);
    if (s.context_length > 0) spec.cfg.context_length = s.context_length;
    model_ = make_model(*dir_, "m.gguf", spec);
    corpus_ = dir_->file("corpus.txt");
    write_word_corpus(corpus_, s.corpus_seed, s.words, s.sentence);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  /// "sparsim <command> --model <model> --corpus <corpus> <options> <extra>".
  static std::string on_tiny(const std::string& command, const std::string& options,
                             const std::string& extra) {
    return sparsim_bin() + " " + command + " --model " + model_ + " --corpus " + corpus_ + " " +
           options + " " + extra;
  }

  /// "sparsim eval" of `model` (a model the suite made, e.g. a pruned one) on the suite's corpus,
  /// two windows of 64 tokens at stride 32, with `extra` options (--json, --out, a method).
  static std::string eval_of(const std::string& model, const std::string& extra = "") {
    return sparsim_bin() + " eval --model " + model + " --corpus " + corpus_ +
           " --context 64 --stride 32 --max-windows 2" + (extra.empty() ? "" : " " + extra);
  }

  /// "sparsim generate" of six tokens after a two-word prompt, on `model`.
  static std::string generate_of(const std::string& model) {
    return sparsim_bin() + " generate --model " + model + " --prompt 'abc def' --max-tokens 6";
  }

  /// make_tiny, and the model's activation-sparsity calibration cal.h5 (kTinyCalibOpts) as calib_.
  static void make_tiny_calibrated(const TinySetup& s) {
    make_tiny(s);
    calib_ = dir_->file("cal.h5");
    const RunResult c = run_cmd(sparsim_bin() + " calibrate --model " + model_ + " --corpus " +
                                corpus_ + " --out " + calib_ + kTinyCalibOpts);
    ASSERT_EQ(c.exit_code, 0) << c.output;
  }

  /// make_tiny, and the model's Fisher scores fisher.h5 (3 sequences of 48 tokens) as calib_.
  static void make_tiny_fisher(const TinySetup& s) {
    make_tiny(s);
    calib_ = dir_->file("fisher.h5");
    const RunResult c = calibrate_fisher(model_, calib_, 3, 48);
    ASSERT_EQ(c.exit_code, 0) << c.output;
  }

  /// Another tiny model, other.gguf (tiny_spec(seed)), as other_: a model the suite's calibration
  /// was not made for.
  static void make_other(std::uint64_t seed) {
    other_ = make_model(*dir_, "other.gguf", tiny_spec(seed));
  }

  /// A corpus of four words, tiny.txt: too short for any calibration.
  static std::string write_short_corpus() {
    const std::string p = dir_->file("tiny.txt");
    std::ofstream f(p);
    f << "a few words only.\n";
    return p;
  }

  /// Runs `sparsim calibrate --fisher` on `model` over the corpus's first `seqs` sequences of
  /// `tokens` tokens, writing `out`.
  static RunResult calibrate_fisher(const std::string& model, const std::string& out, int seqs,
                                    int tokens) {
    return run_cmd(sparsim_bin() + " calibrate --fisher --model " + model + " --corpus " + corpus_ +
                   " --out " + out + " --fisher-seqs " + std::to_string(seqs) +
                   " --fisher-tokens " + std::to_string(tokens));
  }

  inline static TempDir* dir_ = nullptr;
  inline static std::string model_, corpus_;
  inline static std::string calib_, other_;  ///< when the suite makes them
};

/// A bad command line: it must exit non-zero, print `message` and leave none of `outputs`.
/// Failures name `label` (default: the command line).
inline void expect_fails(const std::string& cmd, const std::string& message,
                         const std::vector<std::string>& outputs, const std::string& label = "") {
  const std::string& what = label.empty() ? cmd : label;
  const RunResult r = run_cmd(cmd);
  EXPECT_NE(r.exit_code, 0) << what << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << what << "\n" << r.output;
  for (const std::string& o : outputs) EXPECT_FALSE(std::filesystem::exists(o)) << what;
}

/// Bad command lines: (arguments, the message the run must print).
using BadCases = std::vector<std::pair<std::string, std::string>>;

/// expect_fails for `command(arguments)` of every case.
template <class Command>
void expect_each_fails(const BadCases& cases, Command&& command,
                       const std::vector<std::string>& outputs) {
  for (const auto& [args, msg] : cases) expect_fails(command(args), msg, outputs, args);
}

/// expect_each_fails where each case's arguments are the whole command line.
inline void expect_each_fails(const BadCases& cases, const std::vector<std::string>& outputs) {
  for (const auto& [cmd, msg] : cases) expect_fails(cmd, msg, outputs);
}

}  // namespace sparsim::test
