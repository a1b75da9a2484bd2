"""The scenario registry: name (and issue number) -> module with ``NAME``, ``TITLE`` and ``run(ctx) -> section``.

``SCENARIOS`` are 1-9, what ``all`` runs; ``OPT_IN`` ones (10: ``stacks``, issue 14) run when named."""

from __future__ import annotations

from types import ModuleType

from bench.scenarios import (
    cluster_failure,
    elastic,
    failure,
    fanout,
    launch,
    logging_throughput,
    memory,
    signal_teardown,
    stacks,
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
# Run by name or number only (``python -m bench stacks``): "all" stays scenarios 1-9 (tests/test_bench.py pins it).
OPT_IN: dict[str, ModuleType] = {m.NAME: m for m in (stacks,)}
NUMBERS = {str(i): name for i, name in enumerate([*SCENARIOS, *OPT_IN], start=1)}
LOCAL = ("launch", "torch_start", "failure", "signal", "memory", "logging")


def scenario(name: str) -> ModuleType:
    """The module of a resolved scenario name, opt-in ones included."""
    return SCENARIOS[name] if name in SCENARIOS else OPT_IN[name]


def resolve(spec: str) -> list[str]:
    """``"1,3,memory"`` -> scenario names; ``all`` = 1–9, ``local`` = 1–6. Unknown names list the known ones."""
    names: list[str] = []
    for word in (w.strip() for w in spec.split(",") if w.strip()):
        if word == "all":
            names += list(SCENARIOS)
        elif word == "local":
            names += list(LOCAL)
        elif word in SCENARIOS or word in OPT_IN or word in NUMBERS:
            names.append(NUMBERS.get(word, word))
        else:
            known = ", ".join(f"{i}={n}" for i, n in NUMBERS.items())
            raise ValueError(f"unknown scenario {word!r}; known: {known}, all, local")
    return list(dict.fromkeys(names))
