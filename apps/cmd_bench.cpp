// sparsim bench: prefill and decode throughput, and decode against the memory-bandwidth ideal.
#include "common.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "io/run_file.hpp"
#include "model/loader.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>

namespace sparsim::app {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Copy bandwidth (read + write bytes per second) of `bytes`-sized buffers, median of reps.
template <class E>
double copy_bandwidth(const E& exec, std::size_t bytes, int reps) {
  const std::size_t n = bytes / sizeof(float);
  Kokkos::View<float*, DeviceOf<E>> a("sparsim::bench::a", n), b("sparsim::bench::b", n);
  Kokkos::deep_copy(a, 1.0f);
  std::vector<double> t;
  for (int r = 0; r < reps + 1; ++r) {
    exec.fence();
    Stopwatch sw;
    Kokkos::parallel_for(
        "sparsim::bench::copy", Kokkos::RangePolicy<E>(exec, 0, n),
        KOKKOS_LAMBDA(const std::size_t i) { b(i) = a(i); });
    exec.fence();
    if (r > 0) t.push_back(sw.seconds());  // first run warms up
  }
  return 2.0 * n * sizeof(float) / median(t);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  CommonOptions co;
  std::string model, storage, json_out;
  int prompt = 512, decode = 128, reps = 3;
  bool profile = false;
  po::options_description d("sparsim bench options");
  d.add_options()("model,m", po::value(&model)->required(), "model file (GGUF)")(
      "prompt", po::value(&prompt)->default_value(512), "prefill length in tokens")(
      "decode", po::value(&decode)->default_value(128), "decode steps after the prefill")(
      "reps", po::value(&reps)->default_value(3), "repetitions (medians are reported)")(
      "storage", po::value(&storage)->default_value("f32"), "weight storage: f32, bf16 or f16")(
      "json", po::value(&json_out), "write the figures as JSON to this file")(
      "profile", po::bool_switch(&profile),
      "after the timed runs, one profiled prefill + decode: time per op (fences after each "
      "kernel)");
  add_common_options(d, co);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: sparsim bench --model M [options]", d, vm)) return 0;
  require(prompt >= 1 && decode >= 1 && reps >= 1, "--prompt, --decode and --reps must be >= 1");
  LoadOptions lo;
  lo.storage = parse_dtype(storage);
  Runtime rt(co);
  const std::string backend = resolve_backend(co.backend);
  return with_backend(co.backend, [&](auto exec) {
    using E = decltype(exec);
    // Measured before the model is loaded, so its buffers do not add to the peak memory.
    const double bw = copy_bandwidth(exec, std::size_t(128) << 20, 5);
    ModelInfo mi;
    auto w = load_model<E>(model, lo, &mi);
    const Config& c = w->cfg;
    require(prompt + decode <= c.context_length,
            "--prompt + --decode = {} exceeds the model's context of {}", prompt + decode,
            c.context_length);
    Engine<E> eng(w, 1, prompt + decode, nullptr, exec);
    std::vector<int> toks(prompt);
    for (int i = 0; i < prompt; ++i) toks[i] = (i * 7919 + 13) % c.vocab;
    std::vector<double> t_pre, t_dec;
    for (int r = 0; r < reps; ++r) {
      Stopwatch sw;
      eng.forward({toks}, 0, false);
      t_pre.push_back(sw.seconds());
      int next = toks.back();
      std::vector<double> steps;
      for (int s = 0; s < decode; ++s) {
        Stopwatch st;
        eng.forward({{next}}, prompt + s, false);
        steps.push_back(st.seconds());
        next = (next * 31 + 7) % c.vocab;
      }
      t_dec.push_back(median(steps));
    }
    // Bytes one decode step must read: every projection, the head and the norms.
    double wbytes = static_cast<double>(w->output.bytes()) + 4.0 * c.d_model * (2 * c.n_layer + 1);
    for (const auto& l : w->layers)
      for (const auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        wbytes += static_cast<double>(m->bytes());
    const double pre_tps = prompt / median(t_pre);
    const double dec_tps = 1.0 / median(t_dec);
    const double ideal_tps = bw / wbytes;
    std::cout << fmt::format(
        "model {} ({} params, {} storage), backend {}, {} threads\n"
        "prefill  {:>9.1f} tokens/s  ({} tokens, median of {})\n"
        "decode   {:>9.1f} tokens/s  (median step of {} after the prompt)\n"
        "bandwidth {:>8.2f} GB/s copy; decode reads {:.1f} MB/token; ideal {:.1f} tokens/s\n"
        "decode / ideal = {:.3f}\n",
        mi.path, c.n_params(), storage, backend, rt.threads(), pre_tps, prompt, reps, dec_tps,
        decode, bw / 1e9, wbytes / 1e6, ideal_tps, dec_tps / ideal_tps);
    nlohmann::json prof;
    if (profile) {
      auto breakdown = [&](const char* what, const std::array<double, flops::kNumOps>& sec) {
        double tot = 0;
        for (double v : sec) tot += v;
        std::cout << fmt::format("\n{} time by op (profiled run)\n", what);
        for (int o = 0; o < flops::kNumOps; ++o) {
          if (sec[o] <= 0) continue;
          std::cout << fmt::format("  {:<14} {:>9.4f} s {:>6.1f}%\n",
                                   flops::to_string(static_cast<flops::Op>(o)), sec[o],
                                   100 * sec[o] / tot);
          prof[what][flops::to_string(static_cast<flops::Op>(o))] = sec[o];
        }
      };
      Engine<E> pe(w, 1, prompt + decode, nullptr, exec);
      pe.set_profile(true);
      pe.forward({toks}, 0, false);
      breakdown("prefill", pe.op_seconds());
      Engine<E> de(w, 1, prompt + decode, nullptr, exec);
      de.forward({toks}, 0, false);
      de.set_profile(true);
      int next = toks.back();
      for (int s = 0; s < decode; ++s) {
        de.forward({{next}}, prompt + s, false);
        next = (next * 31 + 7) % c.vocab;
      }
      breakdown("decode", de.op_seconds());
    }
    if (!json_out.empty()) {
      nlohmann::json j = {{"model", {{"path", mi.path}, {"fingerprint", mi.fingerprint}}},
                          {"storage", storage},
                          {"backend", backend},
                          {"threads", rt.threads()},
                          {"prompt_tokens", prompt},
                          {"decode_tokens", decode},
                          {"prefill_tokens_per_s", pre_tps},
                          {"decode_tokens_per_s", dec_tps},
                          {"copy_bandwidth_bytes_per_s", bw},
                          {"decode_weight_bytes_per_token", wbytes},
                          {"decode_ideal_tokens_per_s", ideal_tps},
                          {"decode_fraction_of_ideal", dec_tps / ideal_tps}};
      if (profile) j["profile_seconds"] = prof;
      io::write_file_atomically(json_out, j.dump(2) + "\n");
    }
    return 0;
  });
}

}  // namespace sparsim::app
