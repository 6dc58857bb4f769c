// sparsim generate: greedy or sampled text from a prompt.
#include "common.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "engine/engine.hpp"
#include "method_stack.hpp"
#include "model/loader.hpp"
#include "model/synth.hpp"
#include "model_io.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>

namespace sparsim::app {

namespace {

/// Picks the next token: argmax at temperature 0, else top-k / top-p sampling.
int sample(const std::vector<float>& logits, float temperature, int top_k, float top_p,
           SynthRng& rng) {
  const int V = static_cast<int>(logits.size());
  if (temperature <= 0.0f)
    return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  const int k = top_k > 0 ? std::min(top_k, V) : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  idx.resize(k);
  std::vector<double> p(k);
  const double mx = logits[idx[0]];
  double z = 0;
  for (int i = 0; i < k; ++i) z += (p[i] = std::exp((logits[idx[i]] - mx) / temperature));
  double cum = 0;
  int keep = k;
  for (int i = 0; i < k; ++i) {
    p[i] /= z;
    cum += p[i];
    if (cum >= top_p) {
      keep = i + 1;
      break;
    }
  }
  double total = 0;
  for (int i = 0; i < keep; ++i) total += p[i];
  double u = rng.uniform() * total;
  for (int i = 0; i < keep; ++i) {
    u -= p[i];
    if (u <= 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  CommonOptions co;
  std::string model_arg, prompt, storage;
  int max_tokens = 64, top_k = 40;
  float temperature = 0.0f, top_p = 0.95f;
  std::uint64_t seed = 1;
  bool chat = false, strict = false, bf16_compute = false;
  MethodArgs ma;
  po::options_description d("sparsim generate options");
  add_model_option(d, model_arg);
  d.add_options()("prompt,p", po::value(&prompt)->required(), "prompt text")(
      "chat", po::bool_switch(&chat), "wrap the prompt in the ChatML template (instruct models)")(
      "max-tokens,n", po::value(&max_tokens)->default_value(64), "tokens to generate")(
      "temperature", po::value(&temperature)->default_value(0.0f), "0: greedy; > 0: sampling")(
      "top-k", po::value(&top_k)->default_value(40), "sample among the k most likely (0: all)")(
      "top-p", po::value(&top_p)->default_value(0.95f), "nucleus probability mass")(
      "seed", po::value(&seed)->default_value(1), "sampling seed")(
      "storage", po::value(&storage)->default_value("f32"), "weight storage: f32, bf16 or f16")(
      "bf16-compute", po::bool_switch(&bf16_compute), kBf16ComputeHelp)(
      "strict", po::bool_switch(&strict), "NaN/Inf in the weights is an error");
  ma.add_options(d);
  add_common_options(d, co);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: sparsim generate --prompt TEXT [options]", d, vm)) return 0;
  require(max_tokens >= 1, "--max-tokens must be positive, got {}", max_tokens);
  require(temperature >= 0 && std::isfinite(temperature), "--temperature must be >= 0");
  require(top_p > 0 && top_p <= 1, "--top-p must be in (0, 1], got {}", top_p);
  require(top_k >= 0, "--top-k must be >= 0, got {}", top_k);
  ma.resolve(&vm);
  LoadOptions lo;
  lo.storage = parse_dtype(storage);
  lo.strict = strict;
  lo.bf16_compute = bf16_compute;
  check_as_options([&] { check_load_options(lo); });
  const ResolvedModel rm = resolve_model(model_arg);
  Runtime rt(co);  // (sets the log level)
  log().info("model {} ({})", rm.path, rm.origin);
  return with_backend(co.backend, [&](auto exec) {
    using E = decltype(exec);
    ModelInfo mi;
    std::shared_ptr<const Weights<E>> w;
    check_as_options([&] { w = load_model<E>(rm.path, lo, &mi); });
    const sparsity::Plan plan = prepare_method(ma, mi, w, lo.storage);
    const Config& c = w->cfg;
    const Tokenizer tok = tokenizer_for(rm.path);
    std::string text = prompt;
    if (chat) text = "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n";
    std::vector<int> ids = tok.encode(text, tok.add_bos_default() && tok.bos_id() >= 0);
    require(!ids.empty(), "the prompt encodes to no tokens");
    const int T = static_cast<int>(ids.size());
    require(T + max_tokens <= c.context_length,
            "prompt ({} tokens) + --max-tokens {} exceed the model's context of {}", T, max_tokens,
            c.context_length);
    Engine<E> eng(w, 1, T + max_tokens, nullptr, exec);
    MethodStack<E> stack(ma, eng, plan, {T + max_tokens, T});
    SynthRng rng(seed);
    Stopwatch sw;
    auto to_vec = [](const Mat<E>& m) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
      return std::vector<float>(h.data(), h.data() + h.size());
    };
    std::vector<float> logits = to_vec(eng.forward({ids}, 0, false));
    const double t_prefill = sw.seconds();
    sw.reset();
    std::vector<int> out;
    std::cout << prompt << (chat ? "\n" : "") << std::flush;
    for (int g = 0; g < max_tokens; ++g) {
      const int next = sample(logits, temperature, top_k, top_p, rng);
      if (next == tok.eos_id()) break;
      out.push_back(next);
      std::cout << tok.decode_token(next) << std::flush;
      if (g + 1 < max_tokens) logits = to_vec(eng.forward({{next}}, T + g, false));
    }
    std::cout << "\n";
    const double t_gen = sw.seconds();
    log().info(
        "{} prompt tokens in {:.2f} s ({:.1f} tok/s); {} generated in {:.2f} s ({:.1f} tok/s)", T,
        t_prefill, T / t_prefill, out.size(), t_gen, out.empty() ? 0.0 : out.size() / t_gen);
    stack.log_records(stack.records());
    return 0;
  });
}

}  // namespace sparsim::app
