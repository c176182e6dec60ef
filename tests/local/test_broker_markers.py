"""The broker-fault checks of tests/broker/markers.py on DumpLogSegments lines and broker log lines as
Kafka 4.4 prints them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.markers import (
    STALLED_S,
    _gaps,
    skipped_markers,
    xfail_if_stalled_by_broker,
)


def batch(offset: int, pid: int, epoch: int, control: bool) -> str:
    return (
        f"baseOffset: {offset} lastOffset: {offset} count: 1 baseSequence: 0 lastSequence: 0 "
        f"producerId: {pid} producerEpoch: {epoch} partitionLeaderEpoch: 0 isTransactional: true "
        f"isControl: {str(control).lower()} deleteHorizonMs: OptionalLong.empty position: 0\n"
    )


def test_a_transaction_left_without_its_marker_until_a_later_epoch_is_a_gap() -> None:
    # as found after a broker restart: producer 1's data at 68 has no marker; epoch 2 writes at 73
    dump = batch(66, 1, 0, False) + batch(67, 1, 0, True) + batch(68, 1, 0, False)
    dump += batch(69, 2, 2, False) + batch(70, 2, 2, True) + batch(73, 1, 2, False) + batch(74, 1, 2, True)
    assert _gaps(dump) == ["producer 1 epoch 0 wrote at 68, then epoch 2 at 73"]


def test_committed_and_aborted_transactions_leave_no_gap() -> None:
    dump = batch(0, 1, 0, False) + batch(1, 1, 0, True) + batch(2, 1, 0, False) + batch(3, 1, 1, True)
    dump += batch(4, 1, 1, False) + batch(5, 1, 1, True)  # aborted by a fence (epoch 1), then a new one
    assert _gaps(dump) == []


SKIPPED = (
    "[2026-12-06 15:12:55,830] INFO [Transaction Marker Channel Manager 1]: Couldn't find leader endpoint "
    "for partitions HashSet(__consumer_offsets-0, ff0792dc2.accounting-0) while trying to send transaction "
    "markers for ff0792dc2-proc-p0, these partitions are likely deleted already and hence can be skipped "
    "(kafka.coordinator.transaction.TransactionMarkerChannelManager)\n"
    "[2026-12-06 15:12:56,081] INFO [Transaction Marker Channel Manager 1]: Couldn't find leader endpoint "
    "for partitions Set(ff0792dc2.results-1) while trying to send transaction markers for "
    "ff0792dc2-consumer-small, these partitions are likely deleted already and hence can be skipped "
    "(kafka.coordinator.transaction.TransactionMarkerChannelManager)\n"
)


def test_the_brokers_skipped_markers_are_read_from_this_run_and_the_one_before_a_restart(
    tmp_path: Path,
) -> None:
    # lines as a Kafka 4.4 broker logged them in restarts whose processor then stalled (a Set or a
    # HashSet, by how many partitions it names)
    (tmp_path / "server.previous.log").write_text(SKIPPED.splitlines(keepends=True)[1])
    (tmp_path / "server.log").write_text("[2026-12-06] INFO unrelated\n" + SKIPPED.splitlines()[0] + "\n")
    assert skipped_markers(tmp_path) == [
        "ff0792dc2-consumer-small: ff0792dc2.results-1",
        "ff0792dc2-proc-p0: __consumer_offsets-0, ff0792dc2.accounting-0",
    ]


def test_a_stall_is_blamed_on_the_broker_only_when_long_and_the_broker_skipped_markers(
    tmp_path: Path,
) -> None:
    (tmp_path / "server.log").write_text("[2026-12-06] INFO unrelated\n")
    xfail_if_stalled_by_broker(tmp_path, STALLED_S * 2)  # returns: nothing to blame
    (tmp_path / "server.log").write_text(SKIPPED)
    xfail_if_stalled_by_broker(tmp_path, STALLED_S - 1)  # returns: not stalled long enough
    with pytest.raises(pytest.xfail.Exception, match="ff0792dc2-proc-p0"):
        xfail_if_stalled_by_broker(tmp_path, STALLED_S)
