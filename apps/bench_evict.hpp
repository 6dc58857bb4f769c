#pragma once
// sparsim bench --evict: what token eviction costs at prefill and saves at decode. A dense
// engine and one with the evictor (and ThinK / GRACE or Token Filtering when --method names
// them) run the same prompts, alternating within each repetition: prefill time, the evictor's
// own selection time (for H2O: the sums inside the prefill attention and the top-k) and the
// method's prefill over the dense one of the same repetition, both against the dense prefill,
// the median decode step of each and the decode attention kernels' time.
#include "bench_decode.hpp"
#include "common.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "io/run_file.hpp"
#include "method_stack.hpp"
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
  MethodStack<E> stack(ma, meth, sparsity::Plan{}, {ctx, prompt});
  pruning::TokenEvictorPolicy<E>* evp = stack.evictor();
  pruning::KvChannelPruner<E>* kvp = stack.channel_selector();
  std::vector<std::vector<int>> seqs(static_cast<std::size_t>(batch));
  for (int s = 0; s < batch; ++s)
    for (int i = 0; i < prompt; ++i)
      seqs[static_cast<std::size_t>(s)].push_back((i * 7919 + 13 + s * 104729) % c.vocab);
  // The decode steps run profiled (per-op times; host backends run op by op anyway, so the
  // fences cost little there), which gives the attention kernels' own time per step: the part
  // of the step eviction shrinks.
  auto run = [&](Engine<E>& eng, double& pre, double& dec, double& att) {
    const DecodeTiming t = timed_decode(eng, seqs, decode, c.vocab, {clock, true, nullptr, 0});
    pre = t.prefill;
    dec = t.step;
    att = t.attention_per_step() / decode;
  };
  std::vector<double> d_pre, d_dec, d_att, m_pre, m_dec, m_att, sel, att_ratio, pre_extra;
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
    // the method's prefill over the dense one of the same repetition (paired)
    pre_extra.push_back(d_pre.back() > 0 ? m_pre.back() / d_pre.back() - 1.0 : 0.0);
    att_ratio.push_back(d_att.back() > 0 ? m_att.back() / d_att.back() : 0.0);
  }
  const double dp = median_of(d_pre), dd = median_of(d_dec), mp = median_of(m_pre),
               md = median_of(m_dec), ms = median_of(sel);
  const double da = median_of(d_att), ma_ = median_of(m_att), ar = median_of(att_ratio);
  const nlohmann::json ej = evict_json(*evp);
  std::cout << fmt::format(
      "token eviction {} (budget {}), {} × {} prompt tokens, {} decode steps, {} reps\n"
      "  prefill      dense {:.4f} s   method {:.4f} s (paired: {:+.2f}%)   selection {:.4f} s "
      "({:.2f}% of the dense prefill)\n"
      "  decode step  dense {:.5f} s   method {:.5f} s   ratio {:.3f}\n"
      "  decode attention (per step)  dense {:.5f} s   method {:.5f} s   ratio {:.3f}\n"
      "  prompt tokens kept {:.4f}; prompt KV bytes / dense {:.4f}\n",
      ej["method"].get<std::string>(), ma.ev.budget, batch, prompt, decode, reps, dp, mp,
      100.0 * median_of(pre_extra), ms, dp > 0 ? 100.0 * ms / dp : 0.0, dd, md,
      dd > 0 ? md / dd : 0.0, da, ma_, ar, ej["kept_fraction"].get<double>(),
      ej["kv_bytes_fraction"].get<double>());
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
                        {"prefill_extra_fraction", median_of(pre_extra)},
                        {"prefill_extra_fraction_reps", pre_extra},
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
    if (stack.token_filter()) j["token_filter"] = token_filter_json(*stack.token_filter());
    io::write_file_atomically(json_out, io::json_file_text(j));
  }
  return 0;
}

}  // namespace sparsim::app
