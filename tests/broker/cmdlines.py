"""Every command line the machine shows while something runs: what ``ps`` would have shown anyone.

A process's arguments are readable by every user of the machine (``/proc/<pid>/cmdline``), so a
password passed as an argument leaks for as long as the process lives. :class:`CommandLines` polls
``/proc`` from a thread every ``interval_s`` and keeps each distinct command line it saw, so a test
can start the project's processes inside it and then look for secrets in what it kept.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType


class CommandLines:
    """``with CommandLines() as seen: ...``; then ``seen.lines``: every command line shown meanwhile."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.lines: set[str] = set()
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cmdlines", daemon=True)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        mine = os.getpid()
        while not self._stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) == mine:
                    continue
                try:
                    raw = (entry / "cmdline").read_bytes()
                except OSError:  # the process ended between the listing and the read
                    continue
                if raw:
                    self.lines.add(raw.replace(b"\0", b" ").decode("utf-8", "replace"))
            self.scans += 1
            self._stop.wait(self.interval_s)

    def showing(self, secret: str) -> list[str]:
        """The command lines that contained ``secret``."""
        return [line for line in self.lines if secret in line]
