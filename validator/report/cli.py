"""`python -m validator report`: the summary of a state dir as text, JSON or an HTML page.
Offline: the loop never imports this package (the status page runs this command in a child)."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

from validator.report.summary import render_text, summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validator report", description=__doc__)
    parser.add_argument("--state-dir", type=Path, default=Path("state"))
    parser.add_argument(
        "--source",
        metavar="NAME",
        help="what the report calls the state dir (run.py passes its volume's name)",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="the summary as JSON")
    output.add_argument(
        "--html", metavar="FILE", help="write a page with plots to FILE (- for stdout)"
    )
    args = parser.parse_args(argv)
    try:
        summary, records = summarize(args.state_dir, args.source)
    except (FileNotFoundError, sqlite3.Error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary.model_dump(), indent=2))
    elif args.html:
        from validator.report.html import render_html  # matplotlib: only for this

        page = render_html(summary, records)
        if args.html == "-":
            sys.stdout.write(page)
        else:
            Path(args.html).write_text(page)
            print(f"wrote {args.html}", file=sys.stderr)
    else:
        sys.stdout.write(render_text(summary))
    return 0
