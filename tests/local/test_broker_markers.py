"""The marker-gap check of tests/broker/markers.py on DumpLogSegments lines as Kafka 4.4 prints them."""

from __future__ import annotations

from tests.broker.markers import _gaps


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
