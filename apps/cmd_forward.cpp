// sparsim forward: the forward pass on given token ids, recorded in a run file.
#include "common.hpp"
#include "core/interrupt.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "io/run_file.hpp"
#include "io/run_guard.hpp"
#include "model/loader.hpp"
#include "records.hpp"

#include <algorithm>
#include <iostream>

namespace sparsim::app {

namespace {

template <class E>
std::vector<float> to_host(const Mat<E>& m) {
  std::vector<float> out(m.extent(0) * m.extent(1));
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
  std::copy(h.data(), h.data() + out.size(), out.begin());
  return out;
}

int argmax(const float* p, int n) {
  return static_cast<int>(std::max_element(p, p + n) - p);
}

}  // namespace

int cmd_forward(int argc, char** argv) {
  CommonOptions co;
  std::string model, tokens_s, mode, out, storage;
  int greedy = 0;
  bool strict = false;
  po::options_description d("sparsim forward options");
  add_model_option(d, model);
  d.add_options()("tokens,t", po::value(&tokens_s)->required(),
                  "prompt token ids, comma separated")(
      "mode", po::value(&mode)->default_value("prefill"),
      "prefill: the prompt in one pass; decode: one token at a time through the KV cache")(
      "greedy", po::value(&greedy)->default_value(0), "greedy decode steps after the prompt")(
      "storage", po::value(&storage)->default_value("f32"), "weight storage: f32, bf16 or f16")(
      "strict", po::bool_switch(&strict), "NaN/Inf in the weights is an error, not a warning")(
      "out,o", po::value(&out), "run file (HDF5) with logits, greedy tokens, timings and FLOPs");
  add_common_options(d, co);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: sparsim forward [--model M] --tokens 1,2,3 [options]", d, vm))
    return 0;
  require(mode == "prefill" || mode == "decode", "--mode must be prefill or decode, got '{}'",
          mode);
  require(greedy >= 0, "--greedy must be non-negative, got {}", greedy);
  const std::vector<int> prompt = parse_int_list(tokens_s, "--tokens");
  model = resolve_model(model).path;
  LoadOptions lo;
  lo.storage = parse_dtype(storage);
  lo.strict = strict;
  io::guard_run({{"--model", model}}, {{"--out", out}});

  Runtime rt(co);
  const std::string backend = resolve_backend(co.backend);
  return with_backend(co.backend, [&](auto exec) {
    using E = decltype(exec);
    ModelInfo mi;
    Stopwatch sw;
    auto w = load_model<E>(model, lo, &mi);
    const double t_load = sw.seconds();
    const Config& c = w->cfg;
    const int T = static_cast<int>(prompt.size());
    for (int id : prompt)
      require(id >= 0 && id < c.vocab, "--tokens: id {} outside the vocabulary 0 … {}", id,
              c.vocab - 1);
    require(T + greedy <= c.context_length,
            "prompt ({}) + greedy steps ({}) exceed the model's context of {} tokens", T, greedy,
            c.context_length);
    std::unique_ptr<io::RunFile> rf;
    if (!out.empty()) rf = std::make_unique<io::RunFile>(out);

    flops::Ledger ledger;
    Engine<E> eng(w, 1, T + greedy, &ledger, exec);
    std::vector<float> logits;
    sw.reset();
    if (mode == "prefill") {
      logits = to_host(eng.forward({prompt}, 0, true));
    } else {
      for (int t = 0; t < T; ++t) {
        auto l = to_host(eng.forward({{prompt[t]}}, t, true));
        logits.insert(logits.end(), l.begin(), l.end());
      }
    }
    const double t_prompt = sw.seconds();
    std::vector<int> gen;
    std::vector<float> gen_logits;
    int next = argmax(logits.data() + static_cast<std::size_t>(T - 1) * c.vocab, c.vocab);
    sw.reset();
    for (int g = 0; g < greedy; ++g) {
      gen.push_back(next);
      auto l = to_host(eng.forward({{next}}, T + g, true));
      gen_logits.insert(gen_logits.end(), l.begin(), l.end());
      next = argmax(l.data(), c.vocab);
    }
    const double t_gen = sw.seconds();

    std::cout << fmt::format("model {} ({} layers, d={}, vocab {}), {} prompt tokens, {} greedy\n",
                             mi.path, c.n_layer, c.d_model, c.vocab, T, greedy);
    std::cout << fmt::format("prompt: {:.3f} s, greedy: {:.3f} s, load: {:.3f} s\n", t_prompt,
                             t_gen, t_load);
    if (!gen.empty())
      std::cout << "greedy tokens: " << fmt::format("{}", fmt::join(gen, ",")) << "\n";

    if (rf) {
      io::Group root = rf->root();
      write_run_header(root, argc, argv, backend, rt.threads(), mi, c, lo.storage);
      io::Group res = root.create_group("results");
      res.set_attr("mode", mode);
      res.write<std::int32_t>("prompt_tokens",
                              std::vector<std::int32_t>(prompt.begin(), prompt.end()),
                              {"", "prompt token ids"});
      res.write<float>("prompt_logits", logits.data(),
                       {static_cast<hsize_t>(T), static_cast<hsize_t>(c.vocab)},
                       {"logit", "logits after each prompt position"});
      if (greedy > 0) {
        res.write<std::int32_t>("greedy_tokens", std::vector<std::int32_t>(gen.begin(), gen.end()),
                                {"", "greedy continuation (argmax of raw logits)"});
        res.write<float>("greedy_logits", gen_logits.data(),
                         {static_cast<hsize_t>(greedy), static_cast<hsize_t>(c.vocab)},
                         {"logit", "logits after each greedy token"});
      }
      io::Group tm = root.create_group("timings");
      tm.write_scalar("load_seconds", t_load, {"s", "model load and dequantization"});
      tm.write_scalar("prompt_seconds", t_prompt, {"s", "prompt forward pass(es)"});
      tm.write_scalar("greedy_seconds", t_gen, {"s", "greedy decode steps"});
      io::Group fl = root.create_group("flops");
      ledger.write(fl);
      interruption_point("write");
      rf->commit();
    }
    return 0;
  });
}

}  // namespace sparsim::app
