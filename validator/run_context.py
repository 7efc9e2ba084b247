"""The run context: the settings of this validator process, one value that the entrypoint builds
once from its options and hands to the module and the kit, beside the runtime scope of one
scoring (validator/scope.py).

    from validator.kit import current_run

    run = current_run()
    run.state_dir                  # where the journal lives; a module's data across runs too
    run.hf_cache_budget_bytes()    # --hf-cache-max-gb in bytes, or None
    run.secret("OPENAI_API_KEY")   # a secret of the module's spec, as normalised at start-up

The validator never writes its own `os.environ` to pass these between its parts: the command
line's options (`--state-dir`, `--hf-token`, ...) win over their variables only in this value.
Outside a run (`--check` is a run; tests, a notebook, a worker script are not) the value is read
from the environment on every call, so the variables keep working as the public inputs they are.

It is a process-wide value, not a context variable like the scope: a thread a module starts (a
pool of judge calls) must see it, and a new thread does not inherit context variables. A child
process gets nothing from it implicitly: what a child needs travels in the child's own env or
request, built from this value by the caller (validator/sandbox/child_process.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from validator.errors import ConfigError
from validator.options import HF_CACHE_BUDGET_ENV, STATE_DIR_ENV

BYTES_PER_GB = 10**9  # decimal, as `huggingface-cli scan-cache` and disk vendors count
DEFAULT_STATE_DIR = Path("state")


@dataclass(frozen=True)
class RunContext:
    state_dir: Path = DEFAULT_STATE_DIR
    hf_cache_max_gb: float | None = None  # over 0 and finite (the option's range)
    # By variable name, the ones that are set; None: read from the environment at each call
    # (outside a run). Never in a repr: the value may reach a log line.
    secrets: Mapping[str, str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        budget = self.hf_cache_max_gb
        if budget is not None and not 0 < budget < float("inf"):
            raise ConfigError(f"{HF_CACHE_BUDGET_ENV}={budget!r}: a number of GB over 0")

    def secret(self, name: str) -> str | None:
        """Secret `name` (an env var of the module's spec: HF_TOKEN, OPENAI_API_KEY), stripped;
        None when it is not set."""
        if self.secrets is not None:
            return self.secrets.get(name) or None
        return os.environ.get(name, "").strip() or None

    def hf_cache_budget_bytes(self) -> int | None:
        """The shared HF cache's budget in bytes (validator/outbound/hf_cache.py); None: none."""
        if self.hf_cache_max_gb is None:
            return None
        return max(1, int(self.hf_cache_max_gb * BYTES_PER_GB))

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> RunContext:
        """The settings as the variables give them (the command line's defaults where unset)."""
        env = os.environ if env is None else env
        raw = env.get(HF_CACHE_BUDGET_ENV, "").strip()
        budget = None
        if raw:
            try:
                budget = float(raw)
            except ValueError:
                budget = -1.0
            if not 0 < budget < float("inf"):
                raise ConfigError(
                    f"{HF_CACHE_BUDGET_ENV}={raw!r}: give the cache budget in GB, a number over 0"
                )
        return cls(Path(env.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR), budget)


_installed: RunContext | None = None


def current_run() -> RunContext:
    """The run context of this process: the entrypoint's, or the environment's outside a run."""
    return _installed if _installed is not None else RunContext.from_environment()


def install_run(context: RunContext | None) -> RunContext | None:
    """`context` is this process's run context from now on (the entrypoint, before the module
    starts; None: the environment's again); the one it replaces."""
    global _installed
    before, _installed = _installed, context
    return before


@contextmanager
def running(context: RunContext) -> Iterator[RunContext]:
    """`context` is this process's run context inside the block (a test, an embedding)."""
    before = install_run(context)
    try:
        yield context
    finally:
        install_run(before)
