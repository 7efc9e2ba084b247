"""Command-line rules shared by the inner CLI and the launcher, so both say the same thing."""

from __future__ import annotations

from validator.secrets import normalise_secret

TASK_IDS_OPTION = "--task_ids / TASK_IDS"
FLOCK_API_KEY_OPTION = "--flock-api-key / FLOCK_API_KEY"
HF_TOKEN_OPTION = "--hf-token / HF_TOKEN"


def normalise_secrets(
    flock_api_key: str | None, hf_token: str | None
) -> tuple[str | None, str | None]:
    """The key and token as they are to be used and redacted; raises MalformedSecret (a
    ConfigError) naming the option of a value that no HTTP header could carry."""
    return (
        normalise_secret(flock_api_key, FLOCK_API_KEY_OPTION),
        normalise_secret(hf_token, HF_TOKEN_OPTION),
    )


def missing_required(
    task_ids: object, flock_api_key: str | None, hf_token: str | None
) -> str | None:
    """The message for the first missing option that only `--check` may leave out, or None."""
    for value, name in (
        (task_ids, TASK_IDS_OPTION),
        (flock_api_key, FLOCK_API_KEY_OPTION),
        (hf_token, HF_TOKEN_OPTION),
    ):
        if not value:
            return f"missing {name} (only --check runs without it)"
    return None
