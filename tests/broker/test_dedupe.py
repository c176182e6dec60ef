"""A producer's repeat runs once: the same ``item_id`` sent again (before a processor is SIGKILLed
before its first commit, after a kill that followed commits) is dead-lettered as
``duplicate-item-id``, never dispatched; every item runs exactly once and the audit is clean, naming
each repeat by id. Repeats after a handover to another instance are tested without a broker
(tests/apps/test_broker_twins.py)."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.kafka.reader import read_topic
from processor.ops.audit import audit
from processor.ops.status import gather
from processor.sim.tracegen import synthetic_records
from processor.sim.traces import TraceRecord
from processor.wire.control import DUPLICATE_ITEM_ID, decode_dead_letter
from tests.broker.rig import CARDS, Rig, Threads, assert_exactly_once, instant_app, running_rig, wait_for

pytestmark = pytest.mark.kafka

GROUP_ARGS = ("--session-timeout-ms", "6000", "--transaction-timeout-ms", "5000")
"""A killed processor's group membership ends in 6 s, not 45: its replacement starts at once."""


def send(rig: Rig, records: Sequence[TraceRecord]) -> None:
    with TokenProducer(rig.conf, rig.topics) as producer:
        for r in records:
            producer.send(r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)


def dead_letters(rig: Rig) -> list[tuple[str, str]]:
    """(reason, detail) of every committed dead letter."""
    out = []
    for msg in read_topic(rig.conf, rig.topics.dead_letter):
        dead = decode_dead_letter(msg.value())
        out.append((dead.reason, dead.detail or ""))
    return out


def assert_repeats_ran_once(rig: Rig, records: Sequence[TraceRecord], repeats: Counter[str]) -> None:
    ids = {r.id for r in records}
    assert_exactly_once(rig, ids, sum(r.length for r in records))
    letters = dead_letters(rig)
    assert {reason for reason, _ in letters} == {DUPLICATE_ITEM_ID}
    assert len(letters) == sum(repeats.values())
    report = audit(rig.conf, rig.topics, rig.group)
    assert report.clean, "\n".join(report.lines())
    assert Counter(i for i, _p, _o in report.repeats) == repeats
    first_id, partition, offset = report.repeats[0]
    assert f"producer repeat: item_id {first_id!r} at partition {partition} offset {offset}" in report.lines()
    length = {r.id: r.length for r in records}
    t = gather(rig.conf, rig.topics, group=rig.group).total
    assert t("duplicate_items") == sum(repeats.values())
    assert t("duplicate_tokens") == sum(length[i] * n for i, n in repeats.items())


def test_repeats_before_and_after_processor_kills_run_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    records = synthetic_records(1500, seed=31, shapes=12, min_len=16, max_len=400, rate_per_s=None)
    first, second = records[:60], records[200:260]
    with running_rig(kafka_bootstrap, tmp_path, consumer_threads=False) as rig:
        send(rig, records)
        send(rig, first)
        # No consumer yet, so no batch to commit early for, and a minute between commits: the first
        # processor takes every item and every repeat and is killed before any of it is committed.
        rig.spawn_processor(
            "before-commit",
            extra=(
                "--session-timeout-ms",
                "6000",
                "--commit-interval-ms",
                "60000",
                "--transaction-timeout-ms",
                "120000",
            ),
        )
        log = rig.pipeline.log_dir / "before-commit.log"
        wait_for(lambda: log.read_text().count(DUPLICATE_ITEM_ID) >= len(first), 90, "the repeats to arrive")
        assert dead_letters(rig) == [], "nothing may be committed before the kill"
        rig.pipeline.procs["before-commit"].send_signal(signal.SIGKILL)
        rig.pipeline.procs["before-commit"].wait()

        consumers = Threads(keep_errors=False)
        for c in CARDS:
            consumers.start(instant_app(rig.conf, rig.topics, c).run, c.consumer)
        try:
            rig.spawn_processor("committed", extra=GROUP_ARGS)
            rig.wait_completed(len(records), timeout_s=120)
            wait_for(lambda: len(dead_letters(rig)) == len(first), 30, "the first repeats' dead letters")
            rig.pipeline.procs["committed"].send_signal(signal.SIGKILL)
            rig.pipeline.procs["committed"].wait()

            send(rig, [*first, *second])  # after the kill: a third copy and a second one
            rig.spawn_processor("after-kill", extra=GROUP_ARGS)
            wait_for(lambda: len(dead_letters(rig)) == 2 * len(first) + len(second), 90, "every repeat")
            codes = rig.pipeline.stop()
        finally:
            consumers.join(30)
    assert codes["after-kill"] == 0
    repeats = Counter({r.id: 2 for r in first}) + Counter({r.id: 1 for r in second})
    assert_repeats_ran_once(rig, records, repeats)
