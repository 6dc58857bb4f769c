#pragma once
/// The parts of a `--method` value: one method of each family joined by '+'
/// (e.g. "topk-guided+token-filter+grace"). Empty parts are kept, so that callers can refuse them.
#include <string>
#include <vector>

namespace sparsim {

inline std::vector<std::string> method_parts(const std::string& method) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t plus = method.find('+', start);
    parts.push_back(method.substr(start, plus == std::string::npos ? plus : plus - start));
    if (plus == std::string::npos) return parts;
    start = plus + 1;
  }
}

}  // namespace sparsim
