#pragma once
// What every prune method (RAP / KVPruner, PaLU / SVD-LLM, FLAP, SlimGPT) does around its own
// work, in one place: the full GGUF model it reads (resolved, checked, guarded against the
// outputs, loaded and refused when already reduced), the corpus windows its statistics run over,
// the read-back of the model it wrote, and the blocks its JSON summary shares.
#include "common.hpp"
#include "core/timer.hpp"
#include "eval/corpus.hpp"
#include "model/loader.hpp"
#include "sparsity/calibration.hpp"
#include "transforms/pruned_gguf.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace sparsim::app {

/// The files of one prune run, as given on the command line (paths left empty are not read or
/// written).
struct PruneFiles {
  std::string model_arg;
  std::string calibration;  ///< --calibration
  std::string out, json_out;
  bool reads_corpus = false;  ///< whether the method reads --corpus (then loaded)
  std::string corpus_arg, text_field;
};

/// The inputs a prune run has opened before any work.
struct PruneSource {
  ResolvedModel model;
  std::optional<Corpus> corpus;  ///< when PruneFiles::reads_corpus
};

/// Resolves the model and requires a GGUF file (prune writes a GGUF built from the source's
/// tensors and tokenizer); runs `check_model` on it (a method's own check of the file); checks
/// the outputs against the inputs (io::guard_run: exit 2 before anything is written); loads the
/// corpus.
PruneSource open_prune_source(const PruneFiles& f,
                              const std::function<void(const ResolvedModel&)>& check_model = {});

/// The calibration file at `path` (none when empty), which must hold Fisher scores.
std::optional<sparsity::Calibration> read_fisher_calibration(const std::string& path);

/// "model <fingerprint> corpus <fingerprint> (<n> sequences of <t> tokens)": the Fisher
/// calibration a recipe names.
std::string fisher_label(const sparsity::Calibration& cal);

/// Which source models a method refuses as already pruned: any reduced model (K/V-pruned,
/// structured or factorised), or only a K/V-pruned one (RAP / KVPruner: the GGUF writer names the
/// other layouts itself).
enum class RefuseSource { AnyReduction, KvPruned };

/// The source model of a prune run, loaded on backend E.
template <class E>
struct FullModel {
  using Exec = E;
  std::shared_ptr<const Weights<E>> w;
  ModelInfo info;
  Stopwatch wall;  ///< running since before the load
};

/// Starts Kokkos for `co`, loads the source model on the selected backend, refuses one already
/// pruned, and returns f(FullModel<E>).
template <class F>
int with_full_model(const CommonOptions& co, const ResolvedModel& rm, RefuseSource refuse, F&& f) {
  Runtime rt(co);
  return with_backend(co.backend, [&](auto exec) {
    using E = decltype(exec);
    (void)exec;
    FullModel<E> m;
    m.w = load_model<E>(rm.path, LoadOptions{}, &m.info);
    const Config& c = m.w->cfg;
    const bool reduced = refuse == RefuseSource::KvPruned
                             ? c.pruned()
                             : c.pruned() || c.structured() || c.low_rank_kv();
    require(!reduced, "{} is already pruned ({}); prune the full model", rm.path, c.prune.method);
    return f(static_cast<const FullModel<E>&>(m));
  });
}

/// The windows a method's statistics run over: the first `count` consecutive windows of `tokens`
/// tokens of the corpus's token stream.
struct WindowRequest {
  int count = 0, tokens = 0;
  std::string tokens_option;  ///< named when a window is longer than the model's context
  std::string command;        ///< starts the message for a corpus too short ("prune")
  std::string noun;           ///< what the windows are called in that message ("windows")
  std::string remedy;         ///< ends that message (" (a longer corpus, ...)"), or empty
};

/// The request of a structured-pruning method whose options are --<method>-windows and
/// --<method>-tokens (flap, slimgpt).
WindowRequest method_windows(const std::string& method, int count, int tokens);

/// The windows of `r`, cut from the corpus as the model at `model_path` tokenizes it; refused when
/// a window is longer than `context_length` or the corpus is too short.
std::vector<std::vector<int>> corpus_windows(const Corpus& corpus, const std::string& model_path,
                                             int context_length, const WindowRequest& r);

/// "corpus <fingerprint> (<count> windows of <tokens> tokens)": the calibration a structured
/// method's recipe names.
std::string windows_label(const Corpus& corpus, int count, int tokens);

/// The summary's "calibration" block of a structured method: the corpus, its windows, `total`
/// tokens.
nlohmann::json windows_json(const Corpus& corpus, int count, int tokens, std::int64_t total);

/// The written model must be one sparsim runs: loaded back (shapes, layout, fingerprint), its
/// config must satisfy `same` (else `mismatch` says why); on failure it is removed and the run
/// fails naming it.
template <class E, class Same>
ModelInfo check_written(const std::string& out, Same&& same, const char* mismatch) {
  ModelInfo mo;
  try {
    auto wp = load_model<E>(out, LoadOptions{}, &mo);
    require(same(wp->cfg), "{}", mismatch);
  } catch (const Error& e) {
    std::error_code ec;
    std::filesystem::remove(out, ec);
    fail("prune: the written model {} does not load ({}); removed", out, e.what());
  }
  return mo;
}

/// check_written for a pruned or structured plan: it must read back as pruned as planned.
template <class E>
ModelInfo check_written_pruned(const std::string& out, const Config& plan) {
  return check_written<E>(
      out,
      [&](const Config& back) {
        return back.pruned() == plan.pruned() && back.structured() == plan.structured() &&
               back.n_params() == plan.n_params();
      },
      "the written model does not read back as pruned");
}

/// Completes a prune summary with the source and output models and the command line, and writes
/// it to PruneFiles::json_out (atomically).
void write_prune_json(nlohmann::json j, const PruneFiles& f, const PruneSource& src,
                      const ModelInfo& source, const ModelInfo& written,
                      const std::string& command);

/// The prune report's lines on the written model: "tensor types (--type …): …" grouped by kind
/// and change, "file size: …", and which --type would make it smaller when it is larger than
/// its source. Each line ends in a newline.
std::string written_model_text(const pruning::WrittenModel& w);

}  // namespace sparsim::app
