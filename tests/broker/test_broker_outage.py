"""The broker freezes under load; every process rides it out without exiting (issue 36).

A broker frozen with SIGSTOP keeps its connections open and answers nothing: transactions and
messages time out, the transaction coordinator vanishes mid-commit. The processors, both consumers,
the collector and ``status --watch`` must stay up (no exit, and no supervisor here to restart
them); the apps say once that Kafka is away and once that it is back (status says it on each
refresh), resume by themselves from their last commit, and the run must end exactly once with a
clean audit (processor/apps/ride.py).

In CI the freeze lasts :data:`FROZEN_S` (20 s: past the processor's 10 s transaction timeout, so
its open transactions die; short enough for CI), with one processor. The issue's own case, a broker
frozen 45 s and then restarted on the same port with its data, under 2 processors and 2 consumers,
runs with ``TOKENFABRIC_OUTAGE_FULL=1`` (about 2 minutes; docs/operations.md has its result).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from processor.local import broker as kafka_local
from processor.ops.alerts import AlertSettings, render
from tests.broker.markers import exactly_once_or_broker_fault, xfail_if_stalled_by_broker
from tests.broker.rig import CARDS, Rig, assert_exactly_once, produce_paced, running_rig, tails
from tests.broker.test_alerts import await_alert, find, free_port, prometheus

pytestmark = pytest.mark.kafka
log = logging.getLogger(__name__)

FROZEN_S = 20.0
INFO = ("--log-level", "INFO")
#: The ride, as by default (processor/apps/ride.py, OUTAGE_EXIT_S), said here so the test keeps it.
RIDE = ("--outage-exit-s", "300")


def complete_without_exits(rig: Rig, n: int, timeout_s: float, broker_logs: Path) -> float:
    """Wait until ``n`` items completed, failing as soon as any process exits; returns the longest
    stretch without a new completion. A stall the broker's logs (``broker_logs``) blame on skipped
    markers is an expected failure (tests.broker.markers)."""
    started = last = time.monotonic()
    done, stall = 0, 0.0
    while done < n:
        exited = {name: p.poll() for name, p in rig.pipeline.procs.items() if p.poll() is not None}
        assert not exited, f"exited during the outage: {exited}; {tails(rig)}"
        assert time.monotonic() - started < timeout_s, f"only {done:,} of {n:,} completed; {tails(rig)}"
        time.sleep(0.5)
        try:
            now_done = rig.completed()
        except KafkaException:  # this test's own reader, just after the broker came back
            continue
        if now_done > done:
            stall, last, done = max(stall, time.monotonic() - last), time.monotonic(), now_done
        xfail_if_stalled_by_broker(broker_logs, time.monotonic() - last)
    return stall


def ride_out(
    state: Path,
    rig: Rig,
    tmp_path: Path,
    processors: int,
    items: int,
    frozen_s: float,
    restart: bool,
    protocol: str = "consumer",
) -> dict[str, str]:
    """The scenario: consumers and processors (on group ``protocol``) under paced load, the broker
    frozen mid-run (and, with ``restart``, replaced), then every item completes once with no process
    exiting; returns each process's log. A real
    Prometheus scrapes processor0 every second with the shipped rules (a 2 s ``broker_away_for_s``):
    TokenfabricBrokerUnreachable must fire while the broker is away, as no target goes down."""
    for contract in CARDS:
        rig.spawn_consumer(contract.consumer, contract, overhead_ms=5, extra=(*INFO, *RIDE))
    ids, tokens, producer = produce_paced(rig, items, seed=36, seconds=15)
    metrics = free_port()
    for i in range(processors):
        port = ("--metrics-port", str(metrics)) if i == 0 else ()
        extra = (*INFO, *RIDE, "--group-protocol", protocol, *port)
        rig.spawn_processor(f"processor{i}", instance=f"p{i}", extra=extra)
    rig.spawn("status", ["status", *rig.pipeline_args(), "--watch", "--interval-s", "2"])
    where = rig.pipeline_args()[:4]  # the collector has no --group
    rig.spawn("collector", ["collector", *where, "--out-dir", str(tmp_path / "out"), *INFO, *RIDE])
    rig.wait_completed(items // 10, timeout_s=120)  # mid-run: batches in flight, items waiting
    home = tmp_path / "prometheus"
    home.mkdir()
    rules = render(AlertSettings(broker_away_for_s=2))
    with prometheus(home, {"tokenfabric-processor": [f"127.0.0.1:{metrics}"]}, rules) as prom:
        frozen: list[float] = []
        freezer = threading.Thread(
            target=lambda: frozen.append(kafka_local.freeze_broker(state, frozen_s, restart=restart))
        )
        began = time.monotonic()
        freezer.start()
        await_alert(prom, "TokenfabricBrokerUnreachable", "firing", frozen_s + 30, began)
        freezer.join()
        assert find(prom.alerts(), "TokenfabricTargetDown") is None  # it stayed up and scraped
    away_s = frozen[0]
    producer.join()
    stall_s = complete_without_exits(rig, len(ids), 400, state / "logs")
    codes = rig.pipeline.stop()
    logs = {n: (tmp_path / f"{n}.log").read_text(errors="replace") for n in codes}
    away = {n: text.count("does not answer (") for n, text in logs.items()}
    back = {n: text.count("answers again after") for n, text in logs.items()}
    print(
        f"OUTAGE frozen={frozen_s:.0f}s restart={restart} away={away_s:.1f}s stall={stall_s:.1f}s away={away}"
    )
    assert away_s >= frozen_s
    assert codes == dict.fromkeys(codes, 0), codes  # nobody exited before SIGTERM, all stopped cleanly
    assert any(away[f"processor{i}"] for i in range(processors)), "no processor noticed the outage"
    assert away == back, (away, back)  # each outage said once when it began and once when it ended
    assert all(a <= 2 for a in away.values()), away
    said = logs["status"]  # status --watch said the broker was gone, and then the status again
    assert "KAFKA UNREACHABLE at" in said, said[-2000:]
    assert "processors (age" in said.rsplit("KAFKA UNREACHABLE", 1)[1], said[-2000:]
    exactly_once_or_broker_fault(lambda: assert_exactly_once(rig, ids, tokens), state / "data")
    return logs


def test_a_frozen_broker_is_ridden_out_without_an_exit(
    private_broker: tuple[Path, str], tmp_path: Path
) -> None:
    """On the classic group protocol (``--group-protocol classic``); the default's is next."""
    state, bootstrap = private_broker
    with running_rig(bootstrap, tmp_path, consumer_threads=False) as rig:
        ride_out(state, rig, tmp_path, 1, 3_000, FROZEN_S, restart=False, protocol="classic")


