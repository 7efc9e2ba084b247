"""Command-line rules shared by the inner CLI and the launcher, so both say the same thing."""

from __future__ import annotations


def missing_required(
    task_ids: object, flock_api_key: str | None, hf_token: str | None
) -> str | None:
    """The message for the first missing option that only `--check` may leave out, or None."""
    for value, name in (
        (task_ids, "--task_ids"),
        (flock_api_key, "--flock-api-key / FLOCK_API_KEY"),
        (hf_token, "--hf-token / HF_TOKEN"),
    ):
        if not value:
            return f"missing {name} (only --check runs without it)"
    return None
