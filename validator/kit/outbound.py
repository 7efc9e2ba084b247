"""Calls to outside as a module author imports them: the overall deadline, the bounded reader
and bounded JSON, re-exported from validator/outbound/, which the Fed Ledger client, the doctor
and the kit's hub use too. Import the names from `validator.kit` (its one table:
`validator/kit/__init__.pyi`).
"""

from validator.outbound.answer_caps import ANSWER_CAPS as ANSWER_CAPS
from validator.outbound.answer_caps import Cap as Cap
from validator.outbound.answer_caps import reading_at_most as reading_at_most
from validator.outbound.bounded_reader import Answer as Answer
from validator.outbound.bounded_reader import capped_event_hooks as capped_event_hooks
from validator.outbound.bounded_reader import capped_session as capped_session
from validator.outbound.bounded_reader import fetch_answer as fetch_answer
from validator.outbound.deadline import CallAbandoned as CallAbandoned
from validator.outbound.deadline import overall_deadline as overall_deadline
from validator.outbound.deadline import wait_or_stop as wait_or_stop
from validator.outbound.safe_json import loads_bounded as loads_bounded
