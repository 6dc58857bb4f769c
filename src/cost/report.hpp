#pragma once
/// What `sparsim predict` reports: predicted time per op, layer and phase, tokens/s and the
/// speedup of the run's method over dense on a hardware profile, and, for a run file that holds
/// measured per-op times (`sparsim bench --out`), predicted against measured.
#include "cost/hardware.hpp"
#include "cost/roofline.hpp"
#include "flops/ledger_file.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace sparsim::cost {

/// The prediction as JSON: run, hardware, precision; per phase (calls, tokens, seconds,
/// dense_seconds, seconds_per_call, tokens_per_s, dense_tokens_per_s, speedup_vs_dense);
/// prefill_tokens_per_s, decode_tokens_per_s, speedup_vs_dense ({phase: x, "total": x});
/// per_op and per_layer lists; notes; and "validation" when the run holds measured times.
/// `hardware_note` says how the profile was applied (thread count), may be empty.
nlohmann::ordered_json prediction_json(const flops::LedgerFile& lf, const HardwareProfile& hw,
                                       const Prediction& pr, const std::string& hardware_note);

/// The same for the terminal (rendered from prediction_json's object); `by_layer` adds the
/// per-layer table.
std::string prediction_text(const nlohmann::ordered_json& j, bool by_layer);

}  // namespace sparsim::cost
