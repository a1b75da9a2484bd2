"""``python -m bench.profile [N]``: where xrun's launch time goes, for the README's "where xrun misses" notes.

Prints (and saves under bench/results/raw/) three things, all median of a few runs:
  1. what any Python process costs here: ``python -c pass``, with and without ``site`` (``-S``);
  2. what importing xrun's CLI costs on top (``python -c 'import xrun.runner.cli'``), with the top modules from
     ``-X importtime``;
  3. a pyinstrument profile of ``xrun --num_gpus N noop.py`` (when pyinstrument is installed).
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
        "largest imports at interpreter start (`site`, .pth files) (-X importtime):",
        *import_top("sys", env, top=6),
        "",
    ]
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
