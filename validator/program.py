"""One program's command line: a click group whose commands each live in a file of their own,
imported only when named, so that a command pays for what it runs and no more. A first word that
names no command goes to the default command (a module name: `python run.py lora ...`,
`python -m validator lora ...`); a word close to a command's name that is no module is a typo,
refused naming the command meant."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class Listed:
    """A command of a program: where its click command is defined, and how --help lists it."""

    target: str  # "package.module:attribute"
    usage: str  # its arguments, after the program's name
    summary: str


class Program(click.Group):
    """The commands of `listed`, loaded on first use, with `default` for a first word that is
    none of them; `modules` lists the module names (read only to tell a typo from a module)."""

    def __init__(
        self,
        name: str,
        listed: Mapping[str, Listed],
        default: str,
        modules: Callable[[], Iterable[str]],
        **attrs: object,
    ) -> None:
        super().__init__(name, **attrs)  # type: ignore[arg-type]
        self.listed, self.default, self.modules = dict(listed), default, modules

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.listed)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        listed = self.listed.get(cmd_name)
        if listed is None:
            return super().get_command(ctx, cmd_name)  # one added with add_command
        module, _, attribute = listed.target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), listed.target
        return command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or not self.names_a_command(args[0]):
            args = self.for_default(args)
        return super().parse_args(ctx, args)

    def names_a_command(self, word: str) -> bool:
        return word in self.listed or word in self.commands

    def for_default(self, args: list[str]) -> list[str]:
        """The arguments with the default command's name first, when the first word names no
        command; a click.UsageError for a word that is a typo of a command's name rather than
        a module."""
        word = args[0] if args else ""
        if word and not word.startswith("-"):
            meant = difflib.get_close_matches(word, [*self.listed, *self.commands], n=1)
            if meant and word not in self.modules():
                modules = ", ".join(self.modules()) or "none found"
                raise click.UsageError(
                    f"{word!r} is neither a command nor a module: did you mean {meant[0]!r}? "
                    f"(modules: {modules})"
                )
        return [self.default, *args]

    def commands_table(self, program: str) -> list[tuple[str, str]]:
        """(usage, summary) of each listed command, for a help page."""
        return [(f"{program} {listed.usage}", listed.summary) for listed in self.listed.values()]
