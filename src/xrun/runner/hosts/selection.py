"""Choose hosts and devices: --include / --exclude / --num_nodes / --num_gpus, DeepSpeed's grammar, strict.

Everything here is pure: a pool ``{host: (slot, ...)}`` in hostfile order goes in, a world of the same shape
comes out, or a ``SelectionError`` that names the flag, the spec and what exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from xrun.errors import SelectionError

Pool = dict[str, tuple[int, ...]]

GRAMMAR = "expected HOST[:SLOT[,SLOT...]][@HOST[:SLOT[,SLOT...]]...], e.g. worker-0:0,2@worker-1"


@dataclass(frozen=True)
class HostFilter:
    host: str
    slots: tuple[int, ...] | None  # None: the whole host


@dataclass(frozen=True)
class Selection:
    """What the user asked for; at most one of include/exclude, and neither together with the counts."""

    include: str | None = None
    exclude: str | None = None
    num_nodes: int | None = None
    num_gpus: int | None = None

    @property
    def filters(self) -> bool:
        return any(v is not None for v in (self.include, self.exclude, self.num_nodes, self.num_gpus))


def parse_filter(flag: str, spec: str) -> tuple[HostFilter, ...]:
    """Parse ``HOST[:SLOT,...]@HOST...``; every malformed part is an error that restates the grammar."""
    if not spec.strip():
        raise SelectionError(flag, spec, f"empty; {GRAMMAR}")
    return tuple(_parse_part(flag, spec, part) for part in spec.split("@"))


def _parse_part(flag: str, spec: str, part: str) -> HostFilter:
    if not part:
        raise SelectionError(flag, spec, f"empty host between '@'; {GRAMMAR}")
    host, colon, slot_text = part.partition(":")
    if not host:
        raise SelectionError(flag, spec, f"{part!r} has no host name; {GRAMMAR}")
    if not colon:
        return HostFilter(host=host, slots=None)
    if ":" in slot_text:
        raise SelectionError(flag, spec, f"{part!r} has more than one ':'; {GRAMMAR}")
    if not slot_text:
        raise SelectionError(flag, spec, f"{part!r} has ':' but no slots; {GRAMMAR}")
    slots = []
    for slot in slot_text.split(","):
        if not re.fullmatch(r"[0-9]+", slot):
            raise SelectionError(flag, spec, f"slot {slot!r} in {part!r} is not a non-negative integer; {GRAMMAR}")
        slots.append(int(slot))
    return HostFilter(host=host, slots=tuple(slots))


def select(pool: Pool, selection: Selection) -> Pool:
    """Apply a selection to a pool; the result keeps pool order and sorted, merged slots."""
    _check_combination(selection)
    if selection.include is not None:
        world = include(pool, parse_filter("--include", selection.include), selection.include)
    elif selection.exclude is not None:
        world = exclude(pool, parse_filter("--exclude", selection.exclude), selection.exclude)
    else:
        world = dict(pool)
        if selection.num_nodes is not None:
            world = keep_first_nodes(world, selection.num_nodes)
        if selection.num_gpus is not None:
            world = keep_first_slots(world, selection.num_gpus)
    return world


def _check_combination(selection: Selection) -> None:
    if selection.include is not None and selection.exclude is not None:
        raise SelectionError("--include", selection.include, "cannot be combined with --exclude; use one of them")
    counts = [
        name
        for name, value in (("--num_nodes", selection.num_nodes), ("--num_gpus", selection.num_gpus))
        if value is not None
    ]
    for flag, spec in (("--include", selection.include), ("--exclude", selection.exclude)):
        if spec is not None and counts:
            raise SelectionError(flag, spec, f"cannot be combined with {counts[0]}; name the devices in {flag} instead")


def include(pool: Pool, filters: tuple[HostFilter, ...], spec: str) -> Pool:
    chosen: dict[str, set[int]] = {}
    for item in filters:
        slots = _check_known(pool, item, "--include", spec)
        chosen.setdefault(item.host, set()).update(slots)
    world = {host: tuple(sorted(chosen[host])) for host in pool if host in chosen}
    return _non_empty(world, "--include", spec)


def exclude(pool: Pool, filters: tuple[HostFilter, ...], spec: str) -> Pool:
    removed: dict[str, set[int]] = {}
    for item in filters:
        slots = _check_known(pool, item, "--exclude", spec)
        removed.setdefault(item.host, set()).update(slots)
    world = {}
    for host, slots in pool.items():
        kept = tuple(s for s in slots if s not in removed.get(host, set()))
        if kept:  # a host left with no slots is dropped
            world[host] = kept
    return _non_empty(world, "--exclude", spec)


def _check_known(pool: Pool, item: HostFilter, flag: str, spec: str) -> tuple[int, ...]:
    if item.host not in pool:
        raise SelectionError(flag, spec, f"unknown host {item.host!r}; known hosts: {_list_hosts(pool)}")
    available = pool[item.host]
    if item.slots is None:
        return available
    missing = [s for s in item.slots if s not in available]
    if missing:
        raise SelectionError(
            flag, spec, f"host {item.host!r} has no slot {missing[0]}; its slots are {_format_slots(available)}"
        )
    return item.slots


def _non_empty(world: Pool, flag: str, spec: str) -> Pool:
    if not world:
        raise SelectionError(flag, spec, "leaves no devices to run on")
    return world


def keep_first_nodes(pool: Pool, count: int) -> Pool:
    if count <= 0:
        raise SelectionError("--num_nodes", str(count), "must be a positive integer")
    if count > len(pool):
        raise SelectionError("--num_nodes", str(count), f"only {len(pool)} host(s) available: {_list_hosts(pool)}")
    return dict(list(pool.items())[:count])


def keep_first_slots(pool: Pool, count: int) -> Pool:
    if count <= 0:
        raise SelectionError("--num_gpus", str(count), "must be a positive integer")
    short = [(host, len(slots)) for host, slots in pool.items() if len(slots) < count]
    if short:
        host, have = short[0]
        raise SelectionError("--num_gpus", str(count), f"host {host!r} has only {have} slot(s)")
    return {host: slots[:count] for host, slots in pool.items()}


def _list_hosts(pool: Pool, limit: int = 8) -> str:
    names = list(pool)
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _format_slots(slots: tuple[int, ...]) -> str:
    return ",".join(str(s) for s in slots)
