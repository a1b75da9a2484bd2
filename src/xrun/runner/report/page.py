"""report.html: a ``model.Report`` as one self-contained page (docs/report.md).

The charts are plotly.js's (made for timelines and line charts; its basic bundle is vendored in the package, so
nothing is fetched from a CDN: clusters have no internet); the page embeds it whole and hands it the figures as
JSON: no chart code here, only the figures' data. Every fact a chart draws is also
in the page's text (titles, tables), so a screen reader, ``grep`` and a test read the same.

Everything from the record (hostnames, reasons, the command) is hostile input: the page's text is escaped as
HTML; the figures' JSON has ``<``, ``>`` and ``&`` as ``\\u`` escapes (no ``</script>`` can end its element), and
their strings are escaped once more because plotly reads a subset of HTML in labels. A Content-Security-Policy
lets only the page's own scripts run (by their hashes) and forbids every fetch.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import shlex
from collections.abc import Sequence
from typing import Any

from xrun.runner.report.model import ATTEMPT_COLUMNS, GROUP_RESTART_COLUMNS, Chart, Mark, Outcome, Report, Span

COLOURS = {Outcome.OK: "#4c9a2a", Outcome.FAILED: "#d62728", Outcome.STOPPED: "#9e9e9e", Outcome.LOST: "#8c564b",
           Outcome.RUNNING: "#1f77b4"}
SYMBOLS = {"restart": "triangle-left", "group restart": "triangle-left-open", "failure": "x", "spare swap": "star",
           "node lost": "x-thin-open", "hang": "hourglass", "stop": "square", "straggler": "diamond",
           "recovered": "diamond-open", "first collective": "circle-open"}
# the kinds written beside their mark (the others: on hover and in the marks' table), and where: marks of the same
# moment (a failure, the restart that follows it) apart
PLACES = {"restart": "top right", "group restart": "top right", "spare swap": "top right", "straggler": "top right",
          "hang": "bottom right", "failure": "bottom right"}
MARK_LABELS_UP_TO = 40  # marks of one kind written beside their symbol (more: on hover and in the table only)
LANE_PX = 22

# Draws each figure of the JSON block, then marks the body drawn (tests wait for it).
GLUE = """(function () {
  var figures = JSON.parse(document.getElementById("xrun-figures").textContent);
  var drawn = Object.keys(figures).map(function (id) {
    var f = figures[id];
    return Plotly.newPlot(id, f.data, f.layout, {displaylogo: false, responsive: true});
  });
  Promise.all(drawn).then(function () { document.body.setAttribute("data-drawn", String(drawn.length)); });
})();"""

STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}th{background:#f3f3f3}
pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap;word-break:break-all}.note{color:#555}
.cause{font-size:1.1em}details{margin:.4em 0 1.2em}"""


def render(report: Report, plotly_js: str) -> str:
    """The page, with ``plotly_js`` (the library's source) embedded."""
    figures = {"timeline": _timeline(report),
               **{f"chart{i}": _chart(c) for i, c in enumerate(report.charts) if c.series}}
    scripts = [plotly_js, GLUE]
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in scripts)
    csp = f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src data:; font-src data:"
    e = _escape
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        f"<title>{e(report.title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{e(report.title)}</h1>",
        f'<p id="state">The run {e(report.state)}.</p>',
        *(f'<p class="note">{e(n)}</p>' for n in report.notes),
        '<section><h2>Root cause</h2>', *(f'<p class="cause">{e(s)}</p>' for s in report.root_cause), "</section>",
        "<section><h2>The run</h2>", _table(("fact", "value"), report.facts, id_="facts"), "</section>",
        "<section><h2>Timeline</h2>",
        '<p>A lane for the job (its attempts, restarts, stops, hangs), for each node and for each rank (its life in '
        'each attempt to its exit); the marks are listed below it.</p>',
        _figure_div("timeline", "Timeline of the run: " + "; ".join(m.text for m in report.marks[:20])),
        "<details open><summary>Marks on the timeline</summary>",
        _table(("t (s)", "lane", "what", "mark"), [(f"{m.t:g}", m.lane, m.text, m.kind) for m in report.marks],
               id_="marks"),
        "</details><details><summary>Spans on the timeline</summary>",
        _table(("lane", "from (s)", "to (s)", "outcome", "what"),
               [(s.lane, f"{s.start:g}", f"{s.end:g}", s.outcome.value, s.text) for s in report.spans], id_="spans"),
        "</details></section>",
        "<section><h2>Attempts</h2>", _table(ATTEMPT_COLUMNS, report.attempts, id_="attempts"), "</section>",
        *_group_restarts(report),
        *(_chart_section(f"chart{i}", chart) for i, chart in enumerate(report.charts)),
        "<section><h2>Command and env contract</h2>",
        "<p>Rank 0's command and the variables xrun set for it on top of its node's environment (each rank's own "
        "RANK, LOCAL_RANK, NODE_RANK...: docs/env-contract.md).</p>",
        f'<pre id="command">{e(shlex.join(report.command)) if report.command else "not in the record"}</pre>',
        _table(("variable", "value"), report.env, id_="env"), "</section>",
    ]
    parts.append(f'<script type="application/json" id="xrun-figures">{_json(figures)}</script>')
    parts.extend(f"<script>{s}</script>" for s in scripts)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _group_restarts(report: Report) -> list[str]:
    """--replica_groups: each group's restart (none: no section, the page of a run without groups is as it was)."""
    if not report.group_restarts:
        return []
    return ["<section><h2>Replica group restarts</h2>",
            "<p>Each restart of a replica group alone (--replica_groups, docs/replica-groups.md), as its node decided "
            "it: the rank whose end caused it (its mark on the timeline), the how-many-th of the group's own "
            "--max_restarts, and the groups on that node that ran on.</p>",
            _table(GROUP_RESTART_COLUMNS, report.group_restarts, id_="group-restarts"), "</section>"]


