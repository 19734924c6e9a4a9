"""``Updater``: the background thread that keeps a live widget current.

A widget's ``update`` reads its source (a run's event log, a sweep's runs)
and redraws; the updater calls it every ``interval`` seconds in a daemon
thread. A thread, not an
asyncio task: comm messages sent from a thread reach the browser while
another cell is busy, whereas a task on the kernel's loop waits for the cell
to finish.

One updater per ``(kind, key)`` per kernel: starting one (a new widget on the
same run, say a re-run cell) stops the previous one on that key, so a
notebook never has two threads redrawing the same thing. ``ended`` says
whether the source has ended; it is asked before each update, so once it says
yes the thread makes one more update, which draws the final state, and ends.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

_ACTIVE: dict[tuple[str, str], "weakref.ref[Updater]"] = {}
_ACTIVE_LOCK = threading.Lock()


class Updater:
    """Calls ``update()`` every ``interval`` s in a daemon thread named ``name``, until stopped or
    until the update made after ``ended()`` first held.

    An exception from either goes to ``on_error`` and polling goes on (a bad
    frame must not end a live view). ``on_exit`` runs in the thread as it
    ends, however it ends. ``owner`` is what :func:`active` reports for this
    updater (the widget).
    """

    def __init__(
        self,
        kind: str,
        key: str,
        update: Callable[[], Any],
        ended: Callable[[], bool],
        interval: float,
        *,
        name: str,
        owner: Any = None,
        on_error: Optional[Callable[[Exception], None]] = None,
        on_exit: Optional[Callable[[], None]] = None,
    ) -> None:
        self.slot = (kind, key)
        self.update = update
        self.ended = ended
        self.interval = float(interval)
        self.name = name
        self.owner = owner
        self.on_error = on_error
        self.on_exit = on_exit
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> "Updater":
        """Start the thread, stopping the updater that held the same ``(kind, key)`` before."""
        with _ACTIVE_LOCK:
            old = _ACTIVE.get(self.slot)
            _ACTIVE[self.slot] = weakref.ref(self)
        old = old() if old is not None else None
        if old is not None and old is not self:
            old.stop()
        if not self.running:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait up to ``timeout`` s for it (not when called from the thread itself)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with _ACTIVE_LOCK:
            ref = _ACTIVE.get(self.slot)
            if ref is not None and ref() is self:
                del _ACTIVE[self.slot]

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                ended = False
                try:
                    ended = self.ended()
                    self.update()
                except Exception as e:
                    if self.on_error is not None:
                        self.on_error(e)
                if ended:
                    break
                self._stop.wait(self.interval)
        finally:
            self._stop.set()
            if self.on_exit is not None:
                self.on_exit()


def active(kind: str) -> dict[str, Any]:
    """The owners of this kernel's running updaters of ``kind``, by key."""
    with _ACTIVE_LOCK:
        updaters = [(slot[1], ref()) for slot, ref in _ACTIVE.items() if slot[0] == kind]
    return {key: u.owner for key, u in updaters if u is not None and u.running}
