"""The scheduler: one object an adapter drives, over the lanes, the dispatch rules, the batches in
flight and the ledger.

What goes where: waiting items sit in the lane table (core/lanes.py, cut into batches by core/cut.py);
which lane a consumer's next batch comes from is core/dispatch.py (its docstring states the rules);
what consumers hold until they answer is core/inflight.py, which failures go back is core/retries.py;
the counts are the ledger's (core/accounting.py), and the scheduler and its parts are its only
writers. The state is private, one :class:`~processor.core.context.SchedulerContext` the scheduler
owns and hands to each of its parts (no part reads another's attributes): taking back restored work
and letting it go in a partition handover is :class:`~processor.core.adoption.Adoption`'s,
withdrawing the items of jobs that end :class:`~processor.core.withdrawals.Withdrawals`', and the
read-only figures for observers :class:`~processor.core.view.SchedulerView`'s (``Scheduler.view``).
The scheduler's methods for those delegate to them, one line each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from typing import Literal

from processor.core.accounting import Ledger
from processor.core.adoption import Adoption
from processor.core.context import SchedulerContext
from processor.core.contract import Contract, check_batch
from processor.core.dispatch import DEADLINES, Choice, DispatchRules, DispatchSettings
from processor.core.endings import Ending
from processor.core.inflight import (
    Answers,
    ConsumerState,
    InFlight,
    book_finished,
    cached_by_id,
    count_answers,
    per_job,
)
from processor.core.item import Batch, Item, ItemOutcome, Outcome
from processor.core.lanes import LaneSettings, LaneTable
from processor.core.retries import RetryPolicy
from processor.core.shares import JobPolicy, Shares
from processor.core.view import SchedulerView
from processor.core.withdrawals import Withdrawals

__all__ = ["DEADLINES", "DispatchSettings", "Scheduler"]  # the settings live in core/dispatch.py


class Scheduler:
    """The scheduling core: lanes, contracts, dispatch and the ledger, driven by ``now_ms``.

    Owned by one thread. Adapters call ``submit`` for each decoded item, ``dispatch`` when slots may
    be free, and ``complete``/``items_done`` when results come back. The scheduler (with its parts)
    is the ledger's only writer: what an adapter learns that the ledger counts (a dead-lettered
    input, a cache report, a checkpoint to resume from) it reports through the methods under "the
    ledger" below.
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
        self._context = ctx = SchedulerContext(LaneTable(lanes), ledger or Ledger(), shares or Shares())
        self.settings = dispatch or DispatchSettings()
        self.batch_prefix = batch_prefix
        self._seq = 0
        self._announced = 0  # consumers ever announced: each one's rank (ConsumerState.rank)
        self.retries = RetryPolicy()
        self._retried: list[Item] = []
        self._rules = DispatchRules(
            self.settings, ctx.shares, ctx.table.by_length, ctx.active, ctx.by_model, ctx.arrivals, ctx.order
        )
        self._adoption = Adoption(ctx, self.requeue)
        self._withdrawals = Withdrawals(ctx)
        self.view = SchedulerView(ctx)

    # -- consumers ------------------------------------------------------------------------------

    def set_contract(self, contract: Contract, slots: int | None = None) -> None:
        """Add a consumer or change its contract (batches it holds stay in flight). ``slots`` is how
        many of its ``max_inflight`` this scheduler may fill (several processor instances share a
        consumer: processor/state/credits.py); None means all of them."""
        ctx = self._context
        state = ctx.consumers.get(contract.consumer)
        if state is None:
            self._announced += 1
            state = ctx.consumers[contract.consumer] = ConsumerState(contract, slots, self._announced)
        else:
            state.slots = slots
            ctx.by_model[state.contract.model].remove(state)
            ctx.order.unpark(state.contract.model)
            if state.contract.model != contract.model:
                state.shape = None
            state.contract = contract
        ctx.by_model.setdefault(contract.model, []).append(state)
        ctx.order.unpark(contract.model)  # which shapes a consumer may take depends on its peers
        ctx.flights.recount_one(state)

    def retire(self, consumer: str, now_ms: int) -> list[Batch]:
        """Remove a consumer; the batches it held go back to their lanes, counted as redelivered."""
        ctx = self._context
        state = ctx.consumers.pop(consumer)
        ctx.flights.forget(state)  # its batches go back below: its slots are free no more
        ctx.by_model[state.contract.model].remove(state)
        ctx.order.unpark(state.contract.model)
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
        ctx = self._context
        if count is not None:
            track = ctx.shares.track
            for item in items:
                if item.job:
                    item.job = track(item.job)
        added: dict[tuple[str, str], list[int]] = {}  # (model, job) -> [items, tokens]
        placed = ctx.order.placed
        for sl, had_items, had_tokens in ctx.table.place_many(items, times):
            if not had_items or not sl.order_dirty:  # else noted already: SwitchOrder.placed returns
                placed(sl, had_items == 0)
            model, job = sl.key[0], sl.job
            tally = added.get((model, job))
            if tally is None:
                tally = added[model, job] = [0, 0]
            tally[0] += sl.waiting_items - had_items
            tally[1] += sl.waiting_tokens - had_tokens
            if had_items == 0:
                ctx.active.setdefault(model, {})[sl.key] = sl
                ctx.shares.lanes_changed(model, job, 1)
        ledger = ctx.ledger
        for (model, job), (n, tokens) in added.items() if count is not None else ():
            ledger.batch_received(model, job, n, tokens, count == "adopted")
        ended = ctx.endings.ended
        if ended:
            for job in {job for _model, job in added if job in ended}:
                self._withdrawals.withdraw_job(job, ended[job], times[-1])
        arrivals = ctx.arrivals
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
        ctx = self._context
        if ctx.endings.deadlines:
            self._withdrawals.expire(now_ms)
        out: list[Batch] = []
        states = ctx.flights.free_in_turn()  # emitting a batch adds or removes no consumer
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
        state = self._context.consumers[consumer]
        if state.free_slots <= 0:
            return None
        return self._next_batch(state, now_ms)

    def _next_batch(self, state: ConsumerState, now_ms: int) -> Batch | None:
        if self._context.endings.deadlines:
            self._withdrawals.expire(now_ms)
        choice = self._rules.choose(state, now_ms)
        return None if choice is None else self._emit(state, now_ms, choice)

    def _emit(self, state: ConsumerState, now_ms: int, choice: Choice) -> Batch:
        """Cut a batch for ``state``'s consumer where ``choice`` says: from its lane, around its anchor
        (an overdue item) when given, its room capping the items (a job's quota)."""
        sl, lane, anchor, room = choice
        ctx = self._context
        c = state.contract
        rule = c.rule if room is None or room >= c.rule.max_items else replace(c.rule, max_items=room)
        leave = anchor is None and self._rules.leaves_longer(c, lane)
        before = lane.tokens
        items, padded_length = ctx.table.take_batch(sl, lane, rule, now_ms, anchor, leave)
        real = before - lane.tokens  # the batch's tokens, without another pass over its items
        if lane.tokens:  # it still holds items
            sl.ready.move_to_end(lane.id)
        ctx.order.taken_from(sl)
        if sl.waiting_items == 0:
            del ctx.active[c.model][sl.key]
            ctx.shares.lanes_changed(c.model, sl.job, -1)
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
        ctx.flights.hold(state, InFlight(batch, job, real))
        ctx.oversized += oversized
        ctx.ledger.batch_routed(model, c.consumer, job, n, real, padded_length * n, oversized)
        ctx.shares.routed(model, job, real, now_ms)
        return batch

    # -- results in ----------------------------------------------------------------------------

    def complete(
        self, batch_id: str, now_ms: int, failed: Collection[str] = (), retriable: Collection[str] = ()
    ) -> Batch | None:
        """The whole batch came back; ``failed`` names the item ids that failed (``retriable``: as
        for :meth:`items_done`). Returns the batch, or None if it is not in flight (a duplicate)."""
        entry = self._context.flights.pop(batch_id)
        if entry is None:
            return None
        flight = entry[1]
        answered = flight.finish(failed)
        if answered is None:  # the common case: the whole batch succeeded at once
            book_finished(self._context.ledger, flight, (len(flight.batch.items), flight.tokens, 0, 0), None)
        else:
            if retriable:
                answered = self._retry(flight, answered, retriable, now_ms)
            book_finished(self._context.ledger, flight, count_answers(answered), answered)
        return flight.batch

    def item_done(self, batch_id: str, item_id: str, ok: bool, now_ms: int) -> bool | None:
        """One item of a batch came back (:meth:`items_done` with one outcome): True when that finished
        the batch (its slot is free), False while items are outstanding, None for a duplicate."""
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
        flights = self._context.flights
        entry = flights.get(batch_id)
        if entry is None:
            return 0, False
        flight = entry[1]
        answered, finished = flight.answer(results)
        applied = len(answered)  # a retried item was answered too: its batch holds it no more
        if answered and retriable:
            answered = self._retry(flight, answered, retriable, now_ms)
        if answered:
            cached = None if cached_tokens is None else cached_by_id(results, cached_tokens)
            book_finished(self._context.ledger, flight, count_answers(answered), answered, cached)
        if finished:
            flights.pop(batch_id)
        return applied, finished

    def requeue(self, batch_id: str, now_ms: int) -> list[Item]:
        """Put a batch's outstanding items back in their lanes (their consumer will not finish them)."""
        ctx = self._context
        entry = ctx.flights.pop(batch_id)
        if entry is None:
            raise KeyError(batch_id)
        batch = entry[1].batch
        items = list(entry[1].outstanding())
        ctx.ledger.requeued(batch.model, batch.consumer, len(items), sum(it.length for it in items))
        for job, (n, tokens) in per_job(items).items():
            ctx.ledger.job_requeued(job, n, tokens)
            ctx.shares.requeued(job, tokens)
        for item in items:
            item.dispatched = False
        self._enqueue_many(items, [now_ms] * len(items), None)
        return items

    def set_policy(self, job: str, policy: JobPolicy) -> None:
        """``job``'s share policy from now on (weight and quotas: core/shares.py)."""
        self._context.shares.set_policy(job, policy)

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
            b, ledger = flight.batch, self._context.ledger
            ledger.retried(b.model, b.consumer, len(again), sum(it.length for it in again))
            for job, (n, tokens) in per_job(again).items():
                ledger.job_retried(job, n, tokens)
            self._retried += again
            self._enqueue_many(again, [now_ms] * len(again), None)
        return rest

    # -- the ledger ------------------------------------------------------------------------------

    def dead_lettered(self) -> None:
        """An input that never became an item (undecodable or invalid): counted, never queued."""
        self._context.ledger.dead_lettered += 1

    def duplicate(self, model: str, tokens: int, job: str = "") -> None:
        """A producer's repeat of an item id within the dedupe window: dead-lettered, never queued;
        counted in its job's book too (as ``submit`` would name the job)."""
        ctx = self._context
        ctx.ledger.duplicate(model, tokens, ctx.shares.track(job) if job else "")

    def cache_reported(self, consumer: str, hit: bool) -> None:
        """A finished batch's engine said whether its prefix was already in the KV cache."""
        self._context.ledger.cache(consumer, hit)

    # -- jobs that end (core/withdrawals.py) -----------------------------------------------------

    def end_job(self, job: str, ending: Ending, now_ms: int) -> int:
        """End ``job``; returns how many of its waiting items left now (:meth:`Withdrawals.end_job`)."""
        return self._withdrawals.end_job(job, ending, now_ms)

    def set_deadline(self, job: str, deadline_ms: int | None, now_ms: int) -> None:
        """``job`` ends ``expired`` at ``deadline_ms`` (None: none): :meth:`Withdrawals.set_deadline`."""
        self._withdrawals.set_deadline(job, deadline_ms, now_ms)

    def expire(self, now_ms: int) -> int:
        """End every job whose deadline has come; how many items left (:meth:`Withdrawals.expire`)."""
        return self._withdrawals.expire(now_ms)

    def take_ended(self) -> list[tuple[Item, Ending]]:
        """The items withdrawn since the last call, with how their job ended (``Withdrawals``)."""
        return self._withdrawals.take_ended()

    # -- a partition handover (core/adoption.py) -------------------------------------------------

    def adopt_waiting(self, item: Item, now_ms: int) -> None:
        """Take in an item restored from the changelog (counted as adopted, not received)."""
        self._enqueue_many((item,), (now_ms,), "adopted")

    def adopt_waiting_many(self, items: Sequence[Item], times: Sequence[int]) -> None:
        """:meth:`adopt_waiting` for each item in turn, in one pass (a restore takes millions)."""
        self._enqueue_many(items, times, "adopted")

    def adopt_in_flight(self, batch: Batch, now_ms: int, done: Collection[str] = ()) -> bool:
        """Re-register a restored batch; False if its consumer is gone (:meth:`Adoption.adopt_in_flight`)."""
        return self._adoption.adopt_in_flight(batch, now_ms, done)

    def release_slots(self) -> None:
        """Every known consumer holds no slots here until :meth:`set_contract` gives it a share again."""
        self._adoption.release_slots()

    def release_all(self) -> None:
        """Forget every waiting item and in-flight batch; contracts stay (:meth:`Adoption.release_all`)."""
        self._adoption.release_all()

    def release(self, which: Callable[[Item], bool], batches: Iterable[str], now_ms: int) -> tuple[int, int]:
        """Forget some waiting items and in-flight batches (:meth:`Adoption.release`)."""
        return self._adoption.release(which, batches, now_ms)

    def done_items(self, batch_id: str) -> list[str]:
        """Ids of the items of an in-flight batch that have been answered already."""
        return self._adoption.done_items(batch_id)

    def resume_ledger(self, snapshot: dict[str, int]) -> None:
        """Continue from a checkpointed ledger (:meth:`Ledger.snapshot`); only before any item arrives."""
        self._adoption.resume_ledger(snapshot)

    # -- housekeeping and views ----------------------------------------------------------------

    def tick(self, now_ms: int) -> int:
        """Periodic housekeeping: retire quiet lanes. Returns how many went quiet."""
        return self._context.table.reclaim_idle(now_ms)

    def in_flight_batches(self) -> Iterable[Batch]:
        return self._context.flights.batches()

    def is_in_flight(self, batch_id: str) -> bool:
        return batch_id in self._context.flights

    def handed_over(self, batch_id: str) -> bool:
        """In flight here when a release let it go, and not adopted back since."""
        return self._context.flights.handed_over(batch_id)

    def made_here(self, batch_id: str) -> bool:
        """Emitted by this scheduler (this incarnation: its ``batch_prefix``)."""
        return batch_id.rsplit("-", 1)[0] == self.batch_prefix

    def in_flight_batch(self, batch_id: str) -> Batch | None:
        """The batch ``batch_id`` while it is in flight, else None (its dispatch time for observers)."""
        entry = self._context.flights.get(batch_id)
        return None if entry is None else entry[1].batch

    def oldest_waiting_ms(self, model: str, scan_limit: int) -> int | None:
        """Arrival time of ``model``'s oldest item not yet dispatched (:class:`SchedulerView`'s)."""
        return self.view.oldest_waiting_ms(model, scan_limit)

    def unserved(self) -> dict[str, tuple[int, int]]:
        """(items, tokens) waiting per model nobody has a contract for: :meth:`SchedulerView.unserved`."""
        return self.view.unserved()

    @property
    def oversized(self) -> int:
        """Single-item batches sent past their consumer's batching rule (settable: the context's)."""
        return self._context.oversized

    @oversized.setter
    def oversized(self, n: int) -> None:
        self._context.oversized = n

    @property
    def shape_switches(self) -> int:
        """Shape switches of every consumer known now (a retired one's go with it); any thread reads it."""
        return self.view.shape_switches()

    def check(self, deep: bool = True) -> None:
        """Compare the ledger with what the lanes and in-flight batches hold; raise on any difference.

        ``deep`` recounts every waiting and in-flight item (linear in what waits) and checks rule 3's
        kept order against the shapes' waiting tokens (core/switch_order.py); otherwise the lanes'
        and in-flight running totals are compared, which is cheap enough for every checkpoint."""
        ctx = self._context
        if deep:
            ctx.table.check()
            ctx.order.check()
            ctx.flights.check_free(ctx.consumers.values())
        waiting = (ctx.table.waiting_items, ctx.table.waiting_tokens)
        ctx.ledger.check_holdings(waiting, ctx.flights.outstanding() if deep else None)
