#include "prune_io.hpp"

#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "model/gguf.hpp"
#include "model/loader.hpp"
#include "model_io.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

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
  if (f.reads_corpus) src.corpus = load_corpus_arg(f.corpus_arg, CorpusOptions{f.text_field});
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

namespace {

/// "attn_output" of "blk.3.attn_output.weight"; the name itself for other names.
std::string tensor_kind(const std::string& name) {
  int l = -1;
  char buf[32] = {};
  if (std::sscanf(name.c_str(), "blk.%d.%31[a-z_].weight", &l, buf) == 2 &&
      name == fmt::format("blk.{}.{}.weight", l, buf))
    return buf;
  return name;
}

std::string megabytes(std::uint64_t b) {
  return fmt::format("{:.1f} MB", static_cast<double>(b) / 1e6);
}

/// Why the output is larger than its source, and which --type would make it smaller.
std::string larger_hint(const std::vector<pruning::TypeChange>& changed) {
  auto all = [&](auto pred) { return std::all_of(changed.begin(), changed.end(), pred); };
  const bool exact = all([](const pruning::TypeChange& c) { return c.exact; });
  const bool blocks = all(
      [](const pruning::TypeChange& c) { return c.row_length % gguf::block_size(c.from) == 0; });
  const bool f32 = !all([](const pruning::TypeChange& c) { return c.to != gguf::GGMLType::F32; });
  std::string s = fmt::format("  the pruned model is LARGER than its source: {}",
                              exact ? "the tensors above were widened to keep their values exact"
                                    : "the tensors above are stored wider than in the source");
  if (blocks) return s + "; --type source or --type q8_0 requantizes them (lossy)\n";
  if (f32) s += "; --type f16 or --type bf16 halves the F32 ones (lossy)";
  return s +
         "; requantizing (--type source, q8_0) needs kept rows of whole quantization blocks, "
         "which these kept widths do not give\n";
}

}  // namespace

std::string written_model_text(const pruning::WrittenModel& w) {
  struct Group {
    std::string what;
    int n;
  };
  std::vector<Group> groups;
  for (const pruning::TypeChange& c : w.changed) {
    const std::string how = c.exact ? "exact" : "lossy";
    const std::string what = c.from == c.to
                                 ? fmt::format("{} requantized in {} ({})", tensor_kind(c.name),
                                               gguf::to_string(c.to), how)
                                 : fmt::format("{} {} -> {} ({})", tensor_kind(c.name),
                                               gguf::to_string(c.from), gguf::to_string(c.to), how);
    auto g =
        std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.what == what; });
    if (g == groups.end())
      groups.push_back({what, 1});
    else
      ++g->n;
  }
  std::string s =
      fmt::format("  tensor types (--type {}): {} tensors kept their type", w.type_option, w.kept);
  if (!w.changed.empty()) s += fmt::format("; {} changed:", w.changed.size());
  for (std::size_t i = 0; i < groups.size(); ++i)
    s += fmt::format("{} {} in {} layer{}", i ? "," : "", groups[i].what, groups[i].n,
                     groups[i].n == 1 ? "" : "s");
  s += fmt::format("\n  file size: {} against the source's {} ({:.3f}x)\n",
                   megabytes(w.output_bytes), megabytes(w.source_bytes),
                   static_cast<double>(w.output_bytes) / static_cast<double>(w.source_bytes));
  if (w.output_bytes > w.source_bytes) s += larger_hint(w.changed);
  return s;
}

}  // namespace sparsim::app
