"""Handing lane state between processor instances: what the processor does when the group revokes
or assigns ingest partitions.

Lane state belongs to ingest partitions, not to instances (docs/reliability.md, "Scale-out and
handover"). The rebalance callbacks only record what moved; the restore runs from the main loop
(:meth:`PartitionHandover.restore_pending`), as Kafka Streams and Quix Streams do:

- an assignment (the whole new set under the classic, eager protocol; only the added partitions
  under the consumer protocol, KIP-848) assigns the partitions paused and marks them pending. The
  loop's next step restores them from the changelog (adopting it into the ledger), re-holds the
  consumer slots their batches hold, rewinds the results reader to where their completions can
  first appear, and resumes them. Partitions this instance kept meanwhile go on dispatching.
- a revocation commits while the partitions are still ours. A pending partition that goes was never
  restored: nothing is thrown away. When restored ones go, only their lane state is let go (the
  waiting items homed in them, the batches whose changelog records live there, their waiting sets
  and seen ids): their next owner restores it from what the commit just made durable. The
  partitions kept keep theirs in memory and go on dispatching, never paused; each consumer's share
  of slots follows them. A revocation of everything owned (the classic protocol's, always) lets go
  of it all at once.
- a restore that fails on a transient broker error (the previous owner's transaction still open,
  an unreachable coordinator) has adopted nothing yet: it is tried again a second later, never a
  crash loop; a rebalance between two tries just changes what is pending.

What differs between the delivery modes is the ownership role's to say
(:meth:`~processor.state.ownership.Ownership.revoked`, :meth:`~processor.state.ownership.Ownership.assigned`):
this component never asks which mode it runs in, and adopts restored state through the
:class:`~processor.state.ownership.Restorable` lane log the ownership hands it.
"""

from __future__ import annotations

import gc
import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.core.accounting import LedgerImbalance
from processor.core.contract import Contract
from processor.core.item import Batch, Item
from processor.core.scheduler import Scheduler
from processor.kafka.exits import FencedByGroup
from processor.state.changelog import ChangelogState
from processor.state.credits import CreditBook
from processor.state.ingest import IngestItem
from processor.state.ownership import Ownership, Restorable
from processor.state.restore import OnWaiting, RestoredState
from processor.state.results import ResultsCursor
from processor.wire.records import LedgerSnapshotRecord

arrival_of = operator.attrgetter("arrival_ms")

log = logging.getLogger("tokenfabric.processor")

Restorer = Callable[[list[int], Callable[[dict[str, Contract]], None], OnWaiting, float], RestoredState]
"""Reads the changelog of some ingest partitions (processor.state.restore.restore, bound to a
pipeline's clients, topics and group); the float is how long to wait for their committed offsets."""


@dataclass(frozen=True, slots=True)
class Restored:
    """What one assignment adopted, for the service's counters and log."""

    partitions: list[int]
    waiting_items: int
    batches: int
    seconds: float


@dataclass(frozen=True, slots=True)
class HandoverContext:
    """Everything the rebalance callbacks work on, passed in by the service that owns them."""

    core: Scheduler
    ownership: Ownership
    """What a revocation and an assignment mean in the delivery mode (processor/state/ownership.py)."""
    credits: CreditBook
    results: ResultsCursor
    restore: Restorer
    commit: Callable[[], None]
    """Make everything consumed so far durable, now (a forced commit)."""
    set_contract: Callable[[Contract], None]
    """Announce a restored contract to the core, with this instance's share of its slots."""
    reassign_results: Callable[[], None]
    """Re-assign the results reader at ``results.next`` (after a rewind)."""
    now_ms: Callable[[], int]
    clock: Callable[[], float]
    """Monotonic seconds (when a restore began and ended)."""
    on_restored: Callable[[Restored], None]
    ingest_topic: str = ""
    """The topic whose partitions move (to pause and resume them)."""
    incremental: bool = True
    """The consumer protocol's callbacks name only what moved (``incremental_assign``); the classic
    protocol's name the whole assignment (``assign``)."""


