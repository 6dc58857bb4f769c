#!/usr/bin/env python3
"""Write (or check) docs/results/<study>/MANIFEST.md, one per study folder.

    scripts/tools/results_manifest.py [--repo ROOT] [--check]

Each manifest lists every file of its folder: what it is, the command that made it, and the commit,
machine and date where the file itself records them (a JSON file's `command`, `commit`, `cpu`,
`machine`, `context`, `gpu`, `date*` fields; a text file's first line "... at <commit>"),
otherwise "not recorded in the file". What each file is, and the command where the file does not
record one, come from the table below (the command as the study's page or script gives it).
--check: exit 1, naming the folder, when a manifest is not what this script would write, a file
has no entry in the table or an entry names no file. Standard library only.
"""
import argparse
import json
import os
import re
import sys

NR = "not recorded in the file"
# a command, then " ## " and a note on where it ran from
ATTN = ("sparsim bench --model PRUNED --baseline smollm2 --prompt 2048 --decode 8 --reps 3 --threads 2"
        " ## through scripts/bench/bench_rap_attention.py, docs/kv-baselines.md")
GPU_CHECK = "OUT=out bash .gpu/bundle/check.sh ## scripts/gpu/check.sh as docs/cuda.md runs it"

# folder -> (pages, {file or subfolder: (what it is, command when the file records none)})
STUDIES = {
    "token_filter": (["token-filter-results.md", "token-filter.md"], {
        "token_filter_smollm2.json": ("Token Filtering on SmolLM2-135M: every run of the study (perplexity, "
                                      "passkey, next-line task, realised skip ratios, figure 2's correlation)",
                                      "scripts/studies/token_filter_study.py --outdir DIR --json "
                                      "docs/results/token_filter/token_filter_smollm2.json --page docs/token-filter-results.md"),
        "token_filter_layers.png": ("figure: realised skip ratio per layer",
                                    "scripts/studies/token_filter_study.py ## written next to its --json"),
        "token_filter_passkey.png": ("figure: passkey accuracy per configuration",
                                     "scripts/studies/token_filter_study.py ## written next to its --json"),
        "token_filter_similarity_attention.png": ("figure: similarity against the attention a token later receives",
                                                  "scripts/studies/token_filter_study.py ## written next to its --json"),
        "token_filter_bench_r0.5_b8_d2048.json": ("attention-stage and step time against dense, r = 0.5, batch 8, "
                                                  "2,048 decode steps",
                                                  "sparsim bench --model smollm2 --method token-filter --tf-ratio 0.5 "
                                                  "--batch 8 --prompt 16 --decode 2048 --reps 5 --threads 2 --json "
                                                  "docs/results/token_filter/token_filter_bench_r0.5_b8_d2048.json"),
        "token_filter_bench_r0.5_b8_d2048_host_lists.json": (
            "the same bench, 3 repetitions, with the kept-row lists built on the host from copied flags "
            "(the binary of the commit before the decisions stayed on the device), run just before the next file",
            "sparsim bench --model smollm2 --method token-filter --tf-ratio 0.5 --batch 8 --prompt 16 --decode 2048 "
            "--reps 3 --threads 2 --json docs/results/token_filter/token_filter_bench_r0.5_b8_d2048_host_lists.json "
            "## with the build of 336de33"),
        "token_filter_bench_r0.5_b8_d2048_device_lists.json": (
            "the same bench with the gate's decisions kept on the device (the kept-row lists from the flags where "
            "they are, one count read back per gated layer)",
            "sparsim bench --model smollm2 --method token-filter --tf-ratio 0.5 --batch 8 --prompt 16 --decode 2048 "
            "--reps 3 --threads 2 --json docs/results/token_filter/token_filter_bench_r0.5_b8_d2048_device_lists.json"),
        "token_filter_bench_r0_b8_d512_cpu_host_lists.json": (
            "r = 0 (the gate's work without a skip), batch 8, 512 decode steps, process CPU time on one thread, "
            "kept-row lists built on the host from copied flags",
            "sparsim bench --model smollm2 --method token-filter --tf-ratio 0 --batch 8 --prompt 16 --decode 512 "
            "--reps 5 --threads 1 --clock cpu --json "
            "docs/results/token_filter/token_filter_bench_r0_b8_d512_cpu_host_lists.json ## with the build of 336de33"),
        "token_filter_bench_r0_b8_d512_cpu_device_lists.json": (
            "r = 0, batch 8, 512 decode steps, process CPU time on one thread, decisions kept on the device",
            "sparsim bench --model smollm2 --method token-filter --tf-ratio 0 --batch 8 --prompt 16 --decode 512 "
            "--reps 5 --threads 1 --clock cpu --json "
            "docs/results/token_filter/token_filter_bench_r0_b8_d512_cpu_device_lists.json"),
        "token_filter_kv_bytes.json": ("KV bytes held and allocated against dense with --tf-drop-skipped",
                                       "scripts/bench/token_filter_kv_bench.py --model smollm2 --json "
                                       "docs/results/token_filter/token_filter_kv_bytes.json"),
    }),
    "kv_prune": (["kv-prune-results.md"], {
        "kv_prune_smollm2.json": ("ThinK and GRACE on SmolLM2-135M: every run of the study",
                                  "scripts/studies/kv_prune_study.py --outdir DIR --json "
                                  "docs/results/kv_prune/kv_prune_smollm2.json --page docs/kv-prune-results.md"),
    }),
    "ruler": (["ruler-results.md"], {
        "ruler_smollm2.json": ("the generated long-context suite on SmolLM2-135M: dense, ThinK and GRACE",
                               "scripts/studies/ruler_study.py --outdir DIR --json docs/results/ruler/ruler_smollm2.json "
                               "--page docs/ruler-results.md"),
    }),
    "ruler_budgets": (["ruler-budgets.md", "ruler-budgets-2048.md"], {
        "ruler_budgets_smollm2.json": ("the long-context suite with every KV-cache method at matched budgets, "
                                       "Token Filtering and FLAP",
                                       "scripts/studies/ruler_study.py --study budgets --task ruler:niah --lengths 1024 "
                                       "--samples 30 --seed 1 --budgets 0.5,0.25 --tf-ratios 0.2,0.5 --snapkv-kernels 9 "
                                       "--models flap_r0.2=FLAP_020.gguf,flap_r0.5=FLAP_050.gguf --outdir DIR --json "
                                       "docs/results/ruler_budgets/ruler_budgets_smollm2.json --page docs/ruler-budgets.md"),
        "ruler_budgets_smollm2_2048.json": ("the same at 2,048 tokens on niah_single and niah_multikey, 20 samples each",
                                            "scripts/studies/ruler_study.py --study budgets --task "
                                            "ruler:niah_single,niah_multikey --lengths 2048 --samples 20 --seed 1 "
                                            "--budgets 0.5,0.25 --tf-ratios 0.2,0.5 --snapkv-kernels 9 --models "
                                            "flap_r0.2=FLAP_020.gguf,flap_r0.5=FLAP_050.gguf --jobs 2 --threads 1 "
                                            "--outdir DIR --json docs/results/ruler_budgets/ruler_budgets_smollm2_2048.json "
                                            "--page docs/ruler-budgets-2048.md"),
    }),
    "eviction": (["eviction.md"], {
        "eviction_smollm2.json": ("StreamingLLM, H2O, SnapKV and PyramidKV on SmolLM2-135M: perplexity, "
                                  "passkey, tokens and prompt KV bytes kept",
                                  "scripts/studies/eviction_study.py --outdir runs/evict --json "
                                  "docs/results/eviction/eviction_smollm2.json --page docs/eviction.md"),
        "eviction_bench.json": ("decode time of each evictor against dense, selection time",
                                "scripts/bench/eviction_bench.py --outdir runs/evict-bench --json "
                                "docs/results/eviction/eviction_bench.json --page docs/eviction.md"),
        "eviction_bench_masked_snapkv_b0.5.json": (
            "SnapKV at half the prompt with the evicted positions masked in place (the binary of "
            "acdf803, before the kept tokens were moved together): the comparison of docs/eviction.md",
            "sparsim bench --model smollm2 --prompt 4096 --decode 32 --reps 3 --threads 1 --clock cpu "
            "--evict snapkv --evict-budget 0.5 --json eviction_bench_masked_snapkv_b0.5.json"),
        "eviction_bench_snapkv_b0.25_loaded.json": (
            "the first SnapKV run at a quarter of the prompt, at load 2.38 while a study shared the cores "
            "(the table's row is the re-run on the idle machine)",
            "sparsim bench --model smollm2 --prompt 4096 --decode 32 --reps 3 --threads 1 --clock cpu "
            "--evict snapkv --evict-budget 0.25 --json eviction_bench_snapkv_b0.25_loaded.json"),
        "eviction_bench_tf_snapkv_b0.5.json": (
            "SnapKV at half the prompt with a dropping Token Filtering gate beside it (kept tokens "
            "moved together under the gate): the paragraph of docs/eviction.md",
            "sparsim bench --model smollm2 --prompt 4096 --decode 16 --reps 1 --threads 1 --clock cpu "
            "--method token-filter --tf-drop-skipped --evict snapkv --evict-budget 0.5 --json "
            "eviction_bench_tf_snapkv_b0.5.json"),
        "eviction_bench_h2o_separate_pass.json": (
            "the H2O rows of the benchmark with the binary of 296a106, where H2O's selection was a "
            "separate pass over every prompt query (before its votes were summed inside the prefill "
            "attention): the comparison of docs/eviction.md",
            "scripts/bench/eviction_bench.py --policies h2o --threads 1 --clock cpu (binary of 296a106; "
            "the rows copied from the eviction_bench.json of that commit)"),
    }),
    "rap": (["rap-results.md", "kv-weight-pruning.md"], {
        "rap_smollm2.json": ("RAP against KVPruner on SmolLM2-135M: every model of the study",
                             "scripts/studies/rap_study.py --outdir out/rap --json docs/results/rap/rap_smollm2.json "
                             "--page docs/rap-results.md"),
        "rap_attention_bench.json": ("the attention module of RAP at rho = 0.7 against dense (sparsim bench --baseline)",
                                     "scripts/bench/bench_rap_attention.py --pruned rap_070.gguf --fisher fisher.h5 --reps 11 "
                                     "--decode 32 --repeat 3 --json docs/results/rap/rap_attention_bench.json"),
        "rap_attention_bench_avx2.json": ("the same with the avx2 build",
                                          "scripts/bench/bench_rap_attention.py ... --sparsim build-avx2/bin/sparsim --json "
                                          "docs/results/rap/rap_attention_bench_avx2.json"),
        "rap_attention_bench_b8_prefill.json": ("the prefill at batch 8 (one process of 3 repetitions)",
                                                "scripts/bench/bench_rap_attention.py ... --batches 8 --decode-only-batches \"\" "
                                                "--reps 3 --decode 8 --json docs/results/rap/rap_attention_bench_b8_prefill.json"),
        "rap_b1_short": ("one short process at batch 1 (noise_*: --decode-only over a noise-filled cache)",
                         "sparsim bench --model rap_070.gguf --baseline smollm2 --batch 1 --prompt 2048 --decode 32 "
                         "--reps 6 [--decode-only] --json FILE"),
        "decode_rope_store.json": ("kernel benchmark: one layer's rotations and cache append, dense and pruned",
                                   "build/bin/sparsim_bench_kernels --benchmark_filter=DecodeRopeStore "
                                   "--benchmark_repetitions=7 --benchmark_out_format=json"),
    }),
    "rap_ablations": (["rap-ablations.md"], {
        "rap_ablations_smollm2.json": ("RAP's design ablations on SmolLM2 (scores, budgets, pair score, K share, "
                                       "pooled budget)", None),
    }),
    "kv_baselines": (["kv-baselines.md", "low-rank.md"], {
        "kv_baselines_smollm2.json": ("RAP against PaLU, SVD-LLM and both KVPruners on SmolLM2", None),
        "kv_baselines_attention_palu.json": ("the attention module of PaLU at 0.7 against dense",
                                             ATTN),
        "kv_baselines_attention_rap.json": ("the attention module of RAP at 0.7 against dense",
                                            ATTN),
        "kv_baselines_attention_svd-llm.json": ("the attention module of SVD-LLM at 0.7 against dense",
                                                ATTN),
    }),
    "recovery": (["recovery-results.md", "recovery.md"], {
        "recovery_smollm2.json": ("recovery after pruning on SmolLM2-135M: every model of the study",
                                  "scripts/studies/recovery_study.py --train wikitext-2/valid.txt --eval wikitext-2/test.txt "
                                  "--outdir out/recovery --json docs/results/recovery/recovery_smollm2.json "
                                  "--page docs/recovery-results.md"),
        "recovery_step_timing.json": ("time and memory of one recover step", None),
        "backprop_torch_check.txt": ("LoRA and gate gradients of sparsim's backward pass against PyTorch",
                                     "scripts/reference/backprop_torch_check.py"),
    }),
    "flap": (["flap.md"], {
        "flap_smollm2.json": ("FLAP on SmolLM2 against Token Filtering",
                              "scripts/studies/flap_study.py --outdir out/flap --json docs/results/flap/flap_smollm2.json "
                              "--page docs/flap.md"),
    }),
    "slimgpt": (["slimgpt.md"], {
        "slimgpt_smollm2.json": ("SlimGPT on SmolLM2 against FLAP",
                                 "scripts/studies/flap_study.py --outdir out/slimgpt --ratios 0.2,0.5 --slimgpt-ratios 0.2,0.5 "
                                 "--tf-ratios '' --json docs/results/slimgpt/slimgpt_smollm2.json --page docs/slimgpt.md"),
    }),
    "probe_pruning": (["probe-pruning.md"], {
        "pp_history_smollm2.json": ("Probe Pruning with and without the calibration history on SmolLM2: "
                                    "perplexity at 128 tokens and paired per-window differences",
                                    "scripts/studies/pp_history_study.py --calib-text valid.txt --outdir out/pp-history "
                                    "--threads 1 --json docs/results/probe_pruning/pp_history_smollm2.json "
                                    "--page docs/probe-pruning.md"),
    }),
    "tf_baselines": (["tf-baselines.md"], {
        "tf_baselines_smollm2.json": ("Token Filtering against FLAP, SlimGPT and Probe Pruning on SmolLM2", None),
        "long_prompt_throughput.json": ("throughput of Token Filtering, FLAP and Probe Pruning at 50% with 1,024-token "
                                        "prompts, batch 8 and 32",
                                        "scripts/bench/long_prompt_throughput.py --flap FLAP_050.gguf --prompt 1024 "
                                        "--decode 16 --batches 8,32 --reps 2 --threads 2 --outdir DIR --json "
                                        "docs/results/tf_baselines/long_prompt_throughput.json --page docs/tf-baselines.md"),
    }),
    "sparsity": (["sparsity-results.md", "sparsity.md"], {
        "sparsity_smollm2.json": ("TEAL, WINA and TopK-Guided on SmolLM2-135M at the papers' settings",
                                  "scripts/studies/sparsity_study.py --outdir runs/study --json "
                                  "docs/results/sparsity/sparsity_smollm2.json --page docs/sparsity-results.md"),
        "calibration_time.json": ("time of each stage of sparsim calibrate at its default settings",
                                  "scripts/bench/calibration_timing.py cal.h5 --json docs/results/sparsity/calibration_time.json"),
        "hf_teal_check.json": ("sparsim's TEAL against a Hugging Face transformers implementation, 16 windows",
                               "scripts/reference/hf_teal_check.py --calibration cal.h5 --windows 16 --threads 2 "
                               "--threshold-jitter 1e-6,-1e-6 --json docs/results/sparsity/hf_teal_check.json"),
        "hf_teal_check_64w.json": ("the same over 64 windows",
                                   "scripts/reference/hf_teal_check.py --calibration cal.h5 --windows 64 --threads 2 --json "
                                   "docs/results/sparsity/hf_teal_check_64w.json"),
    }),
    "cost_validation": (["cost-validation.md", "cost-model.md"], {
        "cost_validation.json": ("the cost model's predictions against measured times on this machine", None),
        "cost_validation_profile.json": ("the hardware profile (sparsim probe) the validation used",
                                         "sparsim probe --out profile.json --thread-counts 1 --reps 5 --clock cpu "
                                         "--name local-1thread-cpu --log-level warn"),
    }),
    "cuda": (["cuda-results.md", "cuda.md", "cost-model.md"], {
        "gpu_h200.json": ("the GPU check run on an NVIDIA H200 (tests, bench, agreement, predict, probe)",
                          GPU_CHECK),
        "gpu_h200_first.json": ("the first GPU check run on an NVIDIA H200 (an early build)",
                                GPU_CHECK),
        "h200_probe.log": ("roofs of an H200 measured with PyTorch and one CUDA kernel (data/hardware/h200-measured.json)",
                           "bash scripts/tools/probe_gpu.sh | tee docs/results/cuda/h200_probe.log"),
    }),
    "eval": (["eval.md"], {
        "llamacpp_smollm2_f32.json": ("sparsim against llama.cpp on SmolLM2-135M F32: perplexity of the same "
                                      "windows and greedy tokens",
                                      "scripts/reference/compare_smollm2_llamacpp.py --threads 2 --out "
                                      "docs/results/eval/llamacpp_smollm2_f32.json"),
        "llamacpp_smollm2_f32_ctx2048.json": ("the same at the TEAL/WINA protocol (context 2048, stride 512, 4 windows)",
                                              "scripts/reference/compare_smollm2_llamacpp.py --context 2048 --stride 512 "
                                              "--max-windows 4 --threads 2 --out "
                                              "docs/results/eval/llamacpp_smollm2_f32_ctx2048.json"),
    }),
    "sweep": (["sweep.md"], {
        "sweep_overhead.json": ("the overhead of sparsim sweep per point against plain runs", None),
    }),
    "setup": (["../README.md"], {
        "fresh_setup.json": ("a full fresh setup: every stage's time, the main job and the test suite", None),
    }),
    "robustness": (["robustness.md"], {
        "batch_tiling.json": ("batch independence and speed of a binary before and after a batch-tiling change",
                              "scripts/bench/batch_tiling_study.py --before base/build/bin/sparsim --after "
                              "build/bin/sparsim --json docs/results/robustness/batch_tiling.json"),
    }),
    "performance": (["performance.md"], {
        "bench_vs_llamacpp.json": ("tokens/s of sparsim against llama.cpp's llama-bench", None),
        "bench_vs_llamacpp_zen4.json": ("the same on a Zen 4 machine", None),
        "bench_vs_llamacpp_zen5.json": ("the same on a Zen 5 machine", None),
        "bench_vs_llamacpp_zen5_avx2.json": ("the same on the Zen 5 machine, both programs built for AVX2", None),
        "bench_vs_llamacpp_zen5_skylakex.json": ("the same on the Zen 5 machine, llama.cpp built for Skylake-X", None),
        "decode_methods.json": ("decode tokens/s of each activation-sparsity method against dense",
                                "scripts/bench/bench_decode_methods.py --calibration cal.h5 --runs 3"),
        "decode_methods_zen4.json": ("the same on a Zen 4 machine", None),
        "decode_methods_zen5.json": ("the same on a Zen 5 machine", None),
        "decode_methods_zen5_avx2.json": ("the same on the Zen 5 machine with the avx2 build", None),
        "decode_methods_llama2_7b_shape.json": ("the same on a Llama-2-7B-shaped model of 8 layers",
                                                "scripts/bench/bench_decode_methods.py --model l7b.gguf --calibration cal.h5 "
                                                "--storages bf16 --methods \"teal,wina,topk-guided=topk-guided --probe 0.5,"
                                                "wina-rot16=wina --rotation-storage bf16,topk-guided-rot16=topk-guided "
                                                "--probe 0.5 --rotation-storage bf16\" --prompt 128 --decode 32 --runs 1 "
                                                "--reps 7 --out docs/results/performance/decode_methods_llama2_7b_shape.json"),
        "decode_methods_llama2_7b_shape_zen5.json": ("the same on a Zen 5 machine", None),
        "decode_projections_zen4_bf16.json": ("TEAL's decode projection by projection, bf16 weights",
                                              "sparsim bench --model smollm2 --storage bf16 --method teal --calibration "
                                              "cal.h5 --prompt 512 --decode 128 --reps 5 --profile --threads 2 --json "
                                              "docs/results/performance/decode_projections_zen4_bf16.json"),
        "decode_projections_zen4_f32.json": ("the same with f32 weights",
                                             "sparsim bench --model smollm2 --storage f32 --method teal --calibration "
                                             "cal.h5 --prompt 512 --decode 128 --reps 5 --profile --threads 2 --json "
                                             "docs/results/performance/decode_projections_zen4_f32.json"),
        "decode_attention_kernel.json": ("kernel benchmark: decode attention of one SmolLM2-shaped layer over 2,048 "
                                         "positions",
                                         "build/bin/sparsim_bench_kernels --benchmark_filter=DecodeAttention "
                                         "--benchmark_repetitions=5"),
        "decode_attention_kernel_avx2.json": ("the same with the avx2 build",
                                              "build-avx2/bin/sparsim_bench_kernels --benchmark_filter=DecodeAttention "
                                              "--benchmark_repetitions=5"),
        "sparse_gemv.json": ("sparse (column-skipping) decode GEMV against dense", None),
        "sparse_gemv_zen4.json": ("the same on a Zen 4 machine", None),
        "sparse_gemv_zen5.json": ("the same on a Zen 5 machine", None),
        "sparse_gemv_zen5_avx2.json": ("the same on the Zen 5 machine with the avx2 build", None),
        "kept_runs_zen4.json": ("reading all rows against a random half, by whole rows per thread", None),
        "portable_build.json": ("the portable build against the native one", None),
        "teal_mask_runs.json": ("the runs of kept columns in TEAL's masks (transformers, PyTorch)",
                                "scripts/reference/teal_mask_runs.py --calibration cal.h5 --windows 8 --json "
                                "docs/results/performance/teal_mask_runs.json"),
        "smollm2_bf16_eval_default.json": ("perplexity and time of SmolLM2 with bf16 weights, default arithmetic",
                                           "sparsim eval --model smollm2 --storage bf16 --max-windows 8 --threads 2 "
                                           "--json docs/results/performance/smollm2_bf16_eval_default.json"),
        "smollm2_bf16_eval_bf16_compute.json": ("the same with --bf16-compute",
                                                "sparsim eval --model smollm2 --storage bf16 --bf16-compute "
                                                "--max-windows 8 --threads 2 --json "
                                                "docs/results/performance/smollm2_bf16_eval_bf16_compute.json"),
    }),
}


