import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Arguments a user may pass to a training script; each must reach the script byte-exact.
WEIRD_ARGS = (
    "plain",
    "with space",
    "it's",
    'say "hi"',
    "$(touch /tmp/xrun-pwned)",
    "`id`",
    "$HOME",
    "a;b",
    "a && b",
    "a | b",
    "line1\nline2",
    "tab\there",
    "back\\slash",
    "ünïcødé ✓ 日本",
    "",
    "--help",
    "-H",
    "--num_gpus=8",
    "--",
    "*",
    "~",
    "#not a comment",
    "a=b",
    "'",
    '"',
)


# A dry run checks that the script exists (issue 12), and the dry-run tests name these throwaway scripts in the
# repository root (run_xrun's default cwd): they exist for the session only (and are git-ignored).
PLACEHOLDER_SCRIPTS = ("t.py", "train.py", "x.py", "--weird-script-name")


@pytest.fixture(scope="session", autouse=True)
def placeholder_scripts():
    made = [path for path in (os.path.join(ROOT, name) for name in PLACEHOLDER_SCRIPTS) if not os.path.exists(path)]
    for path in made:
        with open(path, "w") as handle:
            handle.write("# placeholder script of xrun's dry-run tests (tests/conftest.py)\n")
    yield
    for path in made:
        os.remove(path)


@pytest.fixture
def weird_args():
    return WEIRD_ARGS


def run_xrun(*args, env=None, cwd=ROOT, timeout=60, stdin=subprocess.DEVNULL):
    """Run the real xrun entry point in a subprocess, as a user would."""
    full_env = dict(os.environ)
    full_env.pop("CUDA_VISIBLE_DEVICES", None)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "xrun", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
        stdin=stdin,
    )


def eventually(condition, within: float = 5.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``within`` seconds pass (False)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def torchft_missing() -> str | None:
    """Why a torchft test cannot run here (tests/test_store.py, tests/test_replica_groups.py); CI installs
    torchft==0.2.0 (.ci/run) and sets XRUN_REQUIRE_TORCHFT."""
    try:
        import numpy  # noqa: F401  - torchft needs it and does not declare it
        import torchft  # noqa: F401
    except ImportError as err:
        if os.environ.get("XRUN_REQUIRE_TORCHFT"):
            raise
        return f"torchft is not installed ({err}): pip install torchft==0.2.0 numpy"
    return None
