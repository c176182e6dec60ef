"""The ledger: two equations, in items and in tokens, per model, per consumer and in total."""

from __future__ import annotations

import pytest

from processor.core.accounting import Ledger, LedgerImbalance, Tally, sum_tallies


def busy_ledger() -> Ledger:
    """Two models, two consumers, every kind of event at least once."""
    ledger = Ledger()
    for tokens in (100, 200, 300, 400):
        ledger.received("alpha", tokens)
    ledger.received("beta", 50)
    ledger.received("beta", 70)
    ledger.routed("alpha", "card-1", 2, 300, 400, False)  # items of 100 + 200, padded to 2 x 200
    ledger.routed("alpha", "card-2", 1, 400, 400, True)
    ledger.routed("beta", "card-2", 2, 120, 160, False)
    ledger.finished("alpha", "card-1", 1, 100, 1, 200)
    ledger.requeued("alpha", "card-2", 1, 400)
    ledger.routed("alpha", "card-1", 1, 400, 400, False)
    ledger.finished("beta", "card-2", 2, 120, 0, 0)
    ledger.cache("card-1", True)
    ledger.cache("card-1", False)
    ledger.dead_lettered = 3
    return ledger


def tally(t: Tally) -> tuple[int, int]:
    return t.items, t.tokens


def test_received_equals_queued_plus_routed_in_items_and_tokens() -> None:
    ledger = busy_ledger()
    ledger.check()
    for book in ledger.models.values():
        assert book.received.items == book.queued.items + book.routed.items
        assert book.received.tokens == book.queued.tokens + book.routed.tokens
    assert tally(ledger.total("received")) == (6, 1120)
    assert tally(ledger.total("queued")) == (1, 300)
    assert tally(ledger.total("routed")) == (5, 820)


def test_routed_equals_completed_plus_in_flight_plus_failed() -> None:
    ledger = busy_ledger()
    for book in [*ledger.models.values(), *ledger.consumers.values()]:
        parts = sum_tallies([book.completed, book.in_flight, book.failed])
        assert tally(book.routed) == tally(parts)
    assert tally(ledger.total("completed")) == (3, 220)
    assert tally(ledger.total("failed")) == (1, 200)
    assert tally(ledger.total("in_flight")) == (1, 400)


def test_a_requeued_batch_is_routed_no_longer_and_counts_as_redelivered() -> None:
    ledger = Ledger()
    ledger.received("m", 100)
    ledger.routed("m", "c", 1, 100, 104, False)
    ledger.requeued("m", "c", 1, 100)
    ledger.check()
    book, consumer = ledger.models["m"], ledger.consumer("c")
    assert (tally(book.queued), tally(book.routed), tally(book.in_flight)) == ((1, 100), (0, 0), (0, 0))
    assert tally(consumer.redelivered) == (1, 100)
    assert consumer.batches == 1 and consumer.padded_tokens == 104  # what was sent stays sent


def test_consumer_counters() -> None:
    c = busy_ledger().consumer("card-1")
    assert (c.batches, c.padded_tokens, c.oversized, c.cache_hits, c.cache_lookups) == (2, 800, 0, 1, 2)
    assert busy_ledger().consumer("card-2").oversized == 1


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (
            lambda lg: lg.models["alpha"].queued.add(0, 7),
            "model alpha out of balance: received+adopted_queued+retried 4 items / 1,000 tokens, "
            "queued+routed+cancelled+expired+released_queued 4 items / 1,007 tokens",
        ),
        (
            lambda lg: lg.models["beta"].completed.add(1, 0),
            "model beta out of balance: routed+adopted_in_flight 2 items / 120 tokens, "
            "completed+in_flight+failed+retried+released_in_flight 3 items / 120 tokens",
        ),
        (
            lambda lg: lg.consumers["card-1"].failed.add(0, -5),
            "consumer card-1 out of balance: routed+adopted_in_flight 3 items / 700 tokens, "
            "completed+in_flight+failed+retried+released_in_flight 3 items / 695 tokens",
        ),
    ],
    ids=["received side", "routed side, items", "consumer"],
)
def test_an_imbalance_names_where_and_both_sides(tamper, message: str) -> None:  # type: ignore[no-untyped-def]
    ledger = busy_ledger()
    tamper(ledger)
    with pytest.raises(LedgerImbalance) as info:
        ledger.check()
    assert str(info.value) == message


