"""The phases of one ``tokenfabric demo`` run that wait: the cards getting ready, the drain, and the
progress line both print (processor/cli/demo.py runs the pipelines).

Why a module of its own: the demo's command module holds what runs and what is reported; waiting on
a run's processes and topics is its own job. Invariant: every wait checks that the run's processes
are alive and ends with an exception (never a silent hang) after its limit.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from processor.kafka.topics import TopicNames
    from processor.local.compare import ResultsWatcher
    from processor.local.pipeline import Card, Pipeline


class PhaseLine:
    """One line per phase: rewritten in place on a terminal, printed every few seconds otherwise."""

    def __init__(self, stream: io.TextIOBase | None = None, every_s: float = 5.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s
        self._last = 0.0

    def update(self, text: str) -> None:
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
            self.stream.flush()
        elif now - self._last >= self.every_s:
            self.stream.write(text + "\n")
            self.stream.flush()
        else:
            return
        self._last = now

    def done(self, text: str) -> None:
        self.stream.write(("\r\x1b[2K" if self.tty else "") + text + "\n")
        self.stream.flush()
        self._last = 0.0


def wait_ready(
    name: str,
    conf: dict[str, str],
    topics: TopicNames,
    cards: tuple[Card, ...],
    group: str,
    pipeline: Pipeline,
    line: PhaseLine,
    group_members: Callable[[Mapping[str, str], str], list[int]],
) -> None:
    """Until every card has its engine loaded and its place: contracts announced and the processor in
    its group (tokenfabric), every card in the plain queue's group with partitions assigned, or every
    share-queue card's first poll returned (its member joined the share group)."""
    from processor.apps.sharequeue import JOINED
    from processor.ops.status import gather

    t0 = time.monotonic()
    while True:
        pipeline.check_alive()
        if name == "share-queue":
            ready = all(JOINED in _log_text(pipeline, c.name) for c in cards)
        elif name == "tokenfabric":
            view = gather(conf, topics)
            ready = all(c.name in view.contracts for c in cards) and bool(group_members(conf, group))
        else:
            members = group_members(conf, group)
            ready = len(members) == len(cards) and all(members)
        waited = time.monotonic() - t0
        if ready:
            line.done(f"{name}: {len(cards)} cards ready in {waited:.1f} s")
            return
        if waited > 120:
            raise TimeoutError(f"{name}: the cards were not ready within 120 s (logs in {pipeline})")
        line.update(f"{name}: starting the cards ({waited:.0f} s)")
        time.sleep(0.5)


def _log_text(pipeline: Pipeline, card: str) -> str:
    path = pipeline.log_dir / f"{card}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def drain(
    name: str, watcher: ResultsWatcher, total: int, pipeline: Pipeline, timeout_s: float, line: PhaseLine
) -> None:
    t0 = time.monotonic()
    done = 0
    while done < total:
        pipeline.check_alive()
        done = watcher.poll(0.5)
        elapsed = time.monotonic() - t0
        rate = watcher.tokens / elapsed if elapsed > 0 else 0.0
        line.update(f"{name}: drain {done:,}/{total:,} items, {rate:,.0f} tokens/s, {elapsed:.0f} s")
        if elapsed > timeout_s:
            raise TimeoutError(f"{name}: only {done:,} of {total:,} items completed within {timeout_s:.0f} s")
    elapsed = time.monotonic() - t0
    line.done(
        f"{name}: drained {total:,} items in {elapsed:.1f} s, "
        f"{watcher.tokens / elapsed if elapsed else 0:,.0f} tokens/s"
    )
