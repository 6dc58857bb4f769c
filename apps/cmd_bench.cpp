// sparsim bench: prefill and decode throughput, decode against the memory-bandwidth ideal, and
// with --method the decode of a method against dense in the same run. Options and checks:
// bench_args.*; the modes: bench_throughput.hpp, bench_attention_module.hpp (--baseline),
// bench_token_filter.hpp, bench_kv_prune.hpp (think / grace), bench_evict.hpp (--evict).
#include "bench_args.hpp"
#include "bench_attention_module.hpp"
#include "bench_evict.hpp"
#include "bench_kv_prune.hpp"
#include "bench_throughput.hpp"
#include "bench_token_filter.hpp"
#include "common.hpp"
#include "io/run_guard.hpp"
#include "kernels/bandwidth.hpp"
#include "records.hpp"

#include <nlohmann/json.hpp>

#include <fstream>

namespace sparsim::app {

int cmd_bench(int argc, char** argv) {
  BenchArgs a;
  po::options_description d("sparsim bench options");
  a.add_options(d);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: sparsim bench [--model M] [--method teal --calibration C] [options]", d, vm))
    return 0;
  a.check(vm);
  BenchRun r;
  r.load.storage = parse_dtype(a.storage);
  r.load.bf16_compute = a.bf16_compute;
  check_as_options([&] { check_load_options(r.load); });
  r.model = resolve_model(a.model);
  io::guard_run({{"--model", r.model.path}, {"--calibration", a.ma.calib_path}},
                {{"--json", a.json_out}, {"--out", a.run_out}});
  Runtime rt(a.co);
  r.backend = resolve_backend(a.co.backend);
  r.threads = rt.threads();
  r.load_start = load_average();
  r.argc = argc;
  r.argv = argv;
  return with_backend(a.co.backend, [&](auto exec) {
    using E = decltype(exec);
    if (!a.baseline.empty()) return bench_attention_module(exec, a, r);
    const MethodArgs& ma = a.ma;
    const int prompt = a.prompt, decode = a.decode, reps = a.reps, batch = a.batch;
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
    std::shared_ptr<const Weights<E>> w;
    check_as_options([&] { w = load_model<E>(r.model.path, r.load, &mi); });
    const Config& c = w->cfg;
    // (a synthetic K cache decodes one position after the prompt)
    const int needed = prompt + (a.kv_synthetic ? 1 : decode);
    require(needed <= c.context_length,
            "--prompt + --decode = {} exceeds the model's context of {}", needed, c.context_length);
    // The method's model: the dense one, or its WINA rotation for rotated plans.
    std::shared_ptr<const Weights<E>> ws = w;
    const sparsity::Plan plan = prepare_method(ma, mi, ws, r.load.storage);
    if (ma.evict())
      return bench_evict(exec, ma, w, mi, prompt, decode, reps, batch, a.clock, r.backend,
                         r.threads, a.json_out);
    if (ma.kv_prune)
      return bench_kv_prune(exec, ma, w, mi, prompt, decode, reps, batch, a.kv_synthetic, a.storage,
                            r.backend, r.threads, a.json_out);
    if (ma.token_filter)
      return bench_token_filter(exec, ma, plan, w, ws, mi, prompt, decode, reps, batch,
                                a.skipping == "on", a.storage, r.backend, r.threads, bw,
                                a.json_out);
    return bench_throughput(exec, a, r, w, ws, mi, plan, sb, bw_json);
  });
}

}  // namespace sparsim::app
