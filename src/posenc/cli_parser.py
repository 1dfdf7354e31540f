"""The parser every ``posenc`` subcommand is built on, and how old spellings keep working for one release.

:class:`PosencParser` is argparse with posenc's conventions (one-line usage errors, exit status 2, unrecognized
arguments reported by the subcommand given them); :func:`add_alias` keeps an old flag as a hidden spelling of its
new option and :class:`OldValueSpelling` rewrites an old ``FLAG VALUE`` pair before parsing, each with a
:func:`deprecation_note` on stderr. The options themselves are defined once in :mod:`posenc.cli_args`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn


def deprecation_note(text: str, prog: str = "posenc") -> None:
    """Tell the user on stderr that an old spelling still works for now, and what to write instead."""
    print(f"{prog}: warning: {text}", file=sys.stderr)


class DeprecatedAlias(argparse.Action):
    """An old spelling hidden from ``--help``: stores like the option it stands for, after a note on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, use: str, append: bool = False, **kwargs: Any):
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)
        self.use = use
        self.append = append

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        deprecation_note(f"{option_string} is deprecated and goes in the next release; use {self.use}.", parser.prog)
        if self.append:
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, values)


def add_alias(
    target: argparse._ActionsContainer, flag: str, dest: str, *, use: str, append: bool = False, **kwargs: Any
) -> argparse.Action:
    """Keep ``flag`` working as a hidden spelling of the option stored in ``dest`` (``use`` names the new one)."""
    return target.add_argument(flag, dest=dest, action=DeprecatedAlias, use=use, append=append, **kwargs)


@dataclasses.dataclass(frozen=True)
class OldValueSpelling:
    """An old ``FLAG VALUE`` pair whose new spelling argparse cannot express as an alias (rewritten before parsing).

    Attributes:
        flag: the option string, e.g. ``--json``.
        matches: whether the value that follows is the old use (e.g. a file name after ``--json``).
        rewrite: the new tokens for the value.
        note: the deprecation note.
    """

    flag: str
    matches: Callable[[str], bool]
    rewrite: Callable[[str], list[str]]
    note: str


class PosencParser(argparse.ArgumentParser):
    """argparse with posenc's conventions.

    Usage errors are one line on stderr, ``posenc CMD: error: ...``, with exit status 2; old ``FLAG VALUE``
    spellings registered with :meth:`keep_old_value_spelling` are rewritten (with a note) before parsing.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.old_value_spellings: list[OldValueSpelling] = []

    def keep_old_value_spelling(self, spelling: OldValueSpelling) -> None:
        self.old_value_spellings.append(spelling)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")

    def parse_known_args(  # type: ignore[override]  # narrower than argparse's overloads
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None and self.old_value_spellings:
            args = self._rewrite_old_spellings(list(args))
        return super().parse_known_args(args, namespace)

    def parse_args(  # type: ignore[override]  # narrower than argparse's overloads
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but unrecognized arguments are reported by the subcommand that was given them."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._owner(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _owner(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = getattr(parsed, action.dest, None)
                return action.choices.get(chosen, self) if isinstance(chosen, str) else self
        return self

    def _rewrite_old_spellings(self, args: list[str]) -> list[str]:
        out: list[str] = []
        index = 0
        while index < len(args):
            token = args[index]
            if token == "--":  # the rest is positional
                return out + args[index:]
            flag, eq, inline = token.partition("=")
            spelling = next((s for s in self.old_value_spellings if s.flag == flag), None)
            value = inline if eq else (args[index + 1] if index + 1 < len(args) else None)
            if spelling is None or value is None or not spelling.matches(value):
                out.append(token)
                index += 1
                continue
            deprecation_note(spelling.note, self.prog)
            out += spelling.rewrite(value)
            index += 1 if eq else 2
        return out


__all__ = ["DeprecatedAlias", "OldValueSpelling", "PosencParser", "add_alias", "deprecation_note"]
