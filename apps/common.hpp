#pragma once
// Shared plumbing of the sparsim subcommands: option parsing, Kokkos start-up, backend choice.
#include "core/compat.hpp"
#include "core/error.hpp"
#include "eval/corpus.hpp"

#include <Kokkos_Core.hpp>
#include <boost/program_options.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace sparsim::app {

namespace po = boost::program_options;

/// Median of `v` (the mean of the middle two for an even count); 0 for none.
inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Options every compute subcommand takes.
struct CommonOptions {
  std::string backend;  ///< serial | openmp | cuda | default
  int threads = 0;      ///< host threads (0: OMP_NUM_THREADS or all cores)
  std::string log_level = "info";
};

void add_common_options(po::options_description& d, CommonOptions& c);

/// The model option of every command that reads a model (-m/--model, default smollm2): a GGUF
/// file, a Hugging Face directory or an alias, resolved by resolve_model. `role` names it in
/// the help ("model", "the full model", ...).
void add_model_option(po::options_description& d, std::string& model,
                      const std::string& role = "model");

/// Parses argv (after the subcommand name); prints help and returns false for --help.
/// Throws sparsim::Error for unknown or malformed options.
bool parse(int argc, char** argv, const std::string& usage, po::options_description& desc,
           po::variables_map& vm, const po::positional_options_description* pos = nullptr);

/// Adds --check-options: the command checks its options as usual, prints them (defaults
/// included) as one JSON object on stdout and stops before reading any input file or starting
/// Kokkos. `sparsim sweep` checks every point this way before anything runs.
void add_check_option(po::options_description& d);
/// True (after printing the options) when --check-options was given: the command returns 0.
bool options_checked(const po::variables_map& vm);

/// Starts Kokkos (and sets the BLAS / OpenMP thread count) for the lifetime of the object.
class Runtime {
 public:
  explicit Runtime(const CommonOptions& c);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  int threads() const { return threads_; }

 private:
  int threads_ = 1;
};

/// Parses "1,2,3" into token ids.
std::vector<int> parse_int_list(const std::string& s, const std::string& what);
/// "0.2,0.4" → {0.2, 0.4}; `what` names the option in the error for a non-number or an empty list.
std::vector<double> parse_double_list(const std::string& s, const std::string& what);

/// "a,b,c" → {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split_list(const std::string& s);

/// Name of the backend actually selected ("serial", "openmp", "cuda").
std::string resolve_backend(const std::string& requested);

/// Calls f(ExecSpace{}) for the selected backend.
template <class F>
int with_backend(const std::string& requested, F&& f) {
  const std::string b = resolve_backend(requested);
#ifdef KOKKOS_ENABLE_CUDA
  if (b == "cuda") return f(Kokkos::Cuda());
#endif
#ifdef KOKKOS_ENABLE_OPENMP
  if (b == "openmp") return f(Kokkos::OpenMP());
#endif
#ifdef KOKKOS_ENABLE_SERIAL
  if (b == "serial") return f(Kokkos::Serial());
#endif
  fail("backend '{}' is not enabled in this build", b);
}

/// Enabled backends, comma separated.
std::string enabled_backends();

/// The corpus --corpus names (load_corpus), with its errors naming the option.
Corpus load_corpus_arg(const std::string& spec, const CorpusOptions& opt);

/// The path a --corpus argument reads: the installed corpus for "default" ("" when there is
/// none: loading then says so), else the argument itself.
std::string corpus_input_path(const std::string& spec);

/// A model argument resolved to a path: a file or directory, or a known alias ("smollm2").
struct ResolvedModel {
  std::string path;
  std::string origin;  ///< how it was found, for the user
};
ResolvedModel resolve_model(const std::string& spec);

/// Progress with elapsed time and ETA on stderr: a bar redrawn in place (terminals), or one
/// line per tenth of the work and at least every minute (logs: redirected output, batch jobs).
class ProgressBar {
 public:
  enum class Mode { Off, Bar, Lines };
  ProgressBar(std::string label, bool enabled)
      : ProgressBar(std::move(label), enabled ? Mode::Bar : Mode::Off) {}
  ProgressBar(std::string label, Mode mode);
  /// `detail` (e.g. a running loss and rate) is shown after the counts.
  void update(int done, int total, const std::string& detail = "");
  void finish();

 private:
  std::string label_;
  Mode mode_;
  double t0_;
  bool drawn_ = false;
  int last_tenth_ = -1;
  double last_line_ = 0;
};

/// The progress mode of --progress `arg` (auto, always, never, lines; anything else throws):
/// auto is a bar on a terminal and `otherwise` elsewhere.
ProgressBar::Mode progress_mode(const std::string& arg, ProgressBar::Mode otherwise);

/// --bf16-compute's help, shared by the commands that run a model.
inline constexpr const char* kBf16ComputeHelp =
    "with --storage bf16: prefill (multi-token) products in bf16 arithmetic — rows rounded to "
    "bf16, fp32 accumulation: oneDNN's bf16 matmul on the host (AVX-512; faster, as llama.cpp "
    "computes bf16 models), cuBLAS on a GPU's tensor cores (there also the prefill attention's "
    "products in TF32); decode stays fp32 x bf16";

/// The command-line option of each setting the library's checks name (OptionError::key), e.g.
/// "token_filter.ratio" → "--tf-ratio".
const std::string* option_of_setting(const std::string& key);

/// Runs `f` (a library check of settings the user gave as options); an OptionError of a setting
/// that has an option is raised again as an Error naming the option: "--tf-ratio must be …"
/// (with a fix: "… (--storage bf16)"), a UsageError (exit status 2) where the setting cannot
/// work on this command line.
template <class F>
void check_as_options(F&& f) {
  try {
    f();
  } catch (const OptionError& e) {
    const std::string* flag = option_of_setting(e.key());
    if (!flag) throw;
    const std::string* fix = option_of_setting(e.fix().key);
    const std::string msg = OptionError::join(*flag, e.rest()) +
                            OptionError::fix_text(fix ? *fix : e.fix().name, e.fix());
    if (e.usage()) throw UsageError(msg);
    throw Error(msg);
  }
}

}  // namespace sparsim::app
