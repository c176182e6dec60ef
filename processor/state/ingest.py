"""The processor's item: a core item that remembers where in the ingest topic it came from."""

from __future__ import annotations

from processor.core.item import Item
from processor.wire.heads import ItemHead


class IngestItem(Item):
    """An item that remembers where it came from, so progress can be recorded against its offset.

    Made by :meth:`from_head` (a Struct cannot define ``__init__``)."""

    partition: int = -1
    offset: int = -1
    home: int = -1
    """The changelog partition of its "waiting" record (processor/state/changelog.py)."""
    safe: bool = False
    """At-least-once: has its last answer (processor/state/lane_log.py, ``OffsetLog``)."""
    logged: bool = False
    """Exactly-once: has a committed "waiting" changelog record."""

    @classmethod
    def from_head(cls, head: ItemHead, now_ms: int, partition: int, offset: int) -> IngestItem:
        # payload: the input message, spliced into the batch past its header (processor/wire/heads.py)
        return cls(
            head.item_id,
            head.model,
            head.shape,
            head.token_count,
            now_ms,
            head.message,
            head.output_budget,
            head.job,
            partition=partition,
            offset=offset,
            home=partition,
        )
