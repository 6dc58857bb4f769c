#pragma once
// sparsim bench --baseline: the attention module (q, k, v, o projections, RoPE and cache store,
// attention, a low-rank model's K/V rebuilding) of --model against another model in the same
// run, repetitions interleaved and the load order swapped halfway.
#include "bench_args.hpp"
#include "engine/engine.hpp"
#include "flops/ledger.hpp"
#include "io/run_file.hpp"
#include "transforms/kv_weight_pruning.hpp"
#include "transforms/low_rank.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <array>
#include <iostream>
#include <limits>
#include <vector>

namespace sparsim::app {

namespace attention_module {

/// The ops of the attention module: the q, k, v, o projections, RoPE (with the cache store), the
/// attention kernel (the ops RAP narrows) and a low-rank model's rebuilding of K and V.
constexpr std::array<flops::Op, 7> kAttentionOps = {
    flops::Op::QProj, flops::Op::KProj,     flops::Op::VProj,        flops::Op::OProj,
    flops::Op::RoPE,  flops::Op::AttnScore, flops::Op::KVReconstruct};

/// Seconds of the attention module in a profile.
double attention_seconds(const std::array<double, flops::kNumOps>& sec) {
  double t = 0;
  for (flops::Op op : kAttentionOps) t += sec[static_cast<int>(op)];
  return t;
}

/// Fills the first `positions` positions of every layer's key and value cache with values in
/// [−1, 1) from a fixed hash of their index.
template <class E>
void fill_cache_noise(Engine<E>& eng, int positions) {
  const E exec;
  for (int l = 0; l < eng.config().n_layer; ++l) {
    const KVLayer<E>& kv = eng.cache().layer(l);
    for (int which = 0; which < 2; ++which) {  // (nvcc rejects a braced list of views here)
      const Cache<E> c = which == 0 ? kv.k : kv.v;
      const int ns = static_cast<int>(c.extent(0)), w = static_cast<int>(c.extent(2));
      const int np = std::min(positions, static_cast<int>(c.extent(1)));
      Kokkos::parallel_for(
          "sparsim::bench::fill_cache_noise",
          Kokkos::MDRangePolicy<E, Kokkos::Rank<3>>(exec, {0, 0, 0}, {ns, np, w}),
          KOKKOS_LAMBDA(const int s, const int p, const int j) {
            std::uint32_t h = static_cast<std::uint32_t>((s * 1000003 + p) * 4099 + j + l * 7919);
            h ^= h >> 16;
            h *= 0x7feb352dU;
            h ^= h >> 15;
            h *= 0x846ca68bU;
            h ^= h >> 16;
            c(s, p, j) = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
          });
    }
  }
  exec.fence();
}

struct AttentionTimes {
  std::vector<double> prefill, decode, prefill_total, decode_total;  // per repetition
  /// per repetition, the median decode-step seconds of each of kAttentionOps
  std::vector<std::array<double, kAttentionOps.size()>> decode_ops;
};

/// One profiled prefill of `batch` sequences of `prompt` tokens and `decode` steps of one token
/// per sequence; records the attention-module seconds of the prefill and the median per step.
template <class E>
void attention_run(Engine<E>& eng, int batch, int prompt, int decode, int vocab, bool prefill,
                   AttentionTimes& out) {
  std::vector<std::vector<int>> toks(static_cast<std::size_t>(batch));
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < prompt; ++i) toks[b].push_back((i * 7919 + 13 + b * 101) % vocab);
  eng.set_profile(true);
  auto snap = eng.op_seconds();
  auto delta = [&](double& attn, double& total) {
    const auto now = eng.op_seconds();
    attn = attention_seconds(now) - attention_seconds(snap);
    total = 0;
    for (int o = 0; o < flops::kNumOps; ++o) total += now[o] - snap[o];
    snap = now;
  };
  double a = 0, t = 0;
  std::array<std::vector<double>, kAttentionOps.size()> ops;
  if (prefill) {
    eng.forward(toks, 0, false);
    delta(a, t);
    out.prefill.push_back(a);
    out.prefill_total.push_back(t);
  } else {
    // The decode steps read a cache of `prompt` positions that were never computed: the same
    // work, meaningless values (timing only). Filled with noise, not left at zero: an all-zero
    // cache decoded about 10 % faster than one of real values here, and more so the wider it is.
    fill_cache_noise(eng, prompt);
    snap = eng.op_seconds();
  }
  std::vector<double> steps, totals;
  std::vector<std::vector<int>> next(static_cast<std::size_t>(batch));
  for (int b = 0; b < batch; ++b) next[b] = {toks[b].back()};
  for (int s = 0; s < decode; ++s) {
    const auto before = snap;  // the op seconds after the previous step
    eng.forward(next, prompt + s, false);
    delta(a, t);
    if (s > 0 || decode == 1) {  // the first step warms up after the prefill
      steps.push_back(a);
      totals.push_back(t);
      for (std::size_t i = 0; i < kAttentionOps.size(); ++i) {
        const int o = static_cast<int>(kAttentionOps[i]);
        ops[i].push_back(snap[o] - before[o]);
      }
    }
    for (auto& n : next) n[0] = (n[0] * 31 + 7) % vocab;
  }
  out.decode.push_back(median_of(steps));
  out.decode_total.push_back(median_of(totals));
  std::array<double, kAttentionOps.size()> m{};
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = median_of(ops[i]);
  out.decode_ops.push_back(m);
  eng.set_profile(false);
}

}  // namespace attention_module

