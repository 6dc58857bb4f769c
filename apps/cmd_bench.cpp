// sparsim bench: prefill and decode throughput, decode against the memory-bandwidth ideal, and
// with --method the decode of an activation-sparsity method against dense in the same run.
#include "bench_decode.hpp"
#include "bench_evict.hpp"
#include "bench_kv_prune.hpp"
#include "common.hpp"
#include "core/blas_core.hpp"
#include "core/interrupt.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "flops/ledger.hpp"
#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "kernels/bandwidth.hpp"
#include "kernels/host_gemv.hpp"
#include "method_stack.hpp"
#include "model/loader.hpp"
#include "pruning/kv_prune.hpp"
#include "pruning/low_rank.hpp"
#include "records.hpp"

#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <limits>

namespace sparsim::app {

namespace {

bool is_projection(flops::Op o) {
  return o >= flops::Op::QProj && o <= flops::Op::DownProj;
}

/// `batch` sequences of the prompt `toks` (sequence b's tokens shifted by b), as the engine
/// takes them.
std::vector<std::vector<int>> batch_of(const std::vector<int>& toks, int batch, int vocab) {
  std::vector<std::vector<int>> seqs(static_cast<std::size_t>(batch), toks);
  for (int b = 1; b < batch; ++b)
    for (int& t : seqs[static_cast<std::size_t>(b)]) t = (t + 101 * b) % vocab;
  return seqs;
}

/// Prefill of `batch` sequences of the prompt, then `decode` single-token steps of all of them;
/// returns (prefill seconds, median step).
template <class E>
std::pair<double, double> timed_run(Engine<E>& eng, const std::vector<int>& toks, int decode,
                                    int vocab, Clock clock, int batch = 1) {
  const DecodeTiming t = timed_decode(eng, batch_of(toks, batch, vocab), decode, vocab, {clock});
  return {t.prefill, t.step};
}

/// Per-op times of one profiled prefill and of the decode steps after it.
struct ProfiledRun {
  std::array<double, flops::kNumOps> prefill{}, decode{};
  int decode_steps = 0;  ///< decode steps profiled (the first one warms up after the prefill)
};

/// One prefill of `batch` sequences, then the decode steps of timed_run (the same sequences and
/// tokens), all profiled (per-op times, fences after every kernel) except the first decode step,
/// and recorded in `ledger` (nullptr: none).
template <class E>
ProfiledRun profiled_run(Engine<E>& eng, const std::vector<int>& toks, int decode, int vocab,
                         flops::Ledger* ledger, Clock clock, int batch = 1) {
  ProfiledRun r;
  eng.set_profile_clock(clock);
  const int prompt = static_cast<int>(toks.size());
  const auto seqs = batch_of(toks, batch, vocab);
  eng.clear_op_seconds();
  eng.set_ledger(ledger);
  eng.set_profile(true);
  eng.forward(seqs, 0, false);
  r.prefill = eng.op_seconds();
  eng.set_profile(false);
  eng.set_ledger(nullptr);
  eng.clear_op_seconds();
  std::vector<std::vector<int>> next(static_cast<std::size_t>(batch));
  for (int b = 0; b < batch; ++b) next[static_cast<std::size_t>(b)] = {seqs[b].back()};
  const int first = std::min(1, decode - 1);
  for (int s = 0; s < decode; ++s) {
    if (s == first) {
      eng.set_ledger(ledger);
      eng.set_profile(true);
    }
    eng.forward(next, prompt + s, false);
    for (auto& n : next) n[0] = (n[0] * 31 + 7) % vocab;
  }
  r.decode = eng.op_seconds();
  r.decode_steps = decode - first;
  eng.set_profile(false);
  eng.set_ledger(nullptr);
  return r;
}

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
  if (!kvr.empty()) {
    constexpr double MiB = 1024.0 * 1024.0;
    std::cout << fmt::format(
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
    if (!kvr.empty())
      j["kv_bytes"] = {{"held_final", kvr.held_final},
                       {"dense_final", kvr.dense_final},
                       {"held_peak", kvr.held_peak},
                       {"dense_peak", kvr.dense_peak},
                       {"allocated_peak", kvr.allocated_peak},
                       {"allocated_final", kvr.allocated_final},
                       {"dense_allocated", dense_alloc},
                       {"held_vs_dense_final", kvr.held_final / kvr.dense_final},
                       {"allocated_peak_vs_dense", kvr.allocated_peak / dense_alloc}};
    nlohmann::json fl = nlohmann::json::object();
    for (int o = 0; o < flops::kNumOps; ++o) {
      const auto t = ledger.by_op(static_cast<flops::Op>(o), flops::Phase::Decode);
      if (t.launches > 0)
        fl[flops::to_string(static_cast<flops::Op>(o))] = {{"flops_dense", t.flops_dense},
                                                           {"flops_realised", t.flops_realised},
                                                           {"bytes_dense", t.bytes_dense},
                                                           {"bytes_realised", t.bytes_realised}};
    }
    j["decode_ledger_last_rep"] = fl;
    io::write_file_atomically(json_out, io::json_file_text(j));
  }
  return 0;
}

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

}  // namespace

int cmd_bench(int argc, char** argv) {
  CommonOptions co;
  std::string model, storage, json_out, run_out, skipping = "on", decode_path = "fused",
                                                 clock_name = "wall", baseline;
  int prompt = 512, decode = 128, reps = 3, batch = 1;
  bool profile = false, bf16_compute = false, graph = false, decode_only = false,
       kv_synthetic = false;
  MethodArgs ma;
  po::options_description d("sparsim bench options");
  add_model_option(d, model);
  d.add_options()("prompt", po::value(&prompt)->default_value(512), "prefill length in tokens")(
      "decode", po::value(&decode)->default_value(128), "decode steps after the prefill")(
      "reps", po::value(&reps)->default_value(3), "repetitions (medians are reported)")(
      "storage", po::value(&storage)->default_value("f32"), "weight storage: f32, bf16 or f16")(
      "bf16-compute", po::bool_switch(&bf16_compute), kBf16ComputeHelp)(
      "json", po::value(&json_out), "write the figures as JSON to this file")(
      "out,o", po::value(&run_out),
      "run file (HDF5) of the engine under test (the method's with --method, else dense): the "
      "FLOP ledger of one profiled prefill and the profiled decode steps, their per-op times "
      "(/op_times) and the medians of the timed runs, for sparsim predict to set against")(
      "batch", po::value(&batch)->default_value(1),
      "sequences decoded together (each prefilled with the prompt); tokens/s count all of "
      "them; dense, token-filter, think and grace benchmarks (activation-sparsity methods decode "
      "one)")(
      "decode-path", po::value(&decode_path)->default_value("fused"),
      "devices: fused (five kernels per block for single-token steps) or ops (one kernel per "
      "op); host backends always run op by op")(
      "graph", po::bool_switch(&graph),
      "CUDA: replay each dense decode step as a captured CUDA graph")(
      "profile", po::bool_switch(&profile),
      "after the timed runs, one profiled prefill + decode: time per op (fences after each "
      "kernel)")("baseline", po::value(&baseline),
                 "time the attention module (q, k, v, o projections, RoPE, cache store, "
                 "attention) of --model against this model in the same run, repetitions "
                 "interleaved, e.g. a pruned model against the dense one it came from; both are "
                 "loaded afresh in swapped order for the second half of the repetitions; replaces "
                 "the throughput runs")(
      "decode-only", po::bool_switch(&decode_only),
      "with --baseline: time only the decode steps, at positions --prompt onwards, over a cache "
      "that was never filled (the same work as after a prefill; for long prompts at large "
      "batches, whose prefill would dominate the run)");
  d.add_options()("clock", po::value(&clock_name)->default_value("wall"),
                  "what timings measure: wall (elapsed time) or cpu (the process's CPU time: with "
                  "--threads 1, the work's own time on a machine shared with other jobs)");
  ma.add_options(d);
  d.add_options()("column-skipping", po::value(&skipping)->default_value("on"),
                  "sparse methods: decode masked projections with the column-skipping sparse GEMV "
                  "(on) or feed the masked inputs to the dense kernels (off)");
  d.add_options()("kv-synthetic-cache", po::bool_switch(&kv_synthetic),
                  "think / grace: time decode attention on caches of the model's shape filled "
                  "with random keys and values instead of running the model (for contexts whose "
                  "prefill is too slow to run)");
  add_common_options(d, co);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: sparsim bench [--model M] [--method teal --calibration C] [options]", d, vm))
    return 0;
  require(prompt >= 1 && decode >= 1 && reps >= 1, "--prompt, --decode and --reps must be >= 1");
  require(clock_name == "wall" || clock_name == "cpu", "--clock must be wall or cpu, got '{}'",
          clock_name);
  const Clock clock = clock_name == "cpu" ? Clock::ProcessCpu : Clock::Wall;
  require(run_out.empty() || run_out != json_out, "--out and --json name the same file '{}'",
          run_out);
  require(batch >= 1 && batch <= 1024, "--batch must be in 1 … 1024, got {}", batch);
  require(run_out.empty() || batch == 1,
          "--out: the run file's profiled calls decode one sequence; leave --batch at 1");
  require(decode_path == "fused" || decode_path == "ops",
          "--decode-path must be fused or ops, got '{}'", decode_path);
  ma.resolve(&vm);
  require(batch == 1 || ma.token_filter || !ma.sparse(),
          "--batch: activation-sparsity methods decode one sequence; leave --batch at 1");
  require(run_out.empty() || !ma.token_filter,
          "--out: not written for --method token-filter (its --json has the figures)");
  require(baseline.empty() || !ma.sparse(), "--baseline and --method cannot be combined");
  require(!decode_only || !baseline.empty(), "--decode-only needs --baseline");
  require(!ma.kv_prune || (!ma.token_filter && !ma.sparse()),
          "bench times think or grace on their own: drop the other methods from --method");
  require(baseline.empty() || !ma.kv_prune,
          "--baseline and --method think/grace cannot be combined");
  require(!kv_synthetic || ma.kv_prune, "--kv-synthetic-cache is for --method think or grace");
  require(!ma.evict() || (!ma.token_filter && !ma.sparse() && baseline.empty() && !kv_synthetic &&
                          run_out.empty()),
          "bench times --evict against dense, composed with think or grace at most: drop the "
          "other methods, --baseline, --kv-synthetic-cache and --out");
  require(run_out.empty() || baseline.empty(),
          "--out: not written for --baseline (its --json has the figures)");
  require(skipping == "on" || skipping == "off", "--column-skipping must be on or off, got '{}'",
          skipping);
  const bool sparse = ma.sparse();
  LoadOptions lo;
  lo.storage = parse_dtype(storage);
  lo.bf16_compute = bf16_compute;
  check_load_options(lo);
  const ResolvedModel rm = resolve_model(model);
  io::guard_run({{"--model", rm.path}, {"--calibration", ma.calib_path}},
                {{"--json", json_out}, {"--out", run_out}});
  Runtime rt(co);
  const std::string backend = resolve_backend(co.backend);
  const double load_start = load_average();
  return with_backend(co.backend, [&](auto exec) {
    using E = decltype(exec);
    std::unique_ptr<io::RunFile> rf;
    if (!run_out.empty()) rf = std::make_unique<io::RunFile>(run_out);
    if (!baseline.empty()) {
      const ResolvedModel rb = resolve_model(baseline);
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
          wa = load_model<E>(rm.path, lo, &ma_);
          wb = load_model<E>(rb.path, lo, &mb_);
        } else {
          wb = load_model<E>(rb.path, lo, &mb_);
          wa = load_model<E>(rm.path, lo, &ma_);
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
            attention_run(ea, batch, prompt, decode, wa->cfg.vocab, !decode_only, ta);
            attention_run(eb, batch, prompt, decode, wb->cfg.vocab, !decode_only, tb);
          } else {
            attention_run(eb, batch, prompt, decode, wb->cfg.vocab, !decode_only, tb);
            attention_run(ea, batch, prompt, decode, wa->cfg.vocab, !decode_only, ta);
          }
          loaded_first.push_back(model_first ? 0 : 1);
        }
      }
      std::vector<double> rp, rd, rpt, rdt;
      for (int r = 0; r < reps; ++r) {
        if (!decode_only) {
          rp.push_back(ta.prefill[r] / tb.prefill[r]);
          rpt.push_back(ta.prefill_total[r] / tb.prefill_total[r]);
        }
        rd.push_back(ta.decode[r] / tb.decode[r]);
        rdt.push_back(ta.decode_total[r] / tb.decode_total[r]);
      }
      if (decode_only) {  // reported as NaN / null
        for (auto* v : {&rp, &rpt, &ta.prefill, &tb.prefill})
          v->push_back(std::numeric_limits<double>::quiet_NaN());
      }
      std::cout << fmt::format(
          "attention module of {}\n  against {}, batch {}, prompt {}, {} decode steps, median of "
          "{} interleaved repetitions (profiled: fences after every kernel), backend {}, {} "
          "threads\n"
          "  prefill  {}\n"
          "  decode   {:>10.6f} s vs {:>10.6f} s per step = {:.3f} x  (whole step {:.3f} x)\n",
          ma_.path, mb_.path, batch, prompt, decode, reps, backend, rt.threads(),
          decode_only ? std::string("not run (--decode-only)")
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
            {"bf16_compute", bf16_compute},
            {"backend", backend},
            {"threads", rt.threads()},
            {"batch", batch},
            {"prompt_tokens", prompt},
            {"decode_tokens", decode},
            {"reps", reps},
            {"attention_prefill_seconds", {{"model", ta.prefill}, {"baseline", tb.prefill}}},
            {"attention_decode_step_seconds", {{"model", ta.decode}, {"baseline", tb.decode}}},
            {"forward_prefill_seconds",
             {{"model", ta.prefill_total}, {"baseline", tb.prefill_total}}},
            {"forward_decode_step_seconds",
             {{"model", ta.decode_total}, {"baseline", tb.decode_total}}},
            {"decode_only", decode_only},
            {"loaded_first", loaded_first},  // per repetition: 0 the model, 1 the baseline
            {"attention_decode_ratio_by_load_order",
             {{"model_first", med_or_nan(rd_order[0])},
              {"baseline_first", med_or_nan(rd_order[1])}}},
            {"forward_decode_ratio_by_load_order",
             {{"model_first", med_or_nan(rdt_order[0])},
              {"baseline_first", med_or_nan(rdt_order[1])}}},
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
    // Measured before the model is loaded, so its buffers do not add to the peak memory.
    constexpr bool host =
        Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename E::memory_space>::accessible;
    // STREAM-like reference: arrays of 4 x the last-level cache (host) or 1 GiB (device),
    // 11 repetitions; decode's ideal is the median copy rate, the spread is printed with it
    const kernels::StreamBandwidth sb = kernels::stream_bandwidth(
        exec, host ? kernels::host_stream_bytes() : std::size_t(1024) << 20, 11);
    // Its arrays (up to 2 GiB) are freed again; reset the kernel's peak-RSS mark so that the
    // process's peak memory (wait4, /usr/bin/time) is that of the model run (Linux ≥ 4.0).
    if (host) std::ofstream("/proc/self/clear_refs") << "5";
    // decode's ideal: the faster of the copy kernel and the runtime's own copy
    const double bw = sb.reference();
    const nlohmann::json bw_json = {
        {"array_bytes", sb.array_bytes},
        {"reps", sb.reps},
        {"copy_median", sb.copy.median},
        {"copy_min", sb.copy.min},
        {"copy_max", sb.copy.max},
        {"read_median", sb.read.median},
        {"read_min", sb.read.min},
        {"read_max", sb.read.max},
        {"runtime_copy_median", sb.runtime_copy.median},
        {"runtime_copy_min", sb.runtime_copy.min},
        {"runtime_copy_max", sb.runtime_copy.max},
        {"copy_kernel_fraction_of_runtime_copy",
         sb.runtime_copy.median > 0 ? sb.copy.median / sb.runtime_copy.median : 0.0},
        {"reference", bw}};
    ModelInfo mi;
    std::shared_ptr<const Weights<E>> w = load_model<E>(rm.path, lo, &mi);
    const Config& c = w->cfg;
    // (a synthetic K cache decodes one position after the prompt)
    const int needed = prompt + (kv_synthetic ? 1 : decode);
    require(needed <= c.context_length,
            "--prompt + --decode = {} exceeds the model's context of {}", needed, c.context_length);
    // The method's model: the dense one, or its WINA rotation for rotated plans.
    std::shared_ptr<const Weights<E>> ws = w;
    const sparsity::Plan plan = prepare_method(ma, mi, ws, lo.storage);
    if (ma.evict())
      return bench_evict(exec, ma, w, mi, prompt, decode, reps, batch, clock, backend, rt.threads(),
                         json_out);
    if (ma.kv_prune)
      return bench_kv_prune(exec, ma, w, mi, prompt, decode, reps, batch, kv_synthetic, storage,
                            backend, rt.threads(), json_out);
    if (ma.token_filter)
      return bench_token_filter(exec, ma, plan, w, ws, mi, prompt, decode, reps, batch,
                                skipping == "on", storage, backend, rt.threads(), bw, json_out);
    Engine<E> eng(w, batch, prompt + decode, nullptr, exec);
    eng.set_fused_decode(decode_path == "fused");
    eng.set_graph(graph);
    std::unique_ptr<Engine<E>> se;
    sparsity::ActivationMasker<E> masker(c.n_layer);
    if (sparse) {
      require(batch == 1, "--method decodes one sequence: leave --batch at 1");
      se = std::make_unique<Engine<E>>(ws, 1, prompt + decode, nullptr, exec);
      attach_masker(*se, masker, plan);
      if (skipping == "on") se->use_column_skipping(true);
    }
    std::vector<int> toks(prompt);
    for (int i = 0; i < prompt; ++i) toks[i] = (i * 7919 + 13) % c.vocab;
    // Probe Pruning: its own engine of the same batch, timed alternately with the dense one
    std::unique_ptr<Engine<E>> pe;
    std::unique_ptr<pruning::ProbePruner<E>> ppr;
    if (ma.probe_pruning) {
      pe = std::make_unique<Engine<E>>(w, batch, prompt + decode, nullptr, exec);
      ppr = make_probe_pruner(ma, *pe);
    }
    std::vector<double> tp_pre, tp_dec, tp_probe;
    // Dense and sparse alternate within each repetition, so that load changes on a shared
    // machine hit both alike.
    std::vector<double> t_pre, t_dec, ts_pre, ts_dec;
    for (int r = 0; r < reps; ++r) {
      const auto [pre, dec] = timed_run(eng, toks, decode, c.vocab, clock, batch);
      t_pre.push_back(pre);
      t_dec.push_back(dec);
      if (pe) {
        const double before = ppr->select_seconds();
        const auto [ppre, pdec] = timed_run(*pe, toks, decode, c.vocab, clock, batch);
        tp_pre.push_back(ppre);
        tp_dec.push_back(pdec);
        tp_probe.push_back(ppr->select_seconds() - before);  // the prefill's selection
      }
      if (se) {
        const auto [spre, sdec] = timed_run(*se, toks, decode, c.vocab, clock);
        ts_pre.push_back(spre);
        ts_dec.push_back(sdec);
      }
    }
    // Bytes one decode step must read: every projection, the head and the norms.
    double wbytes = static_cast<double>(w->output.bytes()) + 4.0 * c.d_model * (2 * c.n_layer + 1);
    for (const auto& l : w->layers)
      for (const auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        wbytes += static_cast<double>(m->bytes());
    const double pre_tps = static_cast<double>(prompt) * batch / median_of(t_pre);
    const double dec_tps = static_cast<double>(batch) / median_of(t_dec);
    // every step reads the weights once, whatever the batch
    const double ideal_tps = bw / wbytes * batch;
    std::cout << fmt::format(
        "model {} ({} params, {} storage), backend {}, {} threads, batch {}, decode path {}{}\n"
        "prefill  {:>9.1f} tokens/s  ({} tokens, median of {})\n"
        "decode   {:>9.1f} tokens/s  (median step of {} after the prompt{})\n"
        "bandwidth {:>8.2f} GB/s reference (copy kernel {:.2f}, min {:.2f}, max {:.2f} over {} "
        "runs of {} MiB; read {:.2f} GB/s; runtime copy {:.2f} GB/s)\n"
        "decode reads {:.1f} MB a step; ideal {:.1f} tokens/s; decode / ideal = {:.3f}\n"
        "host kernels: decode GEMV {}, OpenBLAS core {}\n",
        mi.path, c.n_params(), storage, backend, rt.threads(), batch, decode_path,
        eng.graph() ? ", graphs" : (graph ? ", graphs off (capture failed)" : ""), pre_tps,
        batch > 1 ? fmt::format("{} x {}", batch, prompt) : std::to_string(prompt), reps, dec_tps,
        decode, batch > 1 ? fmt::format(", {} tokens a step", batch) : std::string(), bw / 1e9,
        sb.copy.median / 1e9, sb.copy.min / 1e9, sb.copy.max / 1e9, sb.reps, sb.array_bytes >> 20,
        sb.read.median / 1e9, sb.runtime_copy.median / 1e9, wbytes / 1e6, ideal_tps,
        dec_tps / ideal_tps, host::gemv_isa(), *blas_core_name() ? blas_core_name() : "n/a");
    if (const std::string note = blas_core_note(); !note.empty()) std::cout << note << "\n";
    if (pe)
      std::cout << fmt::format(
          "probe-pruning (ratio {}, probe {}): prefill {:.1f} tokens/s, decode {:.1f} tokens/s; "
          "mask selection {:.4f} s a prefill = {:.3f} of the pruned prefill (medians of {})\n",
          ma.pp.ratio, ma.pp.probe, static_cast<double>(prompt) * batch / median_of(tp_pre),
          static_cast<double>(batch) / median_of(tp_dec), median_of(tp_probe),
          median_of(tp_probe) / median_of(tp_pre), reps);

    nlohmann::json prof, mj;
    auto op_json = [](const std::array<double, flops::kNumOps>& sec) {
      nlohmann::json o = nlohmann::json::object();
      for (int i = 0; i < flops::kNumOps; ++i)
        if (sec[i] > 0) o[flops::to_string(static_cast<flops::Op>(i))] = sec[i];
      return o;
    };
    auto breakdown = [&](const std::string& what, const std::array<double, flops::kNumOps>& sec) {
      double tot = 0;
      for (double v : sec) tot += v;
      // (a method's engine decodes one sequence: --method requires --batch 1)
      std::cout << fmt::format("\n{} time by op (profiled run{})\n", what,
                               batch > 1 ? fmt::format(", batch {}", batch) : std::string());
      for (int o = 0; o < flops::kNumOps; ++o) {
        if (sec[o] <= 0) continue;
        std::cout << fmt::format("  {:<14} {:>9.4f} s {:>6.1f}%\n",
                                 flops::to_string(static_cast<flops::Op>(o)), sec[o],
                                 100 * sec[o] / tot);
      }
      prof[what] = op_json(sec);
    };
    // The profiled runs: dense when --profile asks for its breakdown, when the method needs it
    // as a baseline, or when it is the engine the run file describes.
    flops::Ledger ledger(c.n_layer);
    ProfiledRun pd, ps;
    if (profile || sparse || rf) {
      pd = profiled_run(eng, toks, decode, c.vocab, sparse ? nullptr : &ledger, clock, batch);
      if (profile) {
        breakdown("prefill", pd.prefill);
        breakdown("decode", pd.decode);
      }
    }
    if (sparse) {
      masker.reset_stats();
      ps = profiled_run(*se, toks, decode, c.vocab, &ledger, clock);
      const std::string mname = sparsity::method_name(plan.opt.method);
      if (profile) breakdown("decode (" + mname + ")", ps.decode);
      // Realised FLOP fraction of every projection over the profiled decode (the same prompt
      // and steps as the timed runs).
      const auto& td = pd.decode;
      const auto& tsp = ps.decode;
      double t_dense = 0, t_dense_proj = 0, t_proj_scaled = 0, fl_dense = 0, fl_real = 0,
             proj_bytes = 0;
      const double nsteps = std::max(1, ps.decode_steps);
      nlohmann::json projections = nlohmann::json::object();
      for (int o = 0; o < flops::kNumOps; ++o) {
        const auto op = static_cast<flops::Op>(o);
        t_dense += td[o];
        if (!is_projection(op)) continue;
        const auto tot = ledger.by_op(op, flops::Phase::Decode);
        const double f = tot.flops_dense > 0 ? tot.flops_realised / tot.flops_dense : 1.0;
        // per projection: the kept FLOP fraction against the profiled time ratio
        projections[flops::to_string(op)] = {
            {"kept_fraction", f},
            {"dense_seconds", td[o]},
            {"method_seconds", tsp[o]},
            {"flops_dense_per_step", tot.flops_dense / nsteps},
            {"bytes_dense_per_step", tot.bytes_dense / nsteps},
            {"bytes_realised_per_step", tot.bytes_realised / nsteps}};
        t_dense_proj += td[o];
        t_proj_scaled += td[o] * f;
        fl_dense += tot.flops_dense;
        fl_real += tot.flops_realised;
        proj_bytes += tot.bytes_dense;
      }
      // The online re-rotation of a rotated model, streamed at the dense projections' rate.
      const double rot_bytes =
          ledger.by_op(flops::Op::Rotation, flops::Phase::Decode).bytes_realised;
      const double t_rot_ideal = proj_bytes > 0 ? t_dense_proj * rot_bytes / proj_bytes : 0.0;
      const double s_real = fl_dense > 0 ? 1.0 - fl_real / fl_dense : 0.0;
      const double ideal_proj = 1.0 / std::max(1e-9, 1.0 - s_real);
      const double ideal_step =
          t_dense / std::max(1e-12, t_dense - t_dense_proj + t_proj_scaled + t_rot_ideal);
      double t_sparse = 0;
      for (double v : tsp) t_sparse += v;
      const double share_mask = tsp[static_cast<int>(flops::Op::MaskSelect)] / t_sparse;
      const double share_rot = tsp[static_cast<int>(flops::Op::Rotation)] / t_sparse;
      // what one decode step reads and computes, dense against the method (rotation included)
      const flops::Ledger::Totals step = ledger.total(flops::Phase::Decode);
      const flops::Ledger::Totals rot_t = ledger.by_op(flops::Op::Rotation, flops::Phase::Decode);
      const double s_pre_tps = prompt / median_of(ts_pre);
      const double s_dec_tps = 1.0 / median_of(ts_dec);
      std::vector<double> step_ratio;
      for (int r = 0; r < reps; ++r) step_ratio.push_back(t_dec[r] / ts_dec[r]);
      std::cout << fmt::format(
          "\n{} at target sparsity {:.2f} ({} model, column skipping {}), same prompt and "
          "steps\n"
          "prefill  {:>9.1f} tokens/s  (dense prefill: the method sparsifies decode rows only)\n"
          "decode   {:>9.1f} tokens/s  = {:.3f} x dense (median of the per-repetition ratios "
          "{:.3f})\n"
          "realised sparsity of the projections (FLOP-weighted) {:.3f}\n"
          "ideal decode speedup: {:.3f} for the projections alone (1 / (1 - s_realised)), "
          "{:.3f} for the whole step\n"
          "  (dense profile: projections {:.1f}% of the decode time; rest unchanged{})\n"
          "decode time share (profiled {} run): mask selection {:.1f}%, rotation {:.1f}%\n",
          mname, plan.opt.sparsity, plan.rotated ? "rotated" : "plain", skipping, s_pre_tps,
          s_dec_tps, s_dec_tps / dec_tps, median_of(step_ratio), s_real, ideal_proj, ideal_step,
          100 * t_dense_proj / t_dense,
          plan.rotated ? fmt::format(", rotation +{:.1f}%", 100 * t_rot_ideal / t_dense) : "",
          mname, 100 * share_mask, 100 * share_rot);
      std::cout << fmt::format(
          "per decode step: {:.1f} MB read of {:.1f} MB dense ({:.3f} x), {:.1f} MFLOP of {:.1f} "
          "({:.3f} x){}\n",
          step.bytes_realised / nsteps / 1e6, step.bytes_dense / nsteps / 1e6,
          step.bytes_realised / step.bytes_dense, step.flops_realised / nsteps / 1e6,
          step.flops_dense / nsteps / 1e6, step.flops_realised / step.flops_dense,
          plan.rotated
              ? fmt::format("; the online re-rotation ({}) adds {:.1f} MB and {:.1f} MFLOP",
                            to_string(plan.opt.rotation_storage),
                            rot_t.bytes_realised / nsteps / 1e6,
                            rot_t.flops_realised / nsteps / 1e6)
              : "");
      mj = {{"method", mname},
            {"sparsity_target", plan.opt.sparsity},
            {"calibration", ma.calib_path},
            {"rotated", plan.rotated},
            {"column_skipping", skipping == "on"},
            {"prefill_tokens_per_s", s_pre_tps},
            {"decode_tokens_per_s", s_dec_tps},
            {"decode_speedup", s_dec_tps / dec_tps},
            {"decode_speedup_median_of_reps", median_of(step_ratio)},
            {"decode_step_seconds_reps", ts_dec},
            {"realised_projection_sparsity", s_real},
            {"ideal_speedup_projections", ideal_proj},
            {"ideal_speedup_decode_step", ideal_step},
            {"dense_projection_time_share", t_dense_proj / t_dense},
            {"rotation_ideal_time_share", t_rot_ideal / t_dense},
            {"mask_select_time_share", share_mask},
            {"rotation_time_share", share_rot},
            {"rotation_storage", to_string(plan.opt.rotation_storage)},
            {"profiled_decode_steps", ps.decode_steps},
            {"per_step",
             {{"bytes_dense", step.bytes_dense / nsteps},
              {"bytes_realised", step.bytes_realised / nsteps},
              {"bytes_rotation", rot_t.bytes_realised / nsteps},
              {"flops_dense", step.flops_dense / nsteps},
              {"flops_realised", step.flops_realised / nsteps},
              {"flops_rotation", rot_t.flops_realised / nsteps}}},
            {"profile_decode_seconds", {{"dense", op_json(td)}, {"method", op_json(tsp)}}},
            {"projections", projections}};
    }
    if (rf) {
      // The engine under test: its ledger (one prefill, the profiled decode steps), per-op times
      // and the medians of its timed calls.
      const ProfiledRun& pr = sparse ? ps : pd;
      const std::vector<double>& tp = sparse ? ts_pre : t_pre;
      const std::vector<double>& tdec = sparse ? ts_dec : t_dec;
      io::Group root = rf->root();
      write_run_header(root, argc, argv, backend, rt.threads(), mi, c, lo.storage, lo.bf16_compute);
      io::Group cfg = root.create_group("config");
      cfg.set_attr("method",
                   sparse ? std::string(sparsity::method_name(plan.opt.method)) : "dense");
      cfg.set_attr("sparsity_target", sparse ? plan.opt.sparsity : 0.0);
      cfg.set_attr("calibration", ma.calib_path);
      cfg.set_attr("column_skipping", sparse && skipping == "on" ? 1 : 0);
      cfg.set_attr("prompt", prompt);
      cfg.set_attr("decode", decode);
      cfg.set_attr("reps", reps);
      io::Group pg = root.create_group("op_times");
      pg.set_attr("load_average_start", load_start);
      pg.set_attr("clock", clock_name);
      pg.set_attr("load_average_end", load_average());
      std::vector<std::string> ops, timers;
      std::vector<double> secs;
      for (int o = 0; o < flops::kNumOps; ++o) {
        ops.emplace_back(flops::to_string(static_cast<flops::Op>(o)));
        timers.emplace_back(flops::to_string(profile_timer(static_cast<flops::Op>(o))));
      }
      secs.insert(secs.end(), pr.prefill.begin(), pr.prefill.end());
      secs.insert(secs.end(), pr.decode.begin(), pr.decode.end());
      pg.write_strings("phases", {"prefill", "decode"}, {"", "first index of op_seconds"});
      pg.write_strings("ops", ops, {"", "second index of op_seconds"});
      pg.write<double>("op_seconds", secs.data(), {2, static_cast<hsize_t>(flops::kNumOps)},
                       {"s",
                        "wall time per op over the profiled calls (a fence after every "
                        "kernel), [phase][op]"});
      pg.write_strings("timer", timers,
                       {"",
                        "for each op, the op whose timer measured it (one kernel computes "
                        "several ledger ops)"});
      pg.write<std::int64_t>("calls", {1, pr.decode_steps},
                             {"1", "profiled forward calls per phase (the ledger's calls)"});
      pg.write<std::int64_t>("tokens", {prompt, pr.decode_steps},
                             {"token", "token rows of the profiled calls per phase"});
      pg.write<double>("call_seconds_median", {median_of(tp), median_of(tdec)},
                       {"s",
                        "median over the repetitions of the unprofiled calls: the prompt's "
                        "prefill, one decode step (itself the median of its run's steps)"});
      pg.write<std::int64_t>("call_tokens", {prompt, 1}, {"token", "token rows of one timed call"});
      pg.write<double>("prefill_seconds", tp, {"s", "unprofiled prefill of each repetition"});
      pg.write<double>("decode_step_seconds", tdec,
                       {"s", "median unprofiled decode step of each repetition"});
      io::Group fl = root.create_group("flops");
      ledger.write(fl);
      rf->commit();
      std::cout << fmt::format("\nwrote {} (ledger, per-op times, timings)\n", run_out);
    }
    if (!json_out.empty()) {
      nlohmann::json j = {
          {"model", {{"path", mi.path}, {"fingerprint", mi.fingerprint}}},
          {"storage", storage},
          {"bf16_compute", bf16_compute},
          {"backend", backend},
          {"threads", rt.threads()},
          {"prompt_tokens", prompt},
          {"batch", batch},
          {"decode_path", decode_path},
          {"graph", eng.graph()},
          {"decode_tokens", decode},
          {"reps", reps},
          {"clock", clock_name},
          {"prefill_tokens_per_s", pre_tps},
          {"decode_tokens_per_s", dec_tps},
          {"decode_step_seconds_reps", t_dec},
          {"copy_bandwidth_bytes_per_s", bw},
          {"bandwidth", bw_json},
          {"decode_weight_bytes_per_token", wbytes},  // per step (all `batch` tokens); kept name
          {"decode_weight_bytes_per_step", wbytes},
          {"decode_ideal_tokens_per_s", ideal_tps},
          {"decode_fraction_of_ideal", dec_tps / ideal_tps},
          {"load_average_start", load_start},
          {"load_average_end", load_average()},
          {"host_kernels", {{"gemv_isa", host::gemv_isa()}, {"blas_core", blas_core_name()}}}};
      if (profile) j["profile_seconds"] = prof;
      if (profile && !sparse) {
        // what the profiled calls computed (the dense engine's ledger): all `batch` sequences
        const auto pre = ledger.total(flops::Phase::Prefill);
        const auto dec = ledger.total(flops::Phase::Decode);
        j["profile_work"] = {{"batch", batch},
                             {"decode_steps", pd.decode_steps},
                             {"prefill_flops", pre.flops_dense},
                             {"decode_flops", dec.flops_dense},
                             {"decode_bytes", dec.bytes_dense}};
      }
      if (sparse) j["sparse"] = mj;
      if (pe) {
        nlohmann::json pj = probe_pruning_json(*ppr);
        pj.erase("batches");
        pj["prefill_tokens_per_s"] = static_cast<double>(prompt) * batch / median_of(tp_pre);
        pj["decode_tokens_per_s"] = static_cast<double>(batch) / median_of(tp_dec);
        pj["probe_seconds_per_prefill"] = median_of(tp_probe);
        pj["probe_share_of_prefill"] = median_of(tp_probe) / median_of(tp_pre);
        j["probe_pruning"] = pj;
      }
      interruption_point("write");
      io::write_file_atomically(json_out, io::json_file_text(j));
    }
    return 0;
  });
}

}  // namespace sparsim::app
