"""Retire what is gone for good, so ``tokenfabric status`` stops listing it; refuse what still lives.

:func:`forget_processor` retires an instance that is gone for good (scaled down, a crashed test
instance): it rewrites the instance's last checkpoint with ``retired_ms`` set and no gauges. Its
counters stay, so totals and the audit still balance; status no longer lists it. An instance that
runs again under that id checkpoints afresh and is listed again.

:func:`retire_consumer` withdraws a consumer's contract (its tombstone), as
``tokenfabric consumer --retire`` does, once status judges it stale.

Both judge "gone" as status does (processor.ops.status), from the same view of the topics.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaException

from processor.kafka.factory import KAFKA
from processor.kafka.topics import TopicNames
from processor.ops.status import DEFAULT_STALE_S, RETIRED, ConsumerRow, consumer_row, gather
from processor.wire.control import encode_ledger_snapshot
from processor.wire.records import LedgerSnapshotRecord


class StillAlive(ValueError):
    """Refused: the instance or consumer to retire shows signs of life."""


def forget_processor(
    conf: Mapping[str, str], topics: TopicNames, instance: str, stale_s: float = DEFAULT_STALE_S
) -> None:
    """Mark a gone instance retired (see the module's docstring); refuses a live one."""
    view = gather(conf, topics)
    cp = view.checkpoints.get(instance)
    if cp is None:
        known = ", ".join(sorted(view.checkpoints)) or "none"
        raise KeyError(f"no processor instance {instance!r} has checkpointed (known: {known})")
    age = (view.read_ms - cp.taken_ms) / 1000
    if age <= stale_s:
        raise StillAlive(
            f"processor {instance} checkpointed {age:.1f} s ago: stop it first "
            f"(only an instance stale past --stale-s {stale_s:g} can be forgotten)"
        )
    retired = LedgerSnapshotRecord(
        instance=instance,
        taken_ms=cp.taken_ms,
        sequence=cp.sequence + 1,
        counters={**cp.counters, RETIRED: view.read_ms},
        per_model=cp.per_model,
        per_consumer={},
    )
    _write(conf, topics.accounting, instance.encode(), encode_ledger_snapshot(retired))


def retire_consumer(
    conf: Mapping[str, str], topics: TopicNames, consumer: str, stale_s: float = DEFAULT_STALE_S
) -> None:
    """Withdraw a consumer that is gone (its contract's tombstone); refuses one that is up or was
    seen within ``stale_s``. The processor hands its in-flight batches back to the lanes."""
    from processor.apps.consumer import retire

    view = gather(conf, topics, groups=True)
    contract = view.contracts.get(consumer)
    if contract is None:
        known = ", ".join(sorted(view.contracts)) or "none"
        raise KeyError(f"no consumer {consumer!r} has a contract (announced: {known})")
    row = consumer_row(view, consumer, contract, stale_s)
    if row.state != "stale":
        raise StillAlive(
            f"consumer {consumer} is {row.state} ({_life(row)}): stop it first "
            f"(only a consumer stale past --stale-s {stale_s:g} can be retired here; "
            f"`tokenfabric consumer --id {consumer} --retire` retires any)"
        )
    retire(conf, topics, consumer)


def _life(row: ConsumerRow) -> str:
    if row.state == "up":
        return f"{row.members} member{'s' if row.members != 1 else ''} in its group"
    return "seen " + ("never" if row.last_seen_age_s is None else f"{row.last_seen_age_s:.0f} s ago")


def _write(conf: Mapping[str, str], topic: str, key: bytes, value: bytes, timeout_s: float = 30.0) -> None:
    producer = KAFKA.producer({**conf, "enable.idempotence": "true", "acks": "all"})
    failed: list[str] = []
    producer.produce(topic, value, key, on_delivery=lambda err, _m: failed.append(err.str()) if err else None)
    if producer.flush(timeout_s) or failed:
        raise KafkaException(f"writing to {topic}: {failed[0] if failed else 'not delivered in time'}")
