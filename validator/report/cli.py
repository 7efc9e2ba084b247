"""`python -m validator report`: the summary of a state dir as text, JSON or an HTML page.
Offline: the loop never imports this package (the status page runs this command in a child)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import click

from validator.errors import ExitCode
from validator.report.summary import render_text, summarize


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=Path("state"),
    show_default=True,
    help="The state dir whose journal and records are read.",
)
@click.option(
    "--source",
    metavar="NAME",
    help="What the report calls the state dir (run.py passes its volume's name).",
)
@click.option("--json", "as_json", is_flag=True, help="The summary as JSON.")
@click.option("--html", metavar="FILE", help="Write a page with plots to FILE (- for stdout).")
def main(state_dir: Path, source: str | None, as_json: bool, html: str | None) -> None:
    """The summary of a state dir: what its journal and records say happened."""
    if as_json and html:
        raise click.UsageError("--json or --html, not both")
    try:
        summary, records = summarize(state_dir, source)
    except (FileNotFoundError, sqlite3.Error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.USAGE))
    if as_json:
        print(json.dumps(summary.model_dump(), indent=2))
    elif html:
        from validator.report.html import render_html  # matplotlib: only for this

        page = render_html(summary, records)
        if html == "-":
            sys.stdout.write(page)
        else:
            Path(html).write_text(page)
            print(f"wrote {html}", file=sys.stderr)
    else:
        sys.stdout.write(render_text(summary))
