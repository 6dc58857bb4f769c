#pragma once
// sparsim bench without a method, or with an activation-sparsity method or Probe Pruning:
// prefill and decode throughput of the dense model, decode against the memory-bandwidth ideal,
// and the method's engine against dense in the same run (repetitions interleaved); optionally
// a per-op profile (--profile) and a run file of the engine under test (--out).
#include "bench_args.hpp"
#include "bench_decode.hpp"
#include "core/blas_core.hpp"
#include "core/interrupt.hpp"
#include "engine/engine.hpp"
#include "flops/ledger.hpp"
#include "io/run_file.hpp"
#include "kernels/bandwidth.hpp"
#include "kernels/host_gemv.hpp"
#include "method_stack.hpp"
#include "records.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <iostream>
#include <memory>
#include <vector>

namespace sparsim::app {

namespace throughput {

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

/// Per-op seconds of a profile as a JSON object (ops with time only).
inline nlohmann::json op_json(const std::array<double, flops::kNumOps>& sec) {
  nlohmann::json o = nlohmann::json::object();
  for (int i = 0; i < flops::kNumOps; ++i)
    if (sec[i] > 0) o[flops::to_string(static_cast<flops::Op>(i))] = sec[i];
  return o;
}

/// The method's decode against dense: the realised FLOP fraction of every projection over the
/// profiled decode (the same prompt and steps as the timed runs), the ideal speedups, the time
/// shares of mask selection and rotation, the bytes and FLOPs a step; printed, and returned as
/// the `sparse` object of the JSON summary.
inline nlohmann::json sparse_decode_report(const BenchArgs& a, const sparsity::Plan& plan,
                                           const flops::Ledger& ledger, const ProfiledRun& pd,
                                           const ProfiledRun& ps, const std::vector<double>& t_dec,
                                           const std::vector<double>& ts_pre,
                                           const std::vector<double>& ts_dec, double dec_tps) {
  const int prompt = a.prompt, reps = a.reps;
  const std::string& skipping = a.skipping;
  const MethodArgs& ma = a.ma;
  const std::string mname = sparsity::method_name(plan.opt.method);
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
    projections[flops::to_string(op)] = {{"kept_fraction", f},
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
  const double rot_bytes = ledger.by_op(flops::Op::Rotation, flops::Phase::Decode).bytes_realised;
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
      mname, plan.opt.sparsity, plan.rotated ? "rotated" : "plain", skipping, s_pre_tps, s_dec_tps,
      s_dec_tps / dec_tps, median_of(step_ratio), s_real, ideal_proj, ideal_step,
      100 * t_dense_proj / t_dense,
      plan.rotated ? fmt::format(", rotation +{:.1f}%", 100 * t_rot_ideal / t_dense) : "", mname,
      100 * share_mask, 100 * share_rot);
  std::cout << fmt::format(
      "per decode step: {:.1f} MB read of {:.1f} MB dense ({:.3f} x), {:.1f} MFLOP of {:.1f} "
      "({:.3f} x){}\n",
      step.bytes_realised / nsteps / 1e6, step.bytes_dense / nsteps / 1e6,
      step.bytes_realised / step.bytes_dense, step.flops_realised / nsteps / 1e6,
      step.flops_dense / nsteps / 1e6, step.flops_realised / step.flops_dense,
      plan.rotated
          ? fmt::format("; the online re-rotation ({}) adds {:.1f} MB and {:.1f} MFLOP",
                        to_string(plan.opt.rotation_storage), rot_t.bytes_realised / nsteps / 1e6,
                        rot_t.flops_realised / nsteps / 1e6)
          : "");
  return {{"method", mname},
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

/// The run file of the engine under test: its ledger (one prefill, the profiled decode steps),
/// per-op times and the medians of its timed calls (`tp`: prefills, `tdec`: decode steps).
inline void write_throughput_run_file(io::RunFile& rf, const BenchArgs& a, const BenchRun& run,
                                      const ModelInfo& mi, const Config& c,
                                      const sparsity::Plan& plan, const ProfiledRun& pr,
                                      const std::vector<double>& tp,
                                      const std::vector<double>& tdec,
                                      const flops::Ledger& ledger) {
  const bool sparse = a.ma.sparse();
  const int prompt = a.prompt, decode = a.decode, reps = a.reps;
  const MethodArgs& ma = a.ma;
  const std::string &skipping = a.skipping, &clock_name = a.clock_name, &run_out = a.run_out;
  const double load_start = run.load_start;
  io::Group root = rf.root();
  write_run_header(root, run.argc, run.argv, run.backend, run.threads, mi, c, run.load.storage,
                   run.load.bf16_compute);
  io::Group cfg = root.create_group("config");
  cfg.set_attr("method", sparse ? std::string(sparsity::method_name(plan.opt.method)) : "dense");
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
  rf.commit();
  std::cout << fmt::format("\nwrote {} (ledger, per-op times, timings)\n", run_out);
}

/// The timed repetitions of a throughput run and the rates they give.
struct ThroughputTimes {
  std::vector<double> pre, dec;                  ///< dense prefill and decode step, per repetition
  std::vector<double> sparse_pre, sparse_dec;    ///< the method's (--method)
  std::vector<double> pp_pre, pp_dec, pp_probe;  ///< Probe Pruning's, and its selection
  double wbytes = 0;  ///< bytes one decode step must read: every projection, the head, the norms
  double pre_tps = 0, dec_tps = 0, ideal_tps = 0;

  template <class E>
  void finish(const Weights<E>& w, int prompt, int batch, double bw) {
    const Config& c = w.cfg;
    wbytes = static_cast<double>(w.output.bytes()) + 4.0 * c.d_model * (2 * c.n_layer + 1);
    for (const auto& l : w.layers)
      for (const auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        wbytes += static_cast<double>(m->bytes());
    pre_tps = static_cast<double>(prompt) * batch / median_of(pre);
    dec_tps = static_cast<double>(batch) / median_of(dec);
    // every step reads the weights once, whatever the batch
    ideal_tps = bw / wbytes * batch;
  }
};

/// The lines on stdout before the profiles; `graph`: whether the engine runs graphs.
inline std::string throughput_text(const BenchArgs& a, const BenchRun& run, const ModelInfo& mi,
                                   const Config& c, const ThroughputTimes& tt,
                                   const kernels::StreamBandwidth& sb, bool graph) {
  const int prompt = a.prompt, decode = a.decode, batch = a.batch;
  std::string s = fmt::format(
      "model {} ({} params, {} storage), backend {}, {} threads, batch {}, decode path {}{}\n"
      "prefill  {:>9.1f} tokens/s  ({} tokens, median of {})\n"
      "decode   {:>9.1f} tokens/s  (median step of {} after the prompt{})\n"
      "bandwidth {:>8.2f} GB/s reference (copy kernel {:.2f}, min {:.2f}, max {:.2f} over {} "
      "runs of {} MiB; read {:.2f} GB/s; runtime copy {:.2f} GB/s)\n"
      "decode reads {:.1f} MB a step; ideal {:.1f} tokens/s; decode / ideal = {:.3f}\n"
      "host kernels: decode GEMV {}, OpenBLAS core {}\n",
      mi.path, c.n_params(), a.storage, run.backend, run.threads, batch, a.decode_path,
      graph ? ", graphs" : (a.graph ? ", graphs off (capture failed)" : ""), tt.pre_tps,
      batch > 1 ? fmt::format("{} x {}", batch, prompt) : std::to_string(prompt), a.reps,
      tt.dec_tps, decode, batch > 1 ? fmt::format(", {} tokens a step", batch) : std::string(),
      sb.reference() / 1e9, sb.copy.median / 1e9, sb.copy.min / 1e9, sb.copy.max / 1e9, sb.reps,
      sb.array_bytes >> 20, sb.read.median / 1e9, sb.runtime_copy.median / 1e9, tt.wbytes / 1e6,
      tt.ideal_tps, tt.dec_tps / tt.ideal_tps, host::gemv_isa(),
      *blas_core_name() ? blas_core_name() : "n/a");
  if (const std::string note = blas_core_note(); !note.empty()) s += note + "\n";
  if (a.ma.probe_pruning)
    s += fmt::format(
        "probe-pruning (ratio {}, probe {}): prefill {:.1f} tokens/s, decode {:.1f} tokens/s; "
        "mask selection {:.4f} s a prefill = {:.3f} of the pruned prefill (medians of {})\n",
        a.ma.pp.ratio, a.ma.pp.probe, static_cast<double>(prompt) * batch / median_of(tt.pp_pre),
        static_cast<double>(batch) / median_of(tt.pp_dec), median_of(tt.pp_probe),
        median_of(tt.pp_probe) / median_of(tt.pp_pre), a.reps);

  return s;
}

/// The JSON summary's common part; `graph`: whether the engine runs graphs.
inline nlohmann::json throughput_json(const BenchArgs& a, const BenchRun& run, const ModelInfo& mi,
                                      const ThroughputTimes& tt, const kernels::StreamBandwidth& sb,
                                      const nlohmann::json& bw_json, bool graph) {
  return {{"model", {{"path", mi.path}, {"fingerprint", mi.fingerprint}}},
          {"storage", a.storage},
          {"bf16_compute", a.bf16_compute},
          {"backend", run.backend},
          {"threads", run.threads},
          {"prompt_tokens", a.prompt},
          {"batch", a.batch},
          {"decode_path", a.decode_path},
          {"graph", graph},
          {"decode_tokens", a.decode},
          {"reps", a.reps},
          {"clock", a.clock_name},
          {"prefill_tokens_per_s", tt.pre_tps},
          {"decode_tokens_per_s", tt.dec_tps},
          {"decode_step_seconds_reps", tt.dec},
          {"copy_bandwidth_bytes_per_s", sb.reference()},
          {"bandwidth", bw_json},
          {"decode_weight_bytes_per_token", tt.wbytes},  // per step (all `batch` tokens); kept name
          {"decode_weight_bytes_per_step", tt.wbytes},
          {"decode_ideal_tokens_per_s", tt.ideal_tps},
          {"decode_fraction_of_ideal", tt.dec_tps / tt.ideal_tps},
          {"load_average_start", run.load_start},
          {"load_average_end", load_average()},
          {"host_kernels", {{"gemv_isa", host::gemv_isa()}, {"blas_core", blas_core_name()}}}};
}

}  // namespace throughput

/// The throughput benchmark of `w` (and of the method's model `ws` under `plan`); `sb`: the
/// memory bandwidth measured before the model was loaded. Returns the exit status.
template <class E>
int bench_throughput(const E& exec, const BenchArgs& a, const BenchRun& run,
                     std::shared_ptr<const Weights<E>> w, std::shared_ptr<const Weights<E>> ws,
                     const ModelInfo& mi, const sparsity::Plan& plan,
                     const kernels::StreamBandwidth& sb, const nlohmann::json& bw_json) {
  using namespace throughput;
  const int prompt = a.prompt, decode = a.decode, reps = a.reps, batch = a.batch;
  const bool profile = a.profile, graph = a.graph;
  const bool sparse = a.ma.sparse();
  const std::string &skipping = a.skipping, &decode_path = a.decode_path, &json_out = a.json_out,
                    &run_out = a.run_out;
  const Clock clock = a.clock;
  const MethodArgs& ma = a.ma;
  const double bw = sb.reference();
  const Config& c = w->cfg;
  std::unique_ptr<io::RunFile> rf;
  if (!run_out.empty()) rf = std::make_unique<io::RunFile>(run_out);
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
  // Dense and sparse alternate within each repetition, so that load changes on a shared
  // machine hit both alike.
  ThroughputTimes tt;
  for (int r = 0; r < reps; ++r) {
    const auto [pre, dec] = timed_run(eng, toks, decode, c.vocab, clock, batch);
    tt.pre.push_back(pre);
    tt.dec.push_back(dec);
    if (pe) {
      const double before = ppr->select_seconds();
      const auto [ppre, pdec] = timed_run(*pe, toks, decode, c.vocab, clock, batch);
      tt.pp_pre.push_back(ppre);
      tt.pp_dec.push_back(pdec);
      tt.pp_probe.push_back(ppr->select_seconds() - before);  // the prefill's selection
    }
    if (se) {
      const auto [spre, sdec] = timed_run(*se, toks, decode, c.vocab, clock);
      tt.sparse_pre.push_back(spre);
      tt.sparse_dec.push_back(sdec);
    }
  }
  tt.finish(*w, prompt, batch, bw);
  const double dec_tps = tt.dec_tps;
  std::cout << throughput_text(a, run, mi, c, tt, sb, eng.graph());
  nlohmann::json prof, mj;
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
    mj = sparse_decode_report(a, plan, ledger, pd, ps, tt.dec, tt.sparse_pre, tt.sparse_dec,
                              dec_tps);
  }
  if (rf)
    write_throughput_run_file(*rf, a, run, mi, c, plan, sparse ? ps : pd,
                              sparse ? tt.sparse_pre : tt.pre, sparse ? tt.sparse_dec : tt.dec,
                              ledger);
  if (!json_out.empty()) {
    nlohmann::json j = throughput_json(a, run, mi, tt, sb, bw_json, eng.graph());
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
      pj["prefill_tokens_per_s"] = static_cast<double>(prompt) * batch / median_of(tt.pp_pre);
      pj["decode_tokens_per_s"] = static_cast<double>(batch) / median_of(tt.pp_dec);
      pj["probe_seconds_per_prefill"] = median_of(tt.pp_probe);
      pj["probe_share_of_prefill"] = median_of(tt.pp_probe) / median_of(tt.pp_pre);
      j["probe_pruning"] = pj;
    }
    interruption_point("write");
    io::write_file_atomically(json_out, io::json_file_text(j));
  }
  return 0;
}

}  // namespace sparsim::app
