// sparsim prune: weight-side KV pruning (RAP, KVPruner) from Fisher scores, written out as a
// smaller GGUF model that every command runs.
#include "common.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "model/gguf.hpp"
#include "model/loader.hpp"
#include "pruning/kv_prune.hpp"
#include "pruning/pruned_gguf.hpp"
#include "records.hpp"
#include "sparsity/calibration.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>

namespace sparsim::app {

int cmd_prune(int argc, char** argv) {
  CommonOptions co;
  std::string model_arg, method, calib_path, out, json_out, type;
  double retain = 0.7;
  int flops_context = 2048;
  po::options_description d("sparsim prune options");
  add_model_option(d, model_arg, "the full model (GGUF)");
  d.add_options()(
      "method", po::value(&method)->default_value("rap"),
      "rap (whole RoPE pairs of K, per-layer budgets from the Fisher scores) or kvpruner "
      "(single K channels by Fisher score, RoPE-agnostic; same budgets)")(
      "retain", po::value(&retain)->default_value(0.7),
      "mean retain ratio ρ in (0, 1]: the fraction of K and V channels kept over the model")(
      "calibration", po::value(&calib_path),
      "calibration file with Fisher scores of this model (sparsim calibrate --fisher; required)")(
      "out,o", po::value(&out), "pruned model to write (GGUF; required)")(
      "json", po::value(&json_out),
      "JSON summary: method, retain, orphan_ratio, kv_bytes_fraction, attn_params_fraction, "
      "attn_flops_fraction and per-layer figures")(
      "flops-context", po::value(&flops_context)->default_value(2048),
      "prefill length at which the attention FLOP fraction is reported")(
      "type", po::value(&type)->default_value("auto"),
      "type of a tensor that cannot be cut in its source type (W_o of a block-quantized model "
      "cut through its blocks): auto (smallest of f16, bf16, f32 that keeps every value "
      "exactly), source (requantize in the source tensor's type; lossy) or a type: f32, f16, "
      "bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k (requantized; lossy)");
  add_common_options(d, co);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: sparsim prune --method rap|kvpruner --retain R --calibration C --out M.gguf "
             "[--model smollm2] [--json S] [--type auto|source|TYPE]",
             d, vm))
    return 0;
  // Everything a user can get wrong is checked before anything is written.
  const pruning::PruneMethod pm = pruning::parse_prune_method(method);
  const pruning::CutType cut = pruning::CutType::parse(type);
  require(retain > 0 && retain <= 1 && std::isfinite(retain), "--retain must be in (0, 1], got {}",
          retain);
  require(!out.empty(), "prune: --out FILE is required");
  require(!calib_path.empty(),
          "prune: --calibration FILE (from sparsim calibrate --fisher) is "
          "required");
  require(flops_context >= 1, "--flops-context must be positive, got {}", flops_context);
  const sparsity::Calibration cal = sparsity::read_calibration(calib_path);
  require(cal.fisher.has_value(),
          "calibration file {} holds no Fisher scores (make one with sparsim calibrate --fisher)",
          calib_path);
  const ResolvedModel rm = resolve_model(model_arg);
  require(detect_model_format(rm.path) == ModelFormat::Gguf,
          "prune: {} is not a GGUF model; prune writes a GGUF built from the source GGUF's "
          "tensors and tokenizer",
          rm.path);
  {
    gguf::File f = gguf::File::open(rm.path);
    const std::string arch = f.get_string("general.architecture").value_or("llama");
    for (const char* k : {"rope.dimension_count", "rope.freq_base"})
      require(f.has(arch + "." + k),
              "{}: no RoPE metadata ('{}.{}'): pruning RoPE pairs needs a model that states how "
              "it rotates its keys",
              rm.path, arch, k);
  }
  // outputs checked against the inputs by file identity, folders, collisions (exit 2)
  io::guard_run({{"--model", rm.path}, {"--calibration", calib_path}},
                {{"--out", out}, {"--json", json_out}});

  Runtime rt(co);
  return with_backend(co.backend, [&](auto exec) {
    using E = decltype(exec);
    (void)exec;
    Stopwatch wall;
    ModelInfo mi;
    // loaded for its fingerprint and config (the check against the calibration)
    std::shared_ptr<const Weights<E>> w = load_model<E>(rm.path, LoadOptions{}, &mi);
    const Config& c = w->cfg;
    require(!c.pruned(), "{} is already pruned ({}); prune the full model", rm.path,
            c.prune.method);
    cal.check_model(mi.fingerprint, c, mi.path);
    pruning::PruneOptions po_;
    po_.method = pm;
    po_.retain = retain;
    po_.flops_context = flops_context;
    po_.source_fingerprint = mi.fingerprint;
    po_.calibration =
        fmt::format("model {} corpus {} ({} sequences of {} tokens)", cal.model_fingerprint,
                    cal.corpus_fingerprint, cal.fisher->sequences, cal.fisher->tokens);
    const Config pc = pruning::plan_pruning(c, *cal.fisher, po_);
    const pruning::WrittenModel written = pruning::write_pruned_gguf(rm.path, pc, out, cut);
    // The file must be a model sparsim runs: load it back (shapes, layout, fingerprint).
    ModelInfo mo;
    try {
      auto wp = load_model<E>(out, LoadOptions{}, &mo);
      require(wp->cfg.pruned() && wp->cfg.attn.size() == pc.attn.size(),
              "the written model does not read back as pruned");
    } catch (const Error& e) {
      std::error_code ec;
      std::filesystem::remove(out, ec);
      fail("prune: the written model {} does not load ({}); removed", out, e.what());
    }
    const pruning::PruneReport rep = pruning::prune_report(pc);
    const std::vector<double> sig = pruning::layer_sigma(*cal.fisher);
    std::cout << fmt::format(
        "pruned {} -> {}\n  source {} (fingerprint {})\n  Fisher scores {} "
        "({})\n  output fingerprint {}, {} parameters (full: {})\n\n",
        pruning::method_name(pm), out, mi.path, mi.fingerprint, calib_path, po_.calibration,
        mo.fingerprint, pc.n_params(), c.n_params());
    std::cout << rep.table() << written.text();
    std::cout << fmt::format("  wall seconds {:.1f}\n", wall.seconds());
    if (!json_out.empty()) {
      nlohmann::json j = rep.json();
      j.update(written.json());
      j["source"] = {{"path", mi.path}, {"fingerprint", mi.fingerprint}, {"origin", rm.origin}};
      j["output"] = {{"path", out}, {"fingerprint", mo.fingerprint}};
      j["calibration"] = {{"path", calib_path},
                          {"model_fingerprint", cal.model_fingerprint},
                          {"corpus_fingerprint", cal.corpus_fingerprint},
                          {"corpus_path", cal.corpus_path},
                          {"sequences", cal.fisher->sequences},
                          {"tokens", cal.fisher->tokens}};
      j["layer_sigma"] = sig;
      j["n_params"] = pc.n_params();
      j["n_params_full"] = c.n_params();
      j["command"] = command_line(argc, argv);
      io::write_file_atomically(json_out, j.dump(2) + "\n");
    }
    return 0;
  });
}

}  // namespace sparsim::app
