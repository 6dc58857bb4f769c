#include "core/error.hpp"
#include "core/log.hpp"
#include "core/types.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace sparsim {

std::string to_string(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "fp32" || s == "float32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "fp16" || s == "float16") return DType::F16;
  fail("unknown storage type '{}' (expected f32, bf16 or f16)", s);
}

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("sparsim");
    l->set_pattern("[%n] %^%l%$: %v");
    return l;
  }();
  return *logger;
}

void set_log_level(const std::string& level) {
  auto lv = spdlog::level::from_str(level);
  if (lv == spdlog::level::off && level != "off") fail("unknown log level '{}'", level);
  log().set_level(lv);
}

}  // namespace sparsim
