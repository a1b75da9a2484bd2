"""Results as files: JSON (the data), Markdown (the table), PNG (the plot), and the README's latest section.

Rendering is pure (a results document in, text out) so tests/test_bench.py can check it without running
anything. The document: ``{"meta": {...}, "scenarios": {name: section}}``; a section is what a scenario's
``run`` returned.
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Sequence
from typing import Any

from bench.launchers import LAUNCHERS

REFERENCES = ("floor", "xrun")  # ratio columns, unless a section's table names its own
README_START = "<!-- bench:latest:start -->"
README_END = "<!-- bench:latest:end -->"


# ---------------------------------------------------------------------------------------------------------------
# Machine and versions


def machine() -> dict[str, Any]:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            mem_kib = int(f.readline().split()[1])
    except OSError:
        mem_kib = 0
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "mem_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "system": platform.system(),
    }


# ---------------------------------------------------------------------------------------------------------------
# Formatting


def fmt_value(stats: dict[str, Any] | None, unit: str) -> str:
    """``0.0123 s [0.0118–0.0131]``; censored medians print as ``> 8 s``; missing as an en dash."""
    if not stats or stats.get("n", 0) == 0:
        return "–"
    sep = " " if unit and unit not in ("×",) else ""
    if stats["median"] is None:
        limit = stats.get("censor_at")
        return f"> {_num(limit)}{sep}{unit}" if limit is not None else "censored"
    text = f"{_num(stats['median'])}{sep}{unit}"
    if stats["n"] > 1:
        hi = "…" if stats["max"] is None else _num(stats["max"])
        text += f" [{_num(stats['min'])}–{hi}]"
    return text


def fmt_ratio(stats: dict[str, Any] | None) -> str:
    if not stats or stats.get("median") is None:
        return "–"
    return f"{_num(stats['median'])}×"


def _num(x: float | None) -> str:
    if x is None:
        return "?"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}"


def _label(variant: str) -> str:
    launcher, _, flavour = variant.partition(":")
    base = LAUNCHERS[launcher].label if launcher in LAUNCHERS else launcher
    return f"{base} ({flavour})" if flavour else base


def render_section(sec: dict[str, Any]) -> str:
    lines = [f"## {sec['title']}", ""]
    run_info = (
        f"{sec.get('date', '?')} · {sec.get('params', {}).get('rounds', '?')} rounds · "
        f"load {_load(sec.get('load_before'))} → {_load(sec.get('load_after'))} · took {sec.get('duration_s', '?')} s"
    )
    if sec.get("status", "ok") != "ok":
        return "\n".join([*lines, f"{sec.get('date', '?')}: **{sec['status']}**", ""])
    lines += [run_info, ""]
    table = sec["table"]
    metrics: list[Sequence[str]] = table["metrics"]
    refs = [r for r in table.get("references", REFERENCES) if any(r in g["variants"] for g in sec["groups"])]
    header = ["", "launcher"]
    for key, label, _unit in metrics:
        header.append(label)
        if key in (table.get("ratio"), table.get("extra_ratio")):
            header += [f"{label} ×{r}" for r in refs]
    header += ["exit codes", "leftovers"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group in sec["groups"]:
        for variant, entry in group["variants"].items():
            row = [group["label"], _label(variant)]
            for key, _label_text, unit in metrics:
                row.append(fmt_value(entry["metrics"].get(key), unit))
                if key in (table.get("ratio"), table.get("extra_ratio")):
                    for ref in refs:
                        row.append("1×" if ref == variant else fmt_ratio(entry.get(f"vs_{ref}", {}).get(key)))
            codes = sorted({"–" if c is None else str(c) for c in entry["exit_codes"]})
            row.append(",".join(codes) if codes else "–")
            row.append(_leftovers(entry))
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for tgt in sec.get("targets", []):
        lines.append(f"- {render_target(tgt)}")
    for variant, why in sec.get("skipped", {}).items():
        lines.append(f"- skipped {_label(variant)}: {why}")
    for group in sec["groups"]:
        for variant, entry in group["variants"].items():
            for err in dict.fromkeys(entry["errors"]):
                lines.append(f"- error, {group['label']} {_label(variant)}: {_short(err)}")
            for left in _leftover_notes(entry):
                lines.append(f"- left behind, {group['label']} {_label(variant)}: `{left}`")
            for agents in _agent_notes(entry):
                lines.append(f"- agents, {group['label']} {_label(variant)}: {agents}")
    lines.append("")
    return "\n".join(lines)


def render_target(tgt: dict[str, Any]) -> str:
    verdict = {True: "met", False: "**MISSED**", None: "not measured"}[tgt["met"]]
    shown = tgt.get("shown")
    if shown is None:
        unit = tgt.get("unit", "")
        shown = "–" if tgt["value"] is None else f"{_num(tgt['value'])}{' ' if unit and unit != '×' else ''}{unit}"
    return f"{verdict}: {tgt['what']}: {shown}"


def _leftovers(entry: dict[str, Any]) -> str:
    stats = entry["metrics"].get("leftovers")
    if stats is None or stats["n"] == 0:
        return "–"
    return f"{_num(stats['max'])} max" if stats["max"] else "0"


def _leftover_notes(entry: dict[str, Any]) -> list[str]:
    seen: dict[str, None] = {}
    for note in entry.get("notes", []):
        for cmd in note.get("leftovers", []):
            seen[_short(cmd, 200)] = None
    return list(seen)[:3]


def _agent_notes(entry: dict[str, Any]) -> list[str]:
    for note in entry.get("notes", [])[-1:]:
        agents = note.get("agents")
        if agents:
            named = ((_short(_AGENT_PID.sub("", k), 70), v) for k, v in agents.items())
            return [", ".join(f"`{cmd}` {mib} MiB" for cmd, mib in named)]
    return []


_AGENT_PID = re.compile(r"^agent \d+: ")
_NOISE = re.compile(r"xbench[0-9a-f]{16}|/tmp/xbench-\w+")  # per-trial tags and run directories
_PYTHON = re.compile(r"(?:\S*/)?python3?[\d.]*(?=\s|$)")  # /root/.pyenv/versions/3.11.7/bin/python3.11 -> python
_BIN = re.compile(r"\S*/bin/(?=\S)")  # /root/.pyenv/versions/3.11.7/bin/xrun -> xrun
_BENCH_DIR = re.compile(r"\S*/bench/ranks/")


def _short(text: str, limit: int = 300) -> str:
    text = _NOISE.sub("…", text)
    text = (
        _BIN.sub("", _BENCH_DIR.sub("bench/ranks/", _PYTHON.sub("python", text))).replace("\n", " ").replace("|", "\\|")
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _load(value: Any) -> str:
    return "/".join(str(x) for x in value) if value else "?"


def render_markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    mach, ver = meta["machine"], meta["versions"]
    versions = ", ".join(f"{k} {v}" for k, v in ver.items() if v)
    out = [
        "# xrun benchmarks: latest results",
        "",
        f"Machine: {mach['cpu']}, {mach['cores']} cores, {mach['mem_gib']} GiB, {mach['system']} {mach['kernel']}. "
        f"Versions: {versions}. Written {meta['date']}.",
        "",
        "Each cell is the median over paired, interleaved rounds with [min–max]. `×floor` and `×xrun` are ratios "
        "taken within each round (this variant / the reference in the same round), then the median: they are "
        "the numbers to trust on a noisy machine. Load is the 1/5/15-minute load average before → after.",
        "",
    ]
    for sec in doc["scenarios"].values():
        out.append(render_section(sec))
    return "\n".join(out).rstrip() + "\n"


def merge(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """Replace the scenarios that were re-run and keep the others (each section carries its own date)."""
    if not old:
        return new
    order = list(new["scenarios"]) + [k for k in old.get("scenarios", {}) if k not in new["scenarios"]]
    from bench.scenarios import SCALE, SCENARIOS

    ranked = [*SCENARIOS, *SCALE]
    order.sort(key=lambda k: ranked.index(k) if k in ranked else 99)
    scenarios = {k: new["scenarios"].get(k) or old["scenarios"][k] for k in order}
    return {"meta": new["meta"], "scenarios": scenarios}


def update_readme(readme: str, markdown: str, image: str) -> str:
    """Put the latest table (and the plot) between the README's markers."""
    body = markdown.split("\n", 2)[2] if markdown.startswith("# ") else markdown  # drop the title line
    body = re.sub(r"^## ", "### ", body, flags=re.MULTILINE)  # sections sit under the README's own heading
    block = f"{README_START}\n\n![latest results]({image})\n\n{body.strip()}\n\n{README_END}"
    if README_START in readme and README_END in readme:
        head, rest = readme.split(README_START, 1)
        return head + block + rest.split(README_END, 1)[1]
    return readme.rstrip() + "\n\n" + block + "\n"


