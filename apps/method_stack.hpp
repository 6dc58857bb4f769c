#pragma once
// The method stack of one engine: every policy --method and --evict ask for, built from the
// parsed options (MethodArgs), checked against the engine's model, attached to the engine, and
// reported in one place. Commands build a stack, run, and ask the stack for its records:
//
//   MethodStack<E> stack(ma, eng, plan, {gate_tokens, shortest_prefill});
//   ... run the engine ...
//   const nlohmann::json rec = stack.records();   // one block per attached method
//   stack.add_to_summary(rec, j, cols);             // JSON summary and sweep columns
//   stack.write(rec, root);                         // HDF5 groups of the run file
//
// The policies and their order on the engine: the activation masker (with the plan), the Token
// Filtering gate, the ThinK / GRACE channel selector, the token evictor, the Probe Pruning
// policy. A method that is not asked for is absent (nullptr) and adds nothing.
#include "method_setup.hpp"

#include "core/log.hpp"
#include "io/hdf5.hpp"

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

namespace sparsim::app {

/// The sequence lengths a stack is checked against.
struct StackLengths {
  int gate_tokens = 0;       ///< tokens a gated sequence reaches (the warm-up must be shorter)
  int shortest_prefill = 0;  ///< the shortest prompt prefilled before decoding (windows, sinks)
};

template <class E>
class MethodStack {
 public:
  MethodStack(const MethodArgs& a, Engine<E>& eng, const sparsity::Plan& plan, StackLengths len)
      : a_(a), eng_(eng), masker_(eng.config().n_layer) {
    attach_masker(eng, masker_, plan);
    tf_ = make_token_filter(a, eng, len.gate_tokens);
    kv_ = make_kv_pruner(a, eng, len.shortest_prefill);
    ev_ = make_token_evictor(a, eng, len.shortest_prefill);
    pp_ = make_probe_pruner(a, eng);
  }
  MethodStack(const MethodStack&) = delete;
  MethodStack& operator=(const MethodStack&) = delete;

  sparsity::ActivationMasker<E>& masker() { return masker_; }
  const sparsity::ActivationMasker<E>& masker() const { return masker_; }
  gating::TokenFilter<E>* token_filter() const { return tf_.get(); }
  pruning::KvChannelPruner<E>* channel_selector() const { return kv_.get(); }
  pruning::TokenEvictorPolicy<E>* evictor() const { return ev_.get(); }
  pruning::ProbePruner<E>* probe_pruner() const { return pp_.get(); }

  /// One JSON block per attached method, named as in the summaries: token_filter, kv_prune,
  /// evict, probe_pruning (the activation methods report through SparsityReport).
  nlohmann::json records() const {
    nlohmann::json r = nlohmann::json::object();
    if (tf_) r["token_filter"] = token_filter_json(*tf_);
    if (kv_) r["kv_prune"] = kv_prune_json(*kv_, eng_);
    if (ev_) r["evict"] = evict_json(*ev_);
    if (pp_) r["probe_pruning"] = probe_pruning_json(*pp_);
    return r;
  }

  /// Copies the records into a JSON summary `j` and adds their sweep columns to `cols`.
  void add_to_summary(const nlohmann::json& rec, nlohmann::json& j,
                      io::SummaryColumns& cols) const {
    for (const auto& [k, v] : rec.items()) j[k] = v;
    if (ev_) add_evict_columns(rec["evict"], cols);
    if (tf_) add_token_filter_columns(rec["token_filter"], cols);
    if (pp_) {
      cols.add("pp_ratio", a_.pp.ratio, "1",
               "Probe Pruning target: pruned fraction of attention units and FFN channels");
      cols.add("pp_head_ratio", pp_->head_ratio(), "1",
               "Probe Pruning realised pruned fraction of attention units, all layers and batches");
      cols.add("pp_channel_ratio", pp_->channel_ratio(), "1",
               "Probe Pruning realised pruned fraction of FFN channels, all layers and batches");
    }
    if (kv_) add_kv_prune_columns(rec["kv_prune"], cols);
  }

  /// The lines of the attached methods in a command's result table ("  name  value").
  std::string table(const nlohmann::json& rec) const {
    std::string s;
    auto line = [&s](const std::string& name, const std::string& value) {
      s += fmt::format("  {:<22} {:>14}\n", name, value);
    };
    auto num = [&line](const std::string& name, double v) { line(name, fmt::format("{:.4f}", v)); };
    if (ev_) {
      const auto& e = rec["evict"];
      line("token eviction", fmt::format("{} b={}", e["method"].get<std::string>(), a_.ev.budget));
      num("prompt tokens kept", e["kept_fraction"].get<double>());
      num("prompt KV bytes / dense", e["kv_bytes_fraction"].get<double>());
    }
    if (kv_) {
      const auto& k = rec["kv_prune"];
      line("K-channel pruning",
           fmt::format("{} λ={}", k["method"].get<std::string>(), a_.kv.lambda));
      line("key channels kept", fmt::format("{} of {}", kv_->kept_per_head(), kv_->head_dim()));
      num("K bytes / dense", k["k_bytes"].get<double>() / k["k_bytes_dense"].get<double>());
      num("recon error (ThinK)", k["recon_error_think_mean"].get<double>());
      num("recon error (GRACE)", k["recon_error_grace_mean"].get<double>());
    }
    if (tf_) {
      num("token filter target", a_.tf.ratio);
      num("token filter realised", tf_->realised());
    }
    return s;
  }

