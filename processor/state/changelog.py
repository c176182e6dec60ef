"""The lane-state changelog: what a restarted processor needs to rebuild lanes and in-flight slots.

Written in the same Kafka transaction as the batches, the ledger checkpoint and the ingest offsets,
so after any crash the three agree. It never copies token bytes: a record *refers* to an ingest
message by (partition, offset), and restore reads those messages back from the ingest topic.

Records, on a compacted topic with as many partitions as the ingest topic:

* ``S`` + ingest partition (4 bytes) + chunk (8 bytes): the waiting set of one run of 65,536 ingest
  offsets, as a bitmap (see :class:`WaitingSets`). One record per chunk that changed in a
  transaction, not one per item: a processor holding a backlog used to write a record and later a
  tombstone for every item that waited across a commit, twice the ingest traffic again.
* ``B`` + batch id, value: the batch's consumer, lane, padded length, item references, the
  consumer's in-flight slot it holds, which items are answered already, and where the results topic
  stood when it was emitted (its completions can only come after that), and, when some item is past
  its first attempt, every item's attempt (a tail that earlier versions neither write nor read: their
  items read as first attempts). Binary (:data:`BATCH_FORMAT`); JSON values from earlier versions
  still parse.
* ``D`` + ingest partition (4 bytes) + bucket start, ms (8 bytes) + segment (4 bytes): item ids the partition
  took within the dedupe window, as 64-bit hashes (``processor/state/seen.py``), so that a producer's
  repeat is caught after a restart or a handover too. Committed with the offsets of the items they
  remember; tombstoned as the window moves past their bucket.
* ``A`` + ingest partition (4 bytes) + offset (8 bytes), value the attempt (4 bytes, big-endian): the
  attempt of a waiting item past its first (a retriable failure sent it back to the lanes:
  processor/core/retries.py), beside its bit in the waiting set and in the same partition. Written
  when the item is logged waiting, tombstoned when it leaves the waiting set; a waiting item without
  one is on its first attempt.
* ``W`` + partition (4 bytes) + offset (8 bytes), value ``b"1"``: one waiting item, written by
  earlier versions. Still read; a processor that adopts one rewrites it into its chunk and
  tombstones it in the same transaction.

A tombstone (null value) ends a record: the chunk has no waiting item left, the batch completed.
Items that arrive and leave within one transaction are never written at all.

Which changelog partition a record lives in is what makes state move with ingest partitions: a
waiting item's bit lives in a chunk of its *home* partition (the ingest partition it came from, or
for an item put back from a batch, the batch's partition); a batch's record lives in the partition
its in-flight slot belongs to (``processor/state/credits.py``). An instance writes only to partitions it
owns, so whoever is assigned ingest partition p restores exactly changelog partition p.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

WAITING = b"W"
WAITING_SET = b"S"
BATCH = b"B"
SEEN = b"D"
ATTEMPT = b"A"
LEGACY_RESULTS = b"R"  # results positions, written by 0.1 processors; now derived from batch records
PRESENT = b"1"
_REF = struct.Struct(">iq")
_CHUNK_KEY = struct.Struct(">iq")
_SEEN_KEY = struct.Struct(">iqI")
CHUNK_BITS = 16
"""A waiting-set record covers 2**16 consecutive offsets of one ingest partition: at most 8 KiB."""
_CHUNK_MASK = (1 << CHUNK_BITS) - 1
_CHUNK_BYTES = 1 << (CHUNK_BITS - 3)
_FIRST = struct.Struct(">H")
BATCH_FORMAT = 1
"""First byte of a binary batch entry (a JSON entry starts with ``{``)."""
_BATCH_HEAD = struct.Struct(">BiiiqBiIII")
_ATTEMPT = struct.Struct(">I")


def waiting_key(partition: int, offset: int) -> bytes:
    return WAITING + _REF.pack(partition, offset)


def chunk_key(partition: int, chunk: int) -> bytes:
    return WAITING_SET + _CHUNK_KEY.pack(partition, chunk)


def attempt_key(partition: int, offset: int) -> bytes:
    return ATTEMPT + _REF.pack(partition, offset)


def attempt_value(attempt: int) -> bytes:
    return _ATTEMPT.pack(attempt)


def seen_key(partition: int, bucket_ms: int, segment: int) -> bytes:
    return SEEN + _SEEN_KEY.pack(partition, bucket_ms, segment)


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
    attempts: tuple[int, ...] = ()
    """Each item's attempt, in ``refs`` order; empty when every item is on its first (:meth:`attempt`)."""

    def attempt(self, index: int) -> int:
        """The attempt of the item at ``refs[index]``: 1 unless ``attempts`` says otherwise."""
        return self.attempts[index] if self.attempts else 1

    def value(self) -> bytes:
        """Binary: a batch record is written once per batch and again as it is answered in part, so
        its encoding is on the hot path (JSON took a tenth of the processor's thread)."""
        n, d, r = len(self.refs), len(self.done), len(self.results_from)
        consumer = self.consumer.encode("utf-8")
        head = _BATCH_HEAD.pack(
            BATCH_FORMAT,
            self.lane,
            self.padded_length,
            self.pad_multiple,
            self.created_ms,
            self.oversized,
            self.slot,
            n,
            d,
            r,
        )
        parts = [p for p, _ in self.refs] + [o for _, o in self.refs] + list(self.done)
        parts += [p for p, _ in self.results_from] + [o for _, o in self.results_from]
        body = struct.pack(f">H{len(consumer)}s{n}i{n}q{d}I{r}i{r}q", len(consumer), consumer, *parts)
        if not self.attempts:
            return head + body
        return head + body + struct.pack(f">{n}I", *self.attempts)

    @classmethod
    def parse(cls, batch_id: str, value: bytes) -> BatchEntry:
        if value[:1] != bytes((BATCH_FORMAT,)):
            return cls._parse_json(batch_id, value)
        _v, lane, padded, pad_multiple, created, oversized, slot, n, d, r = _BATCH_HEAD.unpack_from(value)
        pos = _BATCH_HEAD.size
        (size,) = _FIRST.unpack_from(value, pos)
        layout = struct.Struct(f">{size}s{n}i{n}q{d}I{r}i{r}q")
        consumer, *parts = layout.unpack_from(value, pos + 2)
        tail = pos + 2 + layout.size  # the attempts, when some item is past its first
        attempts = struct.unpack_from(f">{n}I", value, tail) if len(value) >= tail + 4 * n > tail else ()
        refs = tuple(zip(parts[:n], parts[n : 2 * n], strict=True))
        done = tuple(parts[2 * n : 2 * n + d])
        results = parts[2 * n + d :]
        return cls(
            batch_id,
            consumer.decode("utf-8"),
            lane,
            padded,
            pad_multiple,
            created,
            bool(oversized),
            refs,
            slot,
            done,
            tuple(zip(results[:r], results[r:], strict=True)),
            attempts,
        )

    @classmethod
    def _parse_json(cls, batch_id: str, value: bytes) -> BatchEntry:
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


ChunkId = tuple[int, int, int]
"""(changelog partition, ingest partition, chunk): where a waiting item's bit is recorded."""

_BITS = tuple(tuple(i for i in range(8) if b >> i & 1) for b in range(256))


def _chunk_value(bitmap: bytes | bytearray) -> bytes | None:
    """A bitmap without its leading and trailing zero bytes, after the index of its first byte kept;
    None when nothing is set."""
    stripped = bitmap.rstrip(b"\0")
    kept = stripped.lstrip(b"\0")
    if not kept:
        return None
    return _FIRST.pack(len(stripped) - len(kept)) + kept


def _chunk_offsets(partition: int, chunk: int, value: bytes) -> list[tuple[int, int]]:
    (first,) = _FIRST.unpack_from(value)
    base = (chunk << CHUNK_BITS) + 8 * first
    out: list[tuple[int, int]] = []
    for i, b in enumerate(value[2:]):
        if b:
            at = base + 8 * i
            out.extend((partition, at + j) for j in _BITS[b])
    return out


def _chunk_order(entry: tuple[ChunkId, bytes]) -> tuple[int, int]:
    (_home, ingest, chunk), _value = entry
    return ingest, chunk


class Placed(Protocol):
    """A waiting item as the waiting sets see it (``commit.IngestItem`` is one)."""

    @property
    def home(self) -> int: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


class WaitingRef(NamedTuple):
    home: int
    partition: int
    offset: int


class WaitingSets:
    """The committed waiting items, kept as one bitmap per :data:`ChunkId`, and the chunks changed
    since the last :meth:`flush`. Adding or removing an item is a bit flip; a transaction writes one
    record per changed chunk (or its tombstone, once the chunk is empty)."""

    def __init__(self) -> None:
        self._chunks: dict[ChunkId, bytearray] = {}
        self._dirty: set[ChunkId] = set()
        self._legacy: list[tuple[int, tuple[int, int]]] = []

    def __len__(self) -> int:
        return sum(int.from_bytes(bm, "little").bit_count() for bm in self._chunks.values())

    def add_all(self, items: Iterable[Placed]) -> None:
        """Set the bit of each item (in bulk: the commit marks thousands of items at a time). Items
        come in runs of one chunk (a poll's consecutive offsets): a chunk is looked up when it changes."""
        chunks, dirty = self._chunks, self._dirty
        home: int | None = None
        partition: int | None = None
        chunk: int | None = None
        bitmap = bytearray()
        for it in items:
            offset = it.offset
            if offset >> CHUNK_BITS != chunk or it.partition != partition or it.home != home:
                home, partition, chunk = it.home, it.partition, offset >> CHUNK_BITS
                cid = (home, partition, chunk)
                got = chunks.get(cid)
                bitmap = chunks[cid] = bytearray(_CHUNK_BYTES) if got is None else got
                dirty.add(cid)
            i = offset & _CHUNK_MASK
            bitmap[i >> 3] |= 1 << (i & 7)

    def discard_all(self, items: Iterable[Placed]) -> None:
        chunks, dirty = self._chunks, self._dirty
        for it in items:
            offset = it.offset
            cid = (it.home, it.partition, offset >> CHUNK_BITS)
            bitmap = chunks.get(cid)
            if bitmap is not None:
                i = offset & _CHUNK_MASK
                bitmap[i >> 3] &= ~(1 << (i & 7)) & 0xFF
                dirty.add(cid)

    def load(self, state: ChangelogState) -> None:
        """Take over what restore read: the chunks as committed (nothing to write), and each legacy
        ``W`` record as a bit to write and a tombstone for the record (:meth:`flush`)."""
        for (home, partition, chunk), value in state.chunks.items():
            bitmap = self._chunks[(home, partition, chunk)] = bytearray(_CHUNK_BYTES)
            (first,) = _FIRST.unpack_from(value)
            bitmap[first : first + len(value) - 2] = value[2:]
        self.add_all(WaitingRef(home, *ref) for ref, home in state.legacy_waiting.items())
        self._legacy.extend((home, ref) for ref, home in state.legacy_waiting.items())

    def flush(self) -> list[tuple[int, bytes, bytes | None]]:
        """(changelog partition, key, value or None) for every chunk changed since the last flush."""
        out: list[tuple[int, bytes, bytes | None]] = []
        for cid in self._dirty:
            home, partition, chunk = cid
            value = _chunk_value(self._chunks[cid])
            if value is None:
                del self._chunks[cid]
            out.append((home, chunk_key(partition, chunk), value))
        out.extend((home, waiting_key(*ref), None) for home, ref in self._legacy)
        self._dirty.clear()
        self._legacy.clear()
        return out

    def clear(self) -> None:
        self._chunks.clear()
        self._dirty.clear()
        self._legacy.clear()

    def forget(self, homes: Collection[int]) -> None:
        """Drop the chunks of the changelog partitions ``homes`` (handed over, just after a commit:
        nothing of theirs is left to flush); the other partitions' chunks stay as they are."""
        unflushed = [cid for cid in self._dirty if cid[0] in homes] + [
            r for r in self._legacy if r[0] in homes
        ]
        if unflushed:
            raise RuntimeError(
                f"changelog partitions {sorted(homes)}: let go with unflushed changes {unflushed[:3]}"
            )
        for cid in [cid for cid in self._chunks if cid[0] in homes]:
            del self._chunks[cid]


class ChangelogState:
    """Folds changelog records (in log order per partition) into the waiting refs and open batches.

    ``waiting`` maps each waiting item's ingest ref to its home (the changelog partition its record
    lives in); ``homes`` maps each open batch to its partition. A tombstone only ends a record in its
    own partition, so reading partitions in any order gives the same state.
    """

    def __init__(self) -> None:
        self.chunks: dict[ChunkId, bytes] = {}
        self.legacy_waiting: dict[tuple[int, int], int] = {}
        self.batches: dict[str, BatchEntry] = {}
        self.homes: dict[str, int] = {}
        self.attempts: dict[tuple[int, int], tuple[int, int]] = {}
        """Each waiting item past its first attempt: its ingest ref, to (home, attempt) (``A`` records)."""
        self.seen: dict[tuple[int, int, int], bytes] = {}
        """Seen-id records by (ingest partition, bucket start ms, segment) (``processor/state/seen.py``)."""
        self.records = 0
        self._waiting: dict[tuple[int, int], int] | None = None

    def apply(self, key: bytes, value: bytes | None, partition: int = 0) -> None:
        self.records += 1
        kind = key[:1]
        if kind == WAITING_SET:
            ingest, chunk = _CHUNK_KEY.unpack(key[1:])
            if value is not None:
                self.chunks[(partition, ingest, chunk)] = value
            else:
                self.chunks.pop((partition, ingest, chunk), None)
            self._waiting = None
        elif kind == BATCH:
            batch_id = key[1:].decode("utf-8")
            if value is not None:
                self.batches[batch_id] = BatchEntry.parse(batch_id, value)
                self.homes[batch_id] = partition
            elif self.homes.get(batch_id) == partition:
                del self.batches[batch_id]
                del self.homes[batch_id]
        elif kind == WAITING:
            ref: tuple[int, int] = _REF.unpack(key[1:])
            if value is not None:
                self.legacy_waiting[ref] = partition
            elif self.legacy_waiting.get(ref) == partition:
                del self.legacy_waiting[ref]
            self._waiting = None
        elif kind == ATTEMPT:
            at: tuple[int, int] = _REF.unpack(key[1:])
            if value is not None:
                self.attempts[at] = (partition, _ATTEMPT.unpack(value)[0])
            elif self.attempts.get(at, (None, 0))[0] == partition:
                del self.attempts[at]
        elif kind == SEEN:
            ref3: tuple[int, int, int] = _SEEN_KEY.unpack(key[1:])
            if value is not None:
                self.seen[ref3] = value
            else:
                self.seen.pop(ref3, None)
        elif kind == LEGACY_RESULTS:
            return
        else:
            raise ValueError(f"changelog: unknown record kind {kind!r} in key {key!r}")

    @property
    def waiting(self) -> dict[tuple[int, int], int]:
        """Every waiting item's ingest ref, with its home: the chunks' bits and any legacy records."""
        if self._waiting is None:
            waiting = dict(self.legacy_waiting)
            # in (partition, offset) order, so that sorting the result (restore does) is a linear pass
            for (home, ingest, chunk), value in sorted(self.chunks.items(), key=_chunk_order):
                waiting.update(dict.fromkeys(_chunk_offsets(ingest, chunk, value), home))
            self._waiting = waiting
        return self._waiting

    def attempt_of(self, ref: tuple[int, int]) -> int:
        """The attempt of the waiting item at ingest ``ref``: 1 without an ``A`` record."""
        found = self.attempts.get(ref)
        return 1 if found is None else found[1]

    def batch_refs(self) -> set[tuple[int, int]]:
        """The ingest messages of the open batches' items."""
        out: set[tuple[int, int]] = set()
        for entry in self.batches.values():
            out.update(entry.refs)
        return out
