#!/usr/bin/env python3
"""Turns the results.json of scripts/gpu/check.sh (committed under docs/results/cuda/) into the
markdown page docs/cuda-results.md: tests on CUDA, CUDA vs OpenMP agreement, prefill and decode
speed against the bandwidth ideal, the methods on the device, the cost model against what was
measured, and the goals of the CUDA work.

    scripts/gpu/report.py docs/results/cuda/gpu_h200.json [earlier.json ...] > docs/cuda-results.md

The first file is the run the page is about; later files are earlier runs, whose headline
figures are set beside it. Nominal HBM bandwidths (bytes/s) are the vendors' datasheet figures:
NVIDIA H200 (141 GB HBM3e, 4.8 TB/s), H100 SXM5 80 GB (3.35 TB/s), A100 80 GB SXM
(2,039 GB/s), A100 40 GB (1,555 GB/s).
"""
import json
import sys

NOMINAL = [("H200", 4.8e12), ("H100", 3.35e12), ("A100-SXM4-80GB", 2.039e12),
           ("A100 80GB", 2.039e12), ("A100", 1.555e12)]


def nominal_bw(gpu):
    for key, bw in NOMINAL:
        if key.lower() in gpu.lower():
            return bw
    return None


def fmt(x, p=1):
    return "–" if x is None else f"{x:,.{p}f}"


def verdict(ok):
    return "met" if ok else "not met"


def headline(r):
    """The figures the goals are about, from one results file (None where not measured)."""
    bench = r.get("bench", {})
    h = {}

    def dense(prefix, batch=1):
        c = [j for n, j in bench.items() if n.startswith(prefix) and not j.get("sparse")
             and "decode_tokens_per_s" in j and j.get("batch", 1) == batch
             and j.get("backend", "cuda") == "cuda" and not n.endswith("prefill2048")]
        return max(c, key=lambda j: j["decode_tokens_per_s"]) if c else None

    g7 = dense("llama7b_bf16")
    if g7:
        h["7b_decode_tok_s"] = g7["decode_tokens_per_s"]
        h["7b_decode_fraction_of_copy"] = g7["decode_fraction_of_ideal"]
        h["7b_copy_bw"] = g7["copy_bandwidth_bytes_per_s"]
    gs = dense("smollm2")
    if gs:
        h["smollm2_decode_tok_s"] = gs["decode_tokens_per_s"]
    p7 = bench.get("llama7b_bf16_prefill2048")
    if p7:
        h["7b_prefill_2048_tok_s"] = p7["prefill_tokens_per_s"]
    t7 = bench.get("llama7b_bf16_teal", {}).get("sparse")
    if t7:
        h["7b_teal_speedup"] = t7["decode_speedup"]
    tf = bench.get("smollm2_f32_tf05_b8")
    if tf and "step_ratio" in tf:
        h["tf_step_ratio"] = tf["step_ratio"]
    gr = bench.get("smollm2_f32_grace05_8k", {}).get("decode")
    if gr:
        h["grace_step_ratio"] = gr["step_ratio"]
    rap = bench.get("llama7b4_rap070_attention")
    if rap and "attention_decode_ratio" in rap:
        h["rap_attention_decode_ratio"] = rap["attention_decode_ratio"]
    return h