def _cpu(d):
    if "model" in d:
        n = d.get("logical_cpus")
        return d["model"] + (f", {n} logical CPUs" if n else "")
    if "cpu" in d:
        n = d.get("cores")
        return d["cpu"] + (f", {n} cores" if n else "") + (f", host {d['host']}" if "host" in d else "")
    if "host_name" in d:
        return f"host {d['host_name']}, {d.get('num_cpus', '?')} CPUs at {d.get('mhz_per_cpu', '?')} MHz"
    return None


def json_meta(j):
    """(command, commit, machine, date) as the JSON file records them, None where it does not."""
    if not isinstance(j, dict):
        return None, None, None, None
    command = j.get("command") if isinstance(j.get("command"), str) else None
    commit = j.get("commit") if isinstance(j.get("commit"), str) else None
    if commit is None and isinstance(j.get("git"), str):
        commit = j["git"]
    machine = []
    if isinstance(j.get("gpu"), str):
        machine.append(j["gpu"])
    for key in ("cpu", "machine", "context", "probe"):
        v = j.get(key)
        if isinstance(v, dict) and _cpu(v):
            machine.append(_cpu(v))
            break
        if isinstance(v, str) and key == "machine":
            machine.append(v + (f", {j['cpus']} CPUs" if "cpus" in j else ""))
            break
    else:
        if "cpus" in j:
            machine.append(f"{j['cpus']} CPUs")
    hk = j.get("host_kernels")
    if isinstance(hk, dict) and hk:
        machine.append(f"host kernels {hk.get('gemv_isa', '?')}, OpenBLAS core {hk.get('blas_core', '?')}")
    date = None
    for key in ("date_utc", "started_utc", "date"):
        if isinstance(j.get(key), str):
            date = j[key]
            break
    else:
        for key in ("context", "probe"):
            v = j.get(key)
            if isinstance(v, dict):
                date = v.get("date") or v.get("date_utc")
                if date:
                    break
    return command, commit, "; ".join(machine) or None, date


