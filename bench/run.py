"""``python -m bench [SCENARIOS] [--quick] ...``: run scenarios, write JSON + Markdown + PNG, refresh the README.

Installs nothing: a launcher that is not on PATH is skipped with a reason, a scenario whose prerequisites are
missing (the namespace cluster, an elastic mode) reports "not available".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import sys
import time

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import harness, launchers, report  # noqa: E402
from bench.launchers import LAUNCHERS, LocalJob  # noqa: E402
from bench.scenarios import LOCAL, OPT_IN, SCALE, SCENARIOS, resolve, scenario  # noqa: E402
from bench.scenarios.base import Context  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "scenarios",
        nargs="?",
        default="all",
        help="comma-separated names or numbers (1-9), 'local' (1-6), 'scale' (agent_start, control_plane) "
        "or 'all' (default: 1-9)",
    )
    p.add_argument("--quick", action="store_true", help="smoke pass: one round, small sizes; writes to results/raw/")
    p.add_argument("--reps", type=int, help="rounds per scenario (default: 1 quick, 3-5 full)")
    p.add_argument("--launchers", help="comma-separated subset of xrun,torchrun,deepspeed (the floor always runs)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="scenario knob, e.g. nproc=2,4 cap_s=5 bytes=1000000 signals=INT,TERM",
    )
    p.add_argument("--out", help="write results here instead of bench/results (no merge, no README update)")
    p.add_argument("--seed", type=int, default=0, help="seed for the shuffled round order")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run of each launcher")
    p.add_argument("--list", action="store_true", help="list scenarios and launchers, then exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _own_signals()
    if args.list:
        return _list()
    try:
        names = resolve(args.scenarios)
        if args.launchers:
            for name in args.launchers.split(","):
                launchers.get(name)
    except ValueError as err:
        print(f"bench: {err}", file=sys.stderr)
        return 2
    ctx = Context(
        quick=args.quick,
        reps=args.reps,
        launchers=tuple(args.launchers.split(",")) if args.launchers else None,
        rng=random.Random(args.seed),
        options=dict(kv.split("=", 1) for kv in args.set),
    )
    if not (args.quick or args.no_warmup) and set(names) & set(LOCAL):
        warm_up()
    doc = {"meta": meta(args), "scenarios": {}}
    for name in names:
        print(f"== {scenario(name).TITLE}", file=sys.stderr, flush=True)
        doc["scenarios"][name] = scenario(name).run(ctx)
    write_results(doc, quick=args.quick, out=args.out)
    return 0


def _own_signals() -> None:
    """Make the launchers' signal dispositions independent of how the bench was started.

    A background job of a non-interactive shell (``nohup python -m bench &``, CI) starts with SIGINT ignored, and
    an ignored signal stays ignored across exec: launchers that install no handler would then survive SIGINT in
    scenario 4 only because of how the bench was started. With a handler here, children start with the default.
    SIGTERM to the bench raises, so the current trial's processes are killed on the way out.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def _term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _term)


def meta(args: argparse.Namespace) -> dict[str, object]:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": report.machine(),
        "versions": launchers.versions(),
        "argv": sys.argv[1:],
        "quick": args.quick,
        "load_at_start": harness.load(),
    }


def warm_up() -> None:
    """One untimed N=1 run per launcher: page cache, bytecode, torch's first import are not what we measure."""
    for name, launcher in LAUNCHERS.items():
        if launcher.available() or name == "pyfloor":
            continue
        print(f"  warm-up {name}", file=sys.stderr, flush=True)
        for script in ("noop.py", "torch_allreduce.py"):
            with harness.RunDir() as run:
                job = LocalJob(nproc=1, script=harness.rank_script(script), args=(), master_port=harness.free_port())
                harness.run_local_job(launcher, job, run, deadline_s=120.0)


def write_results(doc: dict, *, quick: bool, out: str | None) -> None:
    raw = os.path.join(RESULTS, "raw")
    os.makedirs(raw, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report.write_json(doc, os.path.join(raw, f"{'quick-' if quick else ''}{stamp}.json"))
    if quick or out:
        target = out or raw
        os.makedirs(target, exist_ok=True)
        base = os.path.join(target, "quick" if quick and not out else "latest")
        report.write_json(doc, base + ".json")
        _write(base + ".md", report.render_markdown(doc))
        report.plot(doc, base + ".png")
        print(f"bench: wrote {base}.json, .md, .png", file=sys.stderr)
        return
    latest = os.path.join(RESULTS, "latest.json")
    old = None
    if os.path.exists(latest):
        with open(latest) as f:
            old = json.load(f)
    merged = report.merge(old, doc)
    report.write_json(merged, latest)
    markdown = report.render_markdown(merged)
    _write(os.path.join(RESULTS, "latest.md"), markdown)
    report.plot(merged, os.path.join(RESULTS, "latest.png"))
    readme = os.path.join(HERE, "README.md")
    if os.path.exists(readme):
        with open(readme) as f:
            text = f.read()
        _write(readme, report.update_readme(text, markdown, "results/latest.png"))
    print(f"bench: wrote {RESULTS}/latest.json, latest.md, latest.png and the README table", file=sys.stderr)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _list() -> int:
    for i, (name, mod) in enumerate([*SCENARIOS.items(), *OPT_IN.items()], start=1):
        print(f"{i}  {name:<12} {mod.TITLE}")
    for name, mod in SCALE.items():
        print(f"   {name:<12} {mod.TITLE}")
    for name, launcher in LAUNCHERS.items():
        missing = launcher.available()
        print(f"   launcher {name:<10} {'ok' if not missing else 'missing: ' + missing}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
