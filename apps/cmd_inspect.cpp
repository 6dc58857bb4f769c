// sparsim inspect: what a model file holds and what it needs in memory.
#include "common.hpp"
#include "model/consistency.hpp"
#include "model/gguf.hpp"
#include "model/loader.hpp"
#include "model/safetensors.hpp"
#include "transforms/flap.hpp"
#include "transforms/kv_weight_pruning.hpp"
#include "transforms/low_rank.hpp"

#include <filesystem>

#include <iostream>
#include <map>

namespace sparsim::app {

int cmd_inspect(int argc, char** argv) {
  std::string model;
  bool all_meta = false;
  po::options_description d("sparsim inspect options");
  add_model_option(d, model);
  d.add_options()(
      "all", po::bool_switch(&all_meta),
      "print long metadata arrays in full (and, for a pruned model, every kept K channel)");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: sparsim inspect [MODEL] [--all]   (MODEL: a file or smollm2)", d,
             vm, &pos))
    return 0;
  model = resolve_model(model).path;

  Config c;
  if (detect_model_format(model) == ModelFormat::HfDirectory) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::is_directory(model) ? fs::path(model) : fs::path(model).parent_path();
    const fs::path index = dir / "model.safetensors.index.json";
    safetensors::Checkpoint ck =
        fs::exists(index)
            ? safetensors::Checkpoint::open_index(index.string())
            : safetensors::Checkpoint::open_file((dir / "model.safetensors").string());
    c = config_from_hf_json((dir / "config.json").string());
    const std::vector<std::string> problems = check_hf_model(dir.string());
    std::cout << fmt::format(
        "directory  {}\nformat     Hugging Face safetensors, {} file(s), {} bytes\n", dir.string(),
        ck.files().size(), ck.total_bytes());
    std::uint64_t n_el = 0;
    std::cout << fmt::format("\ntensors\n  {:<52} {:>5} {:>16} {:>12}\n", "name", "dtype", "shape",
                             "bytes");
    for (const auto& name : ck.names()) {
      const auto e = ck.find(name);
      std::cout << fmt::format("  {:<52} {:>5} {:>16} {:>12}\n", name,
                               safetensors::to_string(e.tensor->dtype), e.tensor->shape_string(),
                               e.tensor->nbytes());
      n_el += e.tensor->n_elements();
    }
    std::cout << fmt::format("\nparameters {} ({:.2f} M)\n", n_el, n_el / 1e6);
    // The same checks as loading: the table above is shown, then every contradiction.
    if (!problems.empty()) fail("{}", describe_problems((dir / "config.json").string(), problems));
  } else {
    gguf::File f = gguf::File::open(model);
    std::cout << fmt::format("file       {}\nformat     GGUF v{}, {} bytes, alignment {}\n",
                             f.path(), f.version(), f.file_size(), f.alignment());
    std::cout << fmt::format("\nmetadata ({} keys)\n", f.metadata().size());
    for (const auto& kv : f.metadata()) {
      std::string v = kv.value.describe();
      if (!all_meta && v.size() > 100) v = v.substr(0, 97) + "...";
      std::cout << fmt::format("  {:<44} {}\n", kv.key, v);
    }
    std::cout << fmt::format("\ntensors ({})\n  {:<36} {:>7} {:>18} {:>14}\n", f.tensors().size(),
                             "name", "type", "shape", "bytes");
    std::uint64_t n_el = 0;
    std::map<std::string, std::uint64_t> by_type;
    for (const auto& t : f.tensors()) {
      std::cout << fmt::format("  {:<36} {:>7} {:>18} {:>14}\n", t.name, gguf::to_string(t.type),
                               t.shape_string(), t.nbytes);
      n_el += t.n_elements();
      by_type[gguf::to_string(t.type)] += t.n_elements();
    }
    std::cout << fmt::format("\nparameters {} ({:.2f} M)", n_el, n_el / 1e6);
    for (const auto& [k, v] : by_type) std::cout << fmt::format(", {} {}", k, v);
    std::cout << "\n";
    // The same checks as loading (shapes against every hyper-parameter, block count against
    // the blocks present): the tables above are shown, then every contradiction.
    c = config_from_gguf(f);
  }
  std::cout << fmt::format(
      "\nmodel      llama: {} layers, d_model {}, heads {} (kv {}), head_dim {}, d_ff {}, vocab "
      "{}, "
      "context {}, rope theta {}, {} embeddings\n",
      c.n_layer, c.d_model, c.n_head, c.n_kv_head, c.head_dim, c.d_ff, c.vocab, c.context_length,
      c.rope_theta, c.tied_embeddings ? "tied" : "separate");
  double kv_per_tok = 0;  // fp32 K and V of every layer
  for (int l = 0; l < c.n_layer; ++l) kv_per_tok += 4.0 * (c.k_cache_width(l) + c.v_cache_width(l));
  if (c.low_rank_kv()) {
    const pruning::LowRankReport r = pruning::low_rank_summary(c);
    std::cout << fmt::format(
        "\nlow-rank   {} at ρ {:.3f} from model {}\n           ranks: {}\n"
        "           recipe {}; the cache holds the latents, K (before RoPE) and V are rebuilt "
        "at attention time\n",
        r.method, r.retain, c.prune.source_fingerprint, c.prune.calibration, c.prune.recipe);
    std::cout << r.text();
  }
  if (c.pruned()) {
    const pruning::PruneReport r = pruning::prune_report(c);
    std::cout << fmt::format(
        "\npruned     {} at retain {:.3f} from model {}\n           Fisher scores: {}\n"
        "           head widths per layer (q/k, v), RoPE pairs kept and orphaned K channels "
        "(kept channels whose RoPE partner was cut), costs against the full model;\n"
        "           RoPE uses each kept channel's original frequency, softmax scale 1/sqrt({})\n",
        r.method, r.retain, c.prune.source_fingerprint, c.prune.calibration, c.head_dim);
    std::cout << r.table();
    if (all_meta) {
      std::cout << "\n  kept K channels (RoPE frequency index) per layer and KV head\n";
      for (int l = 0; l < c.n_layer; ++l)
        for (int h = 0; h < c.n_kv_head; ++h) {
          std::string line;
          for (int i = 0; i < c.qk_head_dim(l); ++i) {
            const int ch = c.k_channel(l, h, i);
            line += fmt::format(" {}({})", ch, c.rope_freq_index(ch));
          }
          std::cout << fmt::format("  {:>3}.{}:{}\n", l, h, line);
        }
    }
  }
  if (c.structured()) {
    Config full = c;
    full.structure.clear();
    const pruning::FlapReport r = pruning::flap_report(full, c, 1.0 - c.prune.retain);
    std::cout << fmt::format(
        "\nstructured {} from model {}\n           statistics: {}\n           recipe: {}\n"
        "           kept query heads, KV heads and FFN channels per layer; W_o and W_down "
        "outputs carry biases\n",
        c.prune.method, c.prune.source_fingerprint, c.prune.calibration, c.prune.recipe);
    std::cout << r.table();
    if (all_meta)
      for (int l = 0; l < c.n_layer; ++l)
        std::cout << fmt::format("  {:>3} query heads: {}\n", l,
                                 fmt::join(c.structure[static_cast<std::size_t>(l)].q_heads, " "));
  }
  std::cout << "\nmemory estimate (weights as stored on the device; fp32 KV cache)\n";
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    // 1-D tensors (norms) stay fp32 whatever the storage type.
    const double norm_el = (2.0 * c.n_layer + 1) * c.d_model;
    const double mat_el = static_cast<double>(c.n_params()) - norm_el;
    const double bytes = mat_el * dtype_size(t) + norm_el * 4;
    std::cout << fmt::format(
        "  {:<5} weights {:>10.1f} MiB   + KV cache {:.1f} MiB per 1024 tokens "
        "per sequence\n",
        to_string(t), bytes / (1 << 20), kv_per_tok * 1024 / (1 << 20));
  }
  return 0;
}

}  // namespace sparsim::app
