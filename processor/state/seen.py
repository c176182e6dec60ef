"""The item ids an ingest partition has taken within the dedupe window: how a producer's repeat is
recognised, remembered compactly, written to the changelog and restored.

Pure: no Kafka, no clock. The caller passes ``now_ms`` (wall-clock milliseconds) to every call, and
the changelog records to write come back as values, so the exactly-once lane log writes them in the
transaction that commits the offsets of the items they remember (docs/reliability.md, "Producer repeats").

Invariants:

* An id is remembered from the ``now_ms`` it was first seen for at least ``window_ms`` and at most
  ``window_ms`` plus one bucket (``window_ms / BUCKETS``): ids are kept in time buckets and forgotten
  a whole bucket at a time. Buckets never go back in time (a wall clock that steps back keeps filling
  the latest bucket), so the live buckets are consecutive and fewer than 255, and a bucket's tag
  (its index modulo 255, plus one) names it alone. Only records restored under a much narrower
  window than they were written with can share a tag with a live bucket until the first flush has
  expired them; forgetting one then forgets the other too: early, never wrongly.
* With ``max_ids`` set, a partition remembers at most that many ids after each flush: past it, the
  oldest buckets are forgotten early (counted in ``evicted``), so memory stays bounded whatever the
  traffic; the window is then shorter than ``window_ms``.
* An id is remembered as its 64-bit xxh3 hash. Two different ids within one partition's window are
  taken for one with probability about n²/2⁶⁵ (10 million ids: 3 in a million); such an item is
  dead-lettered whole, never lost.
* The memory is one open-addressing table per partition: an ``array('Q')`` of hashes (0 is empty)
  and a ``bytearray`` of bucket tags beside it, 9 bytes a slot, between 1/2 and 3/4 full (it grows
  by half: 12 to 18 bytes per remembered id, plus a little; benchmarks/bench_dedupe.py). Linear
  probing (home slot: the hash modulo the table size) with backward-shift deletion, so forgetting
  leaves no tombstones.

Changelog records (:func:`processor.state.changelog.seen_key`): one per partition, bucket and segment,
its value a format byte and the bucket's hashes as little-endian uint64. Each commit appends one
segment per bucket that took new ids; once a bucket is no longer the current one its segments are
merged into as few records as :data:`RECORD_IDS` allows (the old ones tombstoned in the same
transaction), and when it expires every record of it is tombstoned. A key names its bucket by the
bucket's start in milliseconds, not its index, so a processor restarted with another window reads
the records it restores in its own buckets.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import xxhash

from processor.state.changelog import seen_key

BUCKETS = 64
"""The window is remembered in this many buckets: an id is kept up to 1/64 of the window longer."""
RECORD_IDS = 32_768
"""Most hashes in one changelog record (256 KiB), well under the broker's 1 MiB message limit."""
SEEN_FORMAT = 1
"""First byte of a seen-ids record's value."""
_MIN_SLOTS = 1024
_EMPTY = 0
_BIG_ENDIAN = sys.byteorder == "big"


def id_hash(item_id: str) -> int:
    """The 64-bit hash an id is remembered by; never 0 (the table's empty slot)."""
    return xxhash.xxh3_64_intdigest(item_id.encode("utf-8")) or 1


def _pack(hashes: array[int]) -> bytes:
    if _BIG_ENDIAN:
        hashes = array("Q", hashes)
        hashes.byteswap()
    return bytes((SEEN_FORMAT,)) + hashes.tobytes()


def unpack_seen(value: bytes) -> array[int]:
    """The hashes of one seen-ids record."""
    if value[:1] != bytes((SEEN_FORMAT,)):
        raise ValueError(f"changelog: unknown seen-ids record format {value[:1]!r}")
    out = array("Q")
    out.frombytes(value[1:])
    if _BIG_ENDIAN:
        out.byteswap()
    return out


def _positions(tags: bytearray, tag: bytes) -> Iterable[int]:
    """Every index of ``tag`` in ``tags`` (found by ``bytearray.find``, in C)."""
    i = tags.find(tag)
    while i >= 0:
        yield i
        i = tags.find(tag, i + 1)