def _timeline(report: Report) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    lanes = set(report.lanes)
    for outcome in Outcome:
        spans = [s for s in report.spans if s.outcome is outcome and s.lane in lanes]
        if spans:
            data.append(_bars(outcome, spans))
    kinds: dict[str, list[Mark]] = {}
    for mark in (m for m in report.marks if m.lane in lanes):
        kinds.setdefault(mark.kind, []).append(mark)
    for kind, marks in kinds.items():
        labelled = kind in PLACES and len(marks) <= MARK_LABELS_UP_TO
        data.append({"type": "scatter", "name": _plot(kind), "mode": "markers+text" if labelled else "markers",
                     "x": [m.t for m in marks], "y": [_plot(m.lane) for m in marks],
                     "text": [_plot(m.text) for m in marks], "textposition": PLACES.get(kind, "top right"),
                     "hovertext": [_plot(m.text) for m in marks], "hoverinfo": "text",
                     "marker": {"symbol": SYMBOLS.get(kind, "circle"), "size": 11, "color": "#111"}})
    return {"data": data, "layout": {
        "title": {"text": "Timeline: the job, each node and each rank"}, "barmode": "overlay",
        "height": 140 + LANE_PX * len(report.lanes), "margin": {"l": 10, "r": 10, "t": 50, "b": 40},
        "xaxis": {"title": {"text": "seconds since the job's start"}, "rangemode": "tozero"},
        "yaxis": {"type": "category", "categoryorder": "array", "categoryarray": [_plot(x) for x in report.lanes],
                  "autorange": "reversed", "automargin": True},
        "showlegend": True, "legend": {"orientation": "h"}}}


def _bars(outcome: Outcome, spans: Sequence[Span]) -> dict[str, Any]:
    return {"type": "bar", "orientation": "h", "name": _plot(outcome.value), "y": [_plot(s.lane) for s in spans],
            "base": [s.start for s in spans], "x": [max(s.end - s.start, 1e-3) for s in spans],
            "hovertext": [_plot(f"{s.lane}, {s.text} ({s.start:g}-{s.end:g} s)") for s in spans], "hoverinfo": "text",
            "width": 0.6,
            "marker": {"color": COLOURS[outcome]}}


def _chart(chart: Chart) -> dict[str, Any]:
    return {"data": [{"type": "scatter", "mode": "lines+markers", "name": _plot(s.name), "x": list(chart.t),
                      "y": list(s.values)} for s in chart.series],
            "layout": {"title": {"text": _plot(chart.title)}, "height": 320, "showlegend": True,
                       "xaxis": {"title": {"text": "seconds since the job's start"}},
                       "yaxis": {"title": {"text": _plot(chart.unit)}, "rangemode": "tozero"}}}


def _chart_section(id_: str, chart: Chart) -> str:
    e = _escape
    if not chart.series:
        return f"<section><h2>{e(chart.title)}</h2><p>No samples with these figures in the record.</p></section>"
    rows = [(f"{t:g}", *("" if s.values[i] is None else f"{s.values[i]:g}" for s in chart.series))
            for i, t in enumerate(chart.t)]
    return "\n".join([
        f"<section><h2>{e(chart.title)}</h2>",
        *([f'<p class="note">{e(chart.note)}.</p>'] if chart.note else []),
        _figure_div(id_, f"{chart.title}: " + ", ".join(s.name for s in chart.series)),
        "<details><summary>The values drawn</summary>",
        _table(("t (s)", *(f"{s.name} ({chart.unit})" for s in chart.series)), rows, id_=id_ + "-values"),
        "</details></section>"])


def _figure_div(id_: str, label: str) -> str:
    return f'<div id="{id_}" role="img" aria-label="{_escape(label)}"></div>'


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]], *, id_: str) -> str:
    e = _escape
    head = "".join(f"<th>{e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table id="{id_}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _escape(text: str) -> str:
    return html.escape(text, quote=True)


def _plot(text: str) -> str:
    """A string for plotly, which reads ``<br>``, ``<b>``, ``<a href>``... in labels: escaped, it shows as typed."""
    return html.escape(text, quote=False)


def _json(data: Any) -> str:
    """JSON that stays inside its ``<script>`` element whatever the strings hold."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