def test_model_and_consumer_totals_must_agree() -> None:
    ledger = busy_ledger()
    # Move a completed item from one consumer's book to nowhere, keeping that consumer's own equation.
    c = ledger.consumers["card-2"]
    c.completed.add(-1, -50)
    c.routed.add(-1, -50)
    with pytest.raises(
        LedgerImbalance, match="routed by model 5 items / 820 tokens, routed by consumer 4 items / 770"
    ):
        ledger.check()


def test_imbalance_is_an_assertion_error() -> None:
    assert issubclass(LedgerImbalance, AssertionError)


def test_snapshot_is_flat_and_carries_totals_models_and_consumers() -> None:
    snap = busy_ledger().snapshot()
    assert all(isinstance(k, str) and isinstance(v, int) for k, v in snap.items())
    assert snap["received_items"] == 6 and snap["received_tokens"] == 1120
    assert snap["queued_tokens@alpha"] == 300
    assert snap["redelivered_items#card-2"] == 1
    assert snap["padded_tokens#card-1"] == 800
    assert snap["cache_lookups#card-1"] == 2
    assert snap["dead_lettered_items"] == 3


def test_snapshot_restore_round_trip() -> None:
    ledger = busy_ledger()
    snap = ledger.snapshot()
    restored = Ledger.restore(snap)
    assert restored.snapshot() == snap
    restored.check()
    assert restored.consumer("card-1").padded_tokens == 800
    assert restored.dead_lettered == 3


def test_a_restored_ledger_keeps_counting() -> None:
    restored = Ledger.restore(busy_ledger().snapshot())
    restored.routed("alpha", "card-2", 1, 300, 304, False)
    restored.finished("alpha", "card-2", 1, 300, 0, 0)
    restored.check()
    assert tally(restored.total("queued")) == (0, 0)


def test_restore_of_an_empty_snapshot_is_an_empty_ledger() -> None:
    assert Ledger.restore(Ledger().snapshot()).snapshot() == Ledger().snapshot()


def test_model_names_with_separator_characters_survive_a_round_trip() -> None:
    ledger = Ledger()
    ledger.received("org@model#v2", 10)
    ledger.routed("org@model#v2", "c", 1, 10, 16, False)
    snap = ledger.snapshot()
    assert Ledger.restore(snap).snapshot() == snap


def test_release_then_adopt_keeps_both_equations_and_nets_to_zero() -> None:
    """A restart or a rebalance: everything is released, then the changelog's content adopted back."""
    ledger = busy_ledger()
    queued, in_flight = ledger.total("queued"), tally(ledger.consumer("card-1").in_flight)
    ledger.release_all()
    ledger.check()
    assert ledger.total("queued").items == 0 and ledger.total("in_flight").items == 0
    assert ledger.total("released_queued") == queued
    assert tally(ledger.consumer("card-1").released_in_flight) == in_flight
    # adopt the same items back: the per-model delta is zero again
    for model, book in ledger.models.items():
        released = book.released_queued
        for i in range(released.items):  # the first item carries all the tokens: only sums matter here
            ledger.adopted_waiting(model, released.tokens if i == 0 else 0)
    for name, c in ledger.consumers.items():
        model = "alpha" if name == "card-1" else "beta"
        ledger.adopted_in_flight(model, name, c.released_in_flight.items, c.released_in_flight.tokens)
    ledger.check()
    assert all(delta == (0, 0) for delta in ledger.handover_delta().values())
    restored = Ledger.restore(ledger.snapshot())
    assert restored.snapshot() == ledger.snapshot()


def test_adopting_more_than_was_released_shows_in_the_delta() -> None:
    ledger = Ledger()
    ledger.adopted_waiting("alpha", 40)
    ledger.check()
    assert ledger.handover_delta() == {"alpha": (1, 40)}


def test_a_producer_repeat_is_counted_as_a_duplicate_beside_the_equations() -> None:
    ledger = busy_ledger()
    before = ledger.snapshot()
    ledger.duplicate("alpha", 250)
    ledger.duplicate("alpha", 100)
    ledger.check()  # never received, so both equations still hold
    after = ledger.snapshot()
    assert (after["duplicate_items"], after["duplicate_tokens"]) == (2, 350)
    assert (after["duplicate_items@alpha"], after["duplicate_tokens@alpha"]) == (2, 350)
    assert after["dead_lettered_items"] == before["dead_lettered_items"] + 2
    assert after["received_items"] == before["received_items"]
    assert Ledger.restore(after).snapshot() == after


