"""Token shares between jobs: weights, quotas and per-job ledgers (processor/core/shares.py).

The properties are checked by driving a real scheduler in virtual time: each consumer runs one batch
at a time and takes ``batch tokens / speed`` ms per batch, so a card's rate is in tokens like the
simulator's cards.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.accounting import Ledger
from processor.core.item import Batch, Item
from processor.core.scheduler import DispatchSettings, Scheduler
from processor.core.shares import JobPolicy, Shares, ShareSettings
from tests.core.helpers import MODEL, make_contract

SLACK = 16_384


def make_sched(cards: int, shares: Shares, budget: int = 8192, max_wait_ms: int = 60_000) -> Scheduler:
    sched = Scheduler(None, DispatchSettings(max_wait_ms=max_wait_ms), shares=shares)
    for i in range(cards):
        sched.set_contract(make_contract(f"c{i}", budget=budget, items=64, inflight=1))
    return sched


def job_items(job: str, n: int, rng: random.Random, shapes: int = 3, t: int = 0) -> list[Item]:
    return [
        Item(f"{job}-{i}", MODEL, rng.randrange(shapes), rng.randint(16, 1024), t, job=job) for i in range(n)
    ]


class Run:
    """A scheduler driven in virtual time; ``log`` holds (dispatch ms, batch) in order."""

    def __init__(self, sched: Scheduler, speed_tokens_per_ms: float = 10.0) -> None:
        self.sched = sched
        self.speed = speed_tokens_per_ms
        self.now = 0
        self.log: list[tuple[int, Batch]] = []
        self.running: list[tuple[float, str]] = []

    def step(self, until_ms: int | None = None) -> bool:
        """Dispatch, then advance to the next completion; False when nothing is left to run."""
        for batch in self.sched.dispatch(self.now):
            self.log.append((self.now, batch))
            self.running.append((self.now + max(1.0, batch.padded_tokens / self.speed), batch.batch_id))
        if not self.running:
            return False
        self.running.sort()
        done_at, batch_id = self.running.pop(0)
        self.now = max(self.now, int(done_at) + 1)
        if until_ms is not None:
            self.now = min(self.now, until_ms)
        self.sched.complete(batch_id, self.now)
        return True

    def run(self, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if not self.step():
                return


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    weights=st.lists(st.sampled_from([1.0, 2.0, 3.0, 4.0]), min_size=2, max_size=4),
    cards=st.integers(1, 3),
)
def test_waiting_jobs_virtual_times_stay_within_slack_times_cards_plus_a_batch(
    seed: int, weights: list[float], cards: int
) -> None:
    """While every job waits, no job's virtual time (its tokens / weight) runs ahead of the most
    owed one's by more than slack x cards plus one batch of its own: the stated tolerance."""
    rng = random.Random(seed)
    shares = Shares(ShareSettings(slack_tokens=SLACK))
    sched = make_sched(cards, shares)
    jobs = [f"j{k}" for k in range(len(weights))]
    for job, w in zip(jobs, weights, strict=True):
        shares.set_policy(job, JobPolicy(weight=w))
    items = [it for job in jobs for it in job_items(job, 400, rng)]
    rng.shuffle(items)
    for it in items:
        sched.submit(it, 0)
    run = Run(sched)
    budget = 8192
    worst = 0.0
    while run.step():
        waiting = {j for j in jobs if sched.view.job_book(j).queued.items > 0}
        if len(waiting) < len(jobs):
            break
        times = {j: shares.vtime[MODEL].get(j, 0.0) for j in jobs}
        floor = min(times.values())
        for j in jobs:
            bound = SLACK * cards + budget / shares.policy(j).weight
            lag = times[j] - floor
            worst = max(worst, lag / bound)
            assert lag <= bound, f"{j} (weight {shares.policy(j).weight}) {lag:,.0f} ahead > {bound:,.0f}"
    sched.check()
    assert worst > 0  # the jobs did compete


