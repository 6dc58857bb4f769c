#pragma once
// sparsim bench --method think|grace: what K-cache channel pruning costs and saves at decode.
//
// 1. Decode attention, kernel level, in the same run and alternating: every layer's attention of
//    one decode row per sequence at position P (after a prompt of P tokens) over
//      dense     the dense cache (attention(), the engine's dense kernel),
//      method    the cache compacted by the method (cached_attention(), kept channels),
//      no-K      the same compacted cache read with zero key channels per head: the scores are
//                all 0, so the kernel does everything but the key-side work (the floor).
//    K-side time = time − no-K time; the saving the method realises is
//    (dense − method) / (dense − no-K), to be held against λ.
// 2. With a real prefill (the default): prefill time of dense and method, the method's own
//    selection cost (the Gram matrices, then ThinK / GRACE on the host) per head and against the
//    prefill, and profiled decode steps of both engines (attention op and whole step).
//    --kv-synthetic-cache skips the model run: the caches are filled with random keys and values
//    (decode attention time does not depend on their values) and the method selects its channels
//    from random observed queries — for contexts whose prefill is too slow to run here.
#include "bench_decode.hpp"
#include "common.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "io/run_file.hpp"
#include "kernels/cached_attention.hpp"
#include "method_stack.hpp"
#include "records.hpp"

#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>

