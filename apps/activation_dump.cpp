#include "activation_dump.hpp"

#include <algorithm>

namespace sparsim::app {

void DumpArgs::add_options(po::options_description& d) {
  d.add_options()("dump-layers", po::value(&layers_arg),
                  "dump projection inputs and their masks of these layers into the run file "
                  "(/activations), e.g. 0,5; needs a sparse --method and --out")(
      "dump-proj", po::value(&proj_arg)->default_value("q,k,v,o,gate,up,down"),
      "projections to dump: any of q, k, v, o, gate, up, down")(
      "dump-tokens", po::value(&tokens)->default_value(16),
      "sparsified rows dumped per layer and projection")(
      "dump-every", po::value(&every)->default_value(1),
      "dump every k-th sparsified row (in processing order), starting with the first");
}

void DumpArgs::resolve(const po::variables_map& vm, bool sparse, bool has_out, int n_layer) {
  const bool any_other = !vm["dump-proj"].defaulted() || !vm["dump-tokens"].defaulted() ||
                         !vm["dump-every"].defaulted();
  if (layers_arg.empty()) {
    require(!any_other, "--dump-proj, --dump-tokens and --dump-every need --dump-layers");
    require(vm.count("dump-layers") == 0, "--dump-layers: no layer given");
    return;
  }
  require(sparse, "--dump-layers needs a sparse --method (teal, wina or topk-guided)");
  require(has_out, "--dump-layers needs --out (the activations go into the run file)");
  require(tokens >= 1, "--dump-tokens must be >= 1, got {}", tokens);
  require(every >= 1, "--dump-every must be >= 1, got {}", every);
  layers = parse_int_list(layers_arg, "--dump-layers");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    require(layers[i] >= 0 && layers[i] < n_layer, "--dump-layers: layer {} outside 0 … {}",
            layers[i], n_layer - 1);
    require(std::find(layers.begin(), layers.begin() + static_cast<long>(i), layers[i]) ==
                layers.begin() + static_cast<long>(i),
            "--dump-layers: layer {} listed twice", layers[i]);
  }
  std::size_t i = 0;
  while (i <= proj_arg.size()) {
    std::size_t j = proj_arg.find(',', i);
    if (j == std::string::npos) j = proj_arg.size();
    const std::string name = proj_arg.substr(i, j - i);
    int found = -1;
    for (int p = 0; p < kNumProj; ++p)
      if (name == proj_name(static_cast<Proj>(p))) found = p;
    require(found >= 0, "--dump-proj: unknown projection '{}' (q, k, v, o, gate, up, down)", name);
    const Proj p = static_cast<Proj>(found);
    require(std::find(projs.begin(), projs.end(), p) == projs.end(),
            "--dump-proj: projection {} listed twice", name);
    projs.push_back(p);
    i = j + 1;
  }
}

const char* rule_name(MaskRule r) {
  switch (r) {
    case MaskRule::None:
      return "none";
    case MaskRule::Threshold:
      return "threshold";
    case MaskRule::TopK:
      return "topk";
    case MaskRule::Guided:
      break;
  }
  return "guided";
}

}  // namespace sparsim::app