def write_json(doc: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")


# ---------------------------------------------------------------------------------------------------------------
# Plot


def plot(doc: dict[str, Any], path: str) -> bool:
    """One panel per scenario that has data; False (and no file) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    secs = [s for s in doc["scenarios"].values() if s.get("status") == "ok" and s.get("groups")]
    if not secs:
        return False
    cols = 2
    rows = (len(secs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(13, 4.2 * rows), squeeze=False)
    for ax, sec in zip(axes.flat, secs):
        if len(sec["groups"]) > 1 and all("nproc" in g["params"] for g in sec["groups"]):
            _plot_lines(ax, sec)
        else:
            _plot_bars(ax, sec)
        title = sec["title"] if len(sec["title"]) <= 70 else sec["title"][:69] + "…"
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(secs) :]:
        ax.axis("off")
    mach = doc["meta"]["machine"]
    fig.suptitle(
        f"xrun benchmarks · {mach['cores']} cores · {doc['meta']['date'][:10]} · median, bars = min–max", fontsize=10
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _plot_lines(ax: Any, sec: dict[str, Any]) -> None:
    key, label, unit = sec["table"]["metrics"][0]
    variants = list(dict.fromkeys(v for g in sec["groups"] for v in g["variants"]))
    for variant in variants:
        xs, ys, lo, hi = [], [], [], []
        for g in sec["groups"]:
            st = g["variants"].get(variant, {}).get("metrics", {}).get(key)
            if st and st["median"] is not None:
                xs.append(g["params"]["nproc"])
                ys.append(st["median"])
                lo.append(st["median"] - (st["min"] or st["median"]))
                hi.append((st["max"] or st["median"]) - st["median"])
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=_label(variant))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks (N)")
    ax.set_ylabel(f"{label} ({unit})")
    ax.legend(fontsize=8)


def _plot_bars(ax: Any, sec: dict[str, Any]) -> None:
    first_unit = sec["table"]["metrics"][0][2]
    metrics = [m for m in sec["table"]["metrics"] if m[2] == first_unit][:2]  # one axis, one unit
    labels, bars = [], {m[0]: ([], [], []) for m in metrics}  # metric -> (medians, lo, hi)
    censored_any = False
    for g in sec["groups"]:
        for variant, entry in g["variants"].items():
            prefix = f"{g['label']} " if len(sec["groups"]) > 1 else ""
            labels.append(prefix + _label(variant))
            for key, _, _ in metrics:
                st = entry["metrics"].get(key) or {"median": None, "min": None, "max": None, "censor_at": None}
                med = st["median"] if st["median"] is not None else (st.get("censor_at") or 0.0)
                censored_any |= st["median"] is None and bool(st.get("censor_at"))
                bars[key][0].append(med)
                bars[key][1].append(max(0.0, med - (st["min"] if st["min"] is not None else med)))
                bars[key][2].append(max(0.0, (st["max"] if st["max"] is not None else med) - med))
    height = 0.8 / max(1, len(metrics))
    for i, (key, label, unit) in enumerate(metrics):
        meds, lo, hi = bars[key]
        ys = [j + i * height for j in range(len(labels))]
        ax.barh(ys, meds, height=height, xerr=[lo, hi], capsize=2, label=f"{label} ({unit})")
    ax.set_yticks([j + height * (len(metrics) - 1) / 2 for j in range(len(labels))])
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    positive = [v for m in bars.values() for v in m[0] if v > 0]
    if positive and max(positive) / min(positive) > 30:
        ax.set_xscale("log")
    note = " (bar at the cap = still alive at the cap)" if censored_any else ""
    ax.legend(fontsize=8, title=note or None, title_fontsize=7)
