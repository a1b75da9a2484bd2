"""Reading /proc: which tagged processes are alive, their peak memory, and cleaning up after a trial.

Every trial gets a fresh tag. It is put in the launcher's environment (ranks inherit it locally) and in the
rank script's arguments (so it survives ssh, which does not forward the environment). A process is *ours* when
the tag appears in its ``/proc/PID/environ`` or ``/proc/PID/cmdline``. Zombies count as dead: PID 1 on these
machines reaps orphans slowly, and a zombie holds no memory, no files and no GPU.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterable

TAG_ENV = "XRUN_BENCH_TAG"


def new_tag() -> str:
    return "xbench" + uuid.uuid4().hex[:16]


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or a kernel thread we may not read
        return None


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return False
    # The command name is in parentheses and may contain anything; the state follows the last ')'.
    state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3]
    return state not in (b"Z", b"X")


def tagged_pids(tag: str) -> list[int]:
    """Live (non-zombie) processes carrying ``tag``, excluding this process."""
    needle = tag.encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        if any(needle in (_read(f"/proc/{pid}/{what}") or b"") for what in ("cmdline", "environ")) and is_alive(pid):
            found.append(pid)
    return sorted(found)


def in_other_netns(needle: str) -> list[int]:
    """Live processes whose command line holds ``needle`` and that run in another network namespace than this
    one: on the namespace cluster, which one process holds at a time, those are the nodes' processes (node
    agents started over ssh carry neither our environment nor our arguments)."""
    mine = os.readlink("/proc/self/ns/net")
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if needle.encode() in (_read(f"/proc/{pid}/cmdline") or b""):
            try:
                if os.readlink(f"/proc/{pid}/ns/net") != mine and is_alive(pid):
                    found.append(pid)
            except OSError:
                pass
    return found


def cmdline(pid: int, limit: int = 160) -> str:
    raw = _read(f"/proc/{pid}/cmdline") or b""
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def runs_script(pid: int, directory: str) -> bool:
    """True when the process is ``python [-flags] DIRECTORY/...``: a rank, not a launcher that mentions the script
    in its arguments (deepspeed's agent, a shell)."""
    raw = _read(f"/proc/{pid}/cmdline") or b""
    argv = raw.decode(errors="replace").split("\0")
    first = next((a for a in argv[1:] if a and not a.startswith("-")), "")
    return first.startswith(directory)


def status_kib(pid: int, field: str = "VmHWM") -> int | None:
    """A ``/proc/PID/status`` field in KiB (VmHWM: peak resident set), or None once the process is gone."""
    raw = _read(f"/proc/{pid}/status")
    if raw is None:
        return None
    prefix = field.encode() + b":"
    for line in raw.splitlines():
        if line.startswith(prefix):
            return int(line.split()[1])
    return None


def pss_kib(pid: int) -> int | None:
    """Proportional set size: resident pages, shared ones divided among their sharers (what a fork really adds)."""
    raw = _read(f"/proc/{pid}/smaps_rollup")
    if raw is None:
        return None
    for line in raw.splitlines():
        if line.startswith(b"Pss:"):
            return int(line.split()[1])
    return None


def rank_pids(run_dir: str) -> dict[int, float]:
    """Pids the rank scripts recorded in ``RUN_DIR/ranks``, with the start time each wrote."""
    out = {}
    ranks = os.path.join(run_dir, "ranks")
    for name in os.listdir(ranks):
        text = (_read(os.path.join(ranks, name)) or b"").split()
        if text:  # a rank may be caught between creating and writing its file
            out[int(name)] = float(text[0])
    return out


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL each pid (all are processes this bench started and tagged); ignore the ones already gone."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
