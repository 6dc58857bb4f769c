#pragma once
/// Hardware profiles for the roofline cost model: peak FLOP/s per precision, memory bandwidth,
/// L2 size and a per-kernel launch overhead, as data files (JSON) that cite the document every
/// number comes from: vendor datasheets for the GPUs in data/hardware/, measurements for the
/// profile `sparsim probe` writes of the machine at hand (see docs/cost-model.md).
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace sparsim::cost {

/// What `sparsim probe` measured at one host thread count.
struct ThreadRates {
  int threads = 0;
  double copy_bandwidth = 0;     ///< STREAM copy, bytes read + written per second
  double read_bandwidth = 0;     ///< streaming sum, bytes read per second
  double sgemm_flops = 0;        ///< sparsim's prefill GEMM (linear over many rows), FLOP/s
  double gemv_bandwidth = 0;     ///< sparsim's decode GEMV on weights past the LLC, bytes/s
  double launch_overhead_s = 0;  ///< an empty kernel launch + fence
  /// The memory roof at this thread count: the faster of the two streaming kernels.
  double memory_bandwidth() const {
    return read_bandwidth > copy_bandwidth ? read_bandwidth : copy_bandwidth;
  }
};

struct HardwareProfile {
  std::string name;         ///< "h200", "a100-80gb", "local", …
  std::string description;  ///< e.g. "NVIDIA H200 SXM 141 GB"
  std::string kind;         ///< "vendor" (datasheet figures) or "measured"
  std::string file;         ///< where it was loaded from
  std::vector<std::string> aliases;
  std::map<std::string, double> peak_flops;    ///< precision (fp32, tf32, bf16, fp16) → FLOP/s
  double memory_bandwidth = 0;                 ///< bytes/s
  double memory_bytes = 0;                     ///< device memory (0: not given)
  double l2_bytes = 0;                         ///< last-level on-chip cache
  double launch_overhead_s = 0;                ///< added once per kernel launch
  std::map<std::string, std::string> sources;  ///< field ("peak_flops.fp32", …) → document
  std::vector<ThreadRates> thread_rates;       ///< measured profiles: one row per thread count
  nlohmann::json raw;                          ///< the file as read

  /// Peak FLOP/s of `precision`; throws sparsim::Error naming the profile when absent.
  double peak(const std::string& precision) const;
  /// The profile as it applies at `threads` host threads: for a measured profile with a row for
  /// that count, its roofs (peak_flops.fp32 = sgemm_flops, memory_bandwidth, launch overhead);
  /// otherwise the profile itself. `note` (optional) says which was taken.
  HardwareProfile at_threads(int threads, std::string* note = nullptr) const;
  /// name, description, kind, file and the numbers, as JSON (for reports).
  nlohmann::ordered_json summary() const;
};

/// Parses and validates a profile. `origin` names the file in messages. Throws sparsim::Error
/// for malformed JSON, a wrong format tag, a missing or non-positive field, or a number without
/// a `sources` entry naming the document it comes from.
HardwareProfile parse_hardware_profile(const std::string& json_text, const std::string& origin);

/// Loads a profile by name ("h200", "A100-80GB", an alias from a profile's "aliases") from the
/// profile directories, or from a file when `name_or_path` names one (contains '/' or ends in
/// ".json"). Throws sparsim::Error for an unknown name, listing the known ones.
HardwareProfile load_hardware_profile(const std::string& name_or_path);

/// Directories searched for profiles by name: $SPARSIM_HARDWARE_DIR (':'-separated), then the
/// source tree's data/hardware.
std::vector<std::string> hardware_profile_dirs();

/// Names of the profiles found in hardware_profile_dirs(), sorted.
std::vector<std::string> available_hardware_profiles();

}  // namespace sparsim::cost
