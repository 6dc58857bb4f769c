// sparsim flops: the FLOP accounting report of one or more run files (dense against realised
// FLOPs and bytes per phase, op and layer; what a method adds), as tables, CSV, JSON or Markdown.
#include "common.hpp"
#include "flops/ledger_file.hpp"
#include "flops/report.hpp"
#include "io/run_file.hpp"

#include <nlohmann/json.hpp>

#include <iostream>

namespace sparsim::app {

int cmd_flops(int argc, char** argv) {
  std::vector<std::string> files;
  std::string by = "op", out;
  bool json = false, csv = false, markdown = false;
  po::options_description d("sparsim flops options");
  d.add_options()("run", po::value(&files)->multitoken(),
                  "run files (HDF5) of sparsim forward, eval or bench --out; several are shown "
                  "side by side")("by", po::value(&by)->default_value("op"),
                                  "table rows: op (per phase and op) or layer (per phase and "
                                  "layer); JSON and CSV always hold both")(
      "json", po::bool_switch(&json),
      "JSON: per phase dense_flops, realised_flops, dense_bytes, realised_bytes, launches, calls, "
      "tokens, intensities and method overhead, per op (\"ops\") and per layer (\"layers\") the "
      "same; one run: that object, several: {\"runs\": [...]}")(
      "csv", po::bool_switch(&csv),
      "CSV, one row per run, phase, op and layer entry with launches")(
      "markdown", po::bool_switch(&markdown), "Markdown tables")(
      "out,o", po::value(&out), "write the report to this file (atomically) instead of stdout");
  po::positional_options_description pos;
  pos.add("run", -1);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: sparsim flops RUN.h5 [RUN2.h5 ...] [--by op|layer] [--json|--csv|--markdown] "
             "[--out FILE]\n\n"
             "The FLOP / byte ledger of a run: per phase (prefill, decode), op and layer, the "
             "FLOPs and bytes a dense run would need against those the run realised, arithmetic "
             "intensity (FLOP per byte), and the ops a method adds that a dense run does not "
             "have (marked +: mask selection, rotation, similarity tests, channel selection, "
             "...).",
             d, vm, &pos))
    return 0;
  require(!files.empty(), "no run file given (usage: sparsim flops RUN.h5 [RUN2.h5 ...])");
  require(by == "op" || by == "layer", "--by must be op or layer, got '{}'", by);
  require(int(json) + int(csv) + int(markdown) <= 1,
          "--json, --csv and --markdown exclude each other");
  std::vector<flops::LedgerFile> runs;
  for (const std::string& f : files) runs.push_back(flops::read_ledger_file(f));

  std::string text;
  if (json) {
    if (runs.size() == 1) {
      text = io::json_file_text(flops::report_json(runs[0]));
    } else {
      nlohmann::ordered_json j = {{"runs", nlohmann::ordered_json::array()}};
      for (const auto& r : runs) j["runs"].push_back(flops::report_json(r));
      text = io::json_file_text(j);
    }
  } else if (csv) {
    text = flops::report_csv(runs);
  } else if (markdown) {
    text = flops::report_markdown(runs, by == "layer");
  } else {
    text = flops::report_text(runs, by == "layer");
  }
  if (out.empty())
    std::cout << text;
  else
    io::write_file_atomically(out, text);
  return 0;
}

}  // namespace sparsim::app
