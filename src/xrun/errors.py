"""Errors a user can cause. Each carries the fields that locate the problem and prints as one line.

The command-line entry points catch ``XrunError`` and print ``str(err)`` with exit code ``err.exit_code``
(2 for bad input), never a traceback.
"""

from __future__ import annotations

from xrun.printable import shown

USAGE_EXIT_CODE = 2


class XrunError(Exception):
    """Base class: a one-line message that says what is wrong and what to do next."""

    exit_code = USAGE_EXIT_CODE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(XrunError):
    """A flag or a combination of flags that cannot work."""

    def __init__(self, flag: str, reason: str) -> None:
        self.flag = flag
        self.reason = reason
        super().__init__(f"{flag}: {reason}")


class UnknownFlagError(XrunError):
    """A flag the command does not have: the one it probably meant, or where the script's own flags go."""

    def __init__(self, flag: str, *, meant: str | None = None, hint: str = "") -> None:
        self.flag = flag
        self.meant = meant
        self.hint = hint
        shown_flag = flag if len(flag) <= 100 else flag[:100] + "..."
        said = f" (did you mean {meant}?)" if meant is not None else f": {hint}" if hint else ""
        super().__init__(f"unknown flag {shown_flag}{said}")


class HostfileError(XrunError):
    """A hostfile that cannot be read or has a bad line."""

    def __init__(self, path: str, lineno: int | None, line: str | None, reason: str) -> None:
        self.path = path
        self.lineno = lineno
        self.line = line
        self.reason = reason
        where = f"{path}:{lineno}" if lineno is not None else path
        text = f" {shown(line.strip(), limit=200)}:" if line is not None else ""
        super().__init__(f"{where}:{text} {reason}")


class RecordError(XrunError):
    """A run's record (``events.jsonl``, ``summary.json``) that ``xrun report`` cannot read: missing or malformed."""

    def __init__(self, path: str, lineno: int | None, reason: str) -> None:
        self.path = path
        self.lineno = lineno
        self.reason = reason
        where = path + (f":{lineno}" if lineno is not None else "")
        super().__init__(f"{where}: {reason}")


class SelectionError(XrunError):
    """An --include/--exclude/--num_nodes/--num_gpus request that does not fit the hosts."""

    def __init__(self, flag: str, spec: str, reason: str) -> None:
        self.flag = flag
        self.spec = spec
        self.reason = reason
        super().__init__(f"{flag} {shown(spec, limit=200)}: {reason}")


class WorldInfoError(XrunError):
    """A --world_info string that is not base64 JSON of {host: [slot, ...]}."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"--world_info: {reason}")


class BindingError(XrunError):
    """Core binding that cannot be done as asked (bad --bind_core_list, KMP_AFFINITY set, too few cores)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"core binding: {reason}")


class EnvFileError(XrunError):
    """A malformed line in an env file (~/.xrun_env, ./.xrun_env)."""

    def __init__(self, path: str, lineno: int, line: str, reason: str) -> None:
        self.path = path
        self.lineno = lineno
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{lineno}: {shown(line.strip(), limit=200)}: {reason}")


class UnknownHostError(XrunError):
    """A host of the job whose name resolves neither here (DNS, /etc/hosts) nor through ssh's config."""

    def __init__(self, host: str, reason: str) -> None:
        self.host = host
        self.reason = reason
        super().__init__(f"host {shown(host)}: {reason}")


class PortBusyError(XrunError):
    """An explicit ``--master_port`` that another process already holds on node 0 (issue 17)."""

    def __init__(self, host: str, port: int, holder: str | None) -> None:
        self.host = host
        self.port = port
        self.holder = holder
        held = f" by {holder}" if holder else ""
        super().__init__(f"--master_port: port {port} is already in use on {host}{held}; "
                         "leave --master_port out to use a free port, or pick another")


class IncompleteInstallError(XrunError):
    """A file of xrun's own that its package should hold is missing: the install is broken, not the job."""

    def __init__(self, path: str, needed_for: str) -> None:
        self.path = path
        self.needed_for = needed_for
        super().__init__(f"xrun's install is incomplete: {path} is missing ({needed_for}); reinstall xrun "
                         f"(pip install --force-reinstall --no-deps xrun)")


class PreloadHelperLost(XrunError):
    """The preload helper died during an attempt: the next attempt's ranks cannot be forked on its node. Not the
    user's input: the job ends as a node's failure does."""

    exit_code = 1


class PreloadError(XrunError):
    """--preload that cannot work on this node: a module that cannot be imported, or that leaves the helper unfit
    to fork ranks (CUDA initialised, a thread running), or a helper that could not start or died while importing."""

    def __init__(self, message: str, *, module: str | None = None) -> None:
        self.module = module
        super().__init__(message)