def test_each_equation_reports_its_gap_and_is_zero_while_it_holds() -> None:
    """``RECEIVED`` and ``ROUTED`` are the equations ``check`` asks and the metrics publish the gap of."""
    from processor.core.accounting import RECEIVED, ROUTED

    ledger = busy_ledger()
    for book in (*ledger.models.values(), *ledger.jobs.values()):
        assert tally(RECEIVED.gap(book)) == (0, 0)
        assert tally(ROUTED.gap(book)) == (0, 0)
    for c in ledger.consumers.values():
        assert tally(ROUTED.gap(c)) == (0, 0)
    ledger.models["alpha"].queued.add(1, 25)  # a phantom waiting item
    ledger.models["beta"].released_in_flight.add(0, 7)
    assert tally(RECEIVED.gap(ledger.models["alpha"])) == (-1, -25)
    assert tally(ROUTED.gap(ledger.models["beta"])) == (0, -7)
    assert (RECEIVED.name, ROUTED.name) == ("received", "routed")


def events(ledger: Ledger, one_call: bool) -> None:
    """The same arrivals, batches and answers, written through the one-call batch events or through
    the per-book entry points (the model's and consumer's, then the job's)."""
    if one_call:
        ledger.batch_received("alpha", "j1", 3, 600)
        ledger.batch_received("alpha", "j2", 1, 50, adopted=True)
        ledger.batch_routed("alpha", "card-1", "j1", 2, 400, 512, False)
        ledger.batch_routed("alpha", "card-2", "j2", 1, 50, 4096, True)
        ledger.batch_finished("alpha", "card-1", "j1", 1, 150, 1, 250, cached_tokens=100)
        ledger.batch_finished("alpha", "card-2", "j2", 1, 50, 0, 0)
        return
    ledger.received("alpha", 600, 3)
    ledger.job_received("j1", 3, 600)
    ledger.adopted_waiting("alpha", 50, 1)
    ledger.job_received("j2", 1, 50, adopted=True)
    ledger.routed("alpha", "card-1", 2, 400, 512, False)
    ledger.job_routed("j1", 2, 400, 512)
    ledger.routed("alpha", "card-2", 1, 50, 4096, True)
    ledger.job_routed("j2", 1, 50, 4096)
    ledger.finished("alpha", "card-1", 1, 150, 1, 250, cached_tokens=100)
    ledger.job_finished("j1", 1, 150, 1, 250, cached_tokens=100)
    ledger.finished("alpha", "card-2", 1, 50, 0, 0)
    ledger.job_finished("j2", 1, 50, 0, 0)


def test_a_batch_event_in_one_call_books_what_the_per_book_calls_book() -> None:
    one, per_book = Ledger(), Ledger()
    events(one, one_call=True)
    events(per_book, one_call=False)
    one.check_holdings((1, 200), (0, 0))
    assert one.snapshot() == per_book.snapshot()
    assert tally(one.jobs["j1"].failed) == (1, 250) and one.consumers["card-2"].oversized == 1
    assert one.consumers["card-1"].cached_prompt_tokens == 100 and one.jobs["j1"].prefill_tokens == 50


def test_the_books_kept_per_batch_stay_those_of_the_ledger_after_a_release_and_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The books a batch event keeps per (model, consumer, job) are the ledger's own objects: a
    release moves counts within them, and a ledger past the bound on kept triples starts afresh and
    still writes the same books."""
    monkeypatch.setattr("processor.core.accounting._KEPT_BOOKS", 2)
    ledger = Ledger()
    ledger.batch_received("alpha", "j1", 2, 200)
    ledger.batch_routed("alpha", "card-1", "j1", 1, 100, 104, False)
    ledger.release_all()
    ledger.batch_received("alpha", "j1", 1, 30)
    for consumer in ("card-1", "card-2", "card-3"):  # past the bound: the kept books start afresh
        ledger.batch_routed("alpha", consumer, "j1", 0, 0, 0, False)
    ledger.batch_routed("alpha", "card-1", "j1", 1, 30, 32, False)
    ledger.batch_finished("alpha", "card-1", "j1", 1, 30, 0, 0)
    ledger.check_holdings((0, 0), (0, 0))
    book = ledger.models["alpha"]
    assert tally(book.released_queued) == (1, 100) and tally(book.released_in_flight) == (1, 100)
    assert tally(book.completed) == (1, 30) and tally(ledger.jobs["j1"].completed) == (1, 30)
    assert ledger.consumers["card-1"].batches == 3 and ledger.jobs["j1"].batches == 5
