"""Each checked node's result: its row (host, interface, address, figures, verdict); what ``xrun check --network``
prints of the rows (one line per node, or one JSON object with ``--json``, and the summary line); and a job's
``--precheck`` result as data (``PrecheckResult``: which node ranks are bad, why, their figures), which
``precheck_decision`` decides on."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xrun.printable import columns
from xrun.runner.network.node_verdicts import RULE, LinkVerdict, NodeVerdict


@dataclass(frozen=True)
class NodeRow:
    host: str
    interface: str | None
    address: str | None
    result: NodeVerdict

    def to_json(self) -> dict[str, Any]:
        figures = self.result.figures
        return {
            "host": self.host,
            "interface": self.interface,
            "address": self.address,
            "latency_ms": round(figures.latency_ms, 3) if figures else None,
            "throughput_mbs": round(figures.throughput_mbs, 1) if figures else None,
            "allreduce_mbs": round(figures.allreduce_mbs, 1) if figures and figures.allreduce_mbs else None,
            "verdict": self.result.verdict.value,
            "reason": self.result.reason,
        }


@dataclass(frozen=True)
class BadNode:
    """A node the check named: its node rank, host, verdict ('slow' or 'unreachable'), why, and its figures."""

    rank: int
    row: NodeRow

    def describe(self) -> str:
        result, figures = self.row.result, self.row.result.figures
        reduce = (f", all-reduce {figures.allreduce_mbs:.1f} MB/s"
                  if figures and figures.allreduce_mbs is not None else "")
        shown = (f"best pair {figures.latency_ms:.3f} ms, {figures.throughput_mbs:.1f} MB/s{reduce}" if figures
                 else "no pair with it succeeded")
        why = f": {result.reason}" if result.reason else ""
        return f"{self.row.host} {result.verdict.value}{why} ({shown})"


@dataclass(frozen=True)
class PrecheckResult:
    """Every checked node's row (host, interface, address, figures, verdict), by node rank; the check's time."""

    ranks: tuple[int, ...]  # the node ranks checked, in the order of ``rows``
    rows: tuple[NodeRow, ...]
    elapsed: float

    @property
    def bad(self) -> tuple[BadNode, ...]:
        return tuple(BadNode(rank, row) for rank, row in zip(self.ranks, self.rows)
                     if row.result.verdict is not LinkVerdict.OK)

    def table(self) -> list[str]:
        """The check's table (as ``xrun check --network`` prints it) and its rule, to show before a failure."""
        return [*format_table(self.rows).splitlines(), f"rule: {RULE}"]


def node_rows(hosts: Sequence[str], hellos: Mapping[int, Mapping[str, Any]],
              verdicts: Mapping[int, NodeVerdict]) -> list[NodeRow]:
    return [NodeRow(host, hellos.get(i, {}).get("interface"), hellos.get(i, {}).get("address"), verdicts[i])
            for i, host in enumerate(hosts)]


def bad(rows: Sequence[NodeRow]) -> list[NodeRow]:
    return [r for r in rows if r.result.verdict is not LinkVerdict.OK]


def format_table(rows: Sequence[NodeRow]) -> str:
    """One line per node; an ``allreduce MB/s`` column when any node has that figure (--network=allreduce)."""
    reduces = any(r.result.figures and r.result.figures.allreduce_mbs is not None for r in rows)
    header = ("host", "interface", "address", "latency_ms", "MB/s", *(("allreduce MB/s",) if reduces else ()),
              "verdict")
    table = [header]
    for r in rows:
        f = r.result.figures
        verdict = r.result.verdict.value + (f" ({r.result.reason})" if r.result.reason else "")
        reduce = (f"{f.allreduce_mbs:.1f}" if f and f.allreduce_mbs is not None else "-",) if reduces else ()
        table.append((r.host, r.interface or "-", r.address or "-", f"{f.latency_ms:.3f}" if f else "-",
                      f"{f.throughput_mbs:.1f}" if f else "-", *reduce, verdict))
    return "\n".join(columns(table))


def format_json(rows: Sequence[NodeRow], elapsed: float) -> str:
    return json.dumps({"ok": not bad(rows), "elapsed_s": round(elapsed, 2), "rule": RULE,
                       "nodes": [r.to_json() for r in rows]})


def summary(rows: Sequence[NodeRow], elapsed: float) -> str:
    wrong = bad(rows)
    if not wrong:
        return f"xrun check --network: {len(rows)} node(s) ok in {elapsed:.1f} s"
    named = ", ".join(f"{r.host} {r.result.verdict.value}" for r in wrong)
    return f"xrun check --network: {len(wrong)} of {len(rows)} node(s) bad: {named} ({RULE})"
