"""The file a dump's full text goes to, and the lines that show a dump: the same at the head (its merged view of
every node's stacks, ``xrun.runner.job.doctor``) and on a node that is the whole job (``xrun.launch.doctor``)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from xrun.common.result.stacks import RankStack
from xrun.common.result.stackview import full_text, merge, render


def show_stacks(stacks: Sequence[RankStack], problem: str | None, reason: str, *, log_dir: str | None) -> list[str]:
    """The lines that show a dump: the headline naming the file with the full dumps, then the merged view.
    Writes that file (under ``log_dir``, else the working directory)."""
    if problem is not None:
        return [problem]
    if not stacks:
        return [f"{reason}: no rank is running, no stacks to take"]
    try:
        path = write_dump_file(log_dir, full_text(stacks, title=f"xrun: stacks of {len(stacks)} ranks ({reason})"))
        where = f"full dumps in {path}"
    except OSError as err:
        where = f"full dumps not written: {err.strerror or err}"
    lines = [f"{reason}: stacks of {len(stacks)} rank{'s' if len(stacks) != 1 else ''}, outliers first; {where}"]
    return lines + [f"  {line}" for line in render(merge(stacks))]


def write_dump_file(log_dir: str | None, text: str, *, kind: str = "stacks", suffix: str = ".txt") -> str:
    """``{log_dir or the temporary directory}/xrun-{kind}-YYYYmmdd-HHMMSS-<random>{suffix}``, mode 0600; returns its
    absolute path (the lines that announce it name it).

    Never the working directory: a job without ``--log_dir`` is not asked to leave files where it was started.
    Stacks and collective records show what the ranks hold (arguments, paths, tensor shapes): the file is
    readable by its owner only, and made with ``mkstemp`` (O_CREAT|O_EXCL|O_NOFOLLOW, a name nobody can guess
    ahead), so a link another user put in a shared directory such as ``/tmp`` is never followed (issue 22 §6)."""
    import tempfile  # lazy: it loads random and shutil, needed only when a dump is written

    directory = os.path.abspath(log_dir if log_dir is not None else tempfile.gettempdir())
    os.makedirs(directory, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())

    fd, path = tempfile.mkstemp(prefix=f"xrun-{kind}-{stamp}-", suffix=suffix, dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path
