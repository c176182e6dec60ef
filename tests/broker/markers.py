"""What the broker kept of each transaction, read from its own log segments (Kafka's DumpLogSegments).

Why: items completed twice after a broker restart, and once after a 20 s freeze, with every
tokenfabric process behaving. The segments showed why: a consumer transaction that ended (committed,
or aborted) while the one broker was fenced by its own controller had no marker in its results
partition nor in ``__consumer_offsets``. The broker's log says it: ``Couldn't find leader endpoint
for partitions ... these partitions are likely deleted already and hence can be skipped``: the
transaction coordinator skips the markers of partitions with no leader, and on one node a fenced
broker leaves every partition without one. The open completions were then committed by the same
producer's next COMMIT marker, and the batch, whose offset never committed, ran again. A broker fault
is not a tokenfabric one: :func:`exactly_once_or_broker_fault` tells the two apart.

The same skip can stall a run for good (:func:`xfail_if_stalled_by_broker`), seen three ways:
- a processor's offset commit left pending: the group's offsets stay "unstable" (KIP-447), and its
  restore's read of them times out again and again, until that producer commits again, which it
  never does before its restore;
- a consumer app's offset commit left pending: its new batch consumer, reading committed offsets
  the same way, never starts, so it never writes the results partition again;
- a consumer's completions left open at the end of a results partition: the processor's
  ``read_committed`` reader stops at that partition's last stable offset, so the completions after
  it are never booked and the consumers' slots stay taken.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from processor.local.broker_files import java_executable
from processor.local.jars import jars_dir

_BATCH = re.compile(
    r"baseOffset: (\d+) .*?producerId: (-?\d+) producerEpoch: (\d+) .*?isTransactional: (\w+) "
    r"isControl: (\w+)"
)


def missing_markers(
    data_dir: Path, topics: tuple[str, ...] = ("results", "batches", "__consumer_offsets")
) -> list[str]:
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


_SKIPPED = re.compile(
    r"Couldn't find leader endpoint for partitions \w*Set\(([^)]*)\) while trying to send transaction "
    r"markers for (\S+), these partitions are likely deleted already and hence can be skipped"
)


def skipped_markers(log_dir: Path) -> list[str]:
    """What the broker says it skipped, from its logs (this run's and the one before a restart):
    ``transactional id: partitions`` for each transaction whose markers found no leader."""
    said: list[str] = []
    for log in (log_dir / "server.previous.log", log_dir / "server.log"):  # processor.local.broker
        if log.exists():
            said += [f"{m[2]}: {m[1]}" for m in _SKIPPED.finditer(log.read_text(errors="replace"))]
    return said


#: A stretch without a completion this long is a stall worth blaming on the broker, when its log says so.
STALLED_S = 120.0


def xfail_if_stalled_by_broker(log_dir: Path, stall_s: float) -> None:
    """An expected failure when nothing completed for :data:`STALLED_S` and the broker's log says it
    skipped transaction markers: the run cannot end (see the module's docstring), and waiting out the
    test's timeout would only cost CI minutes."""
    if stall_s < STALLED_S:
        return
    skipped = skipped_markers(log_dir)
    if skipped:
        pytest.xfail(f"no completion for {stall_s:.0f} s: the broker skipped the markers of {skipped[:2]}")


def exactly_once_or_broker_fault(check: Callable[[], None], data_dir: Path) -> None:
    """Run the exactly-once ``check``; an item dispatched or completed twice where the broker skipped
    markers is recorded as an expected failure naming the gaps, anything else fails as it is."""
    try:
        check()
    except AssertionError as failed:
        if "twice" not in str(failed):
            raise
        gaps = missing_markers(data_dir) or skipped_markers(data_dir.parent / "logs")
        if gaps:
            pytest.xfail(f"the broker skipped transaction markers while it was fenced: {gaps[:3]}")
        raise