  /// One log line per attached method: what it kept and what its selection cost.
  void log_records(const nlohmann::json& rec) const {
    if (kv_) {
      const auto& kj = rec["kv_prune"];
      log().info(
          "K-channel pruning ({}, λ = {}): {} of {} key channels kept per head; K cache {:.0f} of "
          "{:.0f} bytes dense ({:.3f}); reconstruction error ThinK {:.4f}, GRACE {:.4f}; "
          "selection {:.2f} ms (Grams {:.2f} ms)",
          kj["method"].get<std::string>(), a_.kv.lambda, kv_->kept_per_head(), kv_->head_dim(),
          kj["k_bytes"].get<double>(), kj["k_bytes_dense"].get<double>(),
          kj["k_bytes"].get<double>() / kj["k_bytes_dense"].get<double>(),
          kj["recon_error_think_mean"].get<double>(), kj["recon_error_grace_mean"].get<double>(),
          1e3 * kv_->select_seconds(), 1e3 * kv_->gram_seconds());
    }
    if (ev_) {
      const auto& ej = rec["evict"];
      log().info(
          "token eviction ({}, budget {}): {:.4f} of the prompt's tokens kept; prompt KV {:.0f} of "
          "{:.0f} bytes dense ({:.3f}); selection {:.2f} ms",
          ej["method"].get<std::string>(), a_.ev.budget, ej["kept_fraction"].get<double>(),
          ej["kv_bytes_kept"].get<double>(), ej["kv_bytes_dense"].get<double>(),
          ej["kv_bytes_fraction"].get<double>(), 1e3 * ev_->select_seconds());
    }
    if (pp_)
      log().info(
          "probe-pruning: ratio {}, heads pruned {:.3f}, FFN channels pruned {:.3f} (masks "
          "chosen at the prefill, reused by {} decode steps)",
          a_.pp.ratio, pp_->head_ratio(), pp_->channel_ratio(), pp_->reused_calls());
    if (tf_)
      log().info("token filter: target {:.3f}, realised {:.4f} over {} decided tokens", a_.tf.ratio,
                 tf_->realised(), tf_->decided_tokens());
    if (tf_ && !tf_->kv_cache().empty()) {
      const gating::KVCacheRecord& kv = tf_->kv_cache();
      log().info(
          "token filter KV cache: {:.0f} of {:.0f} bytes held at the end ({:.1f}%), {:.0f} "
          "allocated at the peak against {:.0f} dense",
          kv.held_final, kv.dense_final, 100 * kv.held_final / kv.dense_final, kv.allocated_peak,
          kv.allocated_dense);
    }
  }

  /// The run file's groups of the attached methods under `root`: token_filter, probe_pruning,
  /// evict, kv_prune (with the K-cache bytes per layer from the records).
  void write(const nlohmann::json& rec, io::Group& root) const {
    if (tf_) {
      io::Group g = root.create_group("token_filter");
      tf_->write(g);
    }
    if (pp_) {
      io::Group g = root.create_group("probe_pruning");
      pp_->write(g);
    }
    if (ev_) {
      io::Group g = root.create_group("evict");
      ev_->write(g);
    }
    if (kv_) {
      io::Group g = root.create_group("kv_prune");
      kv_->write(g);
      std::vector<double> kd, kb;
      for (const auto& pl : rec["kv_prune"]["per_layer"]) {
        kd.push_back(pl["k_bytes_dense"].get<double>());
        kb.push_back(pl["k_bytes"].get<double>());
      }
      g.write<double>("k_bytes_dense", kd, {"byte", "K-cache bytes of the dense layout per layer"});
      g.write<double>("k_bytes", kb,
                      {"byte", "K-cache bytes allocated per layer at the end of the run"});
    }
  }

 private:
  const MethodArgs& a_;
  const Engine<E>& eng_;
  sparsity::ActivationMasker<E> masker_;
  std::unique_ptr<gating::TokenFilter<E>> tf_;
  std::unique_ptr<pruning::KvChannelPruner<E>> kv_;
  std::unique_ptr<pruning::TokenEvictorPolicy<E>> ev_;
  std::unique_ptr<pruning::ProbePruner<E>> pp_;
};

}  // namespace sparsim::app
