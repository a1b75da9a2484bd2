"""Per-rank log files under ``--log_dir``: ``{log_dir}/{host}/rank{N}/stdout.log`` and ``stderr.log``, an earlier
run's files renamed with their time, created new and never through a symbolic link (issue 22 §6).

``check_logs`` looks before any rank starts, creating nothing: what ``open_logs`` would refuse, and a directory
where the node's ``failure.json`` or ``summary.json`` goes, is the node preflight's one line and exit code 2
(``xrun.common.preflight``, issue 33 §2). ``open_logs`` still refuses what appears between the two (a link planted
meanwhile): that rank then cannot start.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Iterable

from xrun.common.output.streams import LineCopy

LOG_NAMES = ("stdout", "stderr")
# in the node's folder, beside its ranks' folders: xrun.common.result.failure_report replaces them at the end
FAILURE_JSON, SUMMARY_JSON = "failure.json", "summary.json"
REPORT_NAMES = (FAILURE_JSON, SUMMARY_JSON)
# in the job's log directory: the head's record (xrun.runner.job.record) and the page that draws it (xrun.runner.report)
EVENTS_FILE, REPORT_HTML = "events.jsonl", "report.html"


class LogFileRefused(OSError):
    """A log path xrun will not write through (issue 22 §6): a symbolic link or another file is in its place, or a
    directory of it is another user's link; or one it cannot write (issue 33 §2)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(errno.ELOOP, reason, path)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


# Open a log file as new, never through a symbolic link: O_EXCL refuses any name already there (a link too,
# dangling or not), O_NOFOLLOW says the same for the last component on its own.
_NEW_LOG = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_IN_THE_WAY = ("a symbolic link or another file is in the way of this log file (xrun writes only files it creates); "
               "remove it or choose another --log_dir")


def open_logs(log_dir: str, host: str, rank: int) -> tuple[int, int]:
    """Open ``{log_dir}/{host}/rank{N}/stdout.log`` and ``stderr.log``, keeping earlier runs' files.

    In a shared log directory another user may have put a symbolic link where a log file goes: the file is
    created new (an earlier run's is renamed first) and never through a link, so a link in its place ends the
    rank's start with ``LogFileRefused`` naming it, and a directory of the path that is another user's link
    (not root's) is refused too, rather than writing where that user chose."""
    directory = rank_log_dir(log_dir, host, rank)
    for part in (log_dir, os.path.dirname(directory), directory):  # before makedirs follows them
        _refuse_foreign_link(part)
    os.makedirs(directory, exist_ok=True)
    fds: list[int] = []
    try:
        for name in LOG_NAMES:
            path = os.path.join(directory, f"{name}.log")
            set_aside(path)
            try:
                fds.append(open_new(path))
            except FileExistsError:  # a link (or a file) put there since the rename: not ours to write into
                raise LogFileRefused(path, _IN_THE_WAY) from None
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds[0], fds[1]


def check_logs(log_dir: str, host: str, ranks: Iterable[int]) -> None:
    """``LogFileRefused`` for the first path under ``log_dir`` that would stop one of ``ranks`` from starting
    (``open_logs``) or the node's reports from being written, looked at without creating or following anything;
    ``log_dir`` itself is ``preflight.check_log_dir``'s."""
    node_dir = host_log_dir(log_dir, host)
    for part in (log_dir, node_dir):
        _refuse_foreign_link(part)
    _refuse_non_directory(node_dir, "this node's log folders go in it")
    for name in REPORT_NAMES:  # replaced at the end: os.replace cannot put a file where a directory is
        path = os.path.join(node_dir, name)
        if os.path.isdir(path):
            raise LogFileRefused(path, "is a directory where xrun writes this node's report; remove it or choose "
                                       "another --log_dir")
    for rank in ranks:
        directory = rank_log_dir(log_dir, host, rank)
        _refuse_foreign_link(directory)
        _refuse_non_directory(directory, "this rank's log files go in it")
        for name in LOG_NAMES:
            path = os.path.join(directory, f"{name}.log")
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(info.st_mode):  # an earlier run's file is renamed; anything else is in the way
                raise LogFileRefused(path, f"is {_what(info)} where this rank's log file goes (xrun writes only "
                                           "files it creates); remove it or choose another --log_dir")
        deepest = next((d for d in (directory, node_dir, log_dir) if os.path.isdir(d)), None)
        if deepest is not None:  # none yet: check_log_dir found it can be made
            _refuse_unwritable(deepest)


