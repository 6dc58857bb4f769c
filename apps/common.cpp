#include "common.hpp"

#include "core/log.hpp"

#include <iostream>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace sparsim::app {

void add_common_options(po::options_description& d, CommonOptions& c) {
  d.add_options()
      ("backend", po::value(&c.backend)->default_value("default"),
       "execution backend: serial, openmp, cuda, or default (the build's default)")
      ("threads", po::value(&c.threads)->default_value(0),
       "host threads for OpenMP and BLAS (0: OMP_NUM_THREADS, else all cores)")
      ("log-level", po::value(&c.log_level)->default_value("info"),
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

}  // namespace sparsim::app
