"""An earlier spelling of a command (`python -m launcher.compose`, ...): the warning the alias
table gives (validator/_moved.py), then the command it moved to, with the arguments given."""

from __future__ import annotations

import shlex
import sys
from typing import NoReturn

from launcher.commands.program import PROGRAM, program
from launcher.errors import say
from validator._moved import Alias


def run_moved(moved: Alias) -> NoReturn:
    """Runs `moved.new` (a command of run.py) with this process's arguments."""
    say(f"warning: {moved.line}")
    words = shlex.split(moved.new)[len(shlex.split(PROGRAM)) :]
    program().main([*words, *sys.argv[1:]])
    raise AssertionError("the program exits")
