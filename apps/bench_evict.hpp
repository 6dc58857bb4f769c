#pragma once
// sparsim bench --evict: what token eviction costs at prefill and saves at decode. A dense
// engine and one with the evictor (and ThinK / GRACE when --method names them) run the same
// prompts, alternating within each repetition: prefill time, the evictor's own selection time
// against the prefill, the median decode step of each and the decode attention kernels' time.
#include "common.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "io/run_file.hpp"
#include "method_setup.hpp"
#include "records.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>

namespace sparsim::app {

template <class E>
int bench_evict(const E& exec, const MethodArgs& ma, std::shared_ptr<const Weights<E>> w,
                const ModelInfo& mi, int prompt, int decode, int reps, int batch, Clock clock,
                const std::string& backend, int threads, const std::string& json_out) {
  const Config& c = w->cfg;
  const int ctx = prompt + decode;
  Engine<E> dense(w, batch, ctx, nullptr, exec), meth(w, batch, ctx, nullptr, exec);
  auto evp = make_token_evictor(ma, meth, prompt);
  auto kvp = make_kv_pruner(ma, meth, prompt);
  std::vector<std::vector<int>> seqs(static_cast<std::size_t>(batch));
  for (int s = 0; s < batch; ++s)
    for (int i = 0; i < prompt; ++i)
      seqs[static_cast<std::size_t>(s)].push_back((i * 7919 + 13 + s * 104729) % c.vocab);
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  // The decode steps run profiled (per-op times; host backends run op by op anyway, so the
  // fences cost little there), which gives the attention kernels' own time per step: the part
  // of the step eviction shrinks.
  auto attention_seconds = [](const Engine<E>& eng) {
    const auto& o = eng.op_seconds();
    return o[static_cast<int>(flops::Op::AttnScore)] + o[static_cast<int>(flops::Op::AttnSoftmax)] +
           o[static_cast<int>(flops::Op::AttnValue)];
  };
  auto run = [&](Engine<E>& eng, double& pre, double& dec, double& att) {
    Stopwatch sw(clock);
    eng.forward(seqs, 0, false);
    pre = sw.seconds();
    std::vector<std::vector<int>> next;
    for (const auto& s : seqs) next.push_back({s.back()});
    std::vector<double> steps;
    eng.clear_op_seconds();
    eng.set_profile_clock(clock);
    eng.set_profile(true);
    for (int t = 0; t < decode; ++t) {
      Stopwatch st(clock);
      eng.forward(next, prompt + t, false);
      steps.push_back(st.seconds());
      for (auto& n : next) n[0] = (n[0] * 31 + 7) % c.vocab;
    }
    eng.set_profile(false);
    att = attention_seconds(eng) / decode;
    dec = med(steps);
  };
  std::vector<double> d_pre, d_dec, d_att, m_pre, m_dec, m_att, sel, att_ratio;
  for (int r = 0; r < reps; ++r) {
    double a = 0, b = 0, t = 0;
    run(dense, a, b, t);
    d_pre.push_back(a);
    d_dec.push_back(b);
    d_att.push_back(t);
    const double s0 = evp->select_seconds();
    run(meth, a, b, t);
    m_pre.push_back(a);
    m_dec.push_back(b);
    m_att.push_back(t);
    sel.push_back(evp->select_seconds() - s0);
    att_ratio.push_back(d_att.back() > 0 ? m_att.back() / d_att.back() : 0.0);
  }
  const double dp = med(d_pre), dd = med(d_dec), mp = med(m_pre), md = med(m_dec), ms = med(sel);
  const double da = med(d_att), ma_ = med(m_att), ar = med(att_ratio);
  const nlohmann::json ej = evict_json(*evp);
  std::cout << fmt::format(
      "token eviction {} (budget {}), {} × {} prompt tokens, {} decode steps, {} reps\n"
      "  prefill      dense {:.4f} s   method {:.4f} s   selection {:.4f} s ({:.2f}% of the "
      "dense prefill)\n"
      "  decode step  dense {:.5f} s   method {:.5f} s   ratio {:.3f}\n"
      "  decode attention (per step)  dense {:.5f} s   method {:.5f} s   ratio {:.3f}\n"
      "  prompt tokens kept {:.4f}; prompt KV bytes / dense {:.4f}\n",
      ej["method"].get<std::string>(), ma.ev.budget, batch, prompt, decode, reps, dp, mp, ms,
      dp > 0 ? 100.0 * ms / dp : 0.0, dd, md, dd > 0 ? md / dd : 0.0, da, ma_, ar,
      ej["kept_fraction"].get<double>(), ej["kv_bytes_fraction"].get<double>());
  if (!json_out.empty()) {
    nlohmann::json j = {{"model", {{"path", mi.path}, {"fingerprint", mi.fingerprint}}},
                        {"backend", backend},
                        {"threads", threads},
                        {"method", ma.method},
                        {"batch", batch},
                        {"prompt_tokens", prompt},
                        {"decode_steps", decode},
                        {"reps", reps},
                        {"prefill_seconds_dense", dp},
                        {"prefill_seconds_method", mp},
                        {"select_seconds", ms},
                        {"select_fraction_of_prefill", dp > 0 ? ms / dp : 0.0},
                        {"decode_step_seconds_dense", dd},
                        {"decode_step_seconds_method", md},
                        {"decode_step_ratio", dd > 0 ? md / dd : 0.0},
                        {"decode_attention_seconds_dense", da},
                        {"decode_attention_seconds_method", ma_},
                        {"decode_attention_ratio", ar},
                        {"decode_attention_ratio_reps", att_ratio},
                        {"prefill_seconds_dense_reps", d_pre},
                        {"select_seconds_reps", sel},
                        {"clock", clock == Clock::ProcessCpu ? "cpu" : "wall"},
                        {"load_average", load_average()},
                        {"evict", ej}};
    if (kvp) j["kv_prune"] = kv_prune_json(*kvp, meth);
    io::write_file_atomically(json_out, io::json_file_text(j));
  }
  return 0;
}

}  // namespace sparsim::app
