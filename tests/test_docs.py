"""The documentation keeps up with the code: every flag `--help` shows is documented, every relative link and
anchor in README.md and docs/*.md resolves, every module path the pages and the source name exists (docstrings
and comments included: issue 38 §4), and the README fits on a screen (issue 21).

Fast and offline: three `--help` runs and some file reading.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

REPO = Path(ROOT)
SOURCES = REPO / "src"  # where the docs' module paths (xrun/launch/...) live: the src layout
README = REPO / "README.md"
DOCS = REPO / "docs"
FLAGS_PAGE = DOCS / "flags.md"
README_MAX_LINES = 250

HELP_COMMANDS = {
    "xrun --help": ["-m", "xrun", "--help"],
    "xrun check --help": ["-m", "xrun", "check", "--help"],
    "python -m xrun.launch --help": ["-m", "xrun.launch", "--help"],
}

LONG_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
MODULE_PATH = re.compile(r"(?<![\w./-])xrun/[\w/]*[\w]+(?:\.py|/)?")
MODULE_NAME = re.compile(r"(?<![\w./-])xrun(?:\.[A-Za-z_]\w*)+")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


@functools.cache
def help_text(name: str) -> str:
    done = subprocess.run(
        [sys.executable, *HELP_COMMANDS[name]], cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}: {done.stderr}"
    return done.stdout


def long_flags(text: str) -> set[str]:
    """Every long option a help text shows, every spelling (--num_gpus, --num-gpus, --dry_run, ...)."""
    return {flag.rstrip("-") for flag in LONG_FLAG.findall(text)}


def mentions(text: str, flag: str) -> bool:
    """``flag`` as a whole flag: ``--node_rank`` is not mentioned by ``--node_rank_from``."""
    return re.search(re.escape(flag) + r"(?![\w-])", text) is not None


def undocumented(help_output: str, doc: str) -> list[str]:
    return sorted(flag for flag in long_flags(help_output) if not mentions(doc, flag))


@pytest.mark.parametrize("command", sorted(HELP_COMMANDS))
def test_every_flag_in_help_is_in_the_flag_reference(command: str) -> None:
    flags = long_flags(help_text(command))
    assert "--help" in flags and len(flags) > 10, f"{command} printed no flags? {sorted(flags)}"
    missing = undocumented(help_text(command), FLAGS_PAGE.read_text(encoding="utf-8"))
    assert not missing, f"{command} shows flags that docs/flags.md does not name: {', '.join(missing)}"


def test_a_missing_flag_is_caught() -> None:
    doc = FLAGS_PAGE.read_text(encoding="utf-8")
    without = re.sub(r"--hang_timeout(?![\w-])", "", doc)
    assert "--hang_timeout" not in undocumented(help_text("xrun --help"), doc)
    assert "--hang_timeout" in undocumented(help_text("xrun --help"), without)
    assert not mentions("`--node_rank_from VAR`", "--node_rank")
    assert mentions("`--node_rank K`, `--node-rank`", "--node-rank")


# Links and anchors -----------------------------------------------------------------------------------------


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code removed."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, INLINE_CODE.sub("", line)))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (but - and _), spaces to dashes."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def heading_anchors(text: str) -> frozenset[str]:
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    return heading_anchors(path.read_text(encoding="utf-8"))


def link_problems(page: Path, text: str | None = None) -> list[str]:
    """Every relative link of ``page`` (its ``text``, read from the file when not given) that leads nowhere."""
    text = page.read_text(encoding="utf-8") if text is None else text
    problems = []
    for number, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
                continue
            where = f"{page.relative_to(REPO)}:{number}: {target}"
            path_part, _, anchor = target.partition("#")
            if not path_part:
                if anchor not in heading_anchors(text):
                    problems.append(f"{where}: no heading with anchor #{anchor} on this page")
                continue
            dest = (page.parent / path_part).resolve()
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert link_problems(page) == []


def test_a_broken_link_or_anchor_is_caught() -> None:
    assert slug("The hang doctor: every rank summarised, stacks on demand, hangs named") == (
        "the-hang-doctor-every-rank-summarised-stacks-on-demand-hangs-named")
    assert slug("Nodes that start minutes apart (`--join_timeout`)") == "nodes-that-start-minutes-apart---join_timeout"
    probe = "# Probe\n\n[a](flags.md#no-such-heading) [b](nope.md) [c](#probe) [d](https://x.invalid/)\n" \
        "[e](#not-here) `[f](in-code.md)`\n```\n[g](in-a-code-block.md)\n```\n[h](../README.md#install-and-test)\n"
    problems = link_problems(DOCS / "probe.md", probe)  # a page that is never written
    assert len(problems) == 3, problems
    assert "#no-such-heading" in problems[0] and "nope.md: no such file" in problems[1]
    assert "#not-here" in problems[2]


def test_the_readme_links_every_docs_page() -> None:
    readme = README.read_text(encoding="utf-8")
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if f"(docs/{p.name})" not in readme]
    assert not unlinked, f"README.md's Documentation section does not link: {', '.join(unlinked)}"


def test_the_readme_fits_on_a_screen() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}: move some to docs/"


def test_install_and_test_commands_stay_in_the_readme() -> None:
    readme = README.read_text(encoding="utf-8")
    assert "pip install '.[test]'" in readme and "python -m pytest -q" in readme


# Module paths ----------------------------------------------------------------------------------------------


def module_exists(dotted: str) -> bool:
    """``xrun.a.b.name``: every package on the way exists, and what follows the last module is a name it
    defines (or a submodule), so ``xrun.runner.job.machine._Tally`` and ``xrun.discover`` pass; so does what every
    module has (``xrun.__file__``)."""
    parts = dotted.split(".")
    path = SOURCES / parts[0]
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("__") and part.endswith("__"):
            return True
        if (path / part).is_dir() or (path / f"{part}.py").is_file():
            path = path / part if (path / part).is_dir() else path / f"{part}.py"
            if path.suffix == ".py":
                rest = parts[i + 1:]
                return not rest or re.search(rf"\b{re.escape(rest[0])}\b", path.read_text(encoding="utf-8")) is not None
            continue
        init = path / "__init__.py"
        return init.is_file() and re.search(rf"\b{re.escape(part)}\b", init.read_text(encoding="utf-8")) is not None
    return True


def stale_module_references(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    stale = []
    for ref in sorted(set(MODULE_PATH.findall(text))):
        if ref.endswith(".py") or ref.endswith("/"):
            if not (SOURCES / ref).exists():
                stale.append(ref)
    for ref in sorted(set(MODULE_NAME.findall(text))):
        if not module_exists(ref.rstrip(".")):
            stale.append(ref)
    return stale


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_module_paths_named_in_the_docs_exist(page: Path) -> None:
    assert stale_module_references(page) == []


def test_module_paths_named_in_the_source_exist() -> None:
    # a docstring or comment that names a module moved or removed since (``xrun.runner.backends.sshconn``)
    stale = {str(path.relative_to(REPO)): refs for path in sorted((SOURCES / "xrun").rglob("*.py"))
             if (refs := stale_module_references(path))}
    assert stale == {}


def test_a_stale_module_path_is_caught() -> None:
    assert module_exists("xrun.runner.job.nodes.Tally") and module_exists("xrun.discover")
    assert module_exists("xrun.__file__") and module_exists("xrun.runner.ssh_connections.connect_all")
    assert not module_exists("xrun.runner.backends.sshconn")
    assert not module_exists("xrun.runner.podrun")
    assert not module_exists("xrun.launch.channel.send")
