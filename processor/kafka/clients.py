"""Named client settings for the processor's clients (librdkafka's log: processor.kafka.rdlog).

Every setting that a tokenfabric client adds to the operator's ``client_config`` is stated here once,
with the reason for it, so the apps build clients from names rather than from inline dicts.
"""

from __future__ import annotations

from collections.abc import Mapping

from processor.kafka.reader import LARGE_FETCH_QUEUE


def ingest_settings(conf: Mapping[str, str], group_id: str, session_timeout_ms: int) -> dict[str, str]:
    """The processor's ingest consumer: its own offsets (committed with its output), committed reads."""
    return {
        **conf,
        "group.id": group_id,
        "enable.auto.commit": "false",
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "session.timeout.ms": str(session_timeout_ms),
        "fetch.max.bytes": str(64 * 1024 * 1024),
        **LARGE_FETCH_QUEUE,
    }


def control_settings(conf: Mapping[str, str], group_id: str) -> dict[str, str]:
    """The processor's reader of contracts and results (assigned, never subscribed)."""
    return {
        **conf,
        "group.id": group_id,
        "enable.auto.commit": "false",
        # at-least-once without a committed position: from the beginning, or completions
        # written while the processor starts would be missed and their slots never freed
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }


def batch_producer_settings(
    conf: Mapping[str, str], transactional_id: str | None = None, transaction_timeout_ms: int = 0
) -> dict[str, str | bool]:
    """The producer of batches, dead letters, changelog and checkpoints; transactional when given an id."""
    out: dict[str, str | bool] = {
        **conf,
        "enable.idempotence": "true",
        "linger.ms": "5",
        "batch.size": str(1024 * 1024),
        "message.max.bytes": str(64 * 1024 * 1024),
    }
    if transactional_id is not None:
        out["transactional.id"] = transactional_id
        out["transaction.timeout.ms"] = str(transaction_timeout_ms)
        # The committed transaction is the delivery report. A successful report would copy each
        # batch back into Python to say so: a third copy of every token (docs/benchmarks.md).
        out["delivery.report.only.error"] = True
    return out