RESTORE_RETRY_S = 1.0
"""How long a restore that failed on a transient error waits before it is tried again."""
OFFSETS_WAIT_S = 30.0
"""How long a restore waits for its partitions' committed offsets when this instance owns nothing."""
OFFSETS_WAIT_KEPT_S = 0.5
"""... and while it owns other partitions. A dead owner's open transaction holds that answer back
(KIP-447) for up to its transaction timeout, and the restore runs on the loop: the partitions kept
would dispatch nothing meanwhile (9.4 s in ``bench_rebalance.py``'s kill during a restore). Past
this the restore is tried again :data:`RESTORE_RETRY_S` later, and the loop dispatches in between."""


class PartitionHandover:
    """The revoke and assign callbacks, the partitions they leave pending, and their restore.

    Read from other threads (health): ``owned``, ``pending``, ``restoring_since_s`` (set while a
    restore runs, or partitions wait for one), ``finished_s`` (when the last restore ended).
    Invariant: ``owned`` and ``pending`` never overlap; their union is what the group assigned.
    """

    def __init__(self, context: HandoverContext) -> None:
        self.ctx = context
        self.owned: frozenset[int] = frozenset()
        self.pending: frozenset[int] = frozenset()
        self.restoring_since_s: float | None = None
        self.finished_s: float | None = None
        self.closing = False
        """Set when the service shuts down: a revocation then commits nothing more."""
        self.lost = False
        """Set when the group fenced this member (:meth:`on_lost`): from then on nothing may be
        committed; the loop ends the run (:class:`~processor.kafka.exits.FencedByGroup`)."""
        self._counted_at_start: dict[str, tuple[int, int]] | None = None
        self._owned_at_checkpoint = -1
        self._retry_at_s = 0.0
        self._retrying: list[int] = []

    def resume(self, checkpoint: LedgerSnapshotRecord | None) -> None:
        """At start, in a mode whose lane state moves with partitions: resume the ledger from the
        instance's last checkpoint, remember what it counted (for :meth:`_check_restart`), then let
        go of it all: nothing is this instance's until the group assigns partitions."""
        core = self.ctx.core
        if checkpoint is not None:
            core.resume_ledger(checkpoint.counters)
            self._owned_at_checkpoint = checkpoint.counters.get("owned_partitions", -1)
        self._counted_at_start = core.view.handover_delta()
        core.release_all()

    def on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Make everything consumed so far durable while the partitions are still ours, then let the
        ownership say what a revocation means in its mode (exactly-once: let go of the revoked
        partitions' lane state; the partitions kept keep theirs and dispatch on)."""
        if self.closing:
            return
        revoked = frozenset(tp.partition for tp in partitions)
        unrestored = revoked & self.pending
        self.pending -= revoked
        if revoked == unrestored:
            return  # only partitions paused since their assignment went: nothing was read from them
        self.ctx.commit()
        self.ctx.ownership.revoked(sorted(revoked), self._let_go)

    def on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """The group fenced this member (its session expired: a long pause, or an outage longer than
        the session): its partitions may be another's already, so nothing is committed, and the
        loop must not commit again either (:attr:`lost`).

        Why the loop must stop, not rely on the broker: the open transaction is refused only if it
        carries offsets under the stale member epoch, and after a loss the assignment is empty (or
        new, under a new epoch), so a commit would carry batches of partitions another member now
        dispatches, and nothing to refuse it by. That doubled items under the consumer protocol
        (issue 36). Exactly-once makes the restart that follows safe."""
        self.pending -= frozenset(tp.partition for tp in partitions)
        self.lost = True
        log.warning(
            "ingest partitions %s lost: this member was fenced by the group (a pause or an outage past "
            "its session timeout); its open transaction is abandoned, and it resumes from its last commit",
            sorted(tp.partition for tp in partitions),
        )

    def raise_if_lost(self, who: str) -> None:
        """From the loop, after each poll: end the run if the group fenced this member meanwhile."""
        if self.lost:
            raise FencedByGroup(f"{who}: fenced by its group; its open transaction is abandoned")

    def on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Assign ``partitions`` paused and mark them pending: :meth:`restore_pending` restores them
        from the loop. Outside the callback, so that a long restore never holds up the group."""
        tps = [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in partitions]
        if self.ctx.incremental:
            consumer.incremental_assign(tps)
        else:
            consumer.assign(tps)
        self._set_pending(consumer, frozenset(tp.partition for tp in partitions))

    def _set_pending(self, consumer: Any, partitions: frozenset[int]) -> None:
        if not partitions:
            return
        consumer.pause([TopicPartition(self.ctx.ingest_topic, p) for p in sorted(partitions)])
        self.pending |= partitions
        if self.restoring_since_s is None:
            self.restoring_since_s = self.ctx.clock()

    def restore_pending(self, consumer: Any) -> bool:
        """From the loop: restore the pending partitions and resume them. True when it restored.

        A transient broker error while reading the changelog (nothing is adopted before it has been
        read to its end) leaves the partitions pending for a later step; anything else is raised."""
        if not self.pending or self.closing or self.ctx.clock() < self._retry_at_s:
            return False
        partitions = sorted(self.pending)
        try:
            self.ctx.ownership.assigned(partitions, self._take_over)
        except KafkaException as exc:
            if not _transient(exc):
                raise
            # the changelog read failed before anything was adopted: the partitions just stay pending
            self._retry_at_s = self.ctx.clock() + RESTORE_RETRY_S
            if partitions != self._retrying:  # once per set: a dead owner's transaction takes seconds
                log.warning("restore of ingest partitions %s failed (%s); trying again", partitions, exc)
            self._retrying = partitions
            return False
        self._retrying = []
        self.pending = frozenset()
        self.restoring_since_s = None
        self.finished_s = self.ctx.clock()
        consumer.resume([TopicPartition(self.ctx.ingest_topic, p) for p in partitions])
        return True

    def _let_go(self, lanes: Restorable, partitions: list[int]) -> None:
        """After the commit in ``on_revoke``: forget the lane state of ``partitions`` (their next
        owner restores it from that commit). When every partition owned goes, all of it goes at once;
        otherwise only the waiting items homed in them and the batches whose records live there, and
        each consumer's share of slots follows the partitions kept."""
        ctx = self.ctx
        gone = frozenset(partitions)
        kept = self.owned - gone
        if not kept:
            ctx.core.release_all()
            ctx.core.release_slots()
            lanes.reset()
            self.owned = frozenset()
            ctx.credits.reassign(self.owned)
            return
        batches = lanes.let_go(gone)

        def homed_there(item: Item) -> bool:
            return cast(IngestItem, item).home in gone

        items, released = ctx.core.release(homed_there, batches, ctx.now_ms())
        log.info(
            "ingest partitions %s revoked: let go of %d waiting items and %d batches in flight; "
            "partitions %s kept in memory",
            sorted(gone),
            items,
            released,
            sorted(kept),
        )
        self.owned = kept
        ctx.credits.narrow(kept, batches)
        view = ctx.core.view
        for name in view.consumers():
            contract = view.contract(name)
            if contract is not None:
                ctx.set_contract(contract)  # this instance's share of its slots, on fewer partitions
        ctx.core.check(deep=True)

    def _take_over(self, lanes: Restorable, partitions: list[int]) -> None:
        """Restore the lanes and in-flight batches of ``partitions``, now this instance's too."""
        # Restore builds millions of objects and no reference cycles: a collection in the middle
        # walks everything restored so far and frees nothing (a tenth of restore time when it ran).
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._restore_partitions(lanes, partitions)
        finally:
            if collecting:
                gc.enable()

    def _restore_partitions(self, lanes: Restorable, partitions: list[int]) -> None:
        ctx = self.ctx
        now = ctx.now_ms()

        announced: list[Contract] = []

        def contracts(found: dict[str, Contract]) -> None:
            announced.extend(found.values())  # announced once the share is this assignment's

        adopted: list[IngestItem] = []

        def waiting(ref: tuple[int, int], home: int, head: Any, timestamp_ms: int) -> None:
            # its first arrival, not this restore: waiting ages (and the alert on them) go on across
            # restarts and handovers. The core's clock is epoch ms; a timestamp ahead of it (a producer
            # whose clock runs fast) or missing (<= 0) counts as now.
            arrival = timestamp_ms if 0 < timestamp_ms < now else now
            item = IngestItem.from_head(head, arrival, *ref)
            lanes.adopt(item, home)
            adopted.append(item)

        state = ctx.restore(
            partitions, contracts, waiting, OFFSETS_WAIT_KEPT_S if self.owned else OFFSETS_WAIT_S
        )
        self.owned |= frozenset(partitions)  # read to its end: from here on it is adopted
        ctx.credits.extend(self.owned)
        for contract in announced:
            ctx.set_contract(contract)
        restore_attempts(adopted, state.changelog)
        adopted.sort(key=arrival_of)  # the core's arrival order is its queue's: oldest first
        ctx.core.adopt_waiting_many(adopted, [it.arrival_ms for it in adopted])  # in one pass
        lanes.adopt_waiting(state.changelog)
        rewind: dict[int, int] = {}
        for batch_id, entry in state.changelog.batches.items():
            batch = self._rebuilt_batch(state, batch_id, now)
            lanes.adopt_batch(batch, state.changelog.homes[batch_id], entry)
            done = {batch.items[i].id for i in entry.done}
            if ctx.core.adopt_in_flight(batch, now, done):
                ctx.credits.adopt(entry.consumer, entry.slot, batch_id)
            else:
                lanes.requeued(batch_id, [it for it in batch.items if it.id not in done])
            for p, offset in entry.results_from:
                rewind[p] = min(offset, rewind.get(p, offset))
        if ctx.results.rewind(rewind):
            # ``item_done`` is idempotent: completions already applied count as replays only
            ctx.reassign_results()
        ctx.core.check(deep=True)
        self._check_restart(len(partitions))
        # What was just restored lives until it is dispatched: keep the cyclic collector from
        # walking it again and again (it took a quarter of restore time; docs/benchmarks.md).
        gc.freeze()
        ctx.on_restored(
            Restored(partitions, len(state.changelog.waiting), len(state.changelog.batches), state.seconds)
        )

    @staticmethod
    def _rebuilt_batch(state: RestoredState, batch_id: str, now: int) -> Batch:
        entry = state.changelog.batches[batch_id]
        items = [IngestItem.from_head(state.records[ref], now, *ref) for ref in entry.refs]
        for i in range(len(entry.attempts)):
            items[i].attempt = entry.attempts[i]
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
        before = self._counted_at_start
        self._counted_at_start = None
        n = self.ctx.credits.partitions
        if before is None or assigned != n or self._owned_at_checkpoint != n:
            return
        after = self.ctx.core.view.handover_delta()
        for model in before.keys() | after.keys():
            if before.get(model, (0, 0)) != after.get(model, (0, 0)):
                b, a = before.get(model, (0, 0)), after.get(model, (0, 0))
                raise LedgerImbalance(
                    f"restore: model {model}: the checkpoint counted {a[0] - b[0]:+,} items / "
                    f"{a[1] - b[1]:+,} tokens different from what the changelog holds"
                )


def _transient(exc: KafkaException) -> bool:
    """A broker error a later try can get past (a timeout, a coordinator moving or loading)."""
    err = exc.args[0] if exc.args else None
    if not isinstance(err, KafkaError):
        return False
    timed_out = err.code() in (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._TRANSPORT)
    return not err.fatal() and (err.retriable() or timed_out)


def restore_attempts(waiting: list[IngestItem], state: ChangelogState) -> None:
    """Give each restored waiting item the attempt its ``A`` record kept (without one: its first)."""
    if not state.attempts:
        return
    by_ref = {(it.partition, it.offset): it for it in waiting}
    for ref in state.attempts:
        item = by_ref.get(ref)
        if item is not None:
            item.attempt = state.attempt_of(ref)