@dataclass(slots=True)
class _Bucket:
    keys: list[bytes] = field(default_factory=list)
    """The changelog keys of the bucket's live records."""
    next_segment: int = 0
    """The segment number of the next record this bucket writes."""
    size: int = 0
    """Ids remembered in this bucket."""

    def merged(self) -> bool:
        return len(self.keys) <= -(-self.size // RECORD_IDS)


Record = tuple[bytes, bytes | None]
"""A changelog key and its value (None: a tombstone)."""


class SeenIds:
    """One ingest partition's remembered ids."""

    def __init__(self, partition: int, window_ms: int, max_ids: int = 0) -> None:
        if window_ms < 1:
            raise ValueError(f"the dedupe window must be >= 1 ms, not {window_ms}")
        if max_ids < 0:
            raise ValueError(f"the most ids to remember must be >= 0 (0: no cap), not {max_ids}")
        self.partition = partition
        self.window_ms = window_ms
        self.max_ids = max_ids
        self.evicted = 0
        """Ids forgotten before their window ended, to stay within ``max_ids``."""
        self.bucket_ms = -(-window_ms // BUCKETS)
        self.count = 0
        self._buckets: dict[int, _Bucket] = {}
        self._new: dict[int, array[int]] = {}
        self._latest = -(1 << 62)
        self._open = self._latest
        self._open_ids = array("Q")
        self._resize(_MIN_SLOTS)

    def __len__(self) -> int:
        return self.count

    @property
    def slots(self) -> int:
        return len(self._table)

    def _resize(self, slots: int) -> None:
        old_table, old_tags = getattr(self, "_table", None), getattr(self, "_tags", None)
        self._table = array("Q", bytes(8 * slots))
        self._tags = bytearray(slots)
        self._n = slots
        self.count = 0
        if old_table is None or old_tags is None:
            return
        for tag in set(old_tags) - {0}:
            tb = bytes((tag,))
            self._insert_all(array("Q", (old_table[i] for i in _positions(old_tags, tb))), tag)

    def _reserve(self, more: int) -> None:
        need = self.count + more
        slots = len(self._table)
        if need * 4 <= slots * 3:
            return
        while need * 4 > slots * 3:
            slots = slots * 3 // 2
        self._resize(slots)

    def _insert(self, h: int, tag: int) -> bool:
        """Put ``h`` in the table unless it is there; True when it was not."""
        table, n = self._table, self._n
        i = h % n
        while True:
            v = table[i]
            if v == h:
                return False
            if v == _EMPTY:
                table[i] = h
                self._tags[i] = tag
                self.count += 1
                return True
            i += 1
            if i == n:
                i = 0

    def __contains__(self, h: int) -> bool:
        table, n = self._table, self._n
        i = h % n
        while True:
            v = table[i]
            if v == h:
                return True
            if v == _EMPTY:
                return False
            i += 1
            if i == n:
                i = 0

    def _bucket_at(self, now_ms: int) -> int:
        b = max(now_ms // self.bucket_ms, self._latest)
        self._latest = b
        return b

    def first(self, h: int, now_ms: int) -> bool:
        """Remember ``h`` as seen at ``now_ms``; True if it is new, False if it is a repeat."""
        table, n = self._table, self._n
        i = h % n
        v = table[i]
        while v:
            if v == h:
                return False
            i += 1
            if i == n:
                i = 0
            v = table[i]
        b = now_ms // self.bucket_ms
        if b < self._latest:
            b = self._latest
        else:
            self._latest = b
        tag = b % 255 + 1
        if (self.count + 1) * 4 > len(table) * 3:
            self._reserve(1)
            self._insert(h, tag)
        else:
            table[i] = h
            self._tags[i] = tag
            self.count += 1
        if b != self._open:
            self._open_new(b)
        self._open_ids.append(h)
        return True

    def _open_new(self, b: int) -> None:
        """Ids seen from now on go to bucket ``b`` (kept apart so that ``first`` appends only)."""
        new = self._new.get(b)
        if new is None:
            new = self._new[b] = array("Q")
            if b not in self._buckets:
                self._buckets[b] = _Bucket()
        self._open, self._open_ids = b, new

    # -- forgetting -----------------------------------------------------------------------------

    def _delete_at(self, i: int) -> None:
        """Empty slot ``i`` and shift back the entries after it that probed past it."""
        table, tags, n = self._table, self._tags, self._n
        j = i
        while True:
            j += 1
            if j == n:
                j = 0
            h = table[j]
            if h == _EMPTY:
                break
            k = h % n  # the entry's home slot: it may fill the hole unless k lies in (i, j]
            if (k <= i or k > j) if i < j else (k <= i and k > j):
                table[i] = h
                tags[i] = tags[j]
                i = j
        table[i] = _EMPTY
        tags[i] = 0
        self.count -= 1

    def _slots_of(self, b: int) -> Iterable[int]:
        return _positions(self._tags, bytes((b % 255 + 1,)))

    def _forget(self, b: int) -> None:
        tag, tags = bytes((b % 255 + 1,)), self._tags
        i = tags.find(tag)
        while i >= 0:
            self._delete_at(i)  # may shift another of this bucket's entries into i
            i = tags.find(tag, i)
            if i < 0:
                i = tags.find(tag)  # an entry that wrapped past the end moved before where we were

    def _hashes_of(self, b: int) -> array[int]:
        table = self._table
        return array("Q", (table[i] for i in self._slots_of(b)))

    # -- the changelog --------------------------------------------------------------------------

    def flush(self, now_ms: int) -> list[Record]:
        """The records that make the changelog match memory: expired buckets forgotten and
        tombstoned, the ids seen since the last flush appended, closed buckets merged."""
        out: list[Record] = []
        current = self._bucket_at(now_ms)
        horizon = now_ms - self.window_ms
        for b, hashes in self._new.items():
            self._buckets[b].size += len(hashes)
        self._open = -(1 << 62)  # the next id opens its bucket's list again
        for b in sorted(self._buckets):
            over = self.max_ids and self.count > self.max_ids
            if (b + 1) * self.bucket_ms > horizon and not over:
                break
            bucket = self._buckets.pop(b)
            self._new.pop(b, None)
            self._forget(b)
            if (b + 1) * self.bucket_ms > horizon:
                self.evicted += bucket.size
            out.extend((key, None) for key in bucket.keys)
        for b, hashes in self._new.items():
            out.extend(self._segments(b, self._buckets[b], hashes))
        self._new.clear()
        for b, bucket in self._buckets.items():
            if b < current and not bucket.merged():
                out.extend(self._merge(b, bucket))
        if self.count * 8 < len(self._table) and len(self._table) > _MIN_SLOTS:
            slots = len(self._table)
            while self.count * 8 < slots and slots > _MIN_SLOTS:
                slots = max(_MIN_SLOTS, slots // 2)
            self._resize(slots)
        return out

    def _merge(self, b: int, bucket: _Bucket) -> list[Record]:
        hashes = self._hashes_of(b)
        out: list[Record] = [(key, None) for key in bucket.keys]
        bucket.keys = []
        return out + self._segments(b, bucket, hashes)

    def _segments(self, b: int, bucket: _Bucket, hashes: array[int]) -> list[Record]:
        """``hashes`` as the bucket's next segments, at most :data:`RECORD_IDS` each."""
        out: list[Record] = []
        for start in range(0, len(hashes), RECORD_IDS):
            key = seen_key(self.partition, b * self.bucket_ms, bucket.next_segment)
            bucket.keys.append(key)
            bucket.next_segment += 1
            out.append((key, _pack(hashes[start : start + RECORD_IDS])))
        return out

    def load(self, records: Iterable[tuple[int, int, bytes]]) -> None:
        """Take over committed records, (bucket start ms, segment, value) each: what restore read."""
        parts = [(start, s, unpack_seen(v)) for start, s, v in records]
        self._reserve(sum(len(h) for _, _, h in parts))
        for start, s, hashes in sorted(parts, key=lambda r: (r[0], r[1])):
            b = start // self.bucket_ms
            bucket = self._buckets.get(b)
            if bucket is None:
                bucket = self._buckets[b] = _Bucket()
            bucket.keys.append(seen_key(self.partition, start, s))
            if start == b * self.bucket_ms:  # where this bucket writes: never reuse a live key
                bucket.next_segment = max(bucket.next_segment, s + 1)
            bucket.size += self._insert_all(hashes, b % 255 + 1)
            self._latest = max(self._latest, b)

    def _insert_all(self, hashes: array[int], tag: int) -> int:
        """:meth:`_insert` inlined for a whole record (restore's loop); how many were new."""
        table, tags, n = self._table, self._tags, self._n
        added = 0
        for h in hashes:
            i = h % n
            v = table[i]
            while v:
                if v == h:
                    break
                i += 1
                if i == n:
                    i = 0
                v = table[i]
            else:
                table[i] = h
                tags[i] = tag
                added += 1
        self.count += added
        return added


class SeenBook:
    """The remembered ids of every ingest partition this processor owns."""

    def __init__(self, window_ms: int, max_ids: int = 0) -> None:
        self.window_ms = window_ms
        self.max_ids = max_ids
        self.partitions: dict[int, SeenIds] = {}

    def __len__(self) -> int:
        return sum(len(s) for s in self.partitions.values())

    def _of(self, partition: int) -> SeenIds:
        seen = self.partitions.get(partition)
        if seen is None:
            seen = self.partitions[partition] = SeenIds(partition, self.window_ms, self.max_ids)
        return seen

    def first(self, partition: int, item_id: str, now_ms: int) -> bool:
        """True the first time ``item_id`` arrives in ``partition`` within the window."""
        return self.first_at(now_ms)(partition, item_id)

    def first_at(self, now_ms: int) -> Callable[[int, str], bool]:
        """:meth:`first` with ``now_ms`` bound: one call per id instead of three (the hot path)."""
        partitions, of, digest = self.partitions, self._of, xxhash.xxh3_64_intdigest

        def first(partition: int, item_id: str) -> bool:
            seen = partitions.get(partition)
            if seen is None:
                seen = of(partition)
            return seen.first(digest(item_id.encode("utf-8")) or 1, now_ms)  # id_hash, inlined

        return first

    def flush(self, now_ms: int) -> list[tuple[int, bytes, bytes | None]]:
        """(changelog partition, key, value) for every record to write: see :meth:`SeenIds.flush`."""
        return [(p, k, v) for p, seen in self.partitions.items() for k, v in seen.flush(now_ms)]

    def load(self, records: dict[tuple[int, int, int], bytes]) -> None:
        """Records as restore folded them: (ingest partition, bucket start ms, segment) -> value."""
        by_partition: dict[int, list[tuple[int, int, bytes]]] = {}
        for (p, b, s), v in records.items():
            by_partition.setdefault(p, []).append((b, s, v))
        for p, recs in by_partition.items():
            self._of(p).load(recs)

    def clear(self) -> None:
        self.partitions.clear()

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop what ``partitions`` remember (they were handed over; their next owner restores it)."""
        for p in partitions:
            self.partitions.pop(p, None)
