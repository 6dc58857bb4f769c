#include "sweep/cost.hpp"

#include "core/error.hpp"
#include "core/method_name.hpp"
#include "model/gguf.hpp"
#include "model/loader.hpp"
#include "model/safetensors.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace sparsim::sweep {

namespace fs = std::filesystem;

ModelShape read_model_shape(const std::string& path) {
  ModelShape m;
  if (detect_model_format(path) == ModelFormat::HfDirectory) {
    const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
    const fs::path index = dir / "model.safetensors.index.json";
    const safetensors::Checkpoint ck =
        fs::exists(index)
            ? safetensors::Checkpoint::open_index(index.string())
            : safetensors::Checkpoint::open_file((dir / "model.safetensors").string());
    m.cfg = config_from_hf_json((dir / "config.json").string());
    m.file_bytes = ck.total_bytes();
  } else {
    const gguf::File f = gguf::File::open(path);
    m.cfg = config_from_gguf(f);
    m.file_bytes = f.file_size();
  }
  return m;
}

std::uint64_t corpus_bytes(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return fs::file_size(path, ec);
  std::uint64_t total = 0;
  if (fs::is_directory(path, ec))
    for (const auto& e : fs::recursive_directory_iterator(path, ec))
      if (e.is_regular_file(ec)) total += e.file_size(ec);
  return total;
}

MethodFamilies method_families(const std::string& method) {
  MethodFamilies f;
  for (const std::string& part : method_parts(method)) {
    if (part == "teal" || part == "wina" || part == "topk-guided") f.activation = true;
    if (part == "token-filter") f.token_filter = true;
    if (part == "think" || part == "grace") f.kv_prune = true;
  }
  return f;
}

Cost forward_cost(const Config& c, int sb, int n_seq, int T, int tail, double pf, double af,
                  double kf) {
  Cost k;
  const double n = static_cast<double>(n_seq) * T, d = c.d_model, q = c.q_dim(), kv = c.kv_dim(),
               ff = c.d_ff, nh = c.n_head, hd = c.head_dim;
  auto proj = [&](double rows, double cols, double rows_x, double fraction) {
    const double fl = 2.0 * rows_x * rows * cols;
    const double by = rows * cols * sb + 4.0 * rows_x * (rows + cols);
    k.flops_dense += fl;
    k.flops_realised += fl * fraction;
    k.bytes_dense += by;
    k.bytes_realised += by * fraction;
  };
  auto both = [&](double fl, double by, double fraction = 1.0) {
    k.flops_dense += fl;
    k.flops_realised += fl * fraction;
    k.bytes_dense += by;
    k.bytes_realised += by * fraction;
  };
  const double pairs = static_cast<double>(n_seq) * T * (T + 1.0) / 2.0;
  // query-key products of the scored rows with the prefix, whose keys ThinK / GRACE compact
  const double prefix_pairs =
      static_cast<double>(n_seq) * std::min(tail, T) * (T - std::min(tail, T));
  for (int l = 0; l < c.n_layer; ++l) {
    proj(q, d, n, pf * af);
    proj(kv, d, n, pf);
    proj(kv, d, n, pf);
    proj(d, q, n, pf * af);
    proj(ff, d, n, pf);
    proj(ff, d, n, pf);
    proj(d, ff, n, pf);
    both(2 * 4.0 * n * d, 2 * 8.0 * n * d);                              // two RMSNorms
    both(6.0 * n * (q + kv) / 2, 8.0 * n * (q + kv));                    // RoPE
    both(2 * 2.0 * pairs * nh * hd, 2 * 4.0 * pairs * kv, af);           // scores and value mixing
    both(5.0 * pairs * nh, 0, af);                                       // softmax
    k.flops_realised -= af * (1.0 - kf) * 2.0 * prefix_pairs * nh * hd;  // compacted keys
    k.bytes_realised -= af * (1.0 - kf) * 4.0 * prefix_pairs * kv;
    both(6.0 * n * ff, 12.0 * n * ff);  // SwiGLU
    both(2 * n * d, 2 * 12.0 * n * d);  // residual adds
  }
  both(0, 8.0 * n * d);                                   // embedding
  const double rows = static_cast<double>(n_seq) * tail;  // the rows that get logits
  if (tail < T) both(0, 8.0 * rows * d);                  // gather of the scored rows
  both(4.0 * rows * d, 8.0 * rows * d);                   // final RMSNorm
  proj(c.vocab, d, rows, 1.0);                            // LM head
  k.tokens = n;
  return k;
}

int predicted_windows(const EvalWork& w, const CostRates& r) {
  const double tokens = static_cast<double>(w.corpus_bytes) / r.bytes_per_token;
  const double body = w.context - (w.bos ? 1 : 0);
  double windows = tokens >= body ? std::floor((tokens - body) / std::max(1, w.stride)) + 1 : 1;
  if (w.max_windows > 0) windows = std::min<double>(windows, w.max_windows);
  return static_cast<int>(std::max(1.0, windows));
}

namespace {
void finish_seconds(Cost& k, const ModelShape& m, const CostRates& r) {
  k.seconds =
      r.startup_seconds + static_cast<double>(m.file_bytes) / r.load_bytes_per_second +
      std::max(k.flops_realised / r.flops_per_second, k.bytes_realised / r.bytes_per_second);
}
void add(Cost& a, const Cost& b, double times) {
  a.flops_dense += b.flops_dense * times;
  a.flops_realised += b.flops_realised * times;
  a.bytes_dense += b.bytes_dense * times;
  a.bytes_realised += b.bytes_realised * times;
  a.tokens += b.tokens * times;
}
}  // namespace

Cost predict_eval(const ModelShape& m, const EvalWork& w, const CostRates& r) {
  const int windows = predicted_windows(w, r);
  const int tail = std::min(w.context, w.score + 1);
  // Sparsity applies to the scored rows' projections; the context prefix stays dense. Token
  // Filtering skips a fraction r of all (token, layer) attention blocks; ThinK / GRACE compact
  // the prefix's keys before the scored rows attend to them.
  const double scored = static_cast<double>(tail) / std::max(1, w.context);
  const double pf = 1.0 - std::clamp(w.sparsity, 0.0, 1.0) * scored;
  const double af = 1.0 - std::clamp(w.tf_ratio, 0.0, 1.0);
  const double kf = 1.0 - std::clamp(w.kv_prune, 0.0, 1.0);
  Cost k;
  add(k, forward_cost(m.cfg, w.storage_bytes, 1, w.context, tail, pf, af, kf), windows);
  finish_seconds(k, m, r);
  return k;
}

Cost predict_calibrate(const ModelShape& m, const CalibrateWork& w, const CostRates& r) {
  const double tokens = static_cast<double>(w.corpus_bytes) / r.bytes_per_token;
  const int windows =
      std::max(1, std::min(w.max_windows, static_cast<int>(tokens / std::max(1, w.context))));
  // Histograms: one pass per window. Greedy search: per layer and step, one block run per
  // projection on the greedy sequences, i.e. about 7 forward passes per step; the probes run
  // the greedy sequences once per probe level.
  const double steps = std::ceil(w.cap / w.alpha);
  Cost k;
  for (int v = 0; v < w.variants; ++v) {
    add(k, forward_cost(m.cfg, w.storage_bytes, 1, w.context, 1), windows);
    add(k, forward_cost(m.cfg, w.storage_bytes, w.greedy_seqs, w.greedy_tokens, 1),
        1 + 7 * steps + w.probes);
  }
  finish_seconds(k, m, r);
  return k;
}

}  // namespace sparsim::sweep