namespace sparsim::app {

namespace kvbench {

/// Seconds of the three attention variants over all layers, one repetition each, alternating.
struct AttnTimes {
  std::vector<double> dense, method, nok;
};

/// Times decode attention of `batch` rows (one per sequence, at position `pos`) over every
/// layer: dense layers `dl`, compacted layers `ml`, and `ml` read with zero key channels.
template <class E>
AttnTimes time_attention(const E& exec, const std::vector<KVLayer<E>>& dl,
                         const std::vector<KVLayer<E>>& ml, const AttnShape& sh, int batch, int pos,
                         int reps) {
  const int n_layer = static_cast<int>(dl.size());
  Mat<E> q("sparsim::bench::q", batch, sh.q_width()),
      out("sparsim::bench::o", batch, sh.out_width());
  {
    auto hq = Kokkos::create_mirror_view(q);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (std::size_t i = 0; i < hq.size(); ++i) hq.data()[i] = nd(rng);
    Kokkos::deep_copy(q, hq);
  }
  IVec<E> rs("sparsim::bench::rs", batch), rp("sparsim::bench::rp", batch);
  {
    auto hs = Kokkos::create_mirror_view(rs);
    auto hp = Kokkos::create_mirror_view(rp);
    for (int s = 0; s < batch; ++s) hs(s) = s, hp(s) = pos;
    Kokkos::deep_copy(rs, hs);
    Kokkos::deep_copy(rp, hp);
  }
  // the no-K variant: every head's compact columns empty
  std::vector<KVLayer<E>> zl = ml;
  for (auto& l : zl) {
    l.koff = IMat<E>("sparsim::bench::koff0", l.koff.extent(0), l.koff.extent(1));
  }
  const CMat<E> cq(q);
  auto dense_pass = [&]() {
    for (int l = 0; l < n_layer; ++l) {
      const auto& kv = dl[static_cast<std::size_t>(l)];
      // the engine's dense kernel reads the query rows of a call at p0 = pos, T = 1
      attention(exec, cq, kv.k, kv.v, out, batch, 1, pos, sh.n_head, sh.n_kv_head, sh.qk_dim);
    }
  };
  auto cached_pass = [&](const std::vector<KVLayer<E>>& layers) {
    for (int l = 0; l < n_layer; ++l)
      cached_attention(exec, cq, rs, rp, layers[static_cast<std::size_t>(l)], sh, out, pos + 1);
  };
  AttnTimes t;
  auto timed = [&](auto&& f) {
    exec.fence();
    Stopwatch sw;
    f();
    exec.fence();
    return sw.seconds();
  };
  dense_pass();  // warm up
  cached_pass(ml);
  cached_pass(zl);
  for (int r = 0; r < reps; ++r) {
    t.dense.push_back(timed(dense_pass));
    t.method.push_back(timed([&] { cached_pass(ml); }));
    t.nok.push_back(timed([&] { cached_pass(zl); }));
  }
  return t;
}

/// The JSON and text of one attention timing.
inline nlohmann::json attention_json(const AttnTimes& t, double lambda, int n_layer) {
  std::vector<double> saved;
  for (std::size_t r = 0; r < t.dense.size(); ++r) {
    const double kd = t.dense[r] - t.nok[r];
    saved.push_back(kd > 0 ? (t.dense[r] - t.method[r]) / kd : 0.0);
  }
  const double d = median_of(t.dense), m = median_of(t.method), z = median_of(t.nok);
  const double s = median_of(saved);
  return {{"layers", n_layer},
          {"dense_seconds", d},
          {"method_seconds", m},
          {"no_k_seconds", z},
          {"dense_seconds_reps", t.dense},
          {"method_seconds_reps", t.method},
          {"no_k_seconds_reps", t.nok},
          {"k_side_dense_seconds", d - z},
          {"k_side_method_seconds", m - z},
          {"k_side_saved_fraction", s},
          {"k_side_saved_fraction_reps", saved},
          {"required_fraction", 0.8 * lambda},
          {"meets_requirement", s >= 0.8 * lambda},
          {"attention_ratio", d > 0 ? m / d : 0.0}};
}

/// The decode attention times and K-cache bytes of a run.
struct CacheTiming {
  AttnTimes at;
  std::size_t k_dense = 0, k_method = 0;
  int timed_layers = 0;
};

/// --kv-synthetic-cache: caches of the model's shape filled with random keys and values.
template <class E>
CacheTiming synthetic_cache_timing(const E& exec, const MethodArgs& ma, const Config& c,
                                   const AttnShape& sh, int batch, int prompt, int ctx, int reps,
                                   nlohmann::json& j) {
  CacheTiming res;
  res.timed_layers = c.n_layer;
  // Caches of the model's shape: random keys and values at positions 0 … prompt, the
  // method's channels chosen from random observed queries, the prompt compacted.
  // Enough layers that the timed caches stream from memory as the whole model's do (at least
  // 256 MB of keys and values, or every layer), without allocating the whole model's caches.
  const double layer_bytes = 4.0 * batch * ctx * (sh.k_width() + sh.v_width());
  Config cs = c;
  cs.n_layer = std::min(c.n_layer, std::max(4, static_cast<int>(std::ceil(256e6 / layer_bytes))));
  KVCache<E> dc(cs, batch, ctx), mc(cs, batch, ctx);
  const int n = batch * ctx, kw = sh.k_width(), wobs = ma.kv.window;
  Mat<E> kr("sparsim::bench::k", n, kw), vr("sparsim::bench::v", n, sh.v_width()),
      qo("sparsim::bench::q_obs", batch * wobs, sh.q_width());
  {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto* m : {&kr, &vr, &qo}) {
      auto h = Kokkos::create_mirror_view(*m);
      for (std::size_t i = 0; i < h.size(); ++i) h.data()[i] = nd(rng);
      Kokkos::deep_copy(*m, h);
    }
  }
  pruning::KvChannelPruner<E> sel(ma.kv, cs.n_layer, sh.n_kv_head, sh.qk_dim, batch, 0);
  for (int l = 0; l < cs.n_layer; ++l) {
    dc.store(exec, l, CMat<E>(kr), CMat<E>(vr), batch, ctx, 0);
    mc.store(exec, l, CMat<E>(kr), CMat<E>(vr), batch, ctx, 0);
    const KeptChannels kept = sel.select(exec, l, mc.layer(l), sh, CMat<E>(qo), batch, prompt);
    if (!kept.empty()) mc.compact_keys(exec, l, kept);
  }
  exec.fence();
  std::vector<KVLayer<E>> dl, ml;
  for (int l = 0; l < cs.n_layer; ++l) {
    dl.push_back(dc.layer(l));
    ml.push_back(mc.layer(l));
    res.k_dense += dc.k_bytes(l);
    res.k_method += mc.k_bytes(l);
  }
  res.at = kvbench::time_attention(exec, dl, ml, sh, batch, prompt, reps);
  res.timed_layers = cs.n_layer;
  j["selection"] = {
      {"gram_seconds", sel.gram_seconds()},
      {"select_seconds", sel.select_seconds()},
      {"heads", sel.selections()},
      {"select_seconds_per_head", sel.select_seconds() / std::max<double>(1, sel.selections())}};
  return res;
}

/// A real prefill and decode of the dense and the method's engine, alternating.
template <class E>
CacheTiming model_cache_timing(const E& exec, const MethodArgs& ma,
                               std::shared_ptr<const Weights<E>> w, const AttnShape& sh,
                               const std::vector<std::vector<int>>& prompts, int decode, int reps,
                               int ctx, nlohmann::json& j) {
  const Config& c = w->cfg;
  const int batch = static_cast<int>(prompts.size()), prompt = static_cast<int>(prompts[0].size());
  CacheTiming res;
  res.timed_layers = c.n_layer;
  Engine<E> dense(w, batch, ctx, nullptr, exec), meth(w, batch, ctx, nullptr, exec);
  MethodStack<E> stack(ma, meth, sparsity::Plan{}, {ctx, prompt});
  pruning::KvChannelPruner<E>* sel = stack.channel_selector();
  struct Run {
    double prefill = 0, step = 0, attn = 0;
  };
  auto run = [&](Engine<E>& e) {
    const DecodeTiming t =
        timed_decode(e, prompts, decode, c.vocab, {Clock::Wall, true, nullptr, 1});
    return Run{t.prefill, t.step, t.ops[static_cast<int>(flops::Op::AttnScore)] / decode};
  };
  std::vector<double> d_pre, m_pre, d_step, m_step, d_att, m_att, sel_prefill;
  std::vector<double> sel_head, gram_head;
  for (int r = 0; r < reps; ++r) {
    const Run d = run(dense);
    sel->reset_stats();
    const Run m = run(meth);
    d_pre.push_back(d.prefill);
    m_pre.push_back(m.prefill);
    d_step.push_back(d.step);
    m_step.push_back(m.step);
    d_att.push_back(d.attn);
    m_att.push_back(m.attn);
    const double heads = std::max<double>(1, sel->selections());
    sel_head.push_back(sel->select_seconds() / heads);
    gram_head.push_back(sel->gram_seconds() / heads);
    sel_prefill.push_back((sel->select_seconds() + sel->gram_seconds()) / m.prefill);
    // kernel-level K-side split on the caches as the decode left them
    std::vector<KVLayer<E>> dl, ml;
    for (int l = 0; l < c.n_layer; ++l) {
      dl.push_back(dense.cache().layer(l));
      ml.push_back(meth.cache().layer(l));
    }
    const auto t1 = kvbench::time_attention(exec, dl, ml, sh, batch, prompt, 3);
    res.at.dense.push_back(median_of(t1.dense));
    res.at.method.push_back(median_of(t1.method));
    res.at.nok.push_back(median_of(t1.nok));
  }
  for (int l = 0; l < c.n_layer; ++l) {
    res.k_dense += dense.cache().k_bytes(l);
    res.k_method += meth.cache().k_bytes(l);
  }
  j["decode_tokens"] = decode;
  j["prefill"] = {{"dense_seconds", median_of(d_pre)},
                  {"method_seconds", median_of(m_pre)},
                  {"dense_seconds_reps", d_pre},
                  {"method_seconds_reps", m_pre}};
  j["selection"] = {{"select_seconds_per_head", median_of(sel_head)},
                    {"gram_seconds_per_head", median_of(gram_head)},
                    {"heads_per_prefill", c.n_layer * sh.n_kv_head * batch},
                    {"share_of_prefill", median_of(sel_prefill)},
                    {"share_of_prefill_reps", sel_prefill}};
  j["decode"] = {{"dense_step_seconds", median_of(d_step)},
                 {"method_step_seconds", median_of(m_step)},
                 {"step_ratio", median_of(m_step) / median_of(d_step)},
                 {"dense_attention_seconds_per_step", median_of(d_att)},
                 {"method_attention_seconds_per_step", median_of(m_att)},
                 {"attention_ratio", median_of(m_att) / median_of(d_att)},
                 {"profiled", true}};
  j["kv_prune"] = kv_prune_json(*sel, meth);
  return res;
}

/// The lines on stdout.
inline std::string kv_bench_text(const nlohmann::json& j, const MethodArgs& ma, const ModelInfo& mi,
                                 const AttnShape& sh, const CacheTiming& res, bool synthetic,
                                 int decode) {
  const std::string storage = j["storage"], backend = j["backend"];
  const int threads = j["threads"], batch = j["batch"], prompt = j["prompt_tokens"],
            reps = j["reps"];
  const double load_before = j["load_average_before"], load_after = j["load_average_after"];
  const std::size_t k_dense = res.k_dense, k_method = res.k_method;
  const int timed_layers = res.timed_layers;
  std::string out;
  const auto& a = j["attention"];
  out += fmt::format(
      "model {} ({} storage), backend {}, {} threads; load {:.2f} before, {:.2f} after\n"
      "{} at λ = {} ({} of {} key channels kept per head), {} sequences, prompt {}{}, median of "
      "{} repetitions\n"
      "K cache{}            {:.1f} MB dense, {:.1f} MB compacted ({:.3f})\n"
      "decode attention, {} layers, kernel level (dense / method / no-K floor)\n"
      "  time                     {:.3f} / {:.3f} / {:.3f} ms   method vs dense {:.3f}\n"
      "  K-side time              {:.3f} ms dense, {:.3f} ms method\n"
      "  K-side saved             {:.3f} of dense (λ = {}; required ≥ 0.8·λ = {:.3f}: {})\n",
      mi.path, storage, backend, threads, load_before, load_after, ma.method, ma.kv.lambda,
      j["kept_per_head"].get<int>(), sh.qk_dim, batch, prompt,
      synthetic ? " (synthetic cache)" : fmt::format(" + {} decode steps", decode), reps,
      synthetic ? fmt::format(" ({:>2} layers)", timed_layers) : "            ", k_dense / 1e6,
      k_method / 1e6, static_cast<double>(k_method) / std::max<std::size_t>(1, k_dense),
      timed_layers, 1e3 * a["dense_seconds"].get<double>(), 1e3 * a["method_seconds"].get<double>(),
      1e3 * a["no_k_seconds"].get<double>(), a["attention_ratio"].get<double>(),
      1e3 * a["k_side_dense_seconds"].get<double>(), 1e3 * a["k_side_method_seconds"].get<double>(),
      a["k_side_saved_fraction"].get<double>(), ma.kv.lambda, 0.8 * ma.kv.lambda,
      a["meets_requirement"].get<bool>() ? "met" : "NOT met");
  if (!synthetic) {
    const auto& p = j["prefill"];
    const auto& s = j["selection"];
    const auto& d = j["decode"];
    out += fmt::format(
        "prefill                    {:.3f} s dense, {:.3f} s with selection\n"
        "selection per head         {:.1f} µs ThinK/GRACE on the host (O(d²)), {:.1f} µs Grams; "
        "{:.2f}% of the prefill\n"
        "decode step (profiled)     {:.2f} ms dense, {:.2f} ms method ({:.3f})\n"
        "attention op per step      {:.3f} ms dense, {:.3f} ms method ({:.3f})\n",
        p["dense_seconds"].get<double>(), p["method_seconds"].get<double>(),
        1e6 * s["select_seconds_per_head"].get<double>(),
        1e6 * s["gram_seconds_per_head"].get<double>(), 100 * s["share_of_prefill"].get<double>(),
        1e3 * d["dense_step_seconds"].get<double>(), 1e3 * d["method_step_seconds"].get<double>(),
        d["step_ratio"].get<double>(), 1e3 * d["dense_attention_seconds_per_step"].get<double>(),
        1e3 * d["method_attention_seconds_per_step"].get<double>(),
        d["attention_ratio"].get<double>());
  } else {
    const auto& s = j["selection"];
    out += fmt::format("selection per head         {:.1f} µs on the host (O(d²))\n",
                       1e6 * s["select_seconds_per_head"].get<double>());
  }
  return out;
}

}  // namespace kvbench