def test_shares_over_a_window_follow_the_weights_within_the_stated_tolerance() -> None:
    """Two cards, jobs weighted 1, 2 and 5, all waiting: over the window until the first job runs
    dry each job's share of routed tokens is within slack x cards x sum(weights) / window tokens."""
    rng = random.Random(7)
    slack = 4096
    shares = Shares(ShareSettings(slack_tokens=slack))
    sched = make_sched(2, shares)
    weights = {"a": 1.0, "b": 2.0, "c": 5.0}
    for job, w in weights.items():
        shares.set_policy(job, JobPolicy(weight=w))
        for it in job_items(job, 3000, rng):
            sched.submit(it, 0)
    run = Run(sched)
    while run.step():
        if any(sched.view.job_book(j).queued.items == 0 for j in weights):
            break
    routed = {j: sched.view.job_book(j).routed.tokens for j in weights}
    total = sum(routed.values())
    tolerance = (slack * 2 * sum(weights.values()) + 8192 * len(weights)) / total
    assert tolerance < 0.05  # the window is long enough for the check to mean something
    for j, w in weights.items():
        want = w / sum(weights.values())
        assert abs(routed[j] / total - want) <= tolerance, (j, routed[j] / total, want, tolerance)


def test_equal_weights_on_as_many_cards_settle_one_card_per_job() -> None:
    """The sticky rule: two equal jobs on two cards cost a handful of switches, not one per batch."""
    rng = random.Random(3)
    shares = Shares(ShareSettings(slack_tokens=SLACK))
    sched = make_sched(2, shares)
    for job in ("a", "b"):
        for it in job_items(job, 2000, rng, shapes=1):
            sched.submit(it, 0)
    run = Run(sched)
    run.run()
    moves = 0
    for consumer in ("c0", "c1"):
        jobs = [b.items[0].job for _, b in run.log if b.consumer == consumer]
        moves += sum(1 for x, y in itertools.pairwise(jobs) if x != y)
    assert len(run.log) > 200
    assert moves <= 6, moves


def test_a_job_behind_a_backlog_starts_within_a_few_batches_per_card() -> None:
    rng = random.Random(5)
    shares = Shares(ShareSettings(slack_tokens=SLACK))
    sched = make_sched(2, shares, budget=8192)
    for it in job_items("backlog", 20_000, rng, shapes=5):
        sched.submit(it, 0)
    run = Run(sched)
    while run.now < 30_000:
        run.step()
    arrival = run.now
    for it in job_items("late", 300, rng, shapes=2, t=arrival):
        sched.submit(it, arrival)
    before = len(run.log)
    while not any(b.items[0].job == "late" for _, b in run.log[before:]):
        assert run.step()
    batches_between = [b for _, b in run.log[before:] if b.items[0].job != "late"]
    per_card = len(batches_between) / 2
    # slack / (a full batch's real tokens) batches at most, plus the one in flight on each card
    assert per_card <= SLACK / 4096 / 2 + 2, per_card
    sched.check()


def test_without_shares_the_late_job_waits_for_the_backlog() -> None:
    """The behaviour shares fix: when jobs are unknown (every item of job ""), the deadline serves
    the model's oldest items, which are the backlog's."""
    rng = random.Random(5)
    sched = make_sched(2, Shares(), budget=8192)
    for it in job_items("", 3_000, rng, shapes=5):
        sched.submit(it, 0)
    run = Run(sched)
    while run.now < 5_000:
        run.step()
    late = [Item(f"late-{i}", MODEL, 99, 100, run.now) for i in range(50)]
    for it in late:
        sched.submit(it, run.now)
    before = len(run.log)
    run.run()
    first_late = next(i for i, (_, b) in enumerate(run.log) if b.items[0].id.startswith("late"))
    assert first_late - before > 50  # dozens of backlog batches first


def test_a_single_named_job_dispatches_exactly_as_no_job() -> None:
    """Naming one job changes nothing: the same batches, in the same order."""

    def batches(job: str) -> list[tuple[str, list[str]]]:
        rng = random.Random(11)
        sched = make_sched(2, Shares())
        for it in job_items(job, 1500, rng, shapes=4):
            it.id = it.id.split("-", 1)[1]
            sched.submit(it, 0)
        run = Run(sched)
        run.run()
        return [(b.consumer, [it.id for it in b.items]) for _, b in run.log]

    assert batches("") == batches("only")


