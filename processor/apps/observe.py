"""The processor service's counters and the hooks its observers implement.

Beside the service so that metrics and health can name them without the service's clients. The
service's settings are in :mod:`processor.apps.settings`.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.core.item import Batch


@dataclass(slots=True)
class ServiceCounters:
    consumed: int = 0
    dead_lettered: int = 0
    duplicates: int = 0
    batches_produced: int = 0
    batches_delivered: int = 0
    completions: int = 0
    unknown_completions: int = 0
    """Completions of batches this incarnation made and neither holds nor handed over (not replays):
    a consumer ran a batch again after its completion counted."""
    foreign_completions: int = 0
    """Completions of batches this incarnation does not hold and did not make, or handed over with
    their partition: normal with several instances, since each reads the whole results topic."""
    contracts: int = 0
    commits: int = 0
    checkpoints: int = 0
    backpressure_pauses: int = 0
    restored_items: int = 0
    restored_batches: int = 0
    restore_seconds: float = 0.0
    assignments: int = 0
    replayed_completions: int = 0
    ended_items: int = 0
    """Items of cancelled or expired jobs this instance answered (processor/apps/endings.py)."""

    def missed(self, items: int, replay: bool, unknown: bool) -> None:
        """Completions of ``items`` items this instance did not apply: replays of the results topic,
        batches this incarnation made and neither holds nor handed over (``unknown``: the core's
        ``made_here`` and not ``handed_over``), or other batches: other instances', an earlier
        incarnation's (handed over through the changelog at the restart), or handed over at a
        rebalance (every instance reads the whole results topic)."""
        if replay:
            self.replayed_completions += items
        elif unknown:
            self.unknown_completions += items
        else:
            self.foreign_completions += items


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    """What the service's own thread last saw of its ingest, for observers on other threads (the
    metrics endpoint): they read this value, never the Kafka clients, which belong to the service's
    thread. Taken at each commit (:meth:`of`), so up to one commit interval old."""

    owned: frozenset[int] = frozenset()
    """The ingest partitions the service owns: the handover's (exactly-once), else its assignment."""
    lag: tuple[tuple[int, int], ...] = ()
    """(partition, messages not consumed yet) for each owned partition with a known lag, in order."""

    @classmethod
    def of(cls, owned: frozenset[int], lag: dict[int, int]) -> ServiceStatus:
        """The status of ``owned`` partitions; a partition given up leaves ``lag`` at once (the
        service keeps the last lag of every partition it ever held)."""
        return cls(owned, tuple(sorted((p, n) for p, n in list(lag.items()) if p in owned)))


class ServiceObserver:
    """Hooks the metrics layer implements; the default observes nothing.

    Called from the owner thread, so implementations must be quick and must not call back into the
    service.
    """

    def committed(self, seconds: float) -> None:
        """An ingest offset commit (or a transaction commit, with exactly-once) took ``seconds``."""

    def checkpointed(self, seconds: float) -> None:
        """A ledger checkpoint was produced; ``seconds`` is the time to build and queue it."""

    def dispatched(self, batch: Batch, now_ms: int) -> None:
        """``batch`` was emitted at core time ``now_ms``; its items' ``arrival_ms`` say when they came."""

    def answered(self, batch: Batch, items: int, now_ms: int) -> None:
        """``items`` items of ``batch`` (emitted at ``batch.created_ms``) were answered at ``now_ms``."""


#: How long a model's items must wait with no contract for it before the processor says so: contracts
#: are read from the beginning at every start, a step or two after the first ingest messages.
UNSERVED_GRACE_MS = 5_000


class UnservedWatch:
    """Which models to warn about, once: items wait and no consumer has a contract for the model.

    :meth:`update` takes ``Scheduler.unserved()`` and returns the models that have just been unserved
    for ``grace_ms``. A model is named again only after it was served (or had nothing waiting) in
    between, so a log carries one line per change, not one per tick.
    """

    def __init__(self, grace_ms: int = UNSERVED_GRACE_MS) -> None:
        self.grace_ms = grace_ms
        self._since: dict[str, int] = {}
        self._said: set[str] = set()

    def update(self, unserved: dict[str, tuple[int, int]], now_ms: int) -> list[tuple[str, int, int]]:
        """(model, items, tokens) of each model to warn about now."""
        for model in [m for m in self._since if m not in unserved]:
            del self._since[model]
            self._said.discard(model)
        out: list[tuple[str, int, int]] = []
        for model, (items, tokens) in sorted(unserved.items()):
            since = self._since.setdefault(model, now_ms)
            if model not in self._said and now_ms - since >= self.grace_ms:
                self._said.add(model)
                out.append((model, items, tokens))
        return out
