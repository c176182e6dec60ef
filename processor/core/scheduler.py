"""Shape-sticky dispatch: which lane a consumer's next batch comes from.

The rules, in the order they are applied when a consumer has a free in-flight slot:

1. **Deadline.** If the oldest waiting item of the consumer's model has waited ``max_wait_ms`` and the
   consumer may take its lane, the batch comes from that lane, cut around that item. If the item is in
   another shape, the consumer moves there only once it has stayed ``max_wait_ms`` on its current
   shape. Under the default ``deadline="overtaking"`` the item must also be *overtaken*: the shape the
   consumer would otherwise serve (rules 2 and 3) has received an item ``max_wait_ms`` or more after
   it, and no other consumer that may take the item's lane is on the item's shape (that consumer's
   own rule 1 serves it, in its shape, at its next free slot). In a backlog, where everything arrived
   together, nothing is overtaken and the deadline costs no switch; in streaming a cold item behind a
   hot shape is overtaken by the hot shape's fresh items, as under ``deadline="absolute"`` (the first
   generation's rule, which does not ask). An item therefore waits at most about
   ``max_wait_ms x (1 + shapes holding older overdue items)`` plus one batch's engine time, plus the
   engine time of what arrived within ``max_wait_ms`` after it: it is never passed by a batch of items
   more than ``max_wait_ms`` younger once it is overdue (tests/core/test_properties.py,
   tests/core/test_scheduler.py).
2. **Stick.** Otherwise the batch comes from the consumer's current shape while that shape has a lane
   it may take, lanes served round-robin (a lane that still holds items after a batch goes to the back).
3. **Switch.** Otherwise the consumer moves to the shape of its model with the most waiting tokens
   that has a lane it may take, preferring (``spread``) shapes no other consumer of the model is on.

**Shares.** When several jobs of the consumer's model wait, or a job has a quota, the three rules
ask ``core/shares.py`` (one :class:`~processor.core.shares.Gate` per decision, ``_next_batch``): the
deadline serves only a job within its share, the consumer sticks only while its job is not too far
ahead of the most owed one, and a switch goes to the most owed job's shape (the consumer's own job
first while it may keep it). A quota caps the items a batch takes. With one job and no quota the
rules are exactly the three above.

How a batch is cut from its lane (arrival order, or longest first) is the lane table's
``take_batch`` (processor/core/lanes.py).

A consumer *may take* a lane whose longest item (the longest waiting one when lanes are cut by length,
else the lane's representative length), alone, fits its batching rule (with the
head item's output budget in memory mode), or one that fits no live consumer of the model (its items
then go out as single oversized batches). A small card is thus never sent an item a bigger card of the
same model could hold.

Every batch is checked as it is emitted: one model, one shape, one lane, within the consumer's
batching rule (``contract.BatchRule.fits``) unless it is a single oversized item. A violation raises
``InvariantViolation`` and the scheduler must not be used again: stopping is better than sending a GPU
a mixed batch.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from processor.core.accounting import Ledger, LedgerImbalance
from processor.core.contract import Contract, check_batch
from processor.core.item import Batch, Item
from processor.core.lanes import Lane, LaneSettings, LaneTable, ShapeKey, ShapeLanes, key_job, shape_key
from processor.core.shares import Gate, Shares

DEADLINES = ("overtaking", "absolute")


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    max_wait_ms: int = 60_000
    """An item waiting this long takes priority over shape stickiness (see rule 1)."""
    deadline: str = "overtaking"
    """``overtaking``: an overdue item takes priority only over batches holding items that arrived
    ``max_wait_ms`` after it, and not while a peer serving its shape can take it (rule 1);
    ``absolute``: over every batch (the first generation's rule)."""
    spread: bool = True
    """Rule 3 prefers a shape no other consumer of the model is on (``False``: most waiting tokens)."""

    def __post_init__(self) -> None:
        if self.max_wait_ms < 1:
            raise ValueError(f"max_wait_ms must be >= 1, got {self.max_wait_ms}")
        if self.deadline not in DEADLINES:
            raise ValueError(f"deadline must be one of {', '.join(DEADLINES)}, got {self.deadline!r}")


class InFlight:
    """A batch a consumer holds, and which of its items are still outstanding."""

    __slots__ = ("batch", "job", "pending", "tokens")

    def __init__(self, batch: Batch, job: str | None, tokens: int | None = None) -> None:
        self.batch = batch
        self.pending: dict[str, Item] | None = None  # built on the first per-item completion
        self.job = job  # the job of all its items; None for a batch restored from before lanes had jobs
        self.tokens = batch.real_tokens if tokens is None else tokens  # of all its items


class ConsumerState:
    __slots__ = ("contract", "in_flight", "last_shape", "shape", "shape_switches", "slots", "switched_ms")

    def __init__(self, contract: Contract, slots: int | None = None) -> None:
        self.contract = contract
        self.slots = slots  # this instance's share of max_inflight (processor/state/credits.py); None: all
        self.in_flight: dict[str, InFlight] = {}
        self.shape: ShapeKey | None = None
        self.last_shape: ShapeKey | None = None
        self.switched_ms = 0
        self.shape_switches = 0

    @property
    def free_slots(self) -> int:
        limit = self.contract.max_inflight if self.slots is None else self.slots
        return limit - len(self.in_flight)


def _fits(contract: Contract, lane: Lane, by_length: bool) -> bool:
    """Whether ``contract`` holds the lane's longest item alone (its longest waiting one when the lane
    is cut by length, else its representative length), counting the head item's output budget: the
    head is what would otherwise go out oversized."""
    rule = contract.rule
    output_budget = lane.head().output_budget if rule.counts_output and lane.tokens else 0
    return rule.fits_alone(lane.longest(by_length), output_budget)


def _fits_item(contract: Contract, item: Item) -> bool:
    return contract.rule.fits_alone(item.length, item.output_budget)


class Scheduler:
    """The scheduling core: lanes, contracts, dispatch and the ledger, driven by ``now_ms``.

    Owned by one thread. Adapters call ``submit`` for each decoded item, ``dispatch`` when slots may
    be free, and ``complete``/``item_done`` when results come back. The scheduler is the ledger's only
    writer: what an adapter learns that the ledger counts (a dead-lettered input, a cache report, a
    checkpoint to resume from) it reports through the methods under "the ledger" below.
    """

    def __init__(
        self,
        lanes: LaneSettings | None = None,
        dispatch: DispatchSettings | None = None,
        *,
        ledger: Ledger | None = None,
        batch_prefix: str = "b",
        shares: Shares | None = None,
    ) -> None:
        self.table = LaneTable(lanes)
        self.shares = shares or Shares()
        self.settings = dispatch or DispatchSettings()
        self.ledger = ledger or Ledger()
        self.batch_prefix = batch_prefix
        self.consumers: dict[str, ConsumerState] = {}
        self._by_model: dict[str, list[ConsumerState]] = {}
        self._active: dict[str, dict[ShapeKey, ShapeLanes]] = {}
        self._arrivals: dict[str, deque[Item]] = {}
        self._in_flight: dict[str, tuple[ConsumerState, InFlight]] = {}
        self._seq = 0
        self.oversized = 0

    # -- consumers ------------------------------------------------------------------------------

    def set_contract(self, contract: Contract, slots: int | None = None) -> None:
        """Add a consumer or change its contract (batches it holds stay in flight). ``slots`` is how
        many of its ``max_inflight`` this scheduler may fill (several processor instances share a
        consumer: processor/state/credits.py); None means all of them."""
        state = self.consumers.get(contract.consumer)
        if state is None:
            state = self.consumers[contract.consumer] = ConsumerState(contract, slots)
        else:
            state.slots = slots
            self._by_model[state.contract.model].remove(state)
            if state.contract.model != contract.model:
                state.shape = None
            state.contract = contract
        self._by_model.setdefault(contract.model, []).append(state)

    def retire(self, consumer: str, now_ms: int) -> list[Batch]:
        """Remove a consumer; the batches it held go back to their lanes, counted as redelivered."""
        state = self.consumers.pop(consumer)
        self._by_model[state.contract.model].remove(state)
        returned = [f.batch for f in state.in_flight.values()]
        for batch in returned:
            self.requeue(batch.batch_id, now_ms)
        return returned

    # -- items in ------------------------------------------------------------------------------

    def submit(self, item: Item, now_ms: int) -> None:
        """Take a new item into its lane and count it as received."""
        self.submit_many((item,), (now_ms,))

    def submit_many(self, items: Sequence[Item], times: Sequence[int]) -> None:
        """Take new items in, in order, each at its own ``times[i]`` (what :meth:`submit` on each in
        turn does, in one pass: the simulator submits every arrival between two dispatches this way).
        Nothing is taken if one of them is invalid."""
        for item in items:
            if item.length < 1:
                raise ValueError(f"item {item.id!r}: length must be >= 1, got {item.length}")
        self._enqueue_many(items, times, "received")

    def adopt_waiting(self, item: Item, now_ms: int) -> None:
        """Take in an item restored from the changelog (counted as adopted, not received)."""
        self.adopt_waiting_many((item,), (now_ms,))

    def adopt_waiting_many(self, items: Sequence[Item], times: Sequence[int]) -> None:
        """:meth:`adopt_waiting` for each item in turn, in one pass (a restore takes millions)."""
        self._enqueue_many(items, times, "adopted")

    def adopt_in_flight(self, batch: Batch, now_ms: int, done: Collection[str] = ()) -> bool:
        """Re-register a batch restored from the changelog; ``done`` names items already answered
        (counted where they were answered), the rest are adopted as in flight.

        Returns False if its consumer has no contract any more: the outstanding items then go back to
        their lanes, counted as redelivered.
        """
        for it in batch.items:
            it.job = self.shares.track(it.job)
        jobs = {it.job for it in batch.items}
        flight = InFlight(batch, jobs.pop() if len(jobs) == 1 else None)
        if done:
            flight.pending = {it.id: it for it in batch.items if it.id not in done}
        outstanding = flight.pending.values() if flight.pending is not None else batch.items
        self.ledger.adopted_in_flight(
            batch.model, batch.consumer, len(outstanding), sum(it.length for it in outstanding)
        )
        for job, (n, tokens) in _by_job(outstanding).items():
            self.ledger.job_adopted_in_flight(job, n, tokens)
        state = self.consumers.get(batch.consumer)
        if state is None:
            holder = ConsumerState(Contract(batch.consumer, batch.model, 1, 1))
            holder.in_flight[batch.batch_id] = flight
            self._in_flight[batch.batch_id] = (holder, flight)
            self.requeue(batch.batch_id, now_ms)
            return False
        state.in_flight[batch.batch_id] = flight
        self._in_flight[batch.batch_id] = (state, flight)
        return True

    def release_all(self) -> None:
        """Forget every waiting item and in-flight batch (their ingest partitions are being handed
        over, or restored afresh); the ledger moves their counts to ``released``. Contracts stay."""
        stats = self.table.stats
        stats.lanes_in_use = 0  # the counters of lane activity carry on; only the lanes go
        self.table = LaneTable(self.table.settings)
        self.table.stats = stats
        self._active.clear()
        self.shares.reset_waiting()
        self._arrivals.clear()
        self._in_flight.clear()
        for state in self.consumers.values():
            state.in_flight.clear()
            state.shape = None
        self.ledger.release_all()

    def done_items(self, batch_id: str) -> list[str]:
        """Ids of the items of an in-flight batch that have been answered already."""
        flight = self._in_flight[batch_id][1]
        if flight.pending is None:
            return []
        return [it.id for it in flight.batch.items if it.id not in flight.pending]

    def _enqueue_many(
        self, items: Sequence[Item], times: Sequence[int], count: Literal["received", "adopted"] | None
    ) -> None:
        """Place items in their lanes; ``count`` them per model and per job as received, or adopted
        from the changelog, with one ledger entry per model and job (None: a requeue, which the
        caller counts). A shape that had nothing waiting becomes active, in the order the items
        reached it (rule 3 breaks ties by that order)."""
        if not items:
            return
        if count is not None:
            track = self.shares.track
            for item in items:
                if item.job:
                    item.job = track(item.job)
        added: dict[tuple[str, str], list[int]] = {}  # (model, job) -> [items, tokens]
        for sl, had_items, had_tokens in self.table.place_many(items, times):
            model, job = sl.key[0], sl.job
            tally = added.setdefault((model, job), [0, 0])
            tally[0] += sl.waiting_items - had_items
            tally[1] += sl.waiting_tokens - had_tokens
            if had_items == 0:
                self._active.setdefault(model, {})[sl.key] = sl
                self.shares.lanes_changed(model, job, 1)
        for (model, job), (n, tokens) in added.items() if count is not None else ():
            if count == "adopted":
                self.ledger.adopted_waiting(model, tokens, n)
            else:
                self.ledger.received(model, tokens, n)
            self.ledger.job_received(job, n, tokens, adopted=count == "adopted")
        arrivals = self._arrivals
        models = {model for model, _ in added}
        if len(models) == 1 and (only := models.pop()) in arrivals:  # one model, the common case
            arrivals[only].extend(items)
        else:
            for item in items:
                queue = arrivals.get(item.model)
                if queue is None:
                    queue = arrivals[item.model] = deque()
                queue.append(item)

    # -- batches out ---------------------------------------------------------------------------

    def dispatch(self, now_ms: int) -> list[Batch]:
        """Fill every free slot of every consumer that has work; consumers take turns, one batch each."""
        out: list[Batch] = []
        progress = True
        while progress:
            progress = False
            for state in list(self.consumers.values()):
                if state.free_slots > 0:
                    batch = self._next_batch(state, now_ms)
                    if batch is not None:
                        out.append(batch)
                        progress = True
        return out

    def next_batch(self, consumer: str, now_ms: int) -> Batch | None:
        """One batch for ``consumer`` if it has a free slot and there is work it may take."""
        state = self.consumers[consumer]
        if state.free_slots <= 0:
            return None
        return self._next_batch(state, now_ms)

    def _next_batch(self, state: ConsumerState, now_ms: int) -> Batch | None:
        model = state.contract.model
        active = self._active.get(model)
        if not active:
            return None
        peers = self._by_model[model]
        gate = self.shares.gate(model, now_ms)
        choice: tuple[ShapeLanes, Lane] | None = None
        if state.shape is not None:
            sl = active.get(state.shape)
            if sl is not None and (gate is None or gate.keeps(sl.job, _ahead(state, peers, active, gate))):
                lane = self._eligible_lane(sl, state.contract, peers)
                if lane is not None and (gate is None or gate.allows(sl, lane)):
                    choice = (sl, lane)
        if choice is None:
            if gate is None:
                choice = self._switch_target(state, active, peers)
            else:
                choice = self._shared_target(state, active, peers, gate)
        overdue = self._overdue(state, peers, now_ms, choice)
        if overdue is not None and (
            gate is None or (gate.admits(overdue[0].job) and gate.allows(overdue[0], overdue[1]))
        ):
            sl, lane, anchor = overdue
            return self._emit(state, sl, lane, now_ms, anchor, None if gate is None else gate.room(sl, lane))
        if choice is None:
            return None
        sl, lane = choice
        return self._emit(state, sl, lane, now_ms, None, None if gate is None else gate.room(sl, lane))

    def _overdue(
        self,
        state: ConsumerState,
        peers: list[ConsumerState],
        now_ms: int,
        choice: tuple[ShapeLanes, Lane] | None,
    ) -> tuple[ShapeLanes, Lane, Item | None] | None:
        """Rule 1, the deadline: the lane of the model's oldest waiting item, and that item (the
        anchor its batch is cut around, under the overtaking deadline), when it overrides ``choice``
        (the batch rules 2 and 3 would give); None when it does not.

        The item must have waited ``max_wait_ms``. A consumer on another shape leaves it for the item
        only after staying there ``max_wait_ms``. Under ``deadline="overtaking"`` the item must also be
        overtaken: ``choice``'s shape has received an item ``max_wait_ms`` or more after it (in a
        backlog, where everything arrived together, nothing is ever overtaken), and no other consumer
        that may take the item's lane is on its shape (that one serves it: it is overtaken by nothing
        there but what arrived within ``max_wait_ms`` after it).
        """
        arrivals = self._arrivals[state.contract.model]
        while arrivals and arrivals[0].dispatched:
            arrivals.popleft()
        if not arrivals:
            return None
        oldest = arrivals[0]
        max_wait = self.settings.max_wait_ms
        if now_ms - oldest.arrival_ms < max_wait:
            return None
        key = shape_key(oldest.model, oldest.shape, oldest.job)
        if key != state.shape and state.shape is not None and now_ms - state.switched_ms < max_wait:
            return None
        sl = self._active[oldest.model][key]
        lane = sl.lanes[oldest.lane]
        if not self._may_take(lane, state.contract, peers):
            return None
        if (
            self.table.by_length
            and not _fits_item(state.contract, oldest)
            and any(_fits_item(p.contract, oldest) for p in peers)
        ):
            return None  # a bigger peer holds it
        if self.settings.deadline == "absolute":
            return sl, lane, None
        if choice is not None and choice[0].newest_ms - oldest.arrival_ms < max_wait:
            return None  # what this consumer would serve arrived within max_wait_ms of the item
        for peer in peers:
            if peer is not state and peer.shape == key and _fits(peer.contract, lane, self.table.by_length):
                return None
        return sl, lane, oldest

    def _may_take(self, lane: Lane, contract: Contract, peers: list[ConsumerState]) -> bool:
        """A lane whose longest item ``contract`` holds alone, or that no peer holds (its head then goes
        out oversized); cut by length, also one whose shortest item it holds while a peer holds the
        longest (:meth:`_leaves_longer`: the batch starts below what the peer must take)."""
        by_length = self.table.by_length
        if _fits(contract, lane, by_length):
            return True
        if not any(_fits(p.contract, lane, by_length) for p in peers):
            return True
        return by_length and _fits_item(contract, lane.shortest())

    def _leaves_longer(self, contract: Contract, lane: Lane) -> bool:
        """Whether a batch for ``contract`` must leave the lane's longest items to a peer that holds
        them (cut by length, the lane may hold items only the bigger cards of the model take)."""
        if not self.table.by_length or _fits(contract, lane, True):
            return False
        return any(_fits(p.contract, lane, True) for p in self._by_model[contract.model])

    def _eligible_lane(self, sl: ShapeLanes, contract: Contract, peers: list[ConsumerState]) -> Lane | None:
        if len(peers) == 1:
            return next(iter(sl.ready.values()), None)
        for lane in sl.ready.values():
            if self._may_take(lane, contract, peers):
                return lane
        return None

    def _switch_target(
        self, state: ConsumerState, active: dict[ShapeKey, ShapeLanes], peers: list[ConsumerState]
    ) -> tuple[ShapeLanes, Lane] | None:
        key = self._switch_key(state, peers)
        best = max(active.values(), key=key)
        lane = self._eligible_lane(best, state.contract, peers)
        if lane is not None:
            return best, lane
        for sl in sorted(active.values(), key=key, reverse=True):
            lane = self._eligible_lane(sl, state.contract, peers)
            if lane is not None:
                return sl, lane
        return None

    def _shared_target(
        self, state: ConsumerState, active: dict[ShapeKey, ShapeLanes], peers: list[ConsumerState], gate: Gate
    ) -> tuple[ShapeLanes, Lane] | None:
        """The switch rule under shares: the most owed job's shapes first (the consumer's own job
        first while it may keep it), within a job the one with the most waiting tokens; a lane the
        job's quota leaves no room in is passed over."""
        by_job: dict[str, list[ShapeLanes]] = {}
        for sl in active.values():
            by_job.setdefault(sl.job, []).append(sl)
        jobs = gate.order(by_job)
        switch_key = self._switch_key(state, peers)
        own = key_job(state.shape) if state.shape is not None else None
        if own in by_job and own in jobs and gate.keeps(own, _ahead(state, peers, active, gate)):
            jobs.remove(own)
            jobs.insert(0, own)
        for job in jobs:
            for sl in sorted(by_job[job], key=switch_key, reverse=True):
                lane = self._eligible_lane(sl, state.contract, peers)
                if lane is not None and gate.allows(sl, lane):
                    return sl, lane
        return None

    def _switch_key(
        self, state: ConsumerState, peers: list[ConsumerState]
    ) -> Callable[[ShapeLanes], tuple[bool, int]]:
        """Rule 3's order of shapes: most waiting tokens first, and with ``spread``, shapes no other
        consumer of the model is on before those one is (two cards on one shape both pay its
        prefix-cache miss and both switch again when it drains; on different shapes each pays once)."""
        taken = (
            {p.shape for p in peers if p is not state and p.shape is not None}
            if self.settings.spread and len(peers) > 1
            else set()
        )
        return lambda sl: (sl.key not in taken, _waiting_tokens(sl))

    def _emit(
        self,
        state: ConsumerState,
        sl: ShapeLanes,
        lane: Lane,
        now_ms: int,
        anchor: Item | None = None,
        room: int | None = None,
    ) -> Batch:
        """Cut a batch from ``lane`` for ``state``'s consumer, around ``anchor`` (an overdue item) when
        given; ``room`` caps its items (a job's quota)."""
        c = state.contract
        rule = c.rule if room is None or room >= c.rule.max_items else replace(c.rule, max_items=room)
        leave = anchor is None and self._leaves_longer(c, lane)
        before = lane.tokens
        items, padded_length = self.table.take_batch(sl, lane, rule, now_ms, anchor, leave)
        real = before - lane.tokens  # the batch's tokens, without another pass over its items
        if lane.tokens:  # it still holds items
            sl.ready.move_to_end(lane.id)
        if sl.waiting_items == 0:
            del self._active[c.model][sl.key]
            self.shares.lanes_changed(c.model, sl.job, -1)
        model, shape, job = sl.key[0], sl.key[1], sl.job
        oversized = len(items) == 1 and c.is_oversized(items[0].length, items[0].output_budget)
        self._seq += 1
        batch = Batch(
            batch_id=f"{self.batch_prefix}-{self._seq}",
            consumer=c.consumer,
            model=model,
            shape=shape,
            lane=lane.id,
            pad_multiple=c.pad_multiple,
            padded_length=padded_length,
            items=items,
            created_ms=now_ms,
            oversized=oversized,
        )
        check_batch(batch, c)
        if state.shape != sl.key:  # moving between jobs on one shape is no switch: same prefix cache
            if state.last_shape is not None and state.last_shape[:2] != sl.key[:2]:
                state.shape_switches += 1
            state.shape = sl.key
            state.switched_ms = now_ms
        state.last_shape = sl.key
        flight = InFlight(batch, job, real)
        state.in_flight[batch.batch_id] = flight
        self._in_flight[batch.batch_id] = (state, flight)
        self.oversized += oversized
        padded = padded_length * len(items)
        self.ledger.routed(model, c.consumer, len(items), real, padded, oversized)
        self.ledger.job_routed(job, len(items), real, padded)
        self.shares.routed(model, job, real, now_ms)
        return batch

    # -- results in ----------------------------------------------------------------------------

    def complete(self, batch_id: str, now_ms: int, failed: Collection[str] = ()) -> Batch | None:
        """The whole batch came back; ``failed`` names the item ids that failed.

        Returns the batch, or None if it is not in flight (already completed: a duplicate).
        """
        entry = self._in_flight.pop(batch_id, None)
        if entry is None:
            return None
        state, flight = entry
        del state.in_flight[batch_id]
        batch = flight.batch
        remaining = flight.pending.values() if flight.pending is not None else batch.items
        ok_items = ok_tokens = bad_items = bad_tokens = 0
        if not failed and flight.pending is None:  # the common case: the whole batch done at once
            ok_items, ok_tokens = len(batch.items), flight.tokens
        for item in remaining if failed or flight.pending is not None else ():
            if item.id in failed:
                bad_items += 1
                bad_tokens += item.length
            else:
                ok_items += 1
                ok_tokens += item.length
        self.ledger.finished(batch.model, batch.consumer, ok_items, ok_tokens, bad_items, bad_tokens)
        if flight.job is not None:
            self.ledger.job_finished(flight.job, ok_items, ok_tokens, bad_items, bad_tokens)
        else:
            self._jobs_finished([(it.id not in failed, it) for it in remaining])
        return batch

    def item_done(self, batch_id: str, item_id: str, ok: bool, now_ms: int) -> bool | None:
        """One item of a batch came back. Returns True when that finished the batch (its slot is free),
        False if items are still outstanding, None if the item was not outstanding (a duplicate)."""
        applied, finished = self.items_done(batch_id, [(item_id, ok, False)], now_ms)
        return finished if applied else None

    def items_done(
        self, batch_id: str, results: Sequence[tuple[str, bool, bool]], now_ms: int
    ) -> tuple[int, bool]:
        """Several items of one batch came back (one results message: ``(item_id, ok, cache_hit)``).

        Returns how many of them were outstanding (the rest are duplicates) and whether that
        finished the batch. Same effect as :meth:`item_done` on each in turn, with one ledger entry: the
        common case, a whole batch answered in one message, costs no per-item bookkeeping."""
        entry = self._in_flight.get(batch_id)
        if entry is None:
            return 0, False
        state, flight = entry
        batch = flight.batch
        items = batch.items
        answered: list[tuple[bool, Item]]
        if (
            flight.pending is None
            and len(results) == len(items)
            and all(r[0] == it.id for r, it in zip(results, items, strict=True))
        ):
            answered = [(r[1], it) for r, it in zip(results, items, strict=True)]
            pending: dict[str, Item] = {}
        else:
            if flight.pending is None:
                flight.pending = {it.id: it for it in items}
            pending = flight.pending
            answered = []
            for item_id, ok, _hit in results:
                found = pending.get(item_id)
                if found is not None:
                    del pending[item_id]
                    answered.append((ok, found))
        ok_items = ok_tokens = bad_items = bad_tokens = 0
        for ok, item in answered:
            if ok:
                ok_items += 1
                ok_tokens += item.length
            else:
                bad_items += 1
                bad_tokens += item.length
        if answered:
            self.ledger.finished(batch.model, batch.consumer, ok_items, ok_tokens, bad_items, bad_tokens)
            if flight.job is not None:
                self.ledger.job_finished(flight.job, ok_items, ok_tokens, bad_items, bad_tokens)
            else:
                self._jobs_finished(answered)
        if pending:
            return len(answered), False
        del self._in_flight[batch_id]
        del state.in_flight[batch_id]
        return len(answered), True

    def requeue(self, batch_id: str, now_ms: int) -> list[Item]:
        """Put a batch's outstanding items back in their lanes (their consumer will not finish them)."""
        state, flight = self._in_flight.pop(batch_id)
        del state.in_flight[batch_id]
        batch = flight.batch
        items = list(flight.pending.values()) if flight.pending is not None else batch.items
        self.ledger.requeued(batch.model, batch.consumer, len(items), sum(it.length for it in items))
        for job, (n, tokens) in _by_job(items).items():
            self.ledger.job_requeued(job, n, tokens)
            self.shares.requeued(job, tokens)
        for item in items:
            item.dispatched = False
        self._enqueue_many(items, [now_ms] * len(items), None)
        return items

    def _jobs_finished(self, answered: Sequence[tuple[bool, Item]]) -> None:
        """The per-job side of a ``finished`` entry for a batch restored from before lanes had jobs
        (it may mix them), item by item; a one-job batch makes one ``job_finished`` call instead."""
        for ok, it in answered:
            n = it.length
            self.ledger.job_finished(it.job, int(ok), n if ok else 0, int(not ok), 0 if ok else n)

    # -- the ledger ------------------------------------------------------------------------------

    def resume_ledger(self, snapshot: dict[str, int]) -> None:
        """Continue from a checkpointed ledger (:meth:`Ledger.snapshot`); only before any item arrives."""
        self.ledger = Ledger.restore(snapshot)
        self.ledger.adopt_unbooked_jobs()
        self.shares.resume(self.ledger)

    def dead_lettered(self) -> None:
        """An input that never became an item (undecodable or invalid): counted, never queued."""
        self.ledger.dead_lettered += 1

    def duplicate(self, model: str, tokens: int, job: str = "") -> None:
        """A producer's repeat of an item id within the dedupe window: dead-lettered, never queued;
        counted in its job's book too (as ``submit`` would name the job)."""
        self.ledger.duplicate(model, tokens, self.shares.track(job) if job else "")

    def cache_reported(self, consumer: str, hit: bool) -> None:
        """A finished batch's engine said whether its prefix was already in the KV cache."""
        self.ledger.cache(consumer, hit)

    # -- housekeeping and views ----------------------------------------------------------------

    def tick(self, now_ms: int) -> int:
        """Periodic housekeeping: retire quiet lanes. Returns how many went quiet."""
        return self.table.reclaim_idle(now_ms)

    def in_flight_batches(self) -> Iterable[Batch]:
        return (flight.batch for _, flight in self._in_flight.values())

    def is_in_flight(self, batch_id: str) -> bool:
        return batch_id in self._in_flight

    def in_flight_batch(self, batch_id: str) -> Batch | None:
        """The batch ``batch_id`` while it is in flight, else None (its dispatch time for observers)."""
        entry = self._in_flight.get(batch_id)
        return None if entry is None else entry[1].batch

    def oldest_waiting_ms(self, model: str, scan_limit: int) -> int | None:
        """Arrival time of ``model``'s oldest item not yet dispatched, looking at most ``scan_limit``
        items into its arrival queue (dispatched items leave it lazily, so the first is nearly always
        at the front); None when none of those waits.

        For observers on other threads: the owner thread may change the queue meanwhile, and then
        this raises ``RuntimeError`` ("deque mutated during iteration"); ask again.
        """
        arrivals = self._arrivals.get(model)
        if not arrivals:
            return None
        first = next((it for it in itertools.islice(arrivals, scan_limit) if not it.dispatched), None)
        return None if first is None else first.arrival_ms

    def unserved(self) -> dict[str, tuple[int, int]]:
        """(items, tokens) waiting per model that no consumer has a contract for: work nobody can take
        until one announces. Models with nothing waiting are left out. Read by the processor's log
        (once per model, processor/apps/observe.py) and metrics; from another thread the figures
        may be a step old."""
        return {
            model: (book.queued.items, book.queued.tokens)
            for model, book in list(self.ledger.models.items())
            if book.queued.items > 0 and not self._by_model.get(model)
        }

    @property
    def shape_switches(self) -> int:
        return sum(c.shape_switches for c in self.consumers.values())

    def check(self, deep: bool = True) -> None:
        """Compare the ledger with what the lanes and in-flight batches hold; raise on any difference.

        ``deep`` recounts every waiting and in-flight item (linear in what waits); otherwise the
        lanes' and in-flight running totals are compared, which is cheap enough for every checkpoint.
        """
        if deep:
            self.table.check()
        self.ledger.check()
        queued = self.ledger.total("queued")
        if (queued.items, queued.tokens) != (self.table.waiting_items, self.table.waiting_tokens):
            raise LedgerImbalance(
                f"ledger says {queued.items:,} items / {queued.tokens:,} tokens queued, lanes hold "
                f"{self.table.waiting_items:,} / {self.table.waiting_tokens:,}"
            )
        self.ledger.check_jobs()
        if not deep:
            return
        items = tokens = 0
        for _, flight in self._in_flight.values():
            outstanding = flight.pending.values() if flight.pending is not None else flight.batch.items
            for it in outstanding:
                items += 1
                tokens += it.length
        in_flight = self.ledger.total("in_flight")
        if (in_flight.items, in_flight.tokens) != (items, tokens):
            raise LedgerImbalance(
                f"ledger says {in_flight.items:,} items / {in_flight.tokens:,} tokens in flight, "
                f"batches hold {items:,} / {tokens:,}"
            )


def _waiting_tokens(sl: ShapeLanes) -> int:
    return sl.waiting_tokens


def _ahead(
    state: ConsumerState, peers: list[ConsumerState], active: dict[ShapeKey, ShapeLanes], gate: Gate
) -> int:
    """How many of the model's other consumers are on (still waiting) shapes of jobs more owed than
    ``state``'s own job: each lets ``state`` keep its job a ``slack_tokens`` longer (core/shares.py)."""
    if state.shape is None:
        return 0
    mine = gate.vtime(key_job(state.shape))
    return sum(
        1
        for p in peers
        if p is not state
        and p.shape is not None
        and p.shape in active
        and gate.vtime(key_job(p.shape)) < mine
    )


def _by_job(items: Iterable[Item]) -> dict[str, tuple[int, int]]:
    """Items and tokens per job."""
    out: dict[str, tuple[int, int]] = {}
    for it in items:
        n, tokens = out.get(it.job, (0, 0))
        out[it.job] = (n + 1, tokens + it.length)
    return out