def text_meta(path):
    commit = machine = date = None
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    m = re.search(r"\bat ([0-9a-f]{7,40})\b", lines[0]) if lines else None
    if m:
        commit = m.group(1)
    for line in lines:
        m = re.match(r"(NVIDIA [A-Za-z0-9 ]+?) \d", line)
        if m:
            machine = m.group(1)
            break
    for line in lines:
        m = re.search(r"\b(\d{4}-\d{2}-\d{2}(?:T[\d:]+Z?)?)\b", line)
        if m:
            date = m.group(1)
            break
    return commit, machine, date


def cell(s):
    return s.replace("|", "\\|").replace("\n", " ")


def render(folder, repo):
    pages, table = STUDIES[folder]
    base = os.path.join(repo, "docs", "results", folder)
    links = ", ".join(f"[{os.path.basename(p)}](../../{p})" for p in pages)
    out = [f"# docs/results/{folder}", "",
           f"Written by `scripts/tools/results_manifest.py`; do not edit by hand. The study's pages: {links}. "
           f"Command: as the file records it, otherwise as the page or the script gives it. Commit, machine "
           f"and date: as the file records them, otherwise \"{NR}\".", "",
           "| file | what it is | command | commit | machine | date |", "|---|---|---|---|---|---|"]
    for entry in sorted(table):
        what, command = table[entry]
        path = os.path.join(base, entry)
        files = ([os.path.join(entry, n) for n in sorted(os.listdir(path))] if os.path.isdir(path) else [entry])
        for rel in files:
            full = os.path.join(base, rel)
            rec_cmd = commit = machine = date = None
            if rel.endswith(".json"):
                with open(full, encoding="utf-8") as f:
                    rec_cmd, commit, machine, date = json_meta(json.load(f))
            elif rel.endswith((".txt", ".log")):
                commit, machine, date = text_meta(full)
            if rec_cmd:
                cmd = f"`{rec_cmd}` (recorded in the file)"
            elif command:
                c, _, note = command.partition(" ## ")
                cmd = f"`{c}`" + (f" ({note})" if note else "")
            else:
                cmd = NR
            out.append("| " + " | ".join(cell(x) for x in (
                f"[{rel}]({rel})", what, cmd, commit or NR, machine or NR, date or NR)) + " |")
    return "\n".join(out) + "\n"


