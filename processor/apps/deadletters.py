"""The dead-letter record of a consumed message, built one way by every app that dead-letters.

The processor (an undecodable, invalid or repeated item), the consumer app (a batch it cannot
decode) and the plain queue (an item it cannot take) all write the same record: why, where the
message came from, the message whole (value and key) and when.
"""

from __future__ import annotations

import time
from typing import Any

from processor.wire.records import DeadLetterRecord


def dead_letter_of(
    msg: Any, reason: str, detail: str, topic: str, partition: int, offset: int
) -> DeadLetterRecord:
    """``msg`` (a consumed message) dead-lettered now, with ``reason`` and ``detail``; ``topic``,
    ``partition`` and ``offset`` are where it was read (the caller knows them even when the message
    does not say)."""
    return DeadLetterRecord(
        reason=reason,
        detail=detail,
        source_topic=topic,
        partition=partition,
        offset=offset,
        original=bytes(msg.value() or b""),
        original_key=msg.key(),
        dead_ms=time.time_ns() // 1_000_000,
    )
