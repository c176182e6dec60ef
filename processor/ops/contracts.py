"""What consumers have announced on the contracts topic: which consumer serves which model.

Read by ``submit`` (to warn that a job's model has no consumer) and by ``status``. The topic is
compacted and keyed by consumer name; a tombstone (``status --retire-consumer``) withdraws an
announcement, so only the latest value per key counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from processor.core.contract import Contract
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.wire.control import decode_contract


@dataclass(frozen=True, slots=True)
class Announcement:
    """A consumer's latest contract and the broker timestamp of the message that carried it."""

    contract: Contract
    timestamp_ms: int


def read_announcements(conf: Mapping[str, str], topics: TopicNames) -> dict[str, Announcement]:
    """Every consumer's latest contract, by consumer name; retired consumers left out."""
    out: dict[str, Announcement] = {}
    for msg in read_topic(conf, topics.contracts):
        key = (msg.key() or b"").decode("utf-8", "replace")
        if msg.value() is None:
            out.pop(key, None)
        else:
            out[key] = Announcement(decode_contract(msg.value()).contract, msg.timestamp()[1])
    return out


def announced_contracts(conf: Mapping[str, str], topics: TopicNames) -> dict[str, Contract]:
    """:func:`read_announcements`' contracts alone."""
    return {name: a.contract for name, a in read_announcements(conf, topics).items()}


def consumers_of(model: str, contracts: Mapping[str, Contract]) -> list[str]:
    """The consumers whose contract names ``model``, sorted: empty means its items would wait."""
    return sorted(name for name, c in contracts.items() if c.model == model)
