"""``--preload``'s node half for a driven agent (docs/preload.md, issue 38 §3): the helper's life, the agent's
whole life, as the session driver (xrun.launch.session.driver) runs it for a connected, pod or local (one-node job)
or a one-node job's (the local run's, the stand-alone agent's: xrun.joined) agent, its one life. The helper and its
client are ``xrun.launch.preload``.

* started once, for the first spec's ranks (their interpreter, shared environment and directory): at the first
  preflight, or at once in pod mode, which knows its ranks before it joins (the import overlaps the join);
* the preflight's answer waits for its imports (``answer``: None, then ``hear`` gives it once the helper is ready,
  failed, or ``PRELOAD_TIMEOUT`` passed; the driver's loop waits on the helper's socket meanwhile, ``wake``);
* before an attempt after the first, a helper that died since ends the job on this node (``check_helper``);
* stopped when the agent ends (``close``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from xrun.common.output.streams import notice
from xrun.errors import PreloadError, PreloadHelperLost
from xrun.launch.ranks.processes import shared_environment
from xrun.launch.session.events import Event, PreflightFailed, PreflightPassed
from xrun.launch.telemetry.endpoints import require_rank_site

if TYPE_CHECKING:
    from xrun.common.spec import NodeSpec
    from xrun.launch.preload.client import PreloadHelper


class Preloading:
    """The helper (None without ``--preload``) and the preflight answer that waits for it."""

    def __init__(self) -> None:
        self.helper: PreloadHelper | None = None  # started at the first preflight, for every attempt
        self._importing: tuple[PreflightPassed, float] | None = None  # the preflight's answer once the helper is ready
        self._error: PreloadError | None = None  # the helper could not start

    def start(self, spec: NodeSpec) -> None:
        """Start the helper once, for ``spec``'s ranks: it imports while the agent goes on. A helper that cannot
        start is found out by ``answer``."""
        if self.helper is None and spec.options.preload:
            try:
                self.helper = start_preload(spec, os.environ)
            except PreloadError as err:
                self._error = err

    def answer(self, spec: NodeSpec, passed: PreflightPassed) -> Event | None:
        """The preflight's answer: ``passed`` once the helper is ready (None: ``hear`` gives it, at most
        ``PRELOAD_TIMEOUT`` later); failed when it cannot be (bad input: the module, exit code 2) or died during the
        last attempt (``check_helper``: the job ends on this node)."""
        self.start(spec)
        if self._error is not None:
            return PreflightFailed(str(self._error), self._error.exit_code)
        helper = self.helper
        if helper is None:
            return passed
        if helper.ready is None:
            self._importing = (passed, time.monotonic() + PRELOAD_TIMEOUT)
            return None
        try:
            check_helper(helper)
        except PreloadHelperLost as err:  # not the user's input: the runner names the host, a spare may step in
            return PreflightFailed(str(err), err.exit_code)
        return passed

    def wake(self) -> tuple[float | None, tuple[int, ...]]:
        """While the preflight waits for the helper: when it times out, and its socket to wait on."""
        if self._importing is None or self.helper is None:
            return None, ()
        return self._importing[1], (self.helper.fileno(),)

    def hear(self, host: Callable[[], str]) -> Event | None:
        """The preflight's answer once the helper is ready (its import time said for ``host()``), or failed; None
        while it imports (or nothing waits)."""
        if self._importing is None or self.helper is None:
            return None
        (passed, deadline), helper = self._importing, self.helper
        answer: Event | None = None
        try:
            if helper.poll_ready() is not None:
                announce(helper, host())
                answer = passed
            elif time.monotonic() >= deadline:
                helper.wait_ready(0)  # raises: the helper took too long, and it is killed
        except PreloadError as err:
            answer = PreflightFailed(str(err), err.exit_code)
        if answer is not None:
            self._importing = None
        return answer

    def close(self) -> None:
        if self.helper is not None:
            self.helper.close()


PRELOAD_TIMEOUT = 600.0  # s for the helper's imports: torch and its kin on a cold shared filesystem, with room


def start_preload(spec: NodeSpec, base_env: Mapping[str, str]) -> PreloadHelper | None:
    """Start the helper that imports ``spec``'s ``--preload`` modules for its ranks (None without it, or without
    ranks); it imports while the caller goes on. ``PreloadError`` (exit code 2) when it cannot start."""
    if not spec.options.preload or not spec.ranks or spec.elastic is not None:
        return None
    require_rank_site()  # every forked rank does the rank-side sitecustomize's work (preload/become.py)
    # lazy: the helper's client and its wire load only in a job that preloads (about 5 ms of every agent's start)
    from xrun.launch.preload.client import PreloadHelper

    return PreloadHelper.start_for(spec.options.preload, spec.ranks[0].argv, env=shared_environment(spec, base_env),
                                   cwd=spec.cwd or os.getcwd())


def announce(helper: PreloadHelper, host: str) -> None:
    """Say how long the ready helper's imports took and, when ``ps`` cannot show a forked rank's own command line,
    why."""
    ready = helper.ready
    assert ready is not None
    notice(host, f"preloaded {','.join(helper.modules)} in {ready.seconds:.2f} s; the ranks are forked from the "
                 f"helper (pid {helper.pid})")
    if ready.titles is not None:
        notice(host, f"ps shows the preload helper's command line for every forked rank, not the rank's own: "
                     f"{ready.titles}")


def check_helper(helper: PreloadHelper) -> None:
    """Before an attempt after the first: a helper that died since (killed, the OOM killer) ends the job on this
    node, in one line (``PreloadHelperLost``): the attempt's ranks cannot be forked (docs/preload.md)."""
    how = helper.gone()
    if how is not None:
        raise PreloadHelperLost(f"--preload: the helper (pid {helper.pid}) {how} during the last attempt, so the "
                                "next attempt's ranks cannot be forked on this node: the job ends here (if the OOM "
                                "killer took it, preload fewer modules or give the node more memory)")
