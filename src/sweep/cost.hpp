#pragma once
/// Predicted cost of a sweep's points, from the model's shape and the run's options: the
/// FLOPs and bytes the FLOP / byte ledger would record (the same per-launch formulas as the
/// engine's launch sites, summed analytically), turned into seconds with the rates of the
/// spec's [cost] table. Used to order work (longest first) and to size Slurm array chunks; a
/// cost model that knows the hardware can replace `seconds` without changing its callers.
#include "model/config.hpp"
#include "sweep/spec.hpp"

#include <cstdint>
#include <string>

namespace sparsim::sweep {

struct Cost {
  double flops_dense = 0, flops_realised = 0;
  double bytes_dense = 0, bytes_realised = 0;
  double tokens = 0;   ///< tokens run through the model
  double seconds = 0;  ///< predicted wall-clock seconds of the whole command
};

/// The model facts a prediction needs, read from the file's header only.
struct ModelShape {
  Config cfg;
  std::uint64_t file_bytes = 0;
};

/// Reads the hyper-parameters of a GGUF file or Hugging Face directory without its weights.
/// Throws sparsim::Error for a missing or unreadable model.
ModelShape read_model_shape(const std::string& path);

/// Bytes of a corpus on disk: a file, or every regular file under a directory.
std::uint64_t corpus_bytes(const std::string& path);

/// What an `eval` point does, as far as its cost goes.
struct EvalWork {
  int context = 2048, stride = 512, score = 512, max_windows = 0;
  bool bos = true;
  int storage_bytes = 4;  ///< bytes per weight as stored (f32 4, bf16 / f16 2)
  double sparsity = 0;    ///< target activation sparsity of the scored rows (0: dense)
  double tf_ratio = 0;    ///< Token Filtering: fraction of (token, layer) attention blocks skipped
  double kv_prune = 0;    ///< ThinK / GRACE: pruned fraction of the prefix's key channels
  std::uint64_t corpus_bytes = 0;
};

/// The method families a `--method` value names ('+'-joined): an activation-sparsity method
/// (teal, wina, topk-guided), token-filter, and a K-cache channel selector (think, grace).
struct MethodFamilies {
  bool activation = false, token_filter = false, kv_prune = false;
};
MethodFamilies method_families(const std::string& method);

/// Perplexity windows of `w` over a corpus of w.corpus_bytes (estimated token count).
int predicted_windows(const EvalWork& w, const CostRates& r);

Cost predict_eval(const ModelShape& m, const EvalWork& w, const CostRates& r);

/// What a `calibrate` run does, as far as its cost goes.
struct CalibrateWork {
  int context = 2048, max_windows = 8, greedy_seqs = 4, greedy_tokens = 128, probes = 4;
  double alpha = 0.025, cap = 0.95;
  int variants = 2;
  int storage_bytes = 4;
  std::uint64_t corpus_bytes = 0;
};

Cost predict_calibrate(const ModelShape& m, const CalibrateWork& w, const CostRates& r);

/// FLOPs and bytes of one dense forward pass over `n_seq` sequences of `T` tokens from
/// position 0 with logits for the last `tail` rows of each, as the ledger counts them;
/// `proj_fraction` scales the projections' FLOPs and bytes (realised sparsity);
/// `attn_stage_fraction` the attention stage's (q_proj, scores, softmax, value mixing, o_proj:
/// what a Token Filtering skip leaves out; k and v projections still run);
/// `k_prefix_fraction` the query-key products of the last `tail` rows with the first T − tail
/// positions (their keys compacted to that fraction of the channels by ThinK / GRACE).
Cost forward_cost(const Config& c, int storage_bytes, int n_seq, int T, int tail,
                  double proj_fraction = 1.0, double attn_stage_fraction = 1.0,
                  double k_prefix_fraction = 1.0);

}  // namespace sparsim::sweep