def _what(info: os.stat_result) -> str:
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    return "a directory" if stat.S_ISDIR(info.st_mode) else "another kind of file"


def _refuse_non_directory(path: str, why: str) -> None:
    """A file where a directory of the logs goes: ``makedirs`` would fail with EEXIST."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise LogFileRefused(path, f"is not a directory, and {why}; remove it or choose another --log_dir")


def _refuse_unwritable(directory: str) -> None:
    """The deepest directory of the logs that exists: xrun makes folders or files in it (or renames in it)."""
    if not os.access(directory, os.W_OK | os.X_OK):
        raise LogFileRefused(directory, "is not writable by this user, and the ranks' log files go in it; "
                                        "choose another --log_dir")


def _refuse_foreign_link(path: str) -> None:
    """A directory of the log path that is a symbolic link owned by another user (not root): refused."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if stat.S_ISLNK(info.st_mode) and info.st_uid not in (0, os.geteuid()):
        raise LogFileRefused(path, f"a symbolic link of another user (uid {info.st_uid}); choose another --log_dir")


def set_aside(path: str) -> None:
    """Rename an earlier run's file (``stdout.log``, ``events.jsonl``) to ``stdout.<its mtime as
    YYYYmmdd-HHMMSS>.log``; a symbolic link or another file in its place is not an earlier run's file:
    ``LogFileRefused``."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise LogFileRefused(path, _IN_THE_WAY)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(info.st_mtime))
    directory, (name, ext) = os.path.dirname(path), os.path.splitext(os.path.basename(path))
    target = os.path.join(directory, f"{name}.{stamp}{ext}")
    n = 1
    while os.path.lexists(target):  # two runs in the same second
        target = os.path.join(directory, f"{name}.{stamp}.{n}{ext}")
        n += 1
    os.rename(path, target)


def open_new(path: str) -> int:
    """``path`` created new, never through a link (a file put there since ``set_aside``: FileExistsError)."""
    return os.open(path, _NEW_LOG, 0o644)


def rank_log_dir(log_dir: str, host: str, rank: int) -> str:
    """``{log_dir}/{host}/rank{N}``: one rank's log files."""
    return os.path.join(host_log_dir(log_dir, host), f"rank{rank}")


def host_log_dir(log_dir: str, host: str) -> str:
    """``{log_dir}/{host}``, the one folder of a node's logs, ``failure.json`` and ``summary.json``: the host
    name with path separators replaced, so that no host name can point outside ``log_dir``."""
    name = host.replace(os.sep, "_")
    return os.path.join(log_dir, name if name not in ("", ".", "..") else "_")


class FilteredLogs:
    """The node's ``filtered_stdout.log`` and ``filtered_stderr.log`` for torchrun's duplicate filters, appended to
    across attempts and restarts: opened and closed by whoever supervises the node's ranks (the rank group, or the
    elastic adapter), each rank stream's copy (``LineCopy``) writing to the file of its console stream. None
    without filters or a log directory."""

    def __init__(self, log_dir: str | None, host: str, filters: tuple[tuple[str, ...], tuple[str, ...]]) -> None:
        self._files: dict[int, tuple[int, tuple[bytes, ...]]] = {}  # console fd (1, 2) -> (file, words)
        if log_dir is None:
            return
        for console, name, words in ((1, "stdout", filters[0]), (2, "stderr", filters[1])):
            if words:
                directory = host_log_dir(log_dir, host)
                os.makedirs(directory, exist_ok=True)
                fd = os.open(os.path.join(directory, f"filtered_{name}.log"),
                             os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
                self._files[console] = (fd, tuple(w.encode("utf-8", "surrogateescape") for w in words))

    def copy(self, console: int) -> LineCopy | None:
        """A rank stream's copy into the file of its console stream (1 or 2), if that stream has filters."""
        opened = self._files.get(console)
        return LineCopy(*opened) if opened is not None else None

    def close(self) -> None:
        files, self._files = self._files, {}
        for fd, _ in files.values():
            os.close(fd)
