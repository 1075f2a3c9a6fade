"""Did-you-mean hints for a mistyped command or flag of `mqstore`.

argparse (before Python 3.14's `suggest_on_error`) answers `mqstore stauts` with the whole list
of commands and `mqstore status --jsno` with the top-level usage only. HintingParser names the
closest command or flag instead, under the usage of the command that was being parsed; the exit
status stays argparse's 2 (CliExit.BAD_INPUT).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Sequence

CLOSE_MATCH_CUTOFF = 0.6  # difflib's default: `stauts` matches `status`, `xyz` matches nothing


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate nearest `word`, or None when none is close."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=CLOSE_MATCH_CUTOFF)
    return matches[0] if matches else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`; did you mean 'X'?` for the closest candidate, or "" when none is close."""
    match = closest(word, candidates)
    return f"; did you mean {match!r}?" if match else ""


def _subparsers_action(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every long flag the parser accepts (`--json`, `--store`), the help flag left out."""
    return [s for s in parser._option_string_actions if s.startswith("--") and s != "--help"]


class HintingParser(argparse.ArgumentParser):
    """An ArgumentParser whose unknown-command and unknown-flag errors name the closest match,
    with the usage of the (sub)command the flag was given to."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        subparsers = _subparsers_action(self)
        # only the first word: a later one may be an option's value, not a command
        if subparsers is not None and args and not args[0].startswith("-") \
                and args[0] not in subparsers.choices:
            self.error(f"unknown command {args[0]!r}{did_you_mean(args[0], subparsers.choices)} "
                       f"(commands: {', '.join(subparsers.choices)})")
        return super().parse_known_args(args, namespace)

    def parse_args(self, args: Sequence[str] | None = None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            owner = self._command_parser(parsed)
            flag = next((a for a in extras if a.startswith("--")), extras[0])
            hint = did_you_mean(flag.partition("=")[0], option_strings(owner))
            owner.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser of the command `parsed` ran (this one when it has no commands)."""
        subparsers = _subparsers_action(self)
        if subparsers is None:
            return self
        chosen = subparsers.choices.get(getattr(parsed, subparsers.dest, None) or "")
        return chosen._command_parser(parsed) if isinstance(chosen, HintingParser) else chosen or self
