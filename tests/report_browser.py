"""report.html in a real browser: headless Chromium (Debian's, driven by playwright) opens the page from disk and
reads what it drew (tests/test_report.py, the restart, straggler, killed-job and spare-swap tests).

No network: every request that is not a file: URL fails the test; every console error does too. The screenshot
is kept under the test's tmp dir and, with XRUN_ARTIFACTS set, there.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"


@dataclass(frozen=True)
class Drawn:
    """What the browser shows: the timeline's lanes (its y axis), the page's text (not its scripts), the seconds
    from the page's load to every chart drawn, and the screenshot."""

    lanes: tuple[str, ...]
    text: str
    svg_text: str  # the charts' own text (labels beside the marks, legends, axis ticks)
    seconds: float
    busy_s: float  # the renderer's main thread busy meanwhile (Chromium's TaskDuration): less the machine's load
    screenshot: Path


def browser_or_skip():
    """playwright's sync API with the system Chromium; skipped without them, failed under XRUN_REQUIRE_BROWSER=1 (CI)."""
    missing = [what for what, ok in (("chromium (apt-get install chromium)", os.path.exists(CHROMIUM)),
                                     ("playwright (pip install playwright)", _has_playwright())) if not ok]
    if missing:
        if os.environ.get("XRUN_REQUIRE_BROWSER") == "1":
            pytest.fail(f"XRUN_REQUIRE_BROWSER=1 and missing: {', '.join(missing)}")
        pytest.skip(f"missing: {', '.join(missing)}")
    from playwright.sync_api import sync_playwright

    return sync_playwright


def _has_playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def open_report(page_path: Path, shot_dir: Path, name: str) -> Drawn:
    sync_playwright = browser_or_skip()
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            def route(r):
                if r.request.url.startswith("file:"):
                    r.continue_()
                else:
                    requests.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            began = time.monotonic()
            page.goto(page_path.resolve().as_uri())
            page.wait_for_selector("body[data-drawn]", timeout=30_000)
            seconds = time.monotonic() - began
            metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
            lanes = tuple(page.eval_on_selector_all("#timeline .yaxislayer-above .ytick text",
                                                    "els => els.map(e => e.textContent)"))
            # the DOM's text, folded tables included (what grep and a screen reader that opens them read)
            text = page.evaluate("Array.from(document.body.children).filter(e => e.tagName !== 'SCRIPT')"
                                 ".map(e => e.textContent).join('\\n')")
            svg_text = " ".join(page.eval_on_selector_all("svg text", "els => els.map(e => e.textContent)"))
            shot = shot_dir / f"{name}.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    if os.environ.get("XRUN_ARTIFACTS"):
        os.makedirs(os.environ["XRUN_ARTIFACTS"], exist_ok=True)
        shutil.copy(shot, os.path.join(os.environ["XRUN_ARTIFACTS"], shot.name))
    assert not errors, errors
    assert not requests, requests
    return Drawn(lanes, text, svg_text, seconds, metrics.get("TaskDuration", 0.0), shot)
