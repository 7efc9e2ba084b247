"""The validator's options on run.py's command line: one definition, the validator's own.

`python run.py run` takes its own options and, after them, the options of `python -m validator
run`, declared in validator/run_options.py: click then checks every option at the door, before
any image is built or any container started. An unknown one is exit 2 with click's "did you
mean", a bad value is exit 2 naming the option, and what was given goes on to the validator as
it was meant. Where run.py has an option of the same name (`--task_ids`, `--check`,
`--config-dir`, the two keys), run.py's is the one; the few that make no sense in a container
are left out (NOT_FORWARDED), so that click names the option to use.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import click
from click.core import ParameterSource

from launcher.engine.containers import PASSED_ENV
from validator.run_options import declared

# The validator's options run.py does not pass on: the journal is a Docker volume there
# (--state-volume, which click's "did you mean" names for --state-dir).
NOT_FORWARDED = frozenset({"state_dir"})
FORWARDED_SECTION = "Validator options (passed on to `python -m validator` in the container)"


def forwarded_options(own: Iterable[click.Parameter]) -> list[click.Option]:
    """The validator's options that run.py passes on, as options of run.py's command: each a
    copy of the validator's (its type, range, choices and help), less the variable, which the
    container reads itself, unless it is one run.py passes to the container
    (launcher/engine/containers.py PASSED_ENV), whose value run.py then checks too."""
    taken = {name for param in own for name in (*param.opts, *param.secondary_opts)}
    forwarded = []
    for param in declared():
        if not isinstance(param, click.Option) or param.name in NOT_FORWARDED:
            continue
        if taken & {*param.opts, *param.secondary_opts}:
            continue  # run.py's own option of that name
        option = copy.copy(param)
        if option.envvar not in PASSED_ENV:
            option.envvar = None
        forwarded.append(option)
    return forwarded


def forwarded_args(ctx: click.Context, options: Iterable[click.Option]) -> list[str]:
    """The validator's arguments for what the command line gave of its options, as click read
    them (a value from a variable reaches the container as that variable)."""
    args: list[str] = []
    for option in options:
        name = option.name or ""
        if ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[name]
        if option.is_flag and option.secondary_opts:
            args.append(option.opts[0] if value else option.secondary_opts[0])
        elif option.is_flag:
            if value:
                args.append(option.opts[0])
        else:
            args += [option.opts[0], str(value)]
    return args
