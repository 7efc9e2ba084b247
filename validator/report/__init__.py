"""The report of a state dir, offline (python -m validator report): summary.py reads the
journal and the records, html.py draws the page, cli.py is the command. The loop never imports
it; it reads what the loop wrote.

`validator.report` was one module before it became this package: its names stay importable
from here (html.py's matplotlib is loaded only by the command's --html).
"""

from validator.report.cli import main
from validator.report.summary import Summary, completed_scores, percentile, render_text, summarize
from validator.state.records import main_metric, outcome_label

__all__ = [
    "Summary",
    "completed_scores",
    "main",
    "main_metric",
    "outcome_label",
    "percentile",
    "render_text",
    "summarize",
]
