"""The ride (processor/apps/ride.py): rounds of an app across broker outages, without a broker.

Each test is a script of rounds: what each round does (return, raise, block) and what the probe
answers while the ride waits for the broker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.apps.ride import BrokerWatch, Current, Ride, RideSettings, StuckSignal
from processor.kafka.exits import BrokerUnreachable, Superseded, TransientFailure
from processor.kafka.outage import StuckCall

FAST = RideSettings(outage_exit_s=5.0, probe_timeout_s=0.01, retry_s=0.01, lookout_s=None)
DOWN = KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "all brokers down"))


class Probe:
    """Raises :class:`BrokerUnreachable` ``fails`` times, then answers."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.calls = 0

    def __call__(self, conf: Mapping[str, str], timeout_s: float) -> None:
        self.calls += 1
        if self.calls <= self.fails:
            raise BrokerUnreachable("no Kafka broker answered")


def script(
    *steps: Callable[[threading.Event], str],
) -> tuple[Callable[[], Callable[[threading.Event], str]], list[int]]:
    """``make_round`` playing ``steps`` in order, and the list of rounds made."""
    made: list[int] = []

    def make_round() -> Callable[[threading.Event], str]:
        made.append(len(made))
        return steps[len(made) - 1]

    return make_round, made


def raises(exc: BaseException) -> Callable[[threading.Event], str]:
    def run(stop: threading.Event) -> str:
        raise exc

    return run


def returns(value: str) -> Callable[[threading.Event], str]:
    return lambda stop: value


def ride(make_round: Callable[[], Callable[[threading.Event], str]], probe: Probe, **kw: object) -> Ride[str]:
    return Ride(make_round, {"bootstrap.servers": "b:9092"}, "processor p0", logging.getLogger("t.ride"),
                FAST, probe=probe, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_an_outage_is_said_once_waited_out_and_the_next_round_runs(caplog: pytest.LogCaptureFixture) -> None:
    make_round, made = script(raises(DOWN), raises(DOWN), returns("done"))
    watch = BrokerWatch()
    r = ride(make_round, Probe(fails=3), watch=watch)
    with caplog.at_level(logging.INFO, "t.ride"):
        assert r.run(threading.Event()) == "done"
    assert made == [0, 1, 2]
    said = [rec.getMessage() for rec in caplog.records]
    assert sum("does not answer (" in m for m in said) == 1, said  # the second failure is the same outage
    assert sum("answers again" in m for m in said) == 1, said
    assert watch.reachable and watch.outages == 1


def test_a_failure_that_is_not_an_outage_ends_the_ride_at_once() -> None:
    twin = Superseded("a newer process took over")
    make_round, made = script(raises(twin))
    with pytest.raises(Superseded):
        ride(make_round, Probe(fails=0)).run(threading.Event())
    assert made == [0]


def test_an_outage_longer_than_the_setting_gives_up_with_a_transient_failure() -> None:
    make_round, _ = script(raises(DOWN))
    r = ride(make_round, Probe(fails=10**9))
    r.settings = RideSettings(outage_exit_s=0.2, probe_timeout_s=0.01, retry_s=0.02, lookout_s=None)
    with pytest.raises(TransientFailure, match="past --outage-exit-s"):
        r.run(threading.Event())
    assert not r.watch.reachable


def test_zero_means_exit_on_the_first_outage_as_before() -> None:
    make_round, _ = script(raises(DOWN))
    r = ride(make_round, Probe(fails=0))
    r.settings = RideSettings(outage_exit_s=0, lookout_s=None)
    with pytest.raises(KafkaException):
        r.run(threading.Event())


def test_a_stop_while_waiting_ends_the_ride_without_a_result() -> None:
    make_round, made = script(raises(DOWN))
    stop = threading.Event()
    probe = Probe(fails=10**9)
    r = ride(make_round, probe)
    threading.Timer(0.2, stop.set).start()
    assert r.run(stop) is None
    assert made == [0] and probe.calls >= 1


def test_a_round_stuck_in_a_call_ends_the_ride_and_no_round_runs_beside_it() -> None:
    """The first round blocks for ever (as in librdkafka#5456); the watchdog's report ends the ride
    with StuckCall (exit 75: a restart fences it), never a second round beside the stuck one."""
    never = threading.Event()
    blocked = threading.Event()

    def stuck_round(stop: threading.Event) -> str:
        blocked.set()
        never.wait()
        return "never"

    make_round, made = script(stuck_round, returns("second"))
    signal = StuckSignal()
    r = ride(make_round, Probe(fails=0), stuck=signal)
    threading.Thread(target=lambda: (blocked.wait(), signal("send_offsets_to_transaction", 25.0))).start()
    with pytest.raises(StuckCall, match="send_offsets_to_transaction has not returned for 25 s"):
        r.run(threading.Event())
    assert made == [0]
    never.set()


def test_a_stuck_call_is_an_outage_and_a_probe_refusal_is_not() -> None:
    from processor.kafka.outage import is_outage
    from processor.kafka.reach import ClusterRefused

    assert is_outage(StuckCall("x has not returned for 25 s"))
    make_round, _ = script(raises(DOWN))

    def refused(conf: Mapping[str, str], timeout_s: float) -> None:
        raise ClusterRefused("TLS handshake refused")

    r = Ride(make_round, {}, "consumer c", logging.getLogger("t.ride"), FAST, probe=refused)
    with pytest.raises(ClusterRefused):
        r.run(threading.Event())


def test_current_reads_the_latest_round_and_replays_what_was_written() -> None:
    class App:
        def __init__(self, n: int) -> None:
            self.n = n
            self.observer: object = None

    current = Current(App(1))
    current.observer = "histograms"
    assert current.n == 1
    second = current.switch(App(2))
    assert current.n == 2 and second.observer == "histograms"


def test_the_watch_counts_each_outage_once_and_its_age() -> None:
    now = [100.0]
    watch = BrokerWatch(clock=lambda: now[0])
    assert watch.reachable and watch.away_for_s() == 0
    assert watch.went_away()
    now[0] += 7
    assert not watch.went_away()  # the same outage, seen again: nothing more to say
    assert not watch.reachable and watch.away_for_s() == 7 and watch.outages == 1
    assert watch.came_back() and not watch.came_back()
    watch.went_away()
    assert watch.outages == 2


def test_rounds_that_keep_failing_while_kafka_answers_end_the_ride_with_their_error() -> None:
    """A deleted batch topic times out every produce while the broker answers: after the allowed
    relapses the ride ends with the round's error (exit 75), instead of waiting out an outage that
    is not there."""
    from processor.apps.ride import MAX_RELAPSES

    timed_out = KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "message timed out"))
    make_round, made = script(*[raises(timed_out)] * (MAX_RELAPSES + 1))
    probe = Probe(fails=0)
    with pytest.raises(KafkaException):
        ride(make_round, probe).run(threading.Event())
    assert len(made) == MAX_RELAPSES + 1 and probe.calls == MAX_RELAPSES + 1


