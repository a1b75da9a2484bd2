"""Many ranks' stacks as one short view, STAT-style: identical stacks merge, the outliers come first (issue 14).

Pure functions over xrun.launch.doctor.stackdump's ``RankStack``: no I/O, no clock.

* ``compact``: one thread's stack on one line, from the script's deepest frame down:
  ``train.py:88 step > loader.__next__ > queue.get`` (the script's file and line, then ``module.function``
  of every deeper frame; a long chain keeps its two first and three last links).
* ``merge``: ranks whose main threads compact to the same line form one group; a rank without a stack is
  grouped by why. Smallest groups first, so the rank that is somewhere else leads.
* ``render``: ``rank 7 (node2, local 3): ...`` for a group of one, ``ranks 0-6, 8-15: ...`` for the rest.
* ``full_text``: every thread of every rank, traceback-style, for the file the view names.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from xrun.common.result.stacks import RankStack, ThreadStack

_RUNPY = ("runpy.py", "<frozen runpy>")  # python -m: the module's frames start below these
_HEAD_LINKS, _TAIL_LINKS = 2, 3  # of a long chain of deeper frames, what the compact line keeps


@dataclass(frozen=True)
class StackGroup:
    text: str  # the compact stack (or why there is none) all members share
    members: tuple[RankStack, ...]  # in rank order


def compact(stack: ThreadStack) -> str:
    """``train.py:88 step > loader.__next__ > queue.get``."""
    frames = [f for f in stack.frames if os.path.basename(f.filename) not in _RUNPY and f.filename not in _RUNPY]
    if not frames:
        return "(no Python frames)"
    script = frames[0].filename
    anchor = max(i for i, f in enumerate(frames) if f.filename == script)
    top = frames[anchor]
    links = [f"{_module(f.filename)}.{f.name}" for f in frames[anchor + 1 :]]
    if len(links) > _HEAD_LINKS + _TAIL_LINKS + 1:
        links = [*links[:_HEAD_LINKS], "...", *links[-_TAIL_LINKS:]]
    return " > ".join([f"{os.path.basename(top.filename)}:{top.line} {top.name}", *links])


def merge(stacks: Iterable[RankStack]) -> list[StackGroup]:
    """Group ranks by their main thread's compact stack; smallest groups (the outliers) first."""
    groups: dict[str, list[RankStack]] = {}
    for stack in sorted(stacks, key=lambda s: s.rank):
        groups.setdefault(_key(stack), []).append(stack)
    ordered = sorted(groups.items(), key=lambda item: (len(item[1]), item[1][0].rank))
    return [StackGroup(text, tuple(members)) for text, members in ordered]


def render(groups: Sequence[StackGroup]) -> list[str]:
    """One line per group, outliers first."""
    lines = []
    for group in groups:
        if len(group.members) == 1:
            one = group.members[0]
            lines.append(f"rank {one.rank} ({one.host}, local {one.local_rank}): {group.text}")
        else:
            lines.append(f"ranks {rank_ranges(m.rank for m in group.members)}: {group.text}")
    return lines


def rank_ranges(ranks: Iterable[int]) -> str:
    """``0-6, 8-15``: consecutive ranks as ranges."""
    spans: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in spans)


def full_text(stacks: Iterable[RankStack], *, title: str) -> str:
    """Every thread of every rank, outermost frame first (as a Python traceback reads)."""
    out = [title, ""]
    for stack in sorted(stacks, key=lambda s: s.rank):
        out.append(f"rank {stack.rank} ({stack.host}, local {stack.local_rank}, pid {stack.pid})")
        if stack.error is not None:
            out.append(f"  no stack: {stack.error}")
        for thread in stack.threads:
            out.append(f"  thread {thread.name}")
            out.extend(f'    File "{f.filename}", line {f.line}, in {f.name}' for f in thread.frames)
        out.append("")
    return "\n".join(out)


def _key(stack: RankStack) -> str:
    if stack.error is not None:
        return f"no stack: {stack.error}"
    if not stack.threads:
        return "(no threads)"
    return compact(stack.threads[0])


def _module(filename: str) -> str:
    base = os.path.basename(filename)
    return base[:-3] if base.endswith(".py") else base