# ------------------------------------------------------------------------------------------ quotas


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rate=st.sampled_from([200.0, 1000.0, 5000.0]),
    burst_ms=st.sampled_from([100, 1000, 5000]),
    total=st.one_of(st.none(), st.integers(1_000, 200_000)),
)
def test_quotas_are_never_exceeded_and_nothing_is_dropped(
    seed: int, rate: float, burst_ms: int, total: int | None
) -> None:
    rng = random.Random(seed)
    shares = Shares(ShareSettings(slack_tokens=SLACK))
    shares.set_policy("capped", JobPolicy(max_tokens_per_s=rate, max_tokens=total, burst_ms=burst_ms))
    sched = make_sched(2, shares)
    items = job_items("capped", 300, rng) + job_items("free", 300, rng)
    for it in items:
        sched.submit(it, 0)
    longest = max(it.length for it in items if it.job == "capped")
    run = Run(sched)
    for _ in range(20_000):  # time passes even when only the capped job waits: tick in 50 ms steps
        if not run.step():
            if sched.view.job_book("capped").queued.items == 0 or run.now > 200_000:
                break
            run.now += 50
    capped = [(t, b.real_tokens) for t, b in run.log if b.items[0].job == "capped"]
    routed = sum(n for _, n in capped)
    if total is not None:
        assert routed <= total
    bucket = max(rate * burst_ms / 1000, longest)
    for i, (t0, _) in enumerate(capped):
        window = 0
        for t1, n in capped[i:]:
            window += n
            assert window <= bucket + rate * (t1 - t0) / 1000 + 1e-6, (t0, t1, window)
    book = sched.view.job_book("capped")
    assert book.routed.tokens == routed
    assert book.queued.items + book.routed.items == 300  # what did not go waits
    assert sched.view.job_book("free").completed.items == 300  # the other job was not held back
    sched.check()


def test_a_job_capped_in_total_waits_until_its_quota_is_raised() -> None:
    rng = random.Random(2)
    shares = Shares()
    shares.set_policy("j", JobPolicy(max_tokens=5_000))
    sched = make_sched(1, shares)
    items = job_items("j", 100, rng)
    for it in items:
        sched.submit(it, 0)
    run = Run(sched)
    run.run()
    book = sched.view.job_book("j")
    assert 0 < book.routed.tokens <= 5_000
    assert book.queued.items > 0
    assert shares.capped_now("j", run.now)
    shares.set_policy("j", JobPolicy())
    run.run()
    assert sched.view.job_book("j").completed.items == 100
    sched.check()


def test_policy_values_are_checked() -> None:
    with pytest.raises(ValueError, match="weight must be > 0"):
        JobPolicy(weight=0)
    with pytest.raises(ValueError, match="max_tokens_per_s"):
        JobPolicy(max_tokens_per_s=-1)
    with pytest.raises(ValueError, match="slack_tokens"):
        ShareSettings(slack_tokens=-1)


