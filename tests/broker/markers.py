"""What the broker kept of each transaction, read from its own log segments (Kafka's DumpLogSegments).

Why: an item completed twice after a broker restart, with every tokenfabric process behaving. The
segments showed why: a consumer transaction committed just before the restart (``CompleteCommit`` in
the transaction log) had no COMMIT marker in its results partition nor in ``__consumer_offsets``
afterwards. Its offsets were therefore never committed, so the batch ran again; and its completions,
left open, were committed by the same producer's next COMMIT marker, of a later epoch. A broker fault
is not a tokenfabric one: the restart test tells the two apart with :func:`missing_markers`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from processor.local.broker_files import java_executable
from processor.local.jars import jars_dir

_BATCH = re.compile(
    r"baseOffset: (\d+) .*?producerId: (-?\d+) producerEpoch: (\d+) .*?isTransactional: (\w+) "
    r"isControl: (\w+)"
)


def missing_markers(data_dir: Path, topics: tuple[str, ...] = ("results", "__consumer_offsets")) -> list[str]:
    """Transactional data the broker holds with no marker before a later epoch of the same producer
    wrote again, in the partitions whose names contain one of ``topics``: each such place is a
    transaction that was neither committed nor aborted where it was written."""
    gaps: list[str] = []
    parts = sorted(p for p in data_dir.iterdir() if p.is_dir() and any(t in p.name for t in topics))
    for part in parts:
        for segment in sorted(part.glob("*.log")):
            gaps += [f"{part.name}: {gap}" for gap in _gaps(_dump(segment))]
    return gaps


def _dump(segment: Path) -> str:
    classpath = f"{jars_dir()}/*"
    tool = "org.apache.kafka.tools.DumpLogSegments"
    command = [java_executable(), "-cp", classpath, tool, "--files", str(segment)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


def _gaps(dump: str) -> list[str]:
    gaps: list[str] = []
    unmarked: dict[int, tuple[int, int]] = {}  # producer id -> (epoch, first offset) written, no marker yet
    for m in _BATCH.finditer(dump):
        offset, pid, epoch = int(m[1]), int(m[2]), int(m[3])
        if m[4] != "true":
            continue
        if m[5] == "true":  # a COMMIT or ABORT marker ends the producer's transaction here
            unmarked.pop(pid, None)
            continue
        held = unmarked.get(pid)
        if held is not None and held[0] != epoch:
            gaps.append(f"producer {pid} epoch {held[0]} wrote at {held[1]}, then epoch {epoch} at {offset}")
        if held is None or held[0] != epoch:
            unmarked[pid] = (epoch, offset)
    return gaps
