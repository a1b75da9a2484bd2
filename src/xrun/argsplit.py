"""Split a launcher command line into the launcher's own options and the user's program + arguments.

argparse's REMAINDER mishandles ``--`` and user arguments that look like options, so the split is done here:
options are consumed up to the first token that is not an option or an option's value; that token is the
user's program and everything after it is passed through untouched, whatever it looks like.

A flag before the program that the parser does not have is an error here, not later: left to argparse, the
splitter would take ``--num-gpu 2 hello.py``'s ``2`` for the program and argparse would then complain about a
missing value. Long flags are matched whole (no abbreviations: a flag means the same in every release).
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from xrun.errors import UnknownFlagError, UsageError
from xrun.shell import render

_MATCHED = 100  # characters of an unknown flag compared with the known ones (difflib is quadratic)
# How alike a suggestion must be: --num-gpu/--num-gpus (0.95) and --num_g/--num_gpus (0.82) are meant,
# --lr/--log_dir (0.62) is not: that is a script's flag before the script.
_CUTOFF = 0.75


@dataclass(frozen=True)
class SplitArgv:
    options: tuple[str, ...]
    program: str | None
    program_args: tuple[str, ...]


def spellings(flag: str) -> list[str]:
    """DeepSpeed spells flags with underscores, torchrun with dashes: accept both."""
    dashed = "--" + flag[2:].replace("_", "-")
    return [flag] if dashed == flag else [flag, dashed]


def takes_values(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """Every option string of ``parser`` -> whether it takes the next token as its value."""
    return {
        # nargs="?" options (--dry-run[=json]) take a value only as "--opt=value", never the next token.
        option: action.nargs not in (0, "?")
        for action in parser._actions  # noqa: SLF001 - argparse has no public view of its options
        for option in action.option_strings
    }


def is_known(token: str, options: Sequence[str] | dict[str, bool]) -> bool:
    """``--opt``, ``--opt=value``, ``-o``, ``-oVALUE`` or ``-abc`` (short flags together) of a known option."""
    if token.startswith("--"):
        return token.split("=", 1)[0] in options
    return token[:2] in options


def _script_after(argv: Sequence[str], index: int) -> int | None:
    """Where the program probably is after the unknown flag at ``index``: ``--lr 3 hello.py``, ``--verbose
    hello.py``, ``--lr=3 hello.py``. A guess, only for the hint: the flag may or may not take a value."""
    nxt = index + 1
    words = [w if not w.startswith("-") else None for w in argv[nxt : nxt + 2]]
    if not words or words[0] is None:
        return None
    flag_has_value = "=" not in argv[index] and not words[0].endswith(".py")
    if flag_has_value and len(words) > 1 and words[1] is not None:
        return nxt + 1
    return nxt


def unknown_flag(parser: argparse.ArgumentParser, argv: Sequence[str], index: int, *,
                 has_script: bool = True) -> UnknownFlagError:
    """The error for ``argv[index]``, a flag ``parser`` does not have: the closest flag it has, or else (for a
    command that runs a script) where the script's own flags go, with the command line that would work."""
    token = argv[index]
    flag = token.split("=", 1)[0] if token.startswith("--") else token[:2]
    known = [option for option in takes_values(parser) if option.startswith("-" * min(2, len(flag) - 1))]
    close = difflib.get_close_matches(flag[:_MATCHED], known, n=1, cutoff=_CUTOFF)
    if close:
        return UnknownFlagError(flag, meant=close[0])
    if not has_script:
        return UnknownFlagError(flag, hint=f"{parser.prog} has no such flag; see {parser.prog} --help")
    script = _script_after(argv, index)
    moved = argv[index:script] if script is not None else argv[index : index + 1]
    example = render([argv[script] if script is not None else "SCRIPT", *moved])
    return UnknownFlagError(flag, hint=f"not a flag of {parser.prog}; arguments for the script go after it "
                                       f"({parser.prog} {example})")


def refuse_bare_separator(option: str, takes_value: dict[str, bool]) -> None:
    """``--num_gpus=--``, ``--num_gpus -- t.py`` (glued by ``split_argv``), ``-H--``: argparse drops a value that
    is ``--`` and hands the flag an empty list, which no check expects (a TypeError traceback); say the value is
    missing instead."""
    name = option.split("=", 1)[0] if option.startswith("--") else option[:2]
    value = option[len(name):]
    value = value[1:] if value.startswith("=") else value  # argparse reads -i=SPEC as -i SPEC
    if value == "--" and takes_value.get(name, False):
        raise UsageError(name, "is missing its value ('--' ends the options: put the value before it)")


def split_argv(parser: argparse.ArgumentParser, argv: Sequence[str]) -> SplitArgv:
    takes_value = takes_values(parser)
    options: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--":  # noqa: S105 - a command-line word, not a password
            index += 1
            break
        if not token.startswith("-") or token == "-":  # noqa: S105
            break
        if not is_known(token, takes_value):
            raise unknown_flag(parser, argv, index)
        options.append(token)
        name = token.split("=", 1)[0] if token.startswith("--") else token[:2]
        if "=" not in token and takes_value.get(name, False) and index + 1 < len(argv) and len(token) == len(name):
            value = argv[index + 1]
            if value.startswith("-"):
                # argparse takes a separate value that looks like an option for a missing one
                # (--launcher_args '--mca x y'): glue it to its option instead.
                options[-1] = f"{token}={value}" if token.startswith("--") else token + value
            else:
                options.append(value)
            index += 1
        refuse_bare_separator(options[-1], takes_value)
        index += 1
    if index >= len(argv):
        return SplitArgv(tuple(options), None, ())
    return SplitArgv(tuple(options), argv[index], tuple(argv[index + 1 :]))
