"""`--shard K/N`: one of N workers sharing a list of task ids looks up only the ids at positions
K, K+N, K+2N, ... (0-based). The Fed Ledger limits lookups per key and task (one per 3 minutes),
so workers that share a key and ask for the same task only race each other; split, each task
has one worker asking. Only lookups are split: assignments already in a worker's journal (from
before a re-shard) are finished and submitted whatever their task.

Imported by the launcher too (it passes `--shard K/N` to worker K), so nothing heavy here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from validator.errors import ConfigError

SHARD_OPTION = "--shard / VALIDATOR_SHARD"
SHARD_ENV = "VALIDATOR_SHARD"
_FORM = re.compile(r"\s*([+-]?\d+)\s*/\s*([+-]?\d+)\s*")
# Task ids named in the start-up line and on the status page before "and N more".
SHOWN_IDS = 20


@dataclass(frozen=True)
class Shard:
    index: int  # K
    count: int  # N

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def pick(self, task_ids: list[str]) -> list[str]:
        """The task ids this shard looks up, in their order in `task_ids`."""
        return [task_id for position, task_id in enumerate(task_ids) if self._holds(position)]

    def _holds(self, position: int) -> bool:
        return position % self.count == self.index


def parse_shard(text: str) -> Shard:
    """`K/N` with 0 <= K < N; ConfigError (exit 2) naming the problem otherwise."""
    match = _FORM.fullmatch(text)
    if match is None:
        raise ConfigError(
            f"{SHARD_OPTION} {text!r} is not K/N: give two integers, e.g. 1/4 (worker 1 of 4)"
        )
    index, count = int(match[1]), int(match[2])
    if count < 1:
        raise ConfigError(f"{SHARD_OPTION} {text!r}: N (the number of shards) must be 1 or more")
    if not 0 <= index < count:
        raise ConfigError(
            f"{SHARD_OPTION} {text!r}: K must be from 0 to {count - 1} (0 <= K < N, counted from 0)"
        )
    return Shard(index, count)


def shard_task_ids(task_ids: list[str], shard: Shard | None) -> list[str]:
    """The task ids to look up: all of them without a shard, else the shard's; ConfigError when
    the shard holds none (an operator should not run a worker that would sit idle)."""
    if shard is None:
        return list(task_ids)
    picked = shard.pick(task_ids)
    if not picked:
        given = len(task_ids)
        raise ConfigError(
            f"{SHARD_OPTION} {shard} of the {given} task id{'s' if given != 1 else ''} holds "
            f"none: with N={shard.count} shards give at least {shard.index + 1} task ids, or "
            "run fewer workers"
        )
    return picked


def describe_lookups(task_ids: list[str], looked_up: list[str], shard: Shard | None) -> str:
    """What the start-up line and the status page say this validator looks up."""
    shown = ", ".join(looked_up[:SHOWN_IDS])
    if len(looked_up) > SHOWN_IDS:
        shown += f" and {len(looked_up) - SHOWN_IDS} more"
    if shard is None:
        return f"tasks {shown}"
    return f"tasks {shown} (shard {shard} of {len(task_ids)} task ids)"
