"""``python -m bench.profile [N]``: where xrun's launch time goes, for the README's "where xrun misses" notes.

Prints (and saves under bench/results/raw/) three things, all median of a few runs:
  1. what any Python process costs here: ``python -c pass``, with and without ``site`` (``-S``);
  2. what importing xrun's CLI costs on top (``python -c 'import xrun.runner.cli'``), with the top modules from
     ``-X importtime``, and the same for a node agent's start path (``xrun.launch.session.main``, which loads
     the driver and what runs the ranks), the path ``python -m xrun.launch --connect`` imports;
  3. the exit path after a rank fails: when xrun's ``main`` returns, when its atexit hooks are done, when the
     process is gone, and when it would be gone with ``os._exit`` after the hooks (interpreter finalization
     skipped);
  4. a pyinstrument profile of ``xrun --num_gpus N noop.py`` (when pyinstrument is installed).
Needs nothing but xrun; pyinstrument (``pip install pyinstrument``) adds part 3.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import harness  # noqa: E402

RAW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "raw")


def wall(argv: list[str], env: dict[str, str], runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


AGENT_START_PATH = "xrun.launch.session.main"  # what `python -m xrun.launch --connect` imports


def import_top(module: str, env: dict[str, str], top: int = 12) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    rows.sort(reverse=True)
    return [f"{us / 1000:7.1f} ms cumulative  {name}" for us, name in rows[:top]]


# Runs xrun's CLI in-process and stamps the moments after the failing rank's exit; atexit hooks run last-in
# first-out, so one registered before importing xrun runs after all of xrun's.
_EXIT_WRAPPER = """\
import atexit, os, sys, time
marks = {}
def _last():
    marks["atexit_done"] = time.time()
    with open(os.path.join(os.environ["XB_DIR"], "marks"), "w") as f:
        f.write(repr(marks))
    if os.environ.get("XB_HARD_EXIT"):
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(7)
atexit.register(_last)
from xrun.joined.entry import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
marks["main_returned"] = time.time()
"""


def exit_path(env: dict[str, str], n: int, runs: int = 5) -> list[str]:
    """Median seconds from the failing rank's exit to each stamp, with and without os._exit after atexit."""
    rows = []
    for hard in (False, True):
        got: dict[str, list[float]] = {}
        for _ in range(runs):
            with harness.RunDir() as run:
                wrapper = os.path.join(run.path, "wrapper.py")
                with open(wrapper, "w") as f:
                    f.write(_EXIT_WRAPPER)
                argv = [
                    sys.executable,
                    wrapper,
                    "--num_gpus",
                    str(n),
                    harness.rank_script("sleeper.py"),
                    f"dir={run.path}",
                    f"fail_rank={n - 1}",
                    "fail_after=1",
                    "code=7",
                    "sleep=30",
                ]
                extra = {"XB_DIR": run.path, **({"XB_HARD_EXIT": "1"} if hard else {})}
                proc = subprocess.Popen(
                    argv,
                    env={**env, **extra},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                while proc.poll() is None:
                    time.sleep(0.0005)
                gone = time.time()
                try:
                    with open(os.path.join(run.path, "fail_ts")) as f:
                        fail = float(f.read())
                    with open(os.path.join(run.path, "marks")) as f:
                        marks = eval(f.read())  # noqa: S307 - our own repr of a dict of floats
                except (OSError, ValueError, SyntaxError):
                    continue
                for key, value in [*marks.items(), ("process_gone", gone)]:
                    got.setdefault(key, []).append(value - fail)
        label = "with os._exit after atexit" if hard else "as is"
        shown = ", ".join(f"{k} {statistics.median(v) * 1000:.1f} ms" for k, v in got.items())
        rows.append(f"  {label:<28} {shown}")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    n = int(args[0]) if args else 4
    env = harness.bench_env("xbench-profile")
    py = sys.executable
    lines = [f"# xrun launch profile, N={n}, {time.strftime('%Y-%m-%d %H:%M:%S')}, load {harness.load()}", ""]
    bare = wall([py, "-c", "pass"], env)
    no_site = wall([py, "-S", "-c", "pass"], env)
    cli = wall([py, "-c", "import xrun.runner.cli"], env)
    lines += [
        f"python -c pass            {bare * 1000:7.1f} ms  (one interpreter start, with site and .pth files)",
        f"python -S -c pass         {no_site * 1000:7.1f} ms  (without site: .pth files cost the difference)",
        f"import xrun.runner.cli    {(cli - bare) * 1000:7.1f} ms  on top of the interpreter start",
        "",
        "largest imports under `import xrun.runner.cli` (-X importtime):",
        *import_top("xrun.runner.cli", env),
        "",
        f"node agent's start path: `import {AGENT_START_PATH}` "
        f"{(wall([py, '-c', f'import {AGENT_START_PATH}'], env) - bare) * 1000:7.1f} ms on top; largest imports:",
        *import_top(AGENT_START_PATH, env),
        "",
        "largest imports at interpreter start (`site`, .pth files) (-X importtime):",
        *import_top("sys", env, top=6),
        "",
    ]
    lines += [f"exit path, {n} ranks, rank {n - 1} exits 7 (median ms after its exit):", *exit_path(env, n), ""]
    xrun = shutil.which("xrun")
    if xrun and shutil.which("pyinstrument"):
        with harness.RunDir() as run:
            out = os.path.join(run.path, "prof.txt")
            subprocess.run(
                [
                    "pyinstrument",
                    "-i",
                    "0.0005",
                    "-o",
                    out,
                    xrun,
                    "--num_gpus",
                    str(n),
                    harness.rank_script("noop.py"),
                    f"dir={run.path}",
                ],
                env=env,
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            with open(out) as f:
                lines += [f"pyinstrument: xrun --num_gpus {n} noop.py", *f.read().splitlines()[:60]]
    else:
        lines.append("(pyinstrument or xrun not installed: no call profile)")
    text = "\n".join(lines) + "\n"
    os.makedirs(RAW, exist_ok=True)
    path = os.path.join(RAW, f"profile-{time.strftime('%Y%m%d-%H%M%S')}.txt")
    with open(path, "w") as f:
        f.write(text)
    print(text + f"\n(saved to {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