def page(path, earlier):
    r = json.load(open(path))
    gpu = r.get("gpu", "?")
    bw_nom = nominal_bw(gpu)
    out = [f"## {gpu} (`{path}`)", ""]
    out.append(f"Check run in {r.get('check_seconds', '?')} s by `scripts/gpu/check.sh` on a build "
               f"of commit `{r.get('commit', '?')}`.")
    out.append("")
    out.append("### Tests on CUDA")
    out.append("| group | ran | passed | failed | skipped |")
    out.append("|---|---|---|---|---|")
    for g, t in r.get("tests", {}).items():
        failed = ", ".join(t.get("failed", [])) or "none"
        skipped = ", ".join(t.get("skipped", [])) or "none"
        out.append(f"| {g} | {t.get('ran', 0)} | {t.get('passed', 0)} | {failed} | {skipped} |")
    out.append("")
    agree = {k: v for k, v in r.get("agreement", {}).items() if isinstance(v, dict)}
    if agree:
        out.append("### CUDA vs OpenMP (SmolLM2-shaped synthetic model, 4 windows of 512 / stride "
                   "256; 96-token prompt + 16 greedy tokens)")
        out.append("| storage | perplexity CUDA | perplexity OpenMP | rel. diff | max logit diff / "
                   "max logit | greedy tokens identical |")
        out.append("|---|---|---|---|---|---|")
        for st, a in agree.items():
            out.append(f"| {st} | {a.get('perplexity_cuda', float('nan')):.6e} | "
                       f"{a.get('perplexity_openmp', float('nan')):.6e} | "
                       f"{a.get('perplexity_rel_diff', float('nan')):.2e} | "
                       f"{a.get('prompt_logits_max_diff_over_max_logit', float('nan')):.2e} | "
                       f"{a.get('greedy_tokens_identical')} |")
        out.append("")
    bench = r.get("bench", {})
    out.append("### Prefill and decode (prompt, then single-token steps; medians)")
    out.append("Decode ideal = weight bytes of one step / the reference bandwidth `bench` measured "
               "in the same process (the faster of its 16-byte copy kernel and the runtime's "
               "device copy, bytes read plus written; × batch: one pass over the weights serves "
               "every sequence).")
    out.append("")
    out.append("| run | storage | path | batch | prefill tok/s | decode tok/s | weights MB/step | "
               "reference GB/s (copy kernel / runtime copy) | decode / ideal | decode / ideal "
               "(nominal HBM) |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for name, j in bench.items():
        if "error" in j or j.get("sparse") or "decode_tokens_per_s" not in j:
            continue
        path_ = j.get("decode_path", "?") + (" + graph" if j.get("graph") else "")
        if j.get("backend") != "cuda":
            path_ = f"{j.get('backend')} ({j.get('threads')} threads)"
        if j.get("bf16_compute"):
            path_ += ", bf16 prefill products"
        wb = j.get("decode_weight_bytes_per_token")
        nom = None
        if bw_nom and wb and j.get("backend") == "cuda":
            nom = j["decode_tokens_per_s"] / (bw_nom / wb * j.get("batch", 1))
        bw = j.get("bandwidth", {})
        bws = fmt(j.get("copy_bandwidth_bytes_per_s", 0) / 1e9, 0)
        if "runtime_copy_median" in bw:
            bws += f" ({bw['copy_median'] / 1e9:,.0f} / {bw['runtime_copy_median'] / 1e9:,.0f})"
        out.append(f"| {name} | {j.get('storage')} | {path_} | {j.get('batch', 1)} | "
                   f"{fmt(j.get('prefill_tokens_per_s'), 0)} | {fmt(j.get('decode_tokens_per_s'))} | "
                   f"{fmt(wb / 1e6 if wb else None)} | {bws} | "
                   f"{fmt(j.get('decode_fraction_of_ideal'), 3)} | {fmt(nom, 3)} |")
    out.append("")
    for key, label in (("smollm2_f32_profile2048", "SmolLM2 shape, f32"),):
        prof = bench.get(key, {}).get("profile_seconds", {}).get("prefill")
        if prof:
            tot = sum(prof.values())
            att = sum(v for k, v in prof.items() if k.startswith("attn"))
            out.append(f"Profiled 2,048-token prefill ({label}, fences after every kernel): "
                       f"{tot * 1e3:.1f} ms in all, attention {100 * att / tot:.1f}%; by op: " +
                       ", ".join(f"{k} {100 * v / tot:.1f}%"
                                 for k, v in sorted(prof.items(), key=lambda kv: -kv[1])))
            out.append("")
        dprof = bench.get(key, {}).get("profile_seconds", {}).get("decode")
        if dprof:
            dtot = sum(dprof.values())
            steps = bench[key].get("decode_tokens", 0)
            out.append(f"Profiled decode after the 2,048-token prompt (op by op, a fence after every "
                       f"kernel, {steps} steps): {dtot * 1e3:.1f} ms in all; by op: " +
                       ", ".join(f"{k} {100 * v / dtot:.1f}%"
                                 for k, v in sorted(dprof.items(), key=lambda kv: -kv[1])))
            out.append("")
    sparse = [(n, j["sparse"]) for n, j in bench.items() if j.get("sparse")]
    if sparse:
        out.append("### Activation sparsity on the device (s = 0.5; dense and sparse in the same run)")
        out.append("The step ideal is the speedup the method's own bytes allow: dense step bytes over "
                   "the sparse step's (the kept weight rows, the masks), as `bench` prints it.")
        out.append("")
        out.append("| run | method | decode tok/s | × dense | step ideal | × dense / ideal | "
                   "realised sparsity | mask selection share |")
        out.append("|---|---|---|---|---|---|---|---|")
        for name, s in sparse:
            frac = s["decode_speedup"] / s["ideal_speedup_decode_step"]
            out.append(f"| {name} | {s['method']} | {fmt(s['decode_tokens_per_s'])} | "
                       f"{s['decode_speedup']:.3f} | {s['ideal_speedup_decode_step']:.3f} | "
                       f"{frac:.3f} | {s['realised_projection_sparsity']:.3f} | "
                       f"{100 * s['mask_select_time_share']:.1f}% |")
        out.append("")
    tf = bench.get("smollm2_f32_tf05_b8")
    gr = bench.get("smollm2_f32_grace05_8k")
    rap = bench.get("llama7b4_rap070_attention")
    if tf or gr or rap:
        out.append("### Attention-side methods on the device")
        if tf and "step_ratio" in tf:
            out.append(f"- Token Filtering r = 0.5, batch 8, prompt {tf.get('prompt_tokens')} + "
                       f"{tf.get('decode_tokens')} decode steps: step {tf['step_ratio']:.3f} of dense, "
                       f"attention stage {tf.get('attention_stage_ratio', float('nan')):.3f} "
                       f"({tf.get('attention_stage_with_gate_ratio', float('nan')):.3f} with the "
                       f"gate's own work).")
        if gr and "decode" in gr:
            d = gr["decode"]
            out.append(f"- GRACE λ = 0.5 at a {gr.get('prompt_tokens', gr.get('prompt', '?'))}-token "
                       f"context: decode step {d['step_ratio']:.3f} of dense (profiled steps), the "
                       f"attention op {d['attention_ratio']:.3f}; K cache "
                       f"{gr.get('k_bytes', 0) / max(gr.get('k_bytes_dense', 1), 1):.3f} of dense.")
        if rap and "attention_decode_ratio" in rap:
            pre = rap.get("attention_prefill_ratio")
            out.append(f"- RAP ρ = 0.7 on a Llama-2-7B-shaped model of 4 layers: attention module "
                       f"{rap['attention_decode_ratio']:.3f} of dense per decode step at position "
                       f"{rap.get('prompt_tokens')} (op by op, a fence after each op)"
                       + (f", prefill {pre:.3f}" if pre is not None else " (decode steps only)")
                       + ".")
        out.append("")
    pred = r.get("predict", {})
    if pred:
        out.append("### The cost model against what was measured")
        probe = r.get("probe", {})
        if probe:
            m = probe.get("measured", {})
            out.append(f"Hardware profile from `sparsim probe --backend cuda` in the same check: "
                       f"fp32 GEMM {probe['peak_flops'].get('fp32', 0) / 1e12:.1f} TFLOP/s, bf16 GEMM "
                       f"{probe['peak_flops'].get('bf16', 0) / 1e12:.1f} TFLOP/s, bandwidth "
                       f"{probe['memory_bandwidth'] / 1e9:,.0f} GB/s (decode GEMV "
                       f"{m.get('gemv_bandwidth', 0) / 1e9:,.0f} GB/s), "
                       f"{probe['launch_overhead_s'] * 1e6:.2f} µs per kernel in a stream of "
                       f"launches ({m.get('launch_overhead_sync_s', 0) * 1e6:.2f} µs with a fence "
                       f"after each).")
            out.append("")
        out.append("| run | phase | predicted / call | measured / call | error |")
        out.append("|---|---|---|---|---|")
        for name, p in pred.items():
            v = p.get("validation", {}).get("phases", {})
            for ph, e in v.items():
                err = e.get("error")
                out.append(f"| {name} | {ph} | {e['predicted_seconds_per_call'] * 1e3:.3f} ms | "
                           f"{e['measured_seconds_per_call'] * 1e3:.3f} ms | "
                           f"{'–' if err is None else f'{100 * err:+.1f}%'} |")
        out.append("")
    h = headline(r)
    out.append("### Goals")
    prev = [(p, headline(json.load(open(p)))) for p in earlier]

    def beside(key, p=1, scale=1.0):
        return "; ".join(f"`{q}`: {fmt(hh[key] * scale, p)}" for q, hh in prev if key in hh)

    def line(key, text, ok, p=1, scale=1.0):
        if key not in h:
            out.append(f"- {text}: not measured in this run.")
            return
        b = beside(key, p, scale)
        out.append(f"- {text}: {fmt(h[key] * scale, p)}; {verdict(ok(h[key]))}"
                   + (f" (earlier: {b})" if b else "") + ".")

    line("7b_decode_tok_s", "Llama-2-7B shape, bf16, batch 1 decode, tok/s (goal ≥ 230)",
         lambda v: v >= 230)
    line("7b_decode_fraction_of_copy", "the same as a share of the measured copy bandwidth's ideal "
         "(goal ≥ 70%)", lambda v: v >= 0.7, 1, 100.0)
    line("smollm2_decode_tok_s", "SmolLM2 decode, tok/s (goal ≥ 2,000)", lambda v: v >= 2000, 0)
    line("7b_prefill_2048_tok_s", "Llama-2-7B shape prefill at 2,048 tokens, tok/s (goal ≥ 15,000)",
         lambda v: v >= 15000, 0)
    line("7b_teal_speedup", "TEAL s = 0.5 decode on the 7B shape, × dense (goal ≥ 1.5)",
         lambda v: v >= 1.5, 3)
    for name, s in sparse:
        frac = s["decode_speedup"] / s["ideal_speedup_decode_step"]
        out.append(f"- {name}: {s['decode_speedup']:.3f}× dense against a step ideal of "
                   f"{s['ideal_speedup_decode_step']:.3f}× = {100 * frac:.1f}% of it (goal ≥ 80%): "
                   f"{verdict(frac >= 0.8)}.")
    line("tf_step_ratio", "Token Filtering r = 0.5 batch 8 step, of dense (goal ≤ 0.85)",
         lambda v: v <= 0.85, 3)
    line("grace_step_ratio", "GRACE λ = 0.5 decode step at 8K, of dense (goal ≤ 0.9)",
         lambda v: v <= 0.9, 3)
    line("rap_attention_decode_ratio", "RAP ρ = 0.7 attention decode on the 7B shape, of dense "
         "(goal ≤ 0.8)", lambda v: v <= 0.8, 3)
    for name, p in pred.items():
        for ph, e in p.get("validation", {}).get("phases", {}).items():
            err = e.get("error")
            if err is not None:
                out.append(f"- predict, {name} {ph}: {100 * err:+.1f}% against measured (goal within "
                           f"±25%): {verdict(abs(err) <= 0.25)}.")
    out.append("")
    return "\n".join(out)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    print("# CUDA results")
    print()
    print("Generated by `scripts/gpu/report.py " + " ".join(sys.argv[1:]) + "` from the JSON that "
          "`scripts/gpu/check.sh` wrote on the GPU machine (see [cuda.md](cuda.md)).")
    print()
    print(page(sys.argv[1], sys.argv[2:]))


if __name__ == "__main__":
    main()
