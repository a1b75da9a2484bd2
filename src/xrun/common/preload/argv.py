"""A rank's command line read the way the interpreter reads it: ``python [OPTIONS] SCRIPT|-m MOD|-c CMD ARGS``.

Only such a command can be forked from the preload helper, and only when its interpreter and options are the
helper's own: options such as ``-O``, ``-X dev`` or ``-W`` act while the interpreter starts, so a rank forked from
a helper started with other ones would not be the rank asked for. Pure (``NotForkable`` says why not), but for
``path0``, which reads the filesystem as the interpreter does to find a script's directory.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

# python(1): the options that take no argument, and those whose argument follows (attached or as the next word).
_FLAGS = frozenset("bBdEIOPqsSuv")
_WITH_ARGUMENT = frozenset("WX")
_LONG_WITH_ARGUMENT = ("--check-hash-based-pycs",)
# What makes the interpreter do something other than run one program: a REPL, help, or its first line skipped.
_NOT_A_PROGRAM = {"i": "-i (interactive)", "h": "-h", "?": "-?", "V": "-V", "x": "-x"}


class NotForkable(ValueError):
    """A rank's command line that the preload helper cannot run as the interpreter would."""


class Mode(Enum):
    SCRIPT = "script"  # a file, a directory or a zip archive
    MODULE = "module"  # -m
    COMMAND = "command"  # -c


@dataclass(frozen=True)
class PythonCommand:
    """``argv`` as the interpreter reads it."""

    python: str  # argv[0], as given
    options: tuple[str, ...]  # the interpreter's options before the program, word for word
    mode: Mode
    target: str  # the script's path, the module's name, or the command's text
    args: tuple[str, ...]  # what follows: sys.argv[1:]


def parse_python_argv(argv: Sequence[str]) -> PythonCommand:
    """Read ``argv`` (``argv[0]`` is the interpreter) as python(1) would; ``NotForkable`` when it runs no program
    (a REPL, ``--help``, a script read from stdin)."""
    if not argv:
        raise NotForkable("the command line is empty")
    options: list[str] = []
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            if i + 1 >= len(argv):
                raise NotForkable("no program after '--' (the interpreter would read stdin)")
            return PythonCommand(argv[0], tuple(options), Mode.SCRIPT, argv[i + 1], tuple(argv[i + 2 :]))
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            if name not in _LONG_WITH_ARGUMENT:
                raise NotForkable(f"the interpreter option {word!r} runs no program")
            options.append(word)
            if "=" not in word:
                if i + 1 >= len(argv):
                    raise NotForkable(f"{word} needs an argument")
                options.append(argv[i + 1])
                i += 1
            i += 1
            continue
        if not word.startswith("-") or word == "-":
            if word == "-":
                raise NotForkable("'-' runs a program read from stdin")
            return PythonCommand(argv[0], tuple(options), Mode.SCRIPT, word, tuple(argv[i + 1 :]))
        found = _short_options(argv, i, options)
        if isinstance(found, PythonCommand):
            return found
        i = found
    raise NotForkable("no program to run (the interpreter would start its REPL)")


def _short_options(argv: Sequence[str], i: int, options: list[str]) -> PythonCommand | int:
    """One word of single-letter options (``-uB``, ``-Wignore``, ``-c CMD``): the program it names, or the index of
    the next word (``options`` grows by what it held)."""
    word = argv[i]
    for j, letter in enumerate(word[1:], start=1):
        rest = word[j + 1 :]
        if letter in ("c", "m"):
            if j > 1:
                options.append(word[:j])
            if rest:
                target, args = rest, argv[i + 1 :]
            elif i + 1 < len(argv):
                target, args = argv[i + 1], argv[i + 2 :]
            else:
                raise NotForkable(f"-{letter} needs an argument")
            mode = Mode.COMMAND if letter == "c" else Mode.MODULE
            return PythonCommand(argv[0], tuple(options), mode, target, tuple(args))
        if letter in _WITH_ARGUMENT:
            if rest:
                options.append(word)
                return i + 1
            if i + 1 >= len(argv):
                raise NotForkable(f"-{letter} needs an argument")
            options.extend((word, argv[i + 1]))
            return i + 2
        if letter in _NOT_A_PROGRAM:
            raise NotForkable(f"the interpreter option {_NOT_A_PROGRAM[letter]} runs no program as given")
        if letter not in _FLAGS:
            raise NotForkable(f"unknown interpreter option -{letter}")
    options.append(word)
    return i + 1


def has_flag(options: tuple[str, ...], letter: str) -> bool:
    """Whether the interpreter options ``options`` (as ``PythonCommand.options`` holds them) include ``-LETTER``."""
    words = iter(options)
    for word in words:
        if not word.startswith("-") or word.startswith("--"):
            continue
        for flag in word[1:]:
            if flag == letter:
                return True
            if flag in _WITH_ARGUMENT:
                if flag == word[-1]:
                    next(words, None)  # its argument is the next word
                break
    return False


def fork_refusal(command: PythonCommand, python: str, options: tuple[str, ...]) -> str | None:
    """Why ``command`` cannot be forked from a helper started as ``python OPTIONS`` (None: it can)."""
    if command.python != python:
        return f"its interpreter {command.python!r} is not the preload helper's {python!r}"
    if command.options != options:
        return (f"its interpreter options {' '.join(command.options) or '(none)'} are not the preload helper's "
                f"{' '.join(options) or '(none)'}")
    if command.mode is Mode.SCRIPT and command.target.endswith((".pyc", ".pyo")):
        return "it runs compiled bytecode (.pyc), which the helper does not load as the interpreter would"
    return None


def path0(command: PythonCommand, cwd: str) -> str:
    """The interpreter's sys.path[0] for ``command`` run in ``cwd``: the script's directory (symbolic links to the
    script followed), ``cwd`` for -m, '' for -c; a directory or zip archive run as a script is itself sys.path[0]."""
    if command.mode is Mode.MODULE:
        return cwd
    if command.mode is Mode.COMMAND:
        return ""
    path = os.path.abspath(os.path.join(cwd, command.target))
    if is_archive_or_dir(path):
        return path
    for _ in range(40):  # python resolves the script's own links (not its directories'), as readlink does
        try:
            link = os.readlink(path)
        except OSError:
            break
        path = os.path.join(os.path.dirname(path), link)
    return os.path.dirname(path)


def is_archive_or_dir(path: str) -> bool:
    return os.path.isdir(path) or (os.path.isfile(path) and zipfile.is_zipfile(path))
