"""Handing lane state between processor instances: what the processor does when the group revokes
or assigns ingest partitions (exactly-once mode).

Lane state belongs to ingest partitions, not to instances (docs/reliability.md, "Scale-out and
handover"). The rebalance protocol is eager: a revocation commits and then lets go of everything
(the ledger moves it to ``released``); an assignment restores exactly the assigned partitions from
the changelog (adopting it into the ledger), re-holds the consumer slots their batches hold, and
rewinds the results reader to where those batches' completions can first appear.

A mixin of :class:`processor.apps.service.ProcessorService`, kept apart because it is the one part of the
service that runs inside librdkafka's rebalance callbacks rather than the loop.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import TopicPartition

from processor.core.accounting import LedgerImbalance
from processor.core.contract import Contract
from processor.core.item import Batch
from processor.core.scheduler import Scheduler
from processor.state.commit import Committer, TransactionalCommitter
from processor.state.credits import CreditBook
from processor.state.ingest import IngestItem
from processor.state.restore import RestoredState, restore
from processor.wire.heads import ItemHead

log = logging.getLogger("tokenfabric.processor")


class PartitionHandover:
    """Revoke and assign callbacks; the attributes below are the service's."""

    conf: dict[str, str]
    core: Scheduler
    committer: Committer
    credits: CreditBook
    owned: frozenset[int]
    restoring_since_s: float | None
    last_step_s: float
    _clock: Callable[[], float]
    _closing: bool
    _results_pos: dict[int, int]
    _handover_at_start: dict[str, tuple[int, int]] | None
    _owned_at_checkpoint: int

    settings: Any
    topics: Any
    counters: Any

    if TYPE_CHECKING:  # the service's methods these callbacks use

        def now_ms(self) -> int: ...
        def _commit(self, force: bool = False) -> None: ...
        def _assign_control(self) -> None: ...
        def _set_contract(self, contract: Contract) -> None: ...

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Make everything consumed so far durable while the partitions are still ours; in
        exactly-once mode then let go of all lane state (the rebalance protocol is eager: every
        partition is revoked, and ``_on_assign`` restores whatever comes back)."""
        if self._closing:
            return
        self._commit(force=True)
        if isinstance(self.committer, TransactionalCommitter):
            self._hand_over(self.committer)
        else:
            self.committer.revoked(sorted(tp.partition for tp in partitions))

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if isinstance(self.committer, TransactionalCommitter):
            self._take_over(self.committer, sorted(tp.partition for tp in partitions))

    def _take_over(self, committer: TransactionalCommitter, partitions: list[int]) -> None:
        """Restore the lanes and in-flight batches of ``partitions``, now this instance's."""
        self.restoring_since_s = self._clock()
        # Restore builds millions of objects and no reference cycles: a collection in the middle
        # walks everything restored so far and frees nothing (a tenth of restore time when it ran).
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._restore_partitions(committer, partitions)
        finally:
            if collecting:
                gc.enable()
            self.restoring_since_s = None
            self.last_step_s = self._clock()

    def _restore_partitions(self, committer: TransactionalCommitter, partitions: list[int]) -> None:
        self.owned = frozenset(partitions)
        self.credits.reassign(self.owned)
        now = self.now_ms()

        def contracts(found: dict[str, Contract]) -> None:
            for contract in found.values():
                self._set_contract(contract)

        adopted: list[IngestItem] = []

        def waiting(ref: tuple[int, int], home: int, head: ItemHead) -> None:
            item = IngestItem.from_head(head, now, *ref)
            committer.adopt(item, home)
            adopted.append(item)

        state = restore(self.conf, self.topics, self.settings.group_id, partitions, contracts, waiting)
        self.core.adopt_waiting_many(adopted, [now] * len(adopted))  # in one pass, in restore order
        committer.adopt_waiting(state.changelog)
        rewind: dict[int, int] = {}
        for batch_id, entry in state.changelog.batches.items():
            batch = self._rebuilt_batch(state, batch_id)
            committer.adopt_batch(batch, state.changelog.homes[batch_id], entry)
            done = {batch.items[i].id for i in entry.done}
            if self.core.adopt_in_flight(batch, now, done):
                self.credits.adopt(entry.consumer, entry.slot, batch_id)
            else:
                committer.requeued(batch_id, [it for it in batch.items if it.id not in done])
            for p, offset in entry.results_from:
                rewind[p] = min(offset, rewind.get(p, offset))
        self._rewind_results(rewind)
        self.core.check(deep=True)
        self._check_restart(len(partitions))
        # What was just restored lives until it is dispatched: keep the cyclic collector from
        # walking it again and again (it took a quarter of restore time; docs/benchmarks.md).
        gc.freeze()
        self.counters.assignments += 1
        self.counters.restored_items += len(state.changelog.waiting)
        self.counters.restored_batches += len(state.changelog.batches)
        self.counters.restore_seconds += state.seconds
        log.info(
            "processor %s: assigned ingest partitions %s; adopted %d waiting items and %d batches in %.2f s",
            self.settings.instance,
            partitions,
            len(state.changelog.waiting),
            len(state.changelog.batches),
            state.seconds,
        )

    def _rebuilt_batch(self, state: RestoredState, batch_id: str) -> Batch:
        entry = state.changelog.batches[batch_id]
        now = self.now_ms()
        items = [IngestItem.from_head(state.records[ref], now, *ref) for ref in entry.refs]
        for item in items:
            item.dispatched = True
            item.lane = entry.lane
        first = items[0]
        return Batch(
            batch_id,
            entry.consumer,
            first.model,
            first.shape,
            entry.lane,
            entry.pad_multiple,
            entry.padded_length,
            list(items),
            entry.created_ms,
            entry.oversized,
        )

    def _check_restart(self, assigned: int) -> None:
        """After a restart that kept every partition, what the changelog holds must be exactly what
        the last checkpoint counted: the crash check that catches a leak or a phantom."""
        before = self._handover_at_start
        self._handover_at_start = None
        n = self.credits.partitions
        if before is None or assigned != n or self._owned_at_checkpoint != n:
            return
        after = self.core.ledger.handover_delta()
        for model in before.keys() | after.keys():
            if before.get(model, (0, 0)) != after.get(model, (0, 0)):
                b, a = before.get(model, (0, 0)), after.get(model, (0, 0))
                raise LedgerImbalance(
                    f"restore: model {model}: the checkpoint counted {a[0] - b[0]:+,} items / "
                    f"{a[1] - b[1]:+,} tokens different from what the changelog holds"
                )

    def _hand_over(self, committer: TransactionalCommitter) -> None:
        """After the commit in ``_on_revoke``: forget everything; the next owner restores it."""
        self.core.release_all()
        committer.reset()
        self.owned = frozenset()
        self.credits.reassign(self.owned)
        for state in self.core.consumers.values():
            state.slots = 0

    def _rewind_results(self, targets: dict[int, int]) -> None:
        """Re-read completions from where an adopted batch's could first appear; ``item_done`` is
        idempotent, so completions this instance already applied are counted as replays only."""
        lower = {p: o for p, o in targets.items() if o < self._results_pos.get(p, o + 1)}
        if not lower:
            return
        self._results_pos.update(lower)
        self._assign_control()
