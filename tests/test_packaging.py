"""What users install is what is tested (issue 37): every file of the source tree under ``src/xrun`` is in the
wheel built from it, and in the package the tests import.

A folder without ``__init__.py`` is skipped by ``find_packages``: ``xrun/launch/telemetry/site`` once was, and every
non-editable install lost ``sitecustomize.py`` (``--preload`` failed, telemetry went silently off) while the
editable CI install found it in the tree. The src layout makes the tests import the installed package; these tests
say which files it lacks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import xrun
from tests.conftest import ROOT

SOURCE = Path(ROOT) / "src" / "xrun"
# XRUN_REQUIRE_INSTALLED=1 (CI): the tests must run against an installed, non-editable xrun; anything else fails.
REQUIRE_INSTALLED = os.environ.get("XRUN_REQUIRE_INSTALLED") == "1"


def tracked_sources() -> set[str]:
    """The package's files as git tracks them, relative to ``src/`` (``xrun/launch/agent.py``); a checkout without
    git (an sdist) falls back to the files on disk, less byte code."""
    done = subprocess.run(["git", "ls-files", "--", "src/xrun"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode == 0 and done.stdout.strip():
        names = {line[len("src/"):] for line in done.stdout.splitlines()}
        return {name for name in names if (Path(ROOT) / "src" / name).exists()}  # a file removed but not committed
    return {str(path.relative_to(SOURCE.parent)) for path in SOURCE.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


def test_the_source_tree_is_found() -> None:
    sources = tracked_sources()
    assert "xrun/__main__.py" in sources and "xrun/launch/telemetry/site/sitecustomize.py" in sources, sorted(sources)


@pytest.mark.slow
def test_the_wheel_built_from_the_tree_holds_every_source_file(tmp_path: Path) -> None:
    """Build the wheel as ``pip install .`` does and list it: a file a user would not get fails here, in any
    environment (editable or not)."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), ROOT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [wheel] = tmp_path.glob("xrun-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packed = {name for name in archive.namelist() if name.startswith("xrun/")}
    missing = sorted(tracked_sources() - packed)
    assert not missing, f"the wheel leaves out: {', '.join(missing)} (a folder without __init__.py?)"


def installed_package() -> Path:
    return Path(xrun.__file__).resolve().parent


def test_the_tests_import_the_installed_package_and_it_holds_every_source_file() -> None:
    package = installed_package()
    if package == SOURCE.resolve():
        message = (f"xrun is imported from the tree ({package}: an editable install); `pip install '.[test]'` "
                   f"tests what users install")
        if REQUIRE_INSTALLED:
            pytest.fail(message)
        pytest.skip(message)
    installed = {str(path.relative_to(package.parent)) for path in package.rglob("*")
                 if path.is_file() and "__pycache__" not in path.parts}
    missing = sorted(tracked_sources() - installed)
    assert not missing, f"the installed xrun ({package}) lacks: {', '.join(missing)}"


def test_a_missing_rank_side_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A copy of the installed package without the ranks' sitecustomize: a run says so in one line, exit 2, before
    any rank starts (it once ran every rank without telemetry and with a PYTHONPATH naming a missing folder)."""
    copy = tmp_path / "site-packages"
    shutil.copytree(installed_package(), copy / "xrun", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "xrun" / "launch" / "telemetry" / "site" / "sitecustomize.py").unlink()
    script = tmp_path / "never.py"
    marker = tmp_path / "ran"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    for flags in ([], ["--preload", "json"]):
        done = subprocess.run([sys.executable, "-m", "xrun", *flags, str(script)], cwd=str(tmp_path),
                              env={**os.environ, "PYTHONPATH": str(copy)}, capture_output=True, text=True,
                              timeout=60)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2, (flags, done.stderr)
        assert any("xrun's install is incomplete" in line and "sitecustomize.py is missing" in line
                   for line in lines), (flags, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert not marker.exists(), f"a rank started under {flags}"
