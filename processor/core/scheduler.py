"""The scheduler: one object an adapter drives, over the lanes, the dispatch rules, the batches in
flight and the ledger.

What goes where: waiting items sit in the lane table (core/lanes.py, cut into batches by core/cut.py);
which lane a consumer's next batch comes from is core/dispatch.py (its docstring states the rules);
what consumers hold until they answer is core/inflight.py, which failures go back is core/retries.py;
the counts are the ledger's (core/accounting.py), and the scheduler is its only writer. Read-only
figures for observers are :class:`~processor.core.view.SchedulerView` (``Scheduler.view``): the
scheduler's state is private. Two parts of it live beside it, as mixins: taking back restored work
and letting it go in a partition handover (core/adoption.py), and withdrawing the items of jobs
that end (core/endings.py).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from typing import Literal

from processor.core.accounting import Ledger
from processor.core.adoption import HandoverAdoption
from processor.core.contract import Contract, check_batch
from processor.core.dispatch import DEADLINES, Choice, DispatchRules, DispatchSettings
from processor.core.endings import EndingJobs, JobEndings
from processor.core.inflight import (
    Answers,
    ConsumerState,
    InFlight,
    InFlightTable,
    cached_by_id,
    count_answers,
    per_job,
)
from processor.core.item import Batch, Item, ItemOutcome, Outcome
from processor.core.lanes import LaneSettings, LaneTable, ShapeKey, ShapeLanes
from processor.core.retries import RetryPolicy
from processor.core.shares import JobPolicy, Shares
from processor.core.switch_order import SwitchOrder
from processor.core.view import SchedulerView

__all__ = ["DEADLINES", "DispatchSettings", "Scheduler"]  # the settings live in core/dispatch.py


class Scheduler(HandoverAdoption, EndingJobs):
    """The scheduling core: lanes, contracts, dispatch and the ledger, driven by ``now_ms``.

    Owned by one thread. Adapters call ``submit`` for each decoded item, ``dispatch`` when slots may
    be free, and ``complete``/``items_done`` when results come back. The scheduler is the ledger's only
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
        self._table = LaneTable(lanes)
        self._shares = shares or Shares()
        self.settings = dispatch or DispatchSettings()
        self._ledger = ledger or Ledger()
        self.batch_prefix = batch_prefix
        self._consumers: dict[str, ConsumerState] = {}
        self._by_model: dict[str, list[ConsumerState]] = {}
        self._active: dict[str, dict[ShapeKey, ShapeLanes]] = {}
        self._arrivals: dict[str, deque[Item]] = {}
        self._order = SwitchOrder()  # rule 3's order of the active shapes, kept as they change
        self._flights = InFlightTable()
        self._seq = 0
        self.oversized = 0
        self._endings = JobEndings()
        self.retries = RetryPolicy()
        self._retried: list[Item] = []
        self._rules = DispatchRules(
            self.settings,
            self._shares,
            self._table.by_length,
            self._active,
            self._by_model,
            self._arrivals,
            self._order,
        )
        self.view = SchedulerView(self)

    # -- consumers ------------------------------------------------------------------------------

    def set_contract(self, contract: Contract, slots: int | None = None) -> None:
        """Add a consumer or change its contract (batches it holds stay in flight). ``slots`` is how
        many of its ``max_inflight`` this scheduler may fill (several processor instances share a
        consumer: processor/state/credits.py); None means all of them."""
        state = self._consumers.get(contract.consumer)
        if state is None:
            state = self._consumers[contract.consumer] = ConsumerState(contract, slots)
        else:
            state.slots = slots
            self._by_model[state.contract.model].remove(state)
            self._order.unpark(state.contract.model)
            if state.contract.model != contract.model:
                state.shape = None
            state.contract = contract
        self._by_model.setdefault(contract.model, []).append(state)
        self._order.unpark(contract.model)  # which shapes a consumer may take depends on its peers

    def retire(self, consumer: str, now_ms: int) -> list[Batch]:
        """Remove a consumer; the batches it held go back to their lanes, counted as redelivered."""
        state = self._consumers.pop(consumer)
        self._by_model[state.contract.model].remove(state)
        self._order.unpark(state.contract.model)
        returned = [f.batch for f in state.in_flight.values()]
        for batch in returned:
            self.requeue(batch.batch_id, now_ms)
        return returned

    # -- items in ------------------------------------------------------------------------------

    def submit(self, item: Item, now_ms: int) -> None:
        """Take a new item into its lane and count it as received."""
        if item.length < 1:
            raise ValueError(f"item {item.id!r}: length must be >= 1, got {item.length}")
        self._enqueue_many((item,), (now_ms,), "received")

    def submit_many(self, items: Sequence[Item], times: Sequence[int]) -> None:
        """Take new items in, in order, each at its own ``times[i]`` (what :meth:`submit` on each in
        turn does, in one pass: the simulator submits every arrival between two dispatches this way).
        Nothing is taken if one of them is invalid."""
        for item in items:
            if item.length < 1:
                raise ValueError(f"item {item.id!r}: length must be >= 1, got {item.length}")
        self._enqueue_many(items, times, "received")

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
            track = self._shares.track
            for item in items:
                if item.job:
                    item.job = track(item.job)
        added: dict[tuple[str, str], list[int]] = {}  # (model, job) -> [items, tokens]
        placed = self._order.placed
        for sl, had_items, had_tokens in self._table.place_many(items, times):
            if not had_items or not sl.order_dirty:  # else noted already: SwitchOrder.placed returns
                placed(sl, had_items == 0)
            model, job = sl.key[0], sl.job
            tally = added.get((model, job))
            if tally is None:
                tally = added[model, job] = [0, 0]
            tally[0] += sl.waiting_items - had_items
            tally[1] += sl.waiting_tokens - had_tokens
            if had_items == 0:
                self._active.setdefault(model, {})[sl.key] = sl
                self._shares.lanes_changed(model, job, 1)
        ledger = self._ledger
        for (model, job), (n, tokens) in added.items() if count is not None else ():
            ledger.batch_received(model, job, n, tokens, count == "adopted")
        ended = self._endings.ended
        if ended:
            for job in {job for _model, job in added if job in ended}:
                self._withdraw_job(job, ended[job], times[-1])
        arrivals = self._arrivals
        if len(added) == 1:  # one model and job, the common case (one item, always)
            ((only, _),) = added
            queue = arrivals.get(only)
            if queue is not None:
                if len(items) == 1:
                    queue.append(items[0])
                else:
                    queue.extend(items)
                return
        models = {model for model, _ in added}
        if len(models) == 1 and (only := models.pop()) in arrivals:  # one model
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
        if self._endings.deadlines:
            self.expire(now_ms)
        out: list[Batch] = []
        states = list(self._consumers.values())  # emitting a batch adds or removes no consumer
        choose = self._rules.choose
        progress = True
        while progress:
            progress = False
            for state in states:
                if state.free_slots > 0:
                    choice = choose(state, now_ms)
                    if choice is not None:
                        out.append(self._emit(state, now_ms, choice))
                        progress = True
        return out

    def next_batch(self, consumer: str, now_ms: int) -> Batch | None:
        """One batch for ``consumer`` if it has a free slot and there is work it may take."""
        state = self._consumers[consumer]
        if state.free_slots <= 0:
            return None
        return self._next_batch(state, now_ms)

    def _next_batch(self, state: ConsumerState, now_ms: int) -> Batch | None:
        if self._endings.deadlines:
            self.expire(now_ms)
        choice = self._rules.choose(state, now_ms)
        return None if choice is None else self._emit(state, now_ms, choice)

    def _emit(self, state: ConsumerState, now_ms: int, choice: Choice) -> Batch:
        """Cut a batch for ``state``'s consumer where ``choice`` says: from its lane, around its anchor
        (an overdue item) when given, its room capping the items (a job's quota)."""
        sl, lane, anchor, room = choice
        c = state.contract
        rule = c.rule if room is None or room >= c.rule.max_items else replace(c.rule, max_items=room)
        leave = anchor is None and self._rules.leaves_longer(c, lane)
        before = lane.tokens
        items, padded_length = self._table.take_batch(sl, lane, rule, now_ms, anchor, leave)
        real = before - lane.tokens  # the batch's tokens, without another pass over its items
        if lane.tokens:  # it still holds items
            sl.ready.move_to_end(lane.id)
        self._order.taken_from(sl)
        if sl.waiting_items == 0:
            del self._active[c.model][sl.key]
            self._shares.lanes_changed(c.model, sl.job, -1)
        model, shape, job = sl.key[0], sl.key[1], sl.job
        n = len(items)
        oversized = n == 1 and not c.rule.fits_alone(items[0].length, items[0].output_budget)
        self._seq += 1
        batch = Batch(  # by position (no keyword dict to build, once per batch), in field order:
            f"{self.batch_prefix}-{self._seq}",  # batch_id
            c.consumer,
            model,
            shape,
            lane.id,
            c.pad_multiple,
            padded_length,
            items,
            now_ms,  # created_ms
            oversized,
        )
        check_batch(batch, c)
        if state.shape != sl.key:  # moving between jobs on one shape is no switch: same prefix cache
            if state.last_shape is not None and state.last_shape[:2] != sl.key[:2]:
                state.shape_switches += 1
            state.shape = sl.key
            state.switched_ms = now_ms
        state.last_shape = sl.key
        self._flights.hold(state, InFlight(batch, job, real))
        self.oversized += oversized
        self._ledger.batch_routed(model, c.consumer, job, n, real, padded_length * n, oversized)
        self._shares.routed(model, job, real, now_ms)
        return batch

    # -- results in ----------------------------------------------------------------------------

    def complete(
        self, batch_id: str, now_ms: int, failed: Collection[str] = (), retriable: Collection[str] = ()
    ) -> Batch | None:
        """The whole batch came back; ``failed`` names the item ids that failed (``retriable``: as
        for :meth:`items_done`). Returns the batch, or None if it is not in flight (a duplicate)."""
        entry = self._flights.pop(batch_id)
        if entry is None:
            return None
        flight = entry[1]
        answered = flight.finish(failed)
        if answered is None:  # the common case: the whole batch succeeded at once
            self._finished(flight, (len(flight.batch.items), flight.tokens, 0, 0), None)
        else:
            if retriable:
                answered = self._retry(flight, answered, retriable, now_ms)
            self._finished(flight, count_answers(answered), answered)
        return flight.batch

    def item_done(self, batch_id: str, item_id: str, ok: bool, now_ms: int) -> bool | None:
        """One item of a batch came back: :meth:`items_done` with one outcome. Returns True when that
        finished the batch (its slot is free), False if items are still outstanding, None if the item
        was not outstanding (a duplicate)."""
        applied, finished = self.items_done(batch_id, (ItemOutcome(item_id, ok),), now_ms)
        return finished if applied else None

    def items_done(
        self,
        batch_id: str,
        results: Sequence[Outcome],
        now_ms: int,
        cached_tokens: Sequence[int] | None = None,
        retriable: Collection[str] = (),
    ) -> tuple[int, bool]:
        """Several items of one batch came back (one results message), as :class:`ItemOutcome` or the
        plain ``(item_id, ok, cache_hit)`` tuples the wire heads build. ``cached_tokens``, when given,
        holds each result's prompt tokens served from the engine's prefix cache, in the same order
        (``CompletionsHead.cached_tokens``); the ledger books them for the ok items that were
        outstanding, and the rest of their prompts as computed.

        ``retriable``: failed items worth another try (``Completion.retriable``); each goes back to
        its lanes, counted ``retried``, while its job allows (:attr:`retries`, core/retries.py; the
        adapter learns which through :meth:`take_retried`), else its failure is final.

        Returns how many of them were outstanding (the rest are duplicates) and whether that
        finished the batch. Same effect as :meth:`item_done` on each in turn, with one ledger entry: the
        common case, a whole batch answered in one message, costs no per-item bookkeeping."""
        entry = self._flights.get(batch_id)
        if entry is None:
            return 0, False
        flight = entry[1]
        answered, finished = flight.answer(results)
        applied = len(answered)  # a retried item was answered too: its batch holds it no more
        if answered and retriable:
            answered = self._retry(flight, answered, retriable, now_ms)
        if answered:
            cached = None if cached_tokens is None else cached_by_id(results, cached_tokens)
            self._finished(flight, count_answers(answered), answered, cached)
        if finished:
            self._flights.pop(batch_id)
        return applied, finished

    def requeue(self, batch_id: str, now_ms: int) -> list[Item]:
        """Put a batch's outstanding items back in their lanes (their consumer will not finish them)."""
        entry = self._flights.pop(batch_id)
        if entry is None:
            raise KeyError(batch_id)
        batch = entry[1].batch
        items = list(entry[1].outstanding())
        self._ledger.requeued(batch.model, batch.consumer, len(items), sum(it.length for it in items))
        for job, (n, tokens) in per_job(items).items():
            self._ledger.job_requeued(job, n, tokens)
            self._shares.requeued(job, tokens)
        for item in items:
            item.dispatched = False
        self._enqueue_many(items, [now_ms] * len(items), None)
        return items

    def set_policy(self, job: str, policy: JobPolicy) -> None:
        """``job``'s share policy from now on (weight and quotas: core/shares.py)."""
        self._shares.set_policy(job, policy)

    def set_max_attempts(self, job: str, max_attempts: int | None) -> None:
        """``job``'s items get ``max_attempts`` dispatches in all (None: the default, 3)."""
        self.retries.set(job, max_attempts)

    def take_retried(self) -> list[Item]:
        """The items sent back for another attempt (their new ``attempt`` set) since the last call."""
        out, self._retried = self._retried, []
        return out

    def _retry(self, flight: InFlight, answered: Answers, retriable: Collection[str], now_ms: int) -> Answers:
        """Send back the items of ``answered`` that :meth:`RetryPolicy.split` retries; returns the rest."""
        again, rest = self.retries.split(answered, retriable)
        if again:
            b = flight.batch
            self._ledger.retried(b.model, b.consumer, len(again), sum(it.length for it in again))
            for job, (n, tokens) in per_job(again).items():
                self._ledger.job_retried(job, n, tokens)
            self._retried += again
            self._enqueue_many(again, [now_ms] * len(again), None)
        return rest

    def _finished(
        self,
        flight: InFlight,
        counts: tuple[int, int, int, int],
        answered: Answers | None,
        cached: dict[str, int] | None = None,
    ) -> None:
        """Book answered items: ``counts`` is (ok items, ok tokens, failed items, failed tokens);
        ``answered`` lists them (None: every item of the batch, all ok); ``cached`` the prompt
        tokens the engine served from its cache, by item id (None: not reported, all computed). A
        batch restored from before lanes had jobs may mix jobs: its job books are written item by item."""
        batch, job, both = flight.batch, flight.job, answered
        if both is None and (cached is not None or job is None):  # every item of the batch, all ok
            both = [(True, it) for it in batch.items]
        total = None if cached is None or both is None else sum(cached.get(it.id, 0) for ok, it in both if ok)
        ok_items, ok_tokens, bad_items, bad_tokens = counts  # passed by position: no tuple call (per batch)
        self._ledger.batch_finished(
            batch.model, batch.consumer, job, ok_items, ok_tokens, bad_items, bad_tokens, total
        )
        if job is None and both is not None:
            for ok, it in both:
                n = it.length
                mine = None if cached is None else cached.get(it.id, 0) if ok else 0
                self._ledger.job_finished(it.job, int(ok), n if ok else 0, int(not ok), 0 if ok else n, mine)

    # -- the ledger ------------------------------------------------------------------------------

    def dead_lettered(self) -> None:
        """An input that never became an item (undecodable or invalid): counted, never queued."""
        self._ledger.dead_lettered += 1

    def duplicate(self, model: str, tokens: int, job: str = "") -> None:
        """A producer's repeat of an item id within the dedupe window: dead-lettered, never queued;
        counted in its job's book too (as ``submit`` would name the job)."""
        self._ledger.duplicate(model, tokens, self._shares.track(job) if job else "")

    def cache_reported(self, consumer: str, hit: bool) -> None:
        """A finished batch's engine said whether its prefix was already in the KV cache."""
        self._ledger.cache(consumer, hit)

    # -- housekeeping and views ----------------------------------------------------------------

    def tick(self, now_ms: int) -> int:
        """Periodic housekeeping: retire quiet lanes. Returns how many went quiet."""
        return self._table.reclaim_idle(now_ms)

    def in_flight_batches(self) -> Iterable[Batch]:
        return self._flights.batches()

    def is_in_flight(self, batch_id: str) -> bool:
        return batch_id in self._flights

    def in_flight_batch(self, batch_id: str) -> Batch | None:
        """The batch ``batch_id`` while it is in flight, else None (its dispatch time for observers)."""
        entry = self._flights.get(batch_id)
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
            for model, book in list(self._ledger.models.items())
            if book.queued.items > 0 and not self._by_model.get(model)
        }

    @property
    def shape_switches(self) -> int:
        """Shape switches of every consumer known now (a retired consumer's go with it); safe to read
        from another thread (the dict is copied in one C call)."""
        return sum(c.shape_switches for c in list(self._consumers.values()))

    def check(self, deep: bool = True) -> None:
        """Compare the ledger with what the lanes and in-flight batches hold; raise on any difference.

        ``deep`` recounts every waiting and in-flight item (linear in what waits) and checks rule 3's
        kept order against the shapes' waiting tokens (core/switch_order.py); otherwise the
        lanes' and in-flight running totals are compared, which is cheap enough for every checkpoint.
        """
        if deep:
            self._table.check()
            self._order.check()
        waiting = (self._table.waiting_items, self._table.waiting_tokens)
        self._ledger.check_holdings(waiting, self._flights.outstanding() if deep else None)
