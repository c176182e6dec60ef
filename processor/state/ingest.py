"""The processor's item: a core item that remembers where in the ingest topic it came from."""

from __future__ import annotations

from processor.core.item import Item
from processor.wire.heads import ItemHead


class IngestItem(Item):
    """An item that remembers where it came from, so progress can be recorded against its offset."""

    __slots__ = ("home", "logged", "offset", "partition", "safe")

    def __init__(self, head: ItemHead, now_ms: int, partition: int, offset: int) -> None:
        # payload: the input message, spliced into the batch past its header (processor/wire/heads.py)
        super().__init__(
            head.item_id,
            head.model,
            head.shape,
            head.token_count,
            now_ms,
            head.message,
            head.output_budget,
            head.job,
        )
        self.partition = partition
        self.offset = offset
        self.home = partition  # changelog partition of its "waiting" record (processor/state/changelog.py)
        self.safe = False  # at-least-once: in a delivered batch
        self.logged = False  # exactly-once: has a committed "waiting" changelog record
