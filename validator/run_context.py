"""The run context: this validator process's settings (state dir, HF cache budget, secrets), one
process-wide value that the entrypoint builds once from its options, for the module and the kit
(`current_run()`); outside a run it reads their variables on every call. Why it is a value and
not os.environ or a context variable: docs/internals.md, "The run context".
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