/// The --baseline benchmark; returns the exit status.
template <class E>
int bench_attention_module(const E& exec, const BenchArgs& a, const BenchRun& run) {
  using namespace attention_module;
  const int prompt = a.prompt, decode = a.decode, reps = a.reps, batch = a.batch;
  const std::string &storage = a.storage, &json_out = a.json_out;
  const ResolvedModel rb = resolve_model(a.baseline);
  ModelInfo ma_, mb_;
  const int ctx = prompt + decode;
  AttentionTimes ta, tb;
  // The weights loaded first can run measurably slower for the whole process than the
  // weights loaded second (seen on a virtual machine: the same model against itself, 4-16%
  // per decode step, always against the first loaded). So the repetitions come in two
  // halves with the load order swapped between them (both models loaded afresh), and within
  // a half the model that runs first alternates too.
  const int half = (reps + 1) / 2;
  std::vector<int> loaded_first;  // per repetition: 0 the model, 1 the baseline
  Config cfg_a;                   // the model's (its pruning report)
  for (const bool model_first : {true, false}) {
    const int r0 = model_first ? 0 : half, r1 = model_first ? half : reps;
    if (r0 >= r1) continue;
    std::shared_ptr<const Weights<E>> wa, wb;
    if (model_first) {
      wa = load_model<E>(run.model.path, run.load, &ma_);
      wb = load_model<E>(rb.path, run.load, &mb_);
    } else {
      wb = load_model<E>(rb.path, run.load, &mb_);
      wa = load_model<E>(run.model.path, run.load, &ma_);
    }
    for (const auto* w : {&wa, &wb})
      require(ctx <= (*w)->cfg.context_length,
              "--prompt + --decode = {} exceeds a model's context of {}", ctx,
              (*w)->cfg.context_length);
    require(wa->cfg.vocab == wb->cfg.vocab, "--baseline has another vocabulary");
    cfg_a = wa->cfg;
    Engine<E> ea(wa, batch, ctx, nullptr, exec), eb(wb, batch, ctx, nullptr, exec);
    for (int r = r0; r < r1; ++r) {  // alternate which model goes first
      if (r % 2 == 0) {
        attention_run(ea, batch, prompt, decode, wa->cfg.vocab, !a.decode_only, ta);
        attention_run(eb, batch, prompt, decode, wb->cfg.vocab, !a.decode_only, tb);
      } else {
        attention_run(eb, batch, prompt, decode, wb->cfg.vocab, !a.decode_only, tb);
        attention_run(ea, batch, prompt, decode, wa->cfg.vocab, !a.decode_only, ta);
      }
      loaded_first.push_back(model_first ? 0 : 1);
    }
  }
  std::vector<double> rp, rd, rpt, rdt;
  for (int r = 0; r < reps; ++r) {
    if (!a.decode_only) {
      rp.push_back(ta.prefill[r] / tb.prefill[r]);
      rpt.push_back(ta.prefill_total[r] / tb.prefill_total[r]);
    }
    rd.push_back(ta.decode[r] / tb.decode[r]);
    rdt.push_back(ta.decode_total[r] / tb.decode_total[r]);
  }
  if (a.decode_only) {  // reported as NaN / null
    for (auto* v : {&rp, &rpt, &ta.prefill, &tb.prefill})
      v->push_back(std::numeric_limits<double>::quiet_NaN());
  }
  std::cout << fmt::format(
      "attention module of {}\n  against {}, batch {}, prompt {}, {} decode steps, median of "
      "{} interleaved repetitions (profiled: fences after every kernel), backend {}, {} "
      "threads\n"
      "  prefill  {}\n"
      "  decode   {:>10.6f} s vs {:>10.6f} s per step = {:.3f} x  (whole step {:.3f} x)\n",
      ma_.path, mb_.path, batch, prompt, decode, reps, run.backend, run.threads,
      a.decode_only ? std::string("not run (--decode-only)")
                    : fmt::format("{:>10.4f} s vs {:>10.4f} s  = {:.3f} x  (whole forward "
                                  "{:.3f} x)",
                                  median_of(ta.prefill), median_of(tb.prefill), median_of(rp),
                                  median_of(rpt)),
      median_of(ta.decode), median_of(tb.decode), median_of(rd), median_of(rdt));
  // the two load orders apart, so that a difference between them shows
  std::vector<double> rd_order[2], rdt_order[2];
  for (int r = 0; r < reps; ++r) {
    rd_order[loaded_first[r]].push_back(rd[r]);
    rdt_order[loaded_first[r]].push_back(rdt[r]);
  }
  const auto med_or_nan = [](const std::vector<double>& v) {
    return v.empty() ? std::numeric_limits<double>::quiet_NaN() : median_of(v);
  };
  std::cout << fmt::format(
      "  load order swapped halfway: decode {:.3f} x (whole step {:.3f} x) with the model "
      "loaded first, {:.3f} x ({:.3f} x) with the baseline loaded first\n",
      med_or_nan(rd_order[0]), med_or_nan(rdt_order[0]), med_or_nan(rd_order[1]),
      med_or_nan(rdt_order[1]));
  if (!json_out.empty()) {
    nlohmann::json j = {
        {"model", {{"path", ma_.path}, {"fingerprint", ma_.fingerprint}}},
        {"baseline", {{"path", mb_.path}, {"fingerprint", mb_.fingerprint}}},
        {"storage", storage},
        {"bf16_compute", a.bf16_compute},
        {"backend", run.backend},
        {"threads", run.threads},
        {"batch", batch},
        {"prompt_tokens", prompt},
        {"decode_tokens", decode},
        {"reps", reps},
        {"attention_prefill_seconds", {{"model", ta.prefill}, {"baseline", tb.prefill}}},
        {"attention_decode_step_seconds", {{"model", ta.decode}, {"baseline", tb.decode}}},
        {"forward_prefill_seconds", {{"model", ta.prefill_total}, {"baseline", tb.prefill_total}}},
        {"forward_decode_step_seconds",
         {{"model", ta.decode_total}, {"baseline", tb.decode_total}}},
        {"decode_only", a.decode_only},
        {"loaded_first", loaded_first},  // per repetition: 0 the model, 1 the baseline
        {"attention_decode_ratio_by_load_order",
         {{"model_first", med_or_nan(rd_order[0])}, {"baseline_first", med_or_nan(rd_order[1])}}},
        {"forward_decode_ratio_by_load_order",
         {{"model_first", med_or_nan(rdt_order[0])}, {"baseline_first", med_or_nan(rdt_order[1])}}},
        {"attention_prefill_ratio", median_of(rp)},
        {"attention_decode_ratio", median_of(rd)},
        {"forward_prefill_ratio", median_of(rpt)},
        {"forward_decode_ratio", median_of(rdt)}};
    // Where the decode ratio comes from: each op's median seconds per step, per repetition.
    for (auto [key, tt] :
         {std::pair<const char*, const AttentionTimes*>{"model", &ta}, {"baseline", &tb}})
      for (std::size_t i = 0; i < kAttentionOps.size(); ++i) {
        std::vector<double> v;
        for (const auto& r : tt->decode_ops) v.push_back(r[i]);
        j["attention_decode_op_seconds"][key][flops::to_string(kAttentionOps[i])] = v;
      }
    if (cfg_a.pruned()) j["pruned"] = pruning::prune_report(cfg_a).json();
    if (cfg_a.low_rank_kv()) j["low_rank"] = pruning::low_rank_summary(cfg_a).json();
    io::write_file_atomically(json_out, io::json_file_text(j));
  }
  return 0;
}

}  // namespace sparsim::app
