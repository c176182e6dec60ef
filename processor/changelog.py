"""The lane-state changelog: what a restarted processor needs to rebuild lanes and in-flight slots.

Written in the same Kafka transaction as the batches, the ledger checkpoint and the ingest offsets,
so after any crash the three agree. It never copies token bytes: a record *refers* to an ingest
message by (partition, offset), and restore reads those messages back from the ingest topic.

Two kinds of records, on a compacted topic:

* ``W`` + partition (4 bytes) + offset (8 bytes), value ``b"1"``: an item waiting in a lane.
* ``B`` + batch id, value: the batch's consumer, lane, padded length and item references: a batch
  its consumer has not finished yet (it holds one of the consumer's in-flight slots).
* ``R`` + results partition, value: the offset up to which completions have been applied, so a
  restart re-reads exactly the completions the last commit had not yet counted.

A tombstone (null value) ends each record: the item was dispatched, the batch completed. Items that
arrive and leave within one transaction are never written at all, so a processor that keeps up
writes about one small record per batch, not per item.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

WAITING = b"W"
BATCH = b"B"
RESULTS = b"R"
PRESENT = b"1"
_REF = struct.Struct(">iq")


def waiting_key(partition: int, offset: int) -> bytes:
    return WAITING + _REF.pack(partition, offset)


def batch_key(batch_id: str) -> bytes:
    return BATCH + batch_id.encode("utf-8")


def results_key(partition: int) -> bytes:
    return RESULTS + struct.pack(">i", partition)


def results_value(offset: int) -> bytes:
    return struct.pack(">q", offset)


@dataclass(frozen=True, slots=True)
class BatchEntry:
    batch_id: str
    consumer: str
    lane: int
    padded_length: int
    pad_multiple: int
    created_ms: int
    oversized: bool
    refs: tuple[tuple[int, int], ...]  # (ingest partition, offset) of each item, in batch order

    def value(self) -> bytes:
        return json.dumps(
            {
                "consumer": self.consumer,
                "lane": self.lane,
                "padded_length": self.padded_length,
                "pad_multiple": self.pad_multiple,
                "created_ms": self.created_ms,
                "oversized": self.oversized,
                "refs": self.refs,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def parse(cls, batch_id: str, value: bytes) -> BatchEntry:
        d = json.loads(value)
        return cls(
            batch_id,
            d["consumer"],
            d["lane"],
            d["padded_length"],
            d["pad_multiple"],
            d["created_ms"],
            d["oversized"],
            tuple((int(p), int(o)) for p, o in d["refs"]),
        )


class ChangelogState:
    """Folds changelog records (in log order) into the waiting refs and open batches they describe."""

    def __init__(self) -> None:
        self.waiting: set[tuple[int, int]] = set()
        self.batches: dict[str, BatchEntry] = {}
        self.results: dict[int, int] = {}
        self.records = 0

    def apply(self, key: bytes, value: bytes | None) -> None:
        self.records += 1
        kind = key[:1]
        if kind == WAITING:
            ref = _REF.unpack(key[1:])
            if value is None:
                self.waiting.discard(ref)
            else:
                self.waiting.add(ref)
        elif kind == BATCH:
            batch_id = key[1:].decode("utf-8")
            if value is None:
                self.batches.pop(batch_id, None)
            else:
                self.batches[batch_id] = BatchEntry.parse(batch_id, value)
        elif kind == RESULTS and value is not None:
            self.results[struct.unpack(">i", key[1:])[0]] = struct.unpack(">q", value)[0]
        else:
            raise ValueError(f"changelog: unknown record kind {kind!r} in key {key!r}")

    def refs(self) -> set[tuple[int, int]]:
        """Every ingest message the restored state needs."""
        out = set(self.waiting)
        for entry in self.batches.values():
            out.update(entry.refs)
        return out
