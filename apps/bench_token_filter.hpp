#pragma once
// sparsim bench --method token-filter: Token Filtering (with an activation method, if --method
// names one) against dense, decoding a batch: the attention stage and the whole step, profiled.
#include "bench_decode.hpp"
#include "common.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "io/run_file.hpp"
#include "method_stack.hpp"
#include "records.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <iostream>

namespace sparsim::app {

namespace tfbench {

/// The KV cache the dropping gate held against the dense engine's (the last repetition).
inline std::string kv_cache_text(const gating::KVCacheRecord& kvr, double dense_alloc, int batch) {
  constexpr double MiB = 1024.0 * 1024.0;
  return fmt::format(
      "KV cache, all layers, {} sequences (--tf-drop-skipped, {} layers compacted):\n"
      "  held at the end    {:9.3f} MiB of {:9.3f} MiB written ({:.1f}%)\n"
      "  held at the peak   {:9.3f} MiB of {:9.3f} MiB written ({:.1f}%)\n"
      "  allocated, peak    {:9.3f} MiB; dense engine {:9.3f} MiB ({:.1f}%)\n",
      batch,
      std::count_if(kvr.layers.begin(), kvr.layers.end(),
                    [](const auto& r) { return r.compacted; }),
      kvr.held_final / MiB, kvr.dense_final / MiB, 100 * kvr.held_final / kvr.dense_final,
      kvr.held_peak / MiB, kvr.dense_peak / MiB, 100 * kvr.held_peak / kvr.dense_peak,
      kvr.allocated_peak / MiB, dense_alloc / MiB, 100 * kvr.allocated_peak / dense_alloc);
}

inline nlohmann::json kv_bytes_json(const gating::KVCacheRecord& kvr, double dense_alloc) {
  return {{"held_final", kvr.held_final},
          {"dense_final", kvr.dense_final},
          {"held_peak", kvr.held_peak},
          {"dense_peak", kvr.dense_peak},
          {"allocated_peak", kvr.allocated_peak},
          {"allocated_final", kvr.allocated_final},
          {"dense_allocated", dense_alloc},
          {"held_vs_dense_final", kvr.held_final / kvr.dense_final},
          {"allocated_peak_vs_dense", kvr.allocated_peak / dense_alloc}};
}

/// The decode phase's FLOPs and bytes per op of a ledger.
inline nlohmann::json decode_ledger_json(const flops::Ledger& ledger) {
  nlohmann::json fl = nlohmann::json::object();
  for (int o = 0; o < flops::kNumOps; ++o) {
    const auto t = ledger.by_op(static_cast<flops::Op>(o), flops::Phase::Decode);
    if (t.launches > 0)
      fl[flops::to_string(static_cast<flops::Op>(o))] = {{"flops_dense", t.flops_dense},
                                                         {"flops_realised", t.flops_realised},
                                                         {"bytes_dense", t.bytes_dense},
                                                         {"bytes_realised", t.bytes_realised}};
  }
  return fl;
}

}  // namespace tfbench

/// Token Filtering (optionally with an activation method) against dense, decoding `batch`
/// sequences: every repetition decodes the same prompts with both engines, profiled (fences
/// after each kernel), and compares the attention stage (Q projection, attention, O
/// projection) and the whole step.
template <class E>
int bench_token_filter(const E& exec, const MethodArgs& ma, const sparsity::Plan& plan,
                       std::shared_ptr<const Weights<E>> w, std::shared_ptr<const Weights<E>> ws,
                       const ModelInfo& mi, int prompt, int decode, int reps, int batch,
                       bool skipping, const std::string& storage, const std::string& backend,
                       int threads, double bw, const std::string& json_out) {
  const Config& c = w->cfg;
  const int ctx = prompt + decode;
  Engine<E> dense(w, batch, ctx, nullptr, exec), meth(ws, batch, ctx, nullptr, exec);
  MethodStack<E> stack(ma, meth, plan, {ctx, prompt});
  if (ma.sparse() && skipping && batch == 1) meth.use_column_skipping(true);
  gating::TokenFilter<E>* tfg = stack.token_filter();
  std::vector<std::vector<int>> prompts(static_cast<std::size_t>(batch));
  for (int s = 0; s < batch; ++s)
    for (int i = 0; i < prompt; ++i) prompts[s].push_back((i * 7919 + 13 + s * 104729) % c.vocab);
  struct Run {
    double prefill = 0, step = 0;
    std::array<double, flops::kNumOps> ops{};
  };
  auto run = [&](Engine<E>& e, flops::Ledger* ledger) {
    const DecodeTiming t =
        timed_decode(e, prompts, decode, c.vocab, {Clock::Wall, true, ledger, 1});
    return Run{t.prefill, t.step, t.ops};
  };
  auto at = [](const Run& r, flops::Op o) { return r.ops[static_cast<int>(o)]; };
  auto attn_stage = [&](const Run& r) {
    return at(r, flops::Op::QProj) + at(r, flops::Op::AttnScore) + at(r, flops::Op::OProj);
  };
  auto gate_cost = [&](const Run& r) {
    return at(r, flops::Op::GateSimilarity) + at(r, flops::Op::GatherScatter);
  };
  auto layer_time = [&](const Run& r) {
    double t = 0;
    for (int o = 0; o < flops::kNumOps; ++o) {
      const auto op = static_cast<flops::Op>(o);
      if (op != flops::Op::Embedding && op != flops::Op::LMHead) t += r.ops[o];
    }
    return t;
  };
  const double load_before = load_average();
  flops::Ledger ledger(c.n_layer);
  std::vector<double> r_att, r_att_gate, r_step, d_step, m_step, gate_share, d_att_share, realised;
  nlohmann::json per_rep = nlohmann::json::array();
  for (int r = 0; r < reps; ++r) {
    const Run d = run(dense, nullptr);
    tfg->reset_stats();
    if (r + 1 == reps) ledger.reset();
    const Run m = run(meth, r + 1 == reps ? &ledger : nullptr);
    r_att.push_back(attn_stage(m) / attn_stage(d));
    r_att_gate.push_back((attn_stage(m) + gate_cost(m)) / attn_stage(d));
    r_step.push_back(m.step / d.step);
    d_step.push_back(d.step);
    m_step.push_back(m.step);
    gate_share.push_back(at(m, flops::Op::GateSimilarity) / layer_time(m));
    double total = 0;
    for (double x : d.ops) total += x;
    d_att_share.push_back(attn_stage(d) / total);
    realised.push_back(tfg->realised());
    per_rep.push_back({{"dense_step_seconds", d.step},
                       {"method_step_seconds", m.step},
                       {"dense_attention_stage_seconds", attn_stage(d)},
                       {"method_attention_stage_seconds", attn_stage(m)},
                       {"method_gate_seconds", gate_cost(m)},
                       {"realised", tfg->realised()}});
  }
  const double load_after = load_average();
  const double att = median_of(r_att), step = median_of(r_step), share = median_of(d_att_share);
  // If only the attention stage changed, the step would take 1 − share·(1 − att) of dense.
  const double implied = 1.0 - share * (1.0 - att);
  std::cout << fmt::format(
      "model {} ({} storage), backend {}, {} threads; load {:.2f} before, {:.2f} after\n"
      "{} at r = {:.2f} ({} gated layers, {}), {} sequences, prompt {} + {} decode steps, "
      "median of {} profiled repetitions\n"
      "realised model-wide skip ratio          {:.4f}\n"
      "attention stage (q_proj + attention + o_proj) time vs dense   {:.3f}  (falls {:.1f}%)\n"
      "  with the gate's own work (similarity, gather/scatter)       {:.3f}\n"
      "decode step time vs dense                                     {:.3f}  (falls {:.1f}%)\n"
      "  implied by the attention stage alone ({:.1f}% of the dense step)  {:.3f}\n"
      "similarity test share of the layers' time                     {:.2f}%\n"
      "dense step {:.2f} ms, method step {:.2f} ms\n",
      mi.path, storage, backend, threads, load_before, load_after, ma.method, ma.tf.ratio,
      tfg->layers().size(), gating::to_string(ma.tf.layers), batch, prompt, decode, reps,
      median_of(realised), att, 100 * (1 - att), median_of(r_att_gate), step, 100 * (1 - step),
      100 * share, implied, 100 * median_of(gate_share), 1e3 * median_of(d_step),
      1e3 * median_of(m_step));
  // Dropped tokens: the method's KV cache against the dense engine's (the last repetition).
  const gating::KVCacheRecord& kvr = tfg->kv_cache();
  const double dense_alloc = static_cast<double>(dense.cache().bytes());
  if (!kvr.empty()) std::cout << tfbench::kv_cache_text(kvr, dense_alloc, batch);
  if (!json_out.empty()) {
    nlohmann::json j = {{"model", {{"path", mi.path}, {"fingerprint", mi.fingerprint}}},
                        {"storage", storage},
                        {"backend", backend},
                        {"threads", threads},
                        {"load_average_before", load_before},
                        {"load_average_after", load_after},
                        {"copy_bandwidth_bytes_per_s", bw},
                        {"method", ma.method},
                        {"batch", batch},
                        {"prompt_tokens", prompt},
                        {"decode_tokens", decode},
                        {"reps", reps},
                        {"profiled", true},
                        {"token_filter", token_filter_json(*tfg)},
                        {"attention_stage_ratio", att},
                        {"attention_stage_ratio_reps", r_att},
                        {"attention_stage_with_gate_ratio", median_of(r_att_gate)},
                        {"step_ratio", step},
                        {"step_ratio_reps", r_step},
                        {"step_ratio_implied", implied},
                        {"dense_attention_stage_share", share},
                        {"gate_similarity_share_of_layers", median_of(gate_share)},
                        {"dense_step_seconds", median_of(d_step)},
                        {"method_step_seconds", median_of(m_step)},
                        {"realised_reps", realised},
                        {"per_rep", per_rep},
                        {"dense_kv_bytes_allocated", dense_alloc}};
    if (!kvr.empty()) j["kv_bytes"] = tfbench::kv_bytes_json(kvr, dense_alloc);
    j["decode_ledger_last_rep"] = tfbench::decode_ledger_json(ledger);
    io::write_file_atomically(json_out, io::json_file_text(j));
  }
  return 0;
}

}  // namespace sparsim::app
