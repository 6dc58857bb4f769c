#include "records.hpp"

#include "io/run_file.hpp"
#include "transforms/kv_weight_pruning.hpp"
#include "transforms/low_rank.hpp"

#include <Kokkos_Core.hpp>

#include <ctime>
#include <fstream>

namespace sparsim::app {

std::string command_line(int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  return cmd;
}

double load_average() {
  std::ifstream f("/proc/loadavg");
  double one = -1;
  if (!(f >> one)) return -1;
  return one;
}

void write_run_group(io::Group root, int argc, char** argv) {
  io::Group run = root.create_group("run");
  run.set_attr("format", io::kRunFormat);
  run.set_attr("schema_version", io::kRunSchemaVersion);
  run.set_attr("command", command_line(argc, argv));
  run.set_attr("version", SPARSIM_VERSION);
  const std::time_t now = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  run.set_attr("started_utc", std::string(buf));
}

void write_run_header(io::Group root, int argc, char** argv, const std::string& backend,
                      int threads, const ModelInfo& mi, const Config& cfg, DType storage,
                      bool bf16_compute) {
  write_run_group(root, argc, argv);

  io::Group be = root.create_group("backend");
  be.set_attr("name", backend);
  be.set_attr("threads", threads);
  be.set_attr("kokkos_version", static_cast<std::int64_t>(KOKKOS_VERSION));
  be.set_attr("load_average", load_average());

  io::Group m = root.create_group("model");
  m.set_attr("path", mi.path);
  m.set_attr("format", mi.format);
  m.set_attr("fingerprint", mi.fingerprint);
  m.set_attr("file_bytes", static_cast<std::int64_t>(mi.file_bytes));
  m.set_attr("storage", to_string(storage));
  m.set_attr("bf16_compute", bf16_compute ? 1 : 0);
  m.set_attr("name", cfg.name);
  m.set_attr("n_layer", cfg.n_layer);
  m.set_attr("d_model", cfg.d_model);
  m.set_attr("n_head", cfg.n_head);
  m.set_attr("n_kv_head", cfg.n_kv_head);
  m.set_attr("head_dim", cfg.head_dim);
  m.set_attr("d_ff", cfg.d_ff);
  m.set_attr("vocab", cfg.vocab);
  m.set_attr("context_length", cfg.context_length);
  m.set_attr("rope_theta", static_cast<double>(cfg.rope_theta));
  m.set_attr("rms_eps", static_cast<double>(cfg.rms_eps));
  m.set_attr("tied_embeddings", cfg.tied_embeddings ? 1 : 0);
  m.set_attr("n_params", static_cast<std::int64_t>(cfg.n_params()));
  m.set_attr("nonfinite_weights", static_cast<std::int64_t>(mi.nonfinite));
}

void write_prune_group(io::Group root, const Config& cfg) {
  if (cfg.low_rank_kv()) {
    const pruning::LowRankReport r = pruning::low_rank_summary(cfg);
    io::Group g = root.create_group("low_rank");
    g.set_attr("method", r.method);
    g.set_attr("retain", r.retain);
    g.set_attr("retain_realised", r.retain_realised);
    g.set_attr("group", r.group);
    g.set_attr("whiten", r.whiten ? 1 : 0);
    g.set_attr("kv_bytes_fraction", r.kv_bytes_fraction);
    g.set_attr("kv_params_fraction", r.kv_params_fraction);
    g.set_attr("attn_params_fraction", r.attn_params_fraction);
    g.set_attr("attn_flops_fraction", r.attn_flops_fraction);
    g.set_attr("attn_decode_flops_fraction", r.attn_decode_flops_fraction);
    g.set_attr("flops_context", r.flops_context);
    g.set_attr("source_fingerprint", cfg.prune.source_fingerprint);
    g.set_attr("calibration", cfg.prune.calibration);
    g.set_attr("recipe", cfg.prune.recipe);
    std::vector<std::int32_t> kr, vr;
    for (const auto& l : r.layers) {
      kr.push_back(l.k_rank);
      vr.push_back(l.v_rank);
    }
    g.write<std::int32_t>("k_rank", kr, {"1", "[layer] latent width of the keys (Σ group ranks)"});
    g.write<std::int32_t>("v_rank", vr, {"1", "[layer] latent width of the values"});
    return;
  }
  if (!cfg.pruned()) return;
  const pruning::PruneReport r = pruning::prune_report(cfg);
  io::Group g = root.create_group("pruned");
  g.set_attr("method", r.method);
  g.set_attr("retain", r.retain);
  g.set_attr("retain_realised", r.retain_realised);
  g.set_attr("orphan_ratio", r.orphan_ratio);
  g.set_attr("kv_bytes_fraction", r.kv_bytes_fraction);
  g.set_attr("attn_params_fraction", r.attn_params_fraction);
  g.set_attr("attn_flops_fraction", r.attn_flops_fraction);
  g.set_attr("attn_decode_flops_fraction", r.attn_decode_flops_fraction);
  g.set_attr("flops_context", r.flops_context);
  g.set_attr("source_fingerprint", cfg.prune.source_fingerprint);
  g.set_attr("calibration", cfg.prune.calibration);
  std::vector<std::int32_t> qk, vd, pairs, orphans, kc, vc;
  std::vector<double> kvf, parf, flf;
  for (int l = 0; l < cfg.n_layer; ++l) {
    const pruning::LayerCost& lc = r.layers[static_cast<std::size_t>(l)];
    qk.push_back(lc.qk_dim);
    vd.push_back(lc.v_dim);
    pairs.push_back(lc.pairs);
    orphans.push_back(lc.orphans);
    kvf.push_back(lc.kv_bytes_fraction);
    parf.push_back(lc.attn_params_fraction);
    flf.push_back(lc.attn_flops_fraction);
    const LayerAttention& a = cfg.attn[static_cast<std::size_t>(l)];
    kc.insert(kc.end(), a.k_channels.begin(), a.k_channels.end());
    vc.insert(vc.end(), a.v_channels.begin(), a.v_channels.end());
  }
  g.write<std::int32_t>("qk_head_dim", qk, {"1", "[layer] per-head width of q and k"});
  g.write<std::int32_t>("v_head_dim", vd, {"1", "[layer] per-head width of v"});
  g.write<std::int32_t>("pairs", pairs, {"1", "[layer] whole RoPE pairs kept over the KV heads"});
  g.write<std::int32_t>("orphans", orphans,
                        {"1", "[layer] kept K channels whose RoPE partner was cut"});
  g.write<std::int32_t>("k_channels", kc,
                        {"1", "[layer][kv head][i] full-head channel of each kept K channel"});
  g.write<std::int32_t>("v_channels", vc,
                        {"1", "[layer][kv head][i] full-head channel of each kept V channel"});
  g.write<double>("kv_bytes_fraction", kvf, {"1", "[layer] KV-cache bytes / full model"});
  g.write<double>("attn_params_fraction", parf, {"1", "[layer] attention parameters / full"});
  g.write<double>("attn_flops_fraction", flf,
                  {"1", "[layer] attention FLOPs of a prefill of flops_context tokens / full"});
}

}  // namespace sparsim::app
