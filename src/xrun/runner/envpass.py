"""Which environment variables travel from the head node to the remote nodes.

Sources, later ones win:
1. variables of the runner's environment whose name starts with one of ``PREFIXES``;
2. ``KEY=VALUE`` lines of ``~/.xrun_env``, then of ``./.xrun_env`` (the directory xrun was started in);
3. ``--export NAME`` (the runner's current value) and ``--export NAME=VALUE``, in command-line order.
Then ``PYTHONPATH`` gets the working directory prepended, as DeepSpeed does, so ``import my_pkg`` works on
every node the way it does on the head.

Names that describe the head's session rather than the job never travel (``BLOCKED_NAMES``,
``BLOCKED_PREFIXES``): ``HOME`` belongs to the remote account (the remote user may differ, and a shared
``$HOME`` is already the same), ``SSH_*`` and ``BASH_FUNC_*`` describe the head's own shell. Naming one of them
explicitly in an env file or ``--export`` is an error rather than a silent drop.

Values travel in the node spec over the control channel, never on a command line: they need no quoting and
arrive byte-exact (spaces, quotes, ``$``, backslashes, newlines, any Unicode).

Env file syntax (a strict subset of what shells and dotenv accept)::

    # comment            blank lines are fine
    KEY=value            surrounding whitespace trimmed; ' #' starts a trailing comment
    export KEY=value     'export ' is allowed and ignored
    KEY='literal'        single quotes: nothing inside is special
    KEY="a\\nb \\"q\\""     double quotes: \\n \\t \\r \\\\ \\" \\$ are escapes
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Callable

from xrun.errors import EnvFileError, UsageError
from xrun.runner.hosts.smallfile import SmallFileError, read_regular_bytes

PREFIXES = ("NCCL", "PYTHON", "UCX", "MV2", "MLFLOW", "GLOO", "TORCH", "CUDA", "HF_", "WANDB")
BLOCKED_NAMES = frozenset({"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "HOME"})
BLOCKED_PREFIXES = ("SSH_", "BASH_FUNC_")
ENV_FILE_NAME = ".xrun_env"
ENV_FILE_LIMIT = 1 << 20  # bytes

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOUBLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "$": "$"}


def is_blocked(name: str) -> bool:
    return name in BLOCKED_NAMES or name.startswith(BLOCKED_PREFIXES)


def from_environment(environ: Mapping[str, str], prefixes: Sequence[str] = PREFIXES) -> dict[str, str]:
    """The runner's variables whose names start with a travelling prefix (blocked names excepted)."""
    return {
        name: value
        for name, value in environ.items()
        if name.startswith(tuple(prefixes)) and not is_blocked(name)
    }


def parse_env_text(text: str, path: str) -> dict[str, str]:
    """Parse an env file's text; a bad line raises EnvFileError(path, lineno, line, reason)."""
    result: dict[str, str] = {}
    for lineno, line in enumerate(text.split("\n"), start=1):
        entry = _parse_line(line.rstrip("\r"), path, lineno)
        if entry is not None:
            result[entry[0]] = entry[1]
    return result


def _parse_line(line: str, path: str, lineno: int) -> tuple[str, str] | None:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None

    def bad(reason: str) -> EnvFileError:
        return EnvFileError(path, lineno, line, reason)

    if "\0" in line:  # exec refuses it on every node (a ValueError deep in subprocess)
        raise bad("a NUL byte cannot be part of an environment variable")
    if stripped.startswith("export ") or stripped.startswith("export\t"):
        stripped = stripped[len("export") :].lstrip()
    name, sep, rest = stripped.partition("=")
    name = name.rstrip()
    if not sep:
        raise bad("expected KEY=VALUE")
    if not _NAME.fullmatch(name):
        raise bad(f"{name!r} is not a variable name (letters, digits, underscores; not starting with a digit)")
    if is_blocked(name):
        raise bad(f"{name} never travels to remote nodes (it describes the head's own session)")
    return name, _parse_value(rest.lstrip(), bad)