def test_under_the_consumer_protocol_a_frozen_broker_is_ridden_out_too(
    private_broker: tuple[Path, str], tmp_path: Path
) -> None:
    """The same freeze with the processor on the consumer group protocol (KIP-848), the default,
    where the group refuses a static member's id to a newer member until the older one leaves or
    its session (45 s by default) ends. The run the outage ended leaves once its own client reaches
    the coordinator again (processor.apps.membership.part_from): the next run usually takes the id
    at once (5 of 6 runs here; docs/operations.md), and when it is refused it says so once and
    waits. Either way nothing exits, and every item completes once."""
    state, bootstrap = private_broker
    with running_rig(bootstrap, tmp_path, consumer_threads=False) as rig:
        logs = ride_out(state, rig, tmp_path, 1, 3_000, FROZEN_S, restart=False)
    said = logs["processor0"]
    assert "answers again after" in said, said[-3000:]  # its run was ended by the outage
    waits = said.count("the group still holds instance id")
    print(f"INSTANCE-ID WAITS {waits}")
    assert waits <= 1, said[-3000:]


@pytest.mark.skipif(not os.environ.get("TOKENFABRIC_OUTAGE_FULL"), reason="opt-in: TOKENFABRIC_OUTAGE_FULL=1")
def test_issue_36_broker_frozen_45_s_then_restarted_under_two_processors_and_two_consumers(
    private_broker: tuple[Path, str], tmp_path: Path
) -> None:
    state, bootstrap = private_broker
    with running_rig(bootstrap, tmp_path, consumer_threads=False) as rig:
        ride_out(state, rig, tmp_path, processors=2, items=6_000, frozen_s=45.0, restart=True)
