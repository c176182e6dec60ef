"""The lane-state changelog: what a restarted processor needs to rebuild lanes and in-flight slots.

Written in the same Kafka transaction as the batches, the ledger checkpoint and the ingest offsets,
so after any crash the three agree. It never copies token bytes: a record *refers* to an ingest
message by (partition, offset), and restore reads those messages back from the ingest topic.

Two kinds of records, on a compacted topic with as many partitions as the ingest topic:

* ``W`` + partition (4 bytes) + offset (8 bytes), value ``b"1"``: an item waiting in a lane.
* ``B`` + batch id, value: the batch's consumer, lane, padded length, item references, the
  consumer's in-flight slot it holds, which items are answered already, and where the results topic
  stood when it was emitted (its completions can only come after that).

A tombstone (null value) ends each record: the item was dispatched, the batch completed. Items that
arrive and leave within one transaction are never written at all, so a processor that keeps up
writes about one small record per batch, not per item.

Which changelog partition a record lives in is what makes state move with ingest partitions: a
waiting item's record lives in its *home* partition (the ingest partition it came from, or for an
item put back from a batch, the batch's partition); a batch's record lives in the partition its
in-flight slot belongs to (``processor/credits.py``). An instance writes only to partitions it owns,
so whoever is assigned ingest partition p restores exactly changelog partition p.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

WAITING = b"W"
BATCH = b"B"
LEGACY_RESULTS = b"R"  # results positions, written by 0.1 processors; now derived from batch records
PRESENT = b"1"
_REF = struct.Struct(">iq")


def waiting_key(partition: int, offset: int) -> bytes:
    return WAITING + _REF.pack(partition, offset)


def batch_key(batch_id: str) -> bytes:
    return BATCH + batch_id.encode("utf-8")


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
    slot: int = -1
    """The consumer's in-flight slot the batch holds (-1: none recorded)."""
    done: tuple[int, ...] = ()
    """Indices into ``refs`` of items already answered (counted in the ledger of the same commit)."""
    results_from: tuple[tuple[int, int], ...] = ()
    """(results partition, offset) before which none of this batch's completions can be."""

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
                "slot": self.slot,
                "done": self.done,
                "results_from": self.results_from,
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
            int(d.get("slot", -1)),
            tuple(int(i) for i in d.get("done", ())),
            tuple((int(p), int(o)) for p, o in d.get("results_from", ())),
        )


class ChangelogState:
    """Folds changelog records (in log order per partition) into the waiting refs and open batches.

    ``waiting`` maps each waiting item's ingest ref to its home (the changelog partition its record
    lives in); ``homes`` maps each open batch to its partition. A tombstone only ends a record in its
    own partition, so reading partitions in any order gives the same state.
    """

    def __init__(self) -> None:
        self.waiting: dict[tuple[int, int], int] = {}
        self.batches: dict[str, BatchEntry] = {}
        self.homes: dict[str, int] = {}
        self.records = 0

    def apply(self, key: bytes, value: bytes | None, partition: int = 0) -> None:
        self.records += 1
        kind = key[:1]
        if kind == WAITING:
            ref: tuple[int, int] = _REF.unpack(key[1:])
            if value is not None:
                self.waiting[ref] = partition
            elif self.waiting.get(ref) == partition:
                del self.waiting[ref]
        elif kind == BATCH:
            batch_id = key[1:].decode("utf-8")
            if value is not None:
                self.batches[batch_id] = BatchEntry.parse(batch_id, value)
                self.homes[batch_id] = partition
            elif self.homes.get(batch_id) == partition:
                del self.batches[batch_id]
                del self.homes[batch_id]
        elif kind == LEGACY_RESULTS:
            return
        else:
            raise ValueError(f"changelog: unknown record kind {kind!r} in key {key!r}")

    def refs(self) -> set[tuple[int, int]]:
        """Every ingest message the restored state needs."""
        out = set(self.waiting)
        for entry in self.batches.values():
            out.update(entry.refs)
        return out
