"""Hub listings no real Hub sends (validator/kit/listing.py), made with the local hub's controls,
for each module's test that such a submission is refused before any of its files is fetched.
`HOSTILE_LISTINGS[id]` is (what it does to a repo already on the hub, the refusal's
text)."""

from __future__ import annotations

from collections.abc import Callable

from devkit.hf_hub import LocalHub
from validator.kit import MAX_LISTED_FILES


def _too_many_files(hub: LocalHub, repo: str) -> None:
    hub.pad_listing(repo, MAX_LISTED_FILES)  # with the repo's own files: past the cap


def _a_name_outside(hub: LocalHub, repo: str) -> None:
    hub.list_name(repo, "../../escaped.txt", b"outside")


def _a_negative_size(hub: LocalHub, repo: str) -> None:
    # Unread by every module, but a negative size would pull a total under its cap.
    hub.list_name(repo, "notes.txt", b"x")
    hub.list_size(repo, "notes.txt", -(10**12))


HOSTILE_LISTINGS: dict[str, tuple[Callable[[LocalHub, str], None], str]] = {
    "too-many-files": (_too_many_files, rf"the Hub lists \d+ files, over {MAX_LISTED_FILES}"),
    "a-name-outside": (_a_name_outside, r"'\.\./\.\./escaped\.txt', which is absolute or has"),
    "a-negative-size": (_a_negative_size, r"'notes\.txt' at -1000000000000 bytes, not a size"),
}
