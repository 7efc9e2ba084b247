"""A submission's Hub listing, checked before any of its files is fetched: the plan
the listing makes (how many files, their names, their sizes) is one a real Hub sends, or the
submission is refused.

The real Hub asks for fewer than 100,000 files in a repo (fewer than 10,000 a folder), never
lists a name that leaves the repo's folder, and gives every file's size as a whole number of
bytes when asked for them (`files_metadata=True`). A listing past that comes from a hostile or
intercepted Hub, whose every name the validator would otherwise look at, size and maybe fetch:
SubmissionRejected, naming the first problem. The listing's bytes are bounded where it is read
(validator/kit/hub.py); this bounds what it can ask of the validator once read.
"""

from __future__ import annotations

from huggingface_hub.hf_api import ModelInfo

from validator.errors import SubmissionRejected
from validator.kit.hub import unsafe_name

# No model repo comes near it: a model, its tokenizer, a few hundred shards, checkpoints in
# folders. Every listed name is checked here, and a module may size or fetch any of them.
MAX_LISTED_FILES = 10_000


def checked_listing(
    info: ModelInfo, what: str, *, max_files: int = MAX_LISTED_FILES
) -> dict[str, int | None]:
    """The repo's files and their sizes (the LFS size for LFS files; None where the listing was
    made without `files_metadata=True`), as `hub.file_sizes` gives them, once the listing is
    one a real Hub sends: at most `max_files` files, each name a plain path inside the repo's
    folder (`hub.unsafe_name`), each size a whole number of bytes. SubmissionRejected otherwise,
    before any file is fetched."""
    siblings = info.siblings or []
    if len(siblings) > max_files:
        raise SubmissionRejected(
            f"{what}: the Hub lists {len(siblings)} files, over {max_files} (no model repo "
            "has that many)"
        )
    sizes: dict[str, int | None] = {}
    for sibling in siblings:
        name = sibling.rfilename
        problem = unsafe_name(name) if isinstance(name, str) else "is not text"
        if problem is not None:
            raise SubmissionRejected(
                f"{what}: the Hub lists the file name {str(name)[:200]!r}, which {problem}"
            )
        size = sibling.lfs.size if sibling.lfs else sibling.size
        if size is not None and (type(size) is not int or size < 0):
            raise SubmissionRejected(
                f"{what}: the Hub lists {name[:200]!r} at {str(size)[:40]} bytes, not a size"
            )
        sizes[name] = size
    return sizes