# ------------------------------------------------------------------------------------ per-job ledger


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_per_job_ledgers_balance_through_failures_partial_answers_and_requeues(seed: int) -> None:
    rng = random.Random(seed)
    shares = Shares()
    shares.set_policy("b", JobPolicy(weight=3))
    sched = make_sched(2, shares)
    jobs = ("a", "b", "")
    sent = {j: 0 for j in jobs}
    now = 0
    for _ in range(60):
        now += rng.randint(0, 200)
        for it in job_items(rng.choice(jobs), rng.randint(0, 20), rng, t=now):
            it.id = f"{it.id}@{now}-{rng.random()}"
            sent[it.job] += it.length
            sched.submit(it, now)
        for batch in sched.dispatch(now):
            roll = rng.random()
            if roll < 0.4:
                failed = {it.id for it in batch.items if rng.random() < 0.2}
                sched.complete(batch.batch_id, now, failed)
            elif roll < 0.7:
                half = batch.items[: len(batch.items) // 2]
                sched.items_done(batch.batch_id, [(it.id, True, False) for it in half], now)
            elif roll < 0.8:
                sched.requeue(batch.batch_id, now)
        if rng.random() < 0.05:
            sched.retire("c1", now)
            sched.set_contract(make_contract("c1", budget=8192, items=64, inflight=1))
        sched.check()
    for j in jobs:
        assert sched.view.job_book(j).received.tokens == sent[j]
    for batch in list(sched.in_flight_batches()):
        assert len({it.job for it in batch.items}) == 1  # a batch is one job's


def test_job_books_survive_a_snapshot_even_with_odd_job_names() -> None:
    ledger = Ledger()
    for job in ("a@b", "x#y:z", ""):
        ledger.job_received(job, 2, 30)
        ledger.job_routed(job, 1, 10, 16)
        ledger.job_finished(job, 1, 10, 0, 0)
    ledger.received("m", 30)
    back = Ledger.restore(ledger.snapshot())
    assert back.jobs == ledger.jobs
    assert back.models.keys() == ledger.models.keys()


def test_a_ledger_from_before_jobs_restores_into_job_none_and_keeps_balancing() -> None:
    """Upgrading: a checkpoint without job books puts its counts on job "", so new items of named
    jobs do not put the per-job equations out of balance."""
    old = Scheduler()
    old.set_contract(make_contract("c0", budget=8192, items=64, inflight=1))
    for it in job_items("", 30, random.Random(1)):
        old.submit(it, 0)
    old.dispatch(0)
    snapshot = {k: v for k, v in old.view.ledger_snapshot().items() if not k.startswith("job:")}
    sched = Scheduler()
    sched.resume_ledger(snapshot)
    assert sched.view.job_book("").received.items == 30
    sched._context.ledger.check_jobs()


def test_a_total_quota_counts_what_was_routed_before_a_restart() -> None:
    shares = Shares()
    shares.set_policy("j", JobPolicy(max_tokens=100_000))
    sched = make_sched(1, shares)
    for it in job_items("j", 50, random.Random(4)):
        sched.submit(it, 0)
    sched.dispatch(0)
    routed = sched.view.job_book("j").routed.tokens
    again = Shares()
    again.set_policy("j", JobPolicy(max_tokens=100_000))
    restarted = Scheduler(shares=again)
    restarted.resume_ledger(sched.view.ledger_snapshot())
    assert again.routed_tokens["j"] == routed > 0


def test_jobs_past_max_jobs_count_as_no_job_so_lanes_and_books_stay_bounded() -> None:
    """A producer that puts a session id in job_id: 3 named jobs of their own (the one with a policy
    among them), the rest on job ""."""
    shares = Shares(ShareSettings(max_jobs=3))
    shares.set_policy("vip", JobPolicy(weight=2))  # a job with a policy always has its own
    sched = make_sched(1, shares)
    for i in range(20):
        sched.submit(Item(f"i{i}", MODEL, 1, 100, 0, job=f"session-{i}"), 0)
    sched.submit(Item("v", MODEL, 1, 100, 0, job="vip"), 0)
    assert set(dict(sched.view.job_books())) == {"session-0", "session-1", "", "vip"}
    assert sched.view.job_book("").received.items == 18
    assert len(sched._context.table.shapes) == 4
    sched.check()
    with pytest.raises(ValueError, match="max_jobs"):
        ShareSettings(max_jobs=-1)


def test_a_restored_batch_that_mixes_jobs_is_counted_item_by_item() -> None:
    """A batch cut before lanes had jobs may hold several; adopting and finishing it keeps every
    job's book balanced."""
    sched = make_sched(1, Shares())
    items = [Item(f"x{i}", MODEL, 1, 10 + i, 0, job="ab"[i % 2]) for i in range(6)]
    batch = Batch("old-1", "c0", MODEL, 1, 0, 8, 16, items, 0)
    sched.adopt_in_flight(batch, 0, done={"x0"})
    assert sched.view.job_book("a").adopted_in_flight.items == 2  # x2, x4 (x0 was answered before)
    sched.items_done("old-1", [("x1", True, False)], 0)
    sched.complete("old-1", 0, failed={"x2"})
    sched.check()
    assert sched.view.job_book("b").completed.items == 3
    assert sched.view.job_book("a").failed.tokens == 12


def test_a_gate_is_made_only_while_two_jobs_of_the_model_wait_or_a_quota_is_set() -> None:
    """``Shares.gate`` is None, the whole cost of shares, while at most one job of the model waits
    and no job has a quota (``Shares.contended`` follows the jobs with waiting lanes)."""
    shares = Shares()
    shares.lanes_changed(MODEL, "a", 1)
    assert shares.gate(MODEL, 0) is None and MODEL not in shares.contended
    shares.lanes_changed(MODEL, "b", 1)
    shares.lanes_changed("other", "c", 1)
    assert shares.gate(MODEL, 0) is not None and shares.gate("other", 0) is None
    shares.lanes_changed(MODEL, "a", -1)
    assert shares.gate(MODEL, 0) is None
    shares.lanes_changed(MODEL, "a", 1)
    shares.reset_waiting()
    assert shares.gate(MODEL, 0) is None and not shares.contended
    shares.set_policy("c", JobPolicy(max_tokens=1_000))
    assert shares.gate("other", 0) is not None