def problems_of_table(repo):
    probs = []
    results = os.path.join(repo, "docs", "results")
    for folder in sorted(os.listdir(results)):
        if os.path.isdir(os.path.join(results, folder)) and folder not in STUDIES:
            probs.append(f"docs/results/{folder}: a folder with no entry in scripts/tools/results_manifest.py")
        elif os.path.isfile(os.path.join(results, folder)):
            probs.append(f"docs/results/{folder}: a file outside the study folders")
    for folder, (_, table) in STUDIES.items():
        base = os.path.join(results, folder)
        present = set(os.listdir(base)) - {"MANIFEST.md"} if os.path.isdir(base) else set()
        for n in sorted(present - set(table)):
            probs.append(f"docs/results/{folder}/{n}: no entry in scripts/tools/results_manifest.py")
        for n in sorted(set(table) - present):
            probs.append(f"docs/results/{folder}/{n}: in scripts/tools/results_manifest.py but not in the folder")
    return probs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    help="repository root (default: the one this script is in)")
    ap.add_argument("--check", action="store_true", help="only check that the manifests are up to date")
    a = ap.parse_args()
    probs = problems_of_table(a.repo)
    if probs:
        print("\n".join(probs))
        return 1
    stale = []
    for folder in STUDIES:
        path = os.path.join(a.repo, "docs", "results", folder, "MANIFEST.md")
        text = render(folder, a.repo)
        old = open(path, encoding="utf-8").read() if os.path.isfile(path) else None
        if old == text:
            continue
        if a.check:
            stale.append(f"{os.path.relpath(path, a.repo)}: not what scripts/tools/results_manifest.py writes")
        else:
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
            print(f"wrote {os.path.relpath(path, a.repo)}")
    if stale:
        print("\n".join(stale))
        return 1
    if a.check:
        print(f"results_manifest: {len(STUDIES)} manifests up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