def _parse_value(raw: str, fail: Callable[[str], EnvFileError]) -> str:
    if raw.startswith("'"):
        end = raw.find("'", 1)
        if end < 0:
            raise fail("unterminated single quote")
        _check_trailer(raw[end + 1 :], fail)
        return raw[1:end]
    if raw.startswith('"'):
        out: list[str] = []
        index = 1
        while index < len(raw):
            char = raw[index]
            if char == "\\" and index + 1 < len(raw):
                nxt = raw[index + 1]
                if nxt not in _DOUBLE_ESCAPES:
                    raise fail(f"unknown escape \\{nxt} in double quotes (use \\\\ for a backslash)")
                out.append(_DOUBLE_ESCAPES[nxt])
                index += 2
                continue
            if char == '"':
                _check_trailer(raw[index + 1 :], fail)
                return "".join(out)
            out.append(char)
            index += 1
        raise fail("unterminated double quote")
    comment = re.search(r"\s#", raw)
    value = raw[: comment.start()] if comment else raw
    value = value.rstrip()
    if value.startswith("#"):  # KEY=#x would read as a comment in a shell; make the user quote it
        raise fail("an unquoted value may not start with '#'; quote it")
    if any(q in value for q in "'\""):
        raise fail("quotes inside an unquoted value; quote the whole value")
    return value


def _check_trailer(trailer: str, fail: Callable[[str], EnvFileError]) -> None:
    rest = trailer.strip()
    if rest and not rest.startswith("#"):
        raise fail(f"unexpected text after the closing quote: {rest!r}")


def read_env_file(path: str) -> dict[str, str]:
    """A missing file is an empty one; an unreadable or malformed one is an error. Read like every small file
    xrun is handed (never blocking on a FIFO, at most ``ENV_FILE_LIMIT`` bytes); a leading BOM is dropped."""
    try:
        data = read_regular_bytes(path, limit=ENV_FILE_LIMIT)
    except FileNotFoundError:
        return {}
    except SmallFileError as err:
        raise EnvFileError(path, 0, "", err.reason) from None
    except OSError as err:
        raise EnvFileError(path, 0, "", f"cannot read: {err.strerror}") from None
    return parse_env_text(data.decode("utf-8", errors="surrogateescape").removeprefix("\ufeff"), path)


def env_files(home: str | None, cwd: str) -> list[str]:
    """``~/.xrun_env`` then ``./.xrun_env`` (once, if they are the same file)."""
    paths = [os.path.join(home, ENV_FILE_NAME)] if home else []
    local = os.path.join(cwd, ENV_FILE_NAME)
    if not paths or os.path.abspath(paths[0]) != os.path.abspath(local):
        paths.append(local)
    return paths


def parse_export(spec: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """``NAME=VALUE`` as given, or ``NAME`` with the runner's current value."""
    name, sep, value = spec.partition("=")
    if not _NAME.fullmatch(name):
        raise UsageError("--export", f"{spec!r}: expected NAME or NAME=VALUE with a variable name")
    if is_blocked(name):
        raise UsageError("--export", f"{name} never travels to remote nodes (it describes the head's own session)")
    if sep:
        return name, value
    if name not in environ:
        raise UsageError("--export", f"{name} is not set here; use --export {name}=VALUE")
    return name, environ[name]


def with_pythonpath(env: Mapping[str, str], cwd: str) -> dict[str, str]:
    """Prepend the working directory to PYTHONPATH (kept exact when it is already first)."""
    out = dict(env)
    current = out.get("PYTHONPATH", "")
    if current.split(os.pathsep)[0] != cwd:
        out["PYTHONPATH"] = cwd + (os.pathsep + current if current else "")
    return out


def collect(
    environ: Mapping[str, str],
    *,
    exports: Iterable[str] = (),
    files: Iterable[str] = (),
    cwd: str,
) -> dict[str, str]:
    """The full set of variables to export to remote nodes, in precedence order (see the module doc)."""
    env = from_environment(environ)
    for path in files:
        env.update(read_env_file(path))
    for spec in exports:
        name, value = parse_export(spec, environ)
        env[name] = value
    return with_pythonpath(env, cwd)
