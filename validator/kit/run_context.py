"""The run context as a module author imports it, re-exported from validator/run_context.py,
which the entrypoint installs at start-up. Import the names from `validator.kit` (its one table:
`validator/kit/__init__.pyi`).
"""

from validator.run_context import RunContext as RunContext
from validator.run_context import current_run as current_run
