"""Development tooling, never part of a module image: the Fed Ledger simulator, a local
HuggingFace-style hub, tiny real models and repos built on the spot, and the helpers that run
the validator and its images the way the tests, the benchmarks and the demos do.

It is installed with the repository (`make install`: `pip install -e .`), so tests, `bench/`
and `scripts/` import it by name.
"""

from pathlib import Path

# The checkout this package lives in (an editable install keeps it there): computed once, in
# validator/spec.py.
from validator.spec import REPO_ROOT

HERE = Path(__file__).resolve().parent
# The sample data sets the dev tools, demos, benches and tests read (chat and function-calling
# JSONL): dev data, so it lives here, not under tests/.
DATA_DIR = HERE / "data"
# The folder holding a second `modules/` namespace part with the test module `fixture` (its
# behaviour chosen by the submission's repo id): put on PYTHONPATH by the tools that run the
# validator against it, copied into a repo copy by docker_env.make_module_repo.
FIXTURE_MODULES = HERE / "fixtures"

__all__ = ["DATA_DIR", "FIXTURE_MODULES", "REPO_ROOT"]
