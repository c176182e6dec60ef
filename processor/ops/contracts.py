"""What consumers have announced on the contracts topic: which consumer serves which model.

Read by ``submit`` (to warn that a job's model, or one of its adapters, has no consumer) and by
``status``. The topic is compacted and keyed by consumer name; a tombstone (``status
--retire-consumer``) withdraws an announcement, so only the latest value per key counts.

A contract's ``model`` is a serving key (processor/core/serving.py): a consumer of a LoRA adapter
serves ``model@adapter`` and nothing else, so a model is served for the adapters whose keys some
contract names, and the base model only by a contract naming the bare model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from processor.core.contract import Contract
from processor.core.serving import serving_key, split_serving_key
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
    """The consumers whose contract names ``model`` (a serving key: ``model@adapter`` for an adapter's
    work), sorted: empty means its items would wait."""
    return sorted(name for name, c in contracts.items() if c.model == model)


def unserved_keys(model: str, adapters: Iterable[str], contracts: Mapping[str, Contract]) -> list[str]:
    """The serving keys of ``model`` with each of ``adapters`` ("" for the base model) that no
    contract names, sorted and each once: what ``submit`` warns about for a job whose rows name
    these adapters (``status`` shows their waiting items as UNSERVED)."""
    served = {c.model for c in contracts.values()}
    return sorted({serving_key(model, a) for a in adapters} - served)


def unserved_names(keys: Iterable[str]) -> str:
    """Serving keys in words for a warning: ``model 'm'`` for base-model work, ``adapter 'a' of model
    'm'`` for an adapter's, joined by commas (``submit``'s "no consumer serves ..." line)."""
    words = []
    for key in keys:
        model, adapter = split_serving_key(key)
        words.append(f"adapter {adapter!r} of model {model!r}" if adapter else f"model {model!r}")
    return ", ".join(words)
