#pragma once
// The report generator (scripts/report.py, Python) as the commands call it: which interpreter and
// script, a check that they are usable, and running it.
#include <string>
#include <vector>

namespace sparsim::app {

/// The Python interpreter for scripts: $SPARSIM_PYTHON, else the virtual environment
/// scripts/setup.sh made (known at build time), else python3.
std::string report_python();
/// scripts/report.py: under $SPARSIM_SCRIPTS_DIR, else the source tree's scripts/.
std::string report_script();
/// Fails (sparsim::Error) unless the interpreter runs and imports what report.py needs; says
/// how to get them. Cheap: call it before long work whose result it will plot.
void check_report_tool();
/// Runs report.py with `args`; throws sparsim::Error with its output when it fails.
void run_report_tool(const std::vector<std::string>& args);

}  // namespace sparsim::app
