"""The scenario registry: name (and number) -> module with ``NAME``, ``TITLE`` and ``run(ctx) -> section``.

``SCENARIOS`` are issue 7's suite, numbered 1-9 (``all``, ``local`` = 1-6). ``OPT_IN`` ones (10: ``stacks``, issue
14; 11: ``network_check``, issue 24; 12: ``restarts``, 13: ``spares``, issue 23; 14: ``preload``, issue 32; 15:
``telemetry``, issue 31; 16: ``replica_groups``, issue 39) run when named. ``SCALE`` are issue 15's: the node
agent's start and the 10,000-agent control plane, and issue 31's head telemetry at 1,000 nodes; run by name or as
the group ``scale``, they compare xrun with what bounds it (an interpreter start, the protocol's own targets), not
with the other launchers.
"""

from __future__ import annotations

from types import ModuleType

from bench.scenarios import (
    agent_start,
    cluster_failure,
    control_plane,
    elastic,
    failure,
    fanout,
    launch,
    logging_throughput,
    memory,
    network_check,
    preload,
    replica_groups,
    restarts,
    signal_teardown,
    spares,
    stacks,
    telemetry,
    telemetry_head,
    torch_start,
)

SCENARIOS: dict[str, ModuleType] = {
    m.NAME: m
    for m in (
        launch,
        torch_start,
        failure,
        signal_teardown,
        memory,
        logging_throughput,
        fanout,
        cluster_failure,
        elastic,
    )
}
SCALE: dict[str, ModuleType] = {m.NAME: m for m in (agent_start, control_plane, telemetry_head)}
# Run by name or number only (``python -m bench stacks``): "all" stays scenarios 1-9 (tests/test_bench.py pins it).
OPT_IN: dict[str, ModuleType] = {
    m.NAME: m for m in (stacks, network_check, restarts, spares, preload, telemetry, replica_groups)}
NUMBERS = {str(i): name for i, name in enumerate([*SCENARIOS, *OPT_IN], start=1)}
LOCAL = ("launch", "torch_start", "failure", "signal", "memory", "logging")


def scenario(name: str) -> ModuleType:
    """The module of a resolved scenario name (numbered, opt-in or scale)."""
    return SCENARIOS.get(name) or OPT_IN.get(name) or SCALE[name]


def resolve(spec: str) -> list[str]:
    """``"1,3,memory"`` -> scenario names; ``all`` = 1–9, ``local`` = 1–6, ``scale`` = the scale scenarios.
    Unknown names list the known ones."""
    names: list[str] = []
    for word in (w.strip() for w in spec.split(",") if w.strip()):
        if word == "all":
            names += list(SCENARIOS)
        elif word == "local":
            names += list(LOCAL)
        elif word == "scale":
            names += list(SCALE)
        elif word in SCENARIOS or word in OPT_IN or word in NUMBERS or word in SCALE:
            names.append(NUMBERS.get(word, word))
        else:
            known = ", ".join(f"{i}={n}" for i, n in NUMBERS.items())
            raise ValueError(f"unknown scenario {word!r}; known: {known}, all, local, {', '.join(SCALE)}, scale")
    return list(dict.fromkeys(names))
