"""Development tooling, never part of a module image: the Fed Ledger simulator, a local
HuggingFace-style hub, tiny real models and repos built on the spot, and the helpers that run
the validator and its images the way the tests, the benchmarks and the demos do.

It is installed with the repository (`make install`: `pip install -e .`), so tests, `bench/`
and `scripts/` import it by name.
"""

from pathlib import Path

# The checkout this package lives in (an editable install keeps it there).
REPO_ROOT = Path(__file__).resolve().parent.parent