def test_a_probe_that_answers_only_after_a_while_is_an_outage_said_once() -> None:
    """The round died while the broker was frozen; the first probe hangs until the broker thaws and
    then answers: that was an outage (both lines), not an after-effect."""

    class SlowOnce(Probe):
        def __call__(self, conf: Mapping[str, str], timeout_s: float) -> None:
            self.calls += 1
            if self.calls == 1:
                time.sleep(2.5)  # past QUICK_S

    make_round, made = script(raises(DOWN), returns("done"))
    watch = BrokerWatch()
    assert ride(make_round, SlowOnce(fails=0), watch=watch).run(threading.Event()) == "done"
    assert made == [0, 1] and watch.outages == 1 and watch.reachable


def test_the_lookout_says_an_outage_once_while_the_round_runs_on(caplog: pytest.LogCaptureFixture) -> None:
    """A round blocked on the broker (a commit waiting, an idle consumer) fails nothing; the lookout
    sees the broker stop and start answering, and says each once."""
    release = threading.Event()

    def blocked(stop: threading.Event) -> str:
        release.wait(10)
        return "done"

    class Flaky(Probe):
        def __call__(self, conf: Mapping[str, str], timeout_s: float) -> None:
            super().__call__(conf, timeout_s)
            if self.calls == 6:
                release.set()

    make_round, _ = script(blocked)
    watch = BrokerWatch()
    r = Ride(make_round, {}, "consumer c", logging.getLogger("t.ride"),
             RideSettings(lookout_s=0.05), watch, probe=Flaky(fails=3))  # fmt: skip
    with caplog.at_level(logging.INFO, "t.ride"):
        assert r.run(threading.Event()) == "done"
    said = [rec.getMessage() for rec in caplog.records]
    assert sum("does not answer" in m for m in said) == 1 and sum("answers again" in m for m in said) == 1
    assert watch.reachable and watch.outages == 1


def test_a_round_blocked_through_an_outage_is_waited_for_not_left_behind() -> None:
    """A commit blocked through the outage returns, with an outage error, when the broker times its
    transaction out; the ride starts the next round only after that one has ended (its clients
    closed): two rounds never run at once."""
    released = threading.Event()
    first_ended: list[float] = []
    second_started: list[float] = []

    def blocked_then_down(stop: threading.Event) -> str:
        released.wait(10)
        first_ended.append(time.monotonic())
        raise DOWN

    def second(stop: threading.Event) -> str:
        second_started.append(time.monotonic())
        return "second"

    make_round, made = script(blocked_then_down, second)
    r = ride(make_round, Probe(fails=1))
    threading.Timer(0.5, released.set).start()
    assert r.run(threading.Event()) == "second"
    assert made == [0, 1] and first_ended[0] <= second_started[0]
