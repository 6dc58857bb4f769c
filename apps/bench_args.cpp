#include "bench_args.hpp"

namespace sparsim::app {

void BenchArgs::add_options(po::options_description& d) {
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
}

void BenchArgs::check(const po::variables_map& vm) {
  require(prompt >= 1 && decode >= 1 && reps >= 1, "--prompt, --decode and --reps must be >= 1");
  require(clock_name == "wall" || clock_name == "cpu", "--clock must be wall or cpu, got '{}'",
          clock_name);
  clock = clock_name == "cpu" ? Clock::ProcessCpu : Clock::Wall;
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
  require(!ma.evict() || (!ma.sparse() && baseline.empty() && !kv_synthetic && run_out.empty()),
          "bench times --evict against dense, composed with think, grace or token-filter at "
          "most: drop the other methods, --baseline, --kv-synthetic-cache and --out");
  require(run_out.empty() || baseline.empty(),
          "--out: not written for --baseline (its --json has the figures)");
  require(skipping == "on" || skipping == "off", "--column-skipping must be on or off, got '{}'",
          skipping);
}

}  // namespace sparsim::app
