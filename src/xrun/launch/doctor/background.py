"""One call at a time on a thread, its result handed to a rank group's event loop (xrun.launch.ranks.supervise):
the hang doctor's dumps (py-spy's stacks, the ranks' collective records) and its samples, taken while the ranks'
output keeps flowing.

Register ``fileno`` as a reader and call ``ready`` when it is readable; ``start(call, on_done)`` runs ``call()``
on a daemon thread and ``on_done(result)`` from ``ready``. ``busy`` says whether a call is running.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any


class InBackground:
    def __init__(self, name: str) -> None:
        self._name = name
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._result: Any = None
        self._finished = False
        self._on_done: Callable[[Any], None] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.busy = False

    def fileno(self) -> int:
        return self._wake_r

    def start(self, call: Callable[[], Any], on_done: Callable[[Any], None]) -> bool:
        """Begin ``call``; ``on_done(its result)`` is called from ``ready``. False when one is already running."""
        if self.busy:
            return False
        self.busy, self._on_done, self._finished = True, on_done, False
        threading.Thread(target=self._run, args=(call,), name=self._name, daemon=True).start()
        return True

    def ready(self) -> None:
        try:
            os.read(self._wake_r, 64)
        except OSError:
            pass
        if not self._finished or self._on_done is None:
            return
        result, on_done = self._result, self._on_done
        self.busy, self._on_done, self._result, self._finished = False, None, None, False
        on_done(result)

    def close(self) -> None:
        """Release the pipe; a call still running releases it when it ends (its fd numbers must not be reused
        under it)."""
        with self._lock:
            self._closed = True
            if not self.busy:
                self._close_pipe()

    def _close_pipe(self) -> None:
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self, call: Callable[[], Any]) -> None:
        result = call()
        with self._lock:
            if self._closed:  # the loop is gone: nobody will read the result
                self._close_pipe()
                return
            self._result, self._finished = result, True
            os.write(self._wake_w, b"!")
