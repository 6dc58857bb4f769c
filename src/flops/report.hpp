#pragma once
/// The FLOP accounting report of `sparsim flops`: per phase, op and layer, dense against
/// realised FLOPs and bytes, arithmetic intensity and the overheads a method adds (ops a dense
/// run does not have), for one run or several side by side.
#include "flops/ledger_file.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace sparsim::flops {

/// One run's report as JSON: run identity, and per phase the totals (dense_flops,
/// realised_flops, dense_bytes, realised_bytes, launches, calls, tokens, intensities, saved
/// fractions, method overhead), per op the same ("ops", ops with launches only) and per layer
/// slot ("layers").
nlohmann::ordered_json report_json(const LedgerFile& lf);

/// Terminal tables: one block per run (per op, or per layer with by_layer), then, for several
/// runs, realised FLOPs and bytes side by side per phase and op.
std::string report_text(const std::vector<LedgerFile>& runs, bool by_layer);

/// The same as Markdown tables.
std::string report_markdown(const std::vector<LedgerFile>& runs, bool by_layer);

/// Every non-empty ledger entry of every run, one CSV row each: run, file, method, phase, op,
/// layer, launches, dense_flops, realised_flops, dense_bytes, realised_bytes, method_overhead.
std::string report_csv(const std::vector<LedgerFile>& runs);

}  // namespace sparsim::flops
