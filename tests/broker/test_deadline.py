"""A job's completion window passes mid-run against a real broker: the rows not dispatched by then
expire, exactly those.

The deadline is recorded as ``submit --window`` records it (:func:`processor.ops.lifecycle.record_deadline`),
the processor and the slowed consumers run as real processes, and every topic is read back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.kafka.reader import read_topic
from processor.ops.lifecycle import deadline_from, record_deadline
from processor.wire.items import decode_batch
from tests.broker.rig import CARDS, Rig
from tests.broker.test_cancel import JOB, answered_once, clean_audit, produce_job, slow_rig

pytestmark = pytest.mark.kafka


@pytest.fixture
def rig(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Rig]:
    with slow_rig(kafka_bootstrap, tmp_path) as r:
        yield r


def test_a_window_that_passes_mid_job_expires_exactly_the_rows_not_yet_dispatched(rig: Rig) -> None:
    now_ms = time.time_ns() // 1_000_000
    deadline_ms = deadline_from("6s", None, now_ms)
    assert deadline_ms == now_ms + 6_000
    record_deadline(rig.conf, rig.topics, JOB, deadline_ms, now_ms)  # before the first item, as submit does
    ids = produce_job(rig, 3_000, seed=31)
    rig.spawn_processor("processor-0")
    statuses = answered_once(rig, ids)
    created: dict[str, int] = {}
    for c in CARDS:
        for msg in read_topic(rig.conf, rig.topics.batches(c.consumer)):
            batch = decode_batch(msg.value())
            created.update((it.item_id, batch.created_ms) for it in batch.items)
    assert statuses["ok"] == set(created)
    assert statuses["expired"] == ids - set(created)
    assert statuses["ok"] and statuses["expired"]  # the window passed mid-job
    assert max(created.values()) < deadline_ms  # nothing went out at or after the deadline
    report = clean_audit(rig)
    assert report.expired_items == len(statuses["expired"]) and report.cancelled_items == 0
