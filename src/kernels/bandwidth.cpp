#include "kernels/bandwidth.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>

namespace sparsim::kernels {

std::pair<double, std::string> last_level_cache() {
  double best = 0;
  std::string where;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
    std::ifstream sz(dir + "/size"), lv(dir + "/level");
    std::string s;
    int level = 0;
    if (!(sz >> s) || !(lv >> level)) continue;
    double v = std::atof(s.c_str());
    if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) v *= 1024;
    if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) v *= 1024 * 1024;
    if (v > best) {
      best = v;
      where = fmt::format("{}/size (L{} of cpu0: {})", dir, level, s);
    }
  }
  return {best, where};
}

std::size_t host_stream_bytes() {
  const double llc = last_level_cache().first;
  return static_cast<std::size_t>(
      std::min(1024.0 * 1024 * 1024, std::max(256.0 * 1024 * 1024, 4 * llc)));
}

}  // namespace sparsim::kernels
