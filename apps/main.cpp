// sparsim: simulate and evaluate sparse and pruned Llama inference.
#include "core/blas_core.hpp"
#include "core/device_blas.hpp"
#include "core/error.hpp"
#include "core/interrupt.hpp"

#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>

namespace sparsim::app {
int cmd_inspect(int argc, char** argv);
int cmd_synth(int argc, char** argv);
int cmd_forward(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_calibrate(int argc, char** argv);
int cmd_profile(int argc, char** argv);
int cmd_flops(int argc, char** argv);
int cmd_predict(int argc, char** argv);
int cmd_probe(int argc, char** argv);
int cmd_sweep(int argc, char** argv);
int cmd_collect(int argc, char** argv);
int cmd_prune(int argc, char** argv);
int cmd_compare(int argc, char** argv);
int cmd_recover(int argc, char** argv);
}  // namespace sparsim::app

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

const Command kCommands[] = {
    {"eval", sparsim::app::cmd_eval,
     "perplexity over sliding windows and multiple-choice tasks (run file + JSON summary)"},
    {"compare", sparsim::app::cmd_compare,
     "perplexity of several sparsity configurations on the same windows, dense context shared"},
    {"calibrate", sparsim::app::cmd_calibrate,
     "activation statistics, greedy allocation, sensitivities and WINA rotation for sparsity"},
    {"profile", sparsim::app::cmd_profile,
     "block sensitivity profile e_i and the budgets it implies (run file, table, PNG plot)"},
    {"prune", sparsim::app::cmd_prune,
     "RAP / KVPruner KV pruning from Fisher scores, written as a smaller GGUF model"},
    {"recover", sparsim::app::cmd_recover,
     "LoRA recovery of a pruned model, distilled from the model it was pruned from (GGUF)"},
    {"generate", sparsim::app::cmd_generate, "greedy or sampled text from a prompt"},
    {"inspect", sparsim::app::cmd_inspect,
     "show a model file's metadata, tensors and memory needs; check them against each other"},
    {"synth", sparsim::app::cmd_synth, "write a seeded random Llama model to a GGUF file"},
    {"forward", sparsim::app::cmd_forward,
     "run the forward pass on token ids (prefill, decode, greedy steps) into a run file"},
    {"bench", sparsim::app::cmd_bench,
     "prefill and decode speed, and decode against memory bandwidth"},
    {"flops", sparsim::app::cmd_flops,
     "FLOP accounting of run files: dense vs realised FLOPs and bytes per phase, op and layer"},
    {"predict", sparsim::app::cmd_predict,
     "predicted time, tokens/s and speedup of a run on a hardware profile (roofline)"},
    {"probe", sparsim::app::cmd_probe,
     "measure this machine's bandwidth, GEMM/GEMV rates and launch cost: a hardware profile"},
    {"sweep", sparsim::app::cmd_sweep,
     "run a grid of evaluations from a spec: resumable, under MPI or as a Slurm job array"},
    {"collect", sparsim::app::cmd_collect,
     "merge a sweep's finished points into results.h5 and results.csv"},
};

void usage(std::ostream& os) {
  os << "usage: sparsim <command> [options]   (sparsim <command> --help for its options)\n\n"
     << "commands:\n";
  for (const auto& c : kCommands)
    os << "  " << c.name << std::string(10 - std::strlen(c.name), ' ') << c.help << "\n";
  os << "\nsparsim " << SPARSIM_VERSION << "\n";
}

}  // namespace

namespace sparsim::app {
/// The function of a subcommand, or null (sparsim sweep runs other subcommands' option checks).
int (*command_function(const std::string& name))(int, char**) {
  for (const auto& c : kCommands)
    if (name == c.name) return c.run;
  return nullptr;
}
}  // namespace sparsim::app

int main(int argc, char** argv) {
  sparsim::select_blas_core(argv);
  if (argc < 2) {
    usage(std::cerr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage(std::cout);
    return 0;
  }
  if (cmd == "--version") {
    std::cout << "sparsim " << SPARSIM_VERSION << "\n";
    return 0;
  }
  for (const auto& c : kCommands) {
    if (cmd != c.name) continue;
    sparsim::install_interrupt_handlers("sparsim " + cmd);
    // Exit status: 0 done, 1 error, 2 unusable command line (e.g. an output that is an input),
    // 3 internal error, 128 + signal when interrupted (130 SIGINT, 143 SIGTERM).
    auto interrupted = [&](int sig) {
      std::cerr << sparsim::interrupt::message(sig) << "\n";
      return 128 + sig;
    };
    try {
      const int rc = c.run(argc - 1, argv + 1);
      // A signal after the last interruption point (while the outputs were committed).
      if (const int sig = sparsim::interrupt_signal()) return interrupted(sig);
      return rc;
    } catch (const sparsim::Interrupted& e) {
      return interrupted(e.signal());
    } catch (const sparsim::UsageError& e) {
      std::cerr << "sparsim " << cmd << ": error: " << e.what() << "\n";
      return 2;
    } catch (const sparsim::Error& e) {
      if (const int sig = sparsim::interrupt_signal()) return interrupted(sig);
      std::cerr << "sparsim " << cmd << ": error: " << e.what() << "\n";
      return 1;
    } catch (const std::exception& e) {
      if (const int sig = sparsim::interrupt_signal()) return interrupted(sig);
      // Kokkos reports an allocation it could not make (size and label in its message)
      const std::string what = e.what();
      if (what.find("failed to allocate") != std::string::npos ||
          dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
        std::cerr << "sparsim " << cmd << ": error: out of memory: " << what;
        double free_b = 0, total_b = 0;
        if (sparsim::device_blas::memory_info(free_b, total_b))
          std::cerr << fmt::format(" ({:.2f} GiB of the GPU's {:.2f} GiB free)",
                                   free_b / (1 << 30), total_b / (1 << 30));
        std::cerr << "\n";
        return 1;
      }
      std::cerr << "sparsim " << cmd << ": internal error: " << what << "\n";
      return 3;
    }
  }
  std::cerr << "sparsim: unknown command '" << cmd << "'\n\n";
  usage(std::cerr);
  return 2;
}
