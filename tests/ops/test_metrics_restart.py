"""Counters across a restart: a processor that resumes its ledger from a checkpoint exports what it
counts itself, from 0, so a restored total never reads as new events to ``increase()`` (the
``TokenfabricDeadLetters`` false alarm: a dead-letter counter exported as 0 and then as its restored
total). The restored totals stay in the checkpoint, status and the ``tokenfabric_pipeline_*`` gauges."""

from __future__ import annotations

from processor.core.contract import Contract
from processor.core.item import Item
from processor.ops.metrics import processor_registry
from tests.ops.helpers import FakeService, read_registry, value


def _worked(svc: FakeService) -> dict[str, int]:
    """Two items completed and one dead letter on ``svc``'s core: its ledger snapshot."""
    core = svc.core
    core.set_contract(Contract("card", "m", budget_tokens=4096, max_items=8, pad_multiple=8, max_inflight=1))
    for n in range(2):
        core.submit(Item(f"i{n}", "m", 0xA, 100, arrival_ms=1000), 1000)
    (batch,) = core.dispatch(2000)
    for it in batch.items:
        core.item_done(batch.batch_id, it.id, True, 2500)
    core.dead_lettered()
    return core.view.ledger_snapshot()


def test_a_restarted_processor_exports_its_own_counts_not_the_restored_totals() -> None:
    first = FakeService()
    checkpoint = _worked(first)
    before = read_registry(processor_registry(first, pipeline_in_background=False))
    assert value(before, "tokenfabric_dead_lettered_messages_total") == 1
    assert value(before, "tokenfabric_completed_items_total", model="m") == 2

    again = FakeService()
    registry = processor_registry(again, pipeline_in_background=False)
    again.core.resume_ledger(checkpoint)  # as the service's start does, from the instance's checkpoint
    after = read_registry(registry)
    assert again.core.view.total("completed").items == 2  # the ledger goes on from the checkpoint
    assert value(after, "tokenfabric_dead_lettered_messages_total") == 0  # not 1: nothing new
    assert value(after, "tokenfabric_completed_items_total", model="m") == 0
    assert value(after, "tokenfabric_consumer_completed_items_total", consumer="card") == 0
    assert value(after, "tokenfabric_job_padded_tokens_total", job="") == 0

    _worked(again)  # new events after the restart count from there
    later = read_registry(registry)
    assert value(later, "tokenfabric_dead_lettered_messages_total") == 1
    assert value(later, "tokenfabric_completed_items_total", model="m") == 2
    assert value(later, "tokenfabric_consumer_completed_items_total", consumer="card") == 2
    assert again.core.view.total("completed").items == 4
