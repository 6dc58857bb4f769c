#include "prune_io.hpp"

#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "model/loader.hpp"
#include "model_io.hpp"

#include <fmt/format.h>

namespace sparsim::app {

PruneSource open_prune_source(const PruneFiles& f,
                              const std::function<void(const ResolvedModel&)>& check_model) {
  PruneSource src;
  src.model = resolve_model(f.model_arg);
  require(detect_model_format(src.model.path) == ModelFormat::Gguf,
          "prune: {} is not a GGUF model; prune writes a GGUF built from the source GGUF's "
          "tensors and tokenizer",
          src.model.path);
  if (check_model) check_model(src.model);
  const std::string corpus_path = f.reads_corpus ? corpus_input_path(f.corpus_arg) : std::string();
  // outputs checked against the inputs by file identity, folders, collisions (exit 2)
  io::guard_run(
      {{"--model", src.model.path}, {"--calibration", f.calibration}, {"--corpus", corpus_path}},
      {{"--out", f.out}, {"--json", f.json_out}});
  if (f.reads_corpus) src.corpus = load_corpus(f.corpus_arg, CorpusOptions{f.text_field});
  return src;
}

std::optional<sparsity::Calibration> read_fisher_calibration(const std::string& path) {
  std::optional<sparsity::Calibration> cal;
  if (path.empty()) return cal;
  cal = sparsity::read_calibration(path);
  require(cal->fisher.has_value(),
          "calibration file {} holds no Fisher scores (make one with sparsim calibrate --fisher)",
          path);
  return cal;
}

std::string fisher_label(const sparsity::Calibration& cal) {
  return fmt::format("model {} corpus {} ({} sequences of {} tokens)", cal.model_fingerprint,
                     cal.corpus_fingerprint, cal.fisher->sequences, cal.fisher->tokens);
}

WindowRequest method_windows(const std::string& method, int count, int tokens) {
  WindowRequest r;
  r.count = count;
  r.tokens = tokens;
  r.tokens_option = "--" + method + "-tokens";
  r.command = "prune --method " + method;
  r.noun = "windows";
  r.remedy = fmt::format(" (a longer corpus, or fewer --{}-windows / --{}-tokens)", method, method);
  return r;
}

std::vector<std::vector<int>> corpus_windows(const Corpus& corpus, const std::string& model_path,
                                             int context_length, const WindowRequest& r) {
  require(r.tokens <= context_length, "{} {} exceeds the model's context of {}", r.tokens_option,
          r.tokens, context_length);
  const std::vector<int> stream = corpus_stream(corpus, tokenizer_for(model_path));
  const std::size_t need = static_cast<std::size_t>(r.count) * r.tokens;
  require(stream.size() >= need, "{}: the corpus {} has {} tokens; {} {} of {} need {}{}",
          r.command, corpus.source, stream.size(), r.count, r.noun, r.tokens, need, r.remedy);
  std::vector<std::vector<int>> windows;
  for (int i = 0; i < r.count; ++i) {
    const auto b = stream.begin() + static_cast<std::ptrdiff_t>(i) * r.tokens;
    windows.emplace_back(b, b + r.tokens);
  }
  return windows;
}

std::string windows_label(const Corpus& corpus, int count, int tokens) {
  return fmt::format("corpus {} ({} windows of {} tokens)", corpus.fingerprint, count, tokens);
}

nlohmann::json windows_json(const Corpus& corpus, int count, int tokens, std::int64_t total) {
  return {{"corpus_path", corpus.source},
          {"corpus_fingerprint", corpus.fingerprint},
          {"windows", count},
          {"tokens_per_window", tokens},
          {"tokens", total}};
}

void write_prune_json(nlohmann::json j, const PruneFiles& f, const PruneSource& src,
                      const ModelInfo& source, const ModelInfo& written,
                      const std::string& command) {
  j["source"] = {
      {"path", source.path}, {"fingerprint", source.fingerprint}, {"origin", src.model.origin}};
  j["output"] = {{"path", f.out}, {"fingerprint", written.fingerprint}};
  j["command"] = command;
  io::write_file_atomically(f.json_out, io::json_file_text(j));
}

}  // namespace sparsim::app
