"""Text in reasons and logs as a module author imports it, re-exported from validator/text.py
(the bounds the journal and the Fed Ledger's reasons use). Import the names from
`validator.kit` (its one table: `validator/kit/__init__.pyi`).
"""

from validator.text import one_line as one_line
from validator.text import quoted as quoted
from validator.text import short_commit as short_commit
