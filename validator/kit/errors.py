"""The failure contract as a module author imports it: the exceptions validate() raises (and the
ones the kit's helpers raise), re-exported from validator/errors.py, where the loop's
`classify()` decides what each means (docs/module-api.md, "Exceptions and outcomes").

Re-exported, never copied: the loop catches these very classes. The names are listed in
`validator/kit/__init__.pyi`, the kit's one table; import them from `validator.kit`.
"""

from validator.errors import AnswerTooLarge as AnswerTooLarge
from validator.errors import BaseNotRestored as BaseNotRestored
from validator.errors import ConfigError as ConfigError
from validator.errors import DeviceError as DeviceError
from validator.errors import JsonRefused as JsonRefused
from validator.errors import OperatorError as OperatorError
from validator.errors import SubmissionRejected as SubmissionRejected
from validator.errors import TransientError as TransientError
