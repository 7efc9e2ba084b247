from __future__ import annotations

from tests.faults.figures import FIGURES


def pytest_terminal_summary(terminalreporter) -> None:
    if not FIGURES:
        return
    terminalreporter.section("fault suite figures")
    width = max(len(f.case) for f in FIGURES)
    for figure in FIGURES:
        terminalreporter.write_line(f"{figure.case:<{width}}  {figure.result}")