/// sparsim bench for ThinK / GRACE (see the top of this file).
template <class E>
int bench_kv_prune(const E& exec, const MethodArgs& ma, std::shared_ptr<const Weights<E>> w,
                   const ModelInfo& mi, int prompt, int decode, int reps, int batch, bool synthetic,
                   const std::string& storage, const std::string& backend, int threads,
                   const std::string& json_out) {
  const Config& c = w->cfg;
  ma.validate(c);
  const AttnShape sh = attn_shape(c, 0);
  require(ma.kv.window <= prompt, "--kv-window {} is longer than the prompt of {} tokens",
          ma.kv.window, prompt);
  const int ctx = prompt + (synthetic ? 1 : decode);
  const double load_before = load_average();
  nlohmann::json j = {{"model", {{"path", mi.path}, {"fingerprint", mi.fingerprint}}},
                      {"storage", storage},
                      {"backend", backend},
                      {"threads", threads},
                      {"method", ma.method},
                      {"kv_method", pruning::to_string(ma.kv.method)},
                      {"lambda", ma.kv.lambda},
                      {"head_dim", sh.qk_dim},
                      {"kept_per_head", sh.qk_dim - pruning::prune_count(ma.kv.lambda, sh.qk_dim)},
                      {"batch", batch},
                      {"prompt_tokens", prompt},
                      {"reps", reps},
                      {"synthetic_cache", synthetic},
                      {"load_average_before", load_before}};
  std::vector<std::vector<int>> prompts(static_cast<std::size_t>(batch));
  for (int s = 0; s < batch; ++s)
    for (int i = 0; i < prompt; ++i) prompts[s].push_back((i * 7919 + 13 + s * 104729) % c.vocab);

  const kvbench::CacheTiming res =
      synthetic ? kvbench::synthetic_cache_timing(exec, ma, c, sh, batch, prompt, ctx, reps, j)
                : kvbench::model_cache_timing(exec, ma, w, sh, prompts, decode, reps, ctx, j);
  j["load_average_after"] = load_average();
  j["k_bytes_dense"] = static_cast<double>(res.k_dense);
  j["k_bytes"] = static_cast<double>(res.k_method);
  j["attention"] = kvbench::attention_json(res.at, ma.kv.lambda, res.timed_layers);
  std::cout << kvbench::kv_bench_text(j, ma, mi, sh, res, synthetic, decode);
  if (!json_out.empty()) io::write_file_atomically(json_out, io::json_file_text(j));
  return 0;
}

}  // namespace sparsim::app
