"""The validator that runs inside every module image (docs/development.md; the rooms:
ledger/, state/, observe/, report/, and kit/, the one import for module authors).

Modules written against an earlier layout import paths that have moved (`validator.exceptions`,
`validator.base`, `validator.phases`, ...): `_moved.py` keeps them importing, with a warning
that names the new path.
"""

from validator import _moved

_moved.install()
