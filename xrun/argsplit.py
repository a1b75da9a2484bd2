"""Split a launcher command line into the launcher's own options and the user's program + arguments.

argparse's REMAINDER mishandles ``--`` and user arguments that look like options, so the split is done here:
options are consumed up to the first token that is not an option or an option's value; that token is the
user's program and everything after it is passed through untouched, whatever it looks like.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SplitArgv:
    options: tuple[str, ...]
    program: str | None
    program_args: tuple[str, ...]


def spellings(flag: str) -> list[str]:
    """DeepSpeed spells flags with underscores, torchrun with dashes: accept both."""
    dashed = "--" + flag[2:].replace("_", "-")
    return [flag] if dashed == flag else [flag, dashed]


def split_argv(parser: argparse.ArgumentParser, argv: Sequence[str]) -> SplitArgv:
    takes_value = {
        # nargs="?" options (--dry-run[=json]) take a value only as "--opt=value", never the next token.
        option: action.nargs not in (0, "?")
        for action in parser._actions  # noqa: SLF001 - argparse has no public view of its options
        for option in action.option_strings
    }
    options: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--":  # noqa: S105 - a command-line word, not a password
            index += 1
            break
        if not token.startswith("-") or token == "-":  # noqa: S105
            break
        options.append(token)
        name = token.split("=", 1)[0]
        if "=" not in token and takes_value.get(name, False) and index + 1 < len(argv):
            value = argv[index + 1]
            if value.startswith("-"):
                # argparse takes a separate value that looks like an option for a missing one
                # (--launcher_args '--mca x y'): glue it to its option instead.
                options[-1] = f"{token}={value}" if token.startswith("--") else token + value
            else:
                options.append(value)
            index += 1
        index += 1
    if index >= len(argv):
        return SplitArgv(tuple(options), None, ())
    return SplitArgv(tuple(options), argv[index], tuple(argv[index + 1 :]))
