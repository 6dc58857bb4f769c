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
#include <vector>

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
  const char* example;  ///< one command line that works after scripts/setup.sh
};

struct Group {
  const char* title;
  std::vector<Command> commands;
};

// The commands grouped by what a user wants to do, in the order of a first session.
const std::vector<Group> kGroups = {
    {"evaluate a method (perplexity, tasks, long context; realised against target, FLOPs, bytes)",
     {{"eval", sparsim::app::cmd_eval,
       "perplexity over sliding windows, tasks, retrieval; run file + JSON summary",
       "sparsim eval --method token-filter --tf-ratio 0.3 --max-windows 4 --json tf.json"},
      {"compare", sparsim::app::cmd_compare,
       "several activation-sparsity configurations on the same windows, dense context shared",
       "sparsim compare --calibration cal.h5 --config 'teal: --method teal --sparsity 0.5'"},
      {"generate", sparsim::app::cmd_generate, "greedy or sampled text from a prompt",
       "sparsim generate --chat --prompt 'Name three plays by Shakespeare.' -n 40"}}},
    {"calibrate and profile",
     {{"calibrate", sparsim::app::cmd_calibrate,
       "activation statistics, allocation, sensitivities, WINA rotation; --fisher: KV Fisher "
       "scores",
       "sparsim calibrate --variants plain --out cal.h5"},
      {"profile", sparsim::app::cmd_profile,
       "block sensitivity profile e_i and the budgets it implies (run file, table, PNG plot)",
       "sparsim profile --calibration cal.h5 --out p.h5 --plot p.png"}}},
    {"prune and recover (smaller models every command runs)",
     {{"prune", sparsim::app::cmd_prune,
       "RAP / KVPruner KV pruning from Fisher scores, written as a smaller GGUF model",
       "sparsim prune --method rap --retain 0.7 --calibration fisher.h5 --out rap.gguf"},
      {"recover", sparsim::app::cmd_recover,
       "LoRA recovery of a pruned model, distilled from the model it was pruned from",
       "sparsim recover --model rap.gguf --teacher smollm2 --steps 100 --out rap-r.gguf"}}},
    {"sweep a grid (resumable; MPI, Slurm)",
     {{"sweep", sparsim::app::cmd_sweep,
       "run a grid of evaluations from a TOML spec, under MPI or as a Slurm job array",
       "sparsim sweep data/sweeps/demo.toml --plan"},
      {"collect", sparsim::app::cmd_collect,
       "merge a sweep's finished points into results.h5 and results.csv",
       "sparsim collect data/sweeps/demo.toml"}}},
    {"report (FLOPs, bytes, predicted time; pages: scripts/report.py)",
     {{"flops", sparsim::app::cmd_flops,
       "FLOP accounting of run files: dense vs realised FLOPs and bytes per phase, op, layer",
       "sparsim flops out/eval.h5 --by layer"},
      {"predict", sparsim::app::cmd_predict,
       "predicted time, tokens/s and speedup of a run on a hardware profile (roofline)",
       "sparsim predict out/eval.h5 --hardware a100-80gb"}}},
    {"benchmark this machine",
     {{"bench", sparsim::app::cmd_bench,
       "prefill and decode speed, a method's decode against dense, decode against bandwidth",
       "sparsim bench --prompt 512 --decode 64"},
      {"probe", sparsim::app::cmd_probe,
       "measure bandwidth, GEMM/GEMV rates and launch cost: a hardware profile for predict",
       "sparsim probe --out local.json"}}},
    {"model files",
     {{"inspect", sparsim::app::cmd_inspect,
       "a model file's metadata, tensors and memory needs, checked against each other",
       "sparsim inspect smollm2"},
      {"synth", sparsim::app::cmd_synth, "write a seeded random Llama model to a GGUF file",
       "sparsim synth --preset tiny --out tiny.gguf"},
      {"forward", sparsim::app::cmd_forward,
       "the forward pass on token ids (prefill, decode, greedy steps) into a run file",
       "sparsim forward --tokens 1,2,3 --greedy 4 --out f.h5"}}},
};

void usage(std::ostream& os) {
  os << "usage: sparsim <command> [options]   (sparsim <command> --help for its options)\n"
     << "every command that reads a model takes --model (a GGUF file, a Hugging Face folder or\n"
     << "the alias smollm2, the default)\n";
  for (const auto& g : kGroups) {
    os << "\n" << g.title << ":\n";
    for (const auto& c : g.commands)
      os << "  " << c.name << std::string(11 - std::strlen(c.name), ' ') << c.help << "\n"
         << std::string(13, ' ') << "e.g. " << c.example << "\n";
  }
  os << "\nsparsim " << SPARSIM_VERSION << "\n";
}

const Command* find_command(const std::string& name) {
  for (const auto& g : kGroups)
    for (const auto& c : g.commands)
      if (name == c.name) return &c;
  return nullptr;
}

}  // namespace

namespace sparsim::app {
/// The function of a subcommand, or null (sparsim sweep runs other subcommands' option checks).
int (*command_function(const std::string& name))(int, char**) {
  const Command* c = find_command(name);
  return c != nullptr ? c->run : nullptr;
}
}  // namespace sparsim::app

int main(int argc, char** argv) {
  sparsim::select_blas_core(argv);
  if (argc < 2) {  // a first try: what sparsim does, grouped, with an example of each command
    usage(std::cout);
    return 0;
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
  if (const Command* found = find_command(cmd)) {
    const Command& c = *found;
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
      // a setting that cannot work here, in the library's words (e.g. from a sweep's TOML file)
      const auto* oe = dynamic_cast<const sparsim::OptionError*>(&e);
      return oe && oe->usage() ? 2 : 1;
    } catch (const std::exception& e) {
      if (const int sig = sparsim::interrupt_signal()) return interrupted(sig);
      // Kokkos reports an allocation it could not make (size and label in its message)
      const std::string what = e.what();
      if (what.find("failed to allocate") != std::string::npos ||
          dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
        std::cerr << "sparsim " << cmd << ": error: out of memory: " << what;
        double free_b = 0, total_b = 0;
        if (sparsim::device_blas::memory_info(free_b, total_b))
          std::cerr << fmt::format(" ({:.2f} GiB of the GPU's {:.2f} GiB free)", free_b / (1 << 30),
                                   total_b / (1 << 30));
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
