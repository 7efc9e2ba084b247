"""The validator that runs inside every module image (docs/development.md, "Layout": the loop
on top; the rooms doctor/, ledger/, observe/, report/, state/; kit/, the one import for module
authors; sandbox/ and outbound/, which the kit and the loop share).

Modules written against an earlier layout import paths that have moved (`validator.exceptions`,
`validator.base`, `validator.phases`, ...): `_moved.py` keeps them importing, with a warning
that names the new path.
"""

from validator import _moved

_moved.install()
