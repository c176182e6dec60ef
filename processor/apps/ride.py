"""Ride out a broker outage inside the process: not ready, still live, resumed from the last commit.

Why: a processor or consumer used to exit 75 whenever the broker went away long enough for a
transaction or a message to time out, and Kubernetes restarted it, again and again, for as long as
the broker was away (issue 36). A restart was always the correct recovery, since every piece of
progress is transactional; this module does the same restart without ending the process.

How: :class:`Ride` runs the app one *round* at a time, each round a fresh app with fresh Kafka
clients (``make_round``), in a thread of its own. When a round ends with an outage
(processor.kafka.outage.is_outage), the round is over, its open transaction abandoned, exactly as
if the process had died there. The ride says once that Kafka is away, waits, quietly, until a broker
answers (:func:`processor.kafka.reach.wait_for_cluster`), says once that it is back, and starts the
next round: its ``init_transactions`` aborts what the last round left open (same transactional id),
and it restores from the last commit. Nothing is lost (nothing uncommitted was acknowledged) and
nothing is doubled (nothing uncommitted is visible to ``read_committed`` readers).

A round stuck inside the C library (``send_offsets_to_transaction`` past its timeout,
librdkafka#5456) cannot be interrupted, and its clients cannot be closed: the ride does not leave it
behind to start another beside it (a thread holding a live group member and a transactional producer
is a twin no test has shown harmless: one run completed an item twice). The watchdog reports it to
the ride, which ends the process with 75 (:class:`~processor.kafka.outage.StuckCall`), as before
issue 36: a restart fences the stuck transaction. A commit merely blocked through an outage is
waited for: the broker times its transaction out and the round ends with an error like any other.

The ride gives up, ending the command with 75 as before, when the broker stays away longer than
``outage_exit_s`` (``--outage-exit-s``, 300 s by default; 0 exits at once): then a restart, or a
person, is the fix.

Invariant: at most one round runs its loop at a time; a round left behind is stopped and fenced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from processor.kafka.outage import StuckCall, is_outage
from processor.kafka.reach import PROBE_TIMEOUT_S, RETRY_S, BrokerUnreachable, probe

T = TypeVar("T")

#: ``--outage-exit-s``'s default: how long a command waits for the broker before it exits 75 (issue
#: 36: at least 5 minutes). It was 0 while items completed twice after broker restarts; those came
#: from the one-node broker skipping transaction markers (docs/reliability.md, "Limits today").
OUTAGE_EXIT_S = 300.0
#: A round that ran this long ended a run of failures: the next outage gets the whole wait again.
FRESH_AFTER_S = 60.0
#: Rounds that may fail in a row, each sooner than :data:`FRESH_AFTER_S`, while Kafka answers the
#: probe at once: the after-effects of an outage just over (a transaction found expired, a
#: coordinator still loading). One more, and the failure is not the broker's: the command exits with
#: it (a batch topic deleted, say, times out every produce while the broker answers).
MAX_RELAPSES = 3
#: A probe that answers within this long answers "at once": the broker was there when the round died.
QUICK_S = 2.0
#: The lookout asks the cluster this often while a round runs, and gives each probe as long: a
#: broker frozen or cut off is seen within twice this, whatever the round is doing (a commit
#: blocked on it, or, for an idle consumer, nothing at all).
LOOKOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class RideSettings:
    outage_exit_s: float = OUTAGE_EXIT_S
    """Give up (exit 75) when the broker has been away this long; 0: never wait (exit at once)."""
    probe_timeout_s: float = PROBE_TIMEOUT_S
    retry_s: float = RETRY_S
    lookout_s: float | None = LOOKOUT_S
    """How often the lookout asks the cluster while a round runs (None: no lookout, tests)."""

    def __post_init__(self) -> None:
        if self.outage_exit_s < 0:
            raise ValueError(
                f"--outage-exit-s must be >= 0 (0: exit on the first outage), got {self.outage_exit_s:g}"
            )


class BrokerWatch:
    """Whether the broker answers, as this process last saw it: what health and metrics read.

    Written by the ride's thread and its lookout (under a lock: whoever flips the state says so,
    once), read by the HTTP threads.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.away_since_s: float | None = None
        self.outages = 0
        self._lock = threading.Lock()

    @property
    def reachable(self) -> bool:
        return self.away_since_s is None

    def away_for_s(self) -> float:
        """Seconds since the broker was last seen away began; 0 while it answers."""
        since = self.away_since_s
        return 0.0 if since is None else max(0.0, self.clock() - since)

    def went_away(self) -> bool:
        """The broker is away; True when it answered until now (the caller says so)."""
        with self._lock:
            if self.away_since_s is not None:
                return False
            self.away_since_s = self.clock()
            self.outages += 1
            return True

    def came_back(self) -> bool:
        """The broker answers; True when it was away until now (the caller says so)."""
        with self._lock:
            if self.away_since_s is None:
                return False
            self.away_since_s = None
            return True


class _Round(Generic[T]):
    """One run of the app in its own daemon thread; ``done`` is set when it returns or raises."""

    def __init__(self, run: Callable[[threading.Event], T], name: str) -> None:
        self.stop = threading.Event()
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.started_s = time.monotonic()
        self._run = run
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.result = self._run(self.stop)
        except BaseException as exc:  # handed to the ride's thread, which decides
            self.error = exc
        finally:
            self.done.set()


class StuckSignal:
    """The watchdog's ``on_stuck`` for a ride: records what is stuck and wakes the ride, which then
    ends with :class:`StuckCall` (processor.kafka.watchdog.CallWatchdog takes it as ``on_stuck``)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.said: str | None = None

    def __call__(self, what: str, stuck_s: float) -> None:
        self.said = f"{what} has not returned for {stuck_s:.0f} s"
        self.event.set()

    def take(self) -> str | None:
        """What was stuck, once; None when nothing was."""
        said, self.said = self.said, None
        self.event.clear()
        return said


class Current(Generic[T]):
    """The current round's app, for readers that outlive a round (metrics, health, the CLI's summary).

    Attribute reads go to the current app; attribute writes go to it and are replayed on every later
    app (the metrics' ``observer``), so a reader sees one app across rounds.
    """

    def __init__(self, first: T) -> None:
        object.__setattr__(self, "_target", first)
        object.__setattr__(self, "_written", {})

    @property
    def target(self) -> T:
        target: T = object.__getattribute__(self, "_target")
        return target

    def switch(self, app: T) -> T:
        for name, value in object.__getattribute__(self, "_written").items():
            setattr(app, name, value)
        object.__setattr__(self, "_target", app)
        return app

    def __getattr__(self, name: str) -> object:
        return getattr(object.__getattribute__(self, "_target"), name)

    def __setattr__(self, name: str, value: object) -> None:
        object.__getattribute__(self, "_written")[name] = value
        setattr(object.__getattribute__(self, "_target"), name, value)


class Ride(Generic[T]):
    """Runs rounds of an app until one returns, a failure is not an outage, or the outage lasts.

    ``make_round`` builds a fresh app and returns its ``run(stop)``; ``conf`` are the client settings
    the probe uses; ``who`` names the process in its two lines. ``stuck`` (give it to the process's
    :class:`~processor.kafka.watchdog.CallWatchdog` as ``on_stuck``) ends the ride when a round is
    stuck in a call; ``probe`` asks the cluster once (processor.kafka.reach.probe; tests pass their own).
    """

    def __init__(
        self,
        make_round: Callable[[], Callable[[threading.Event], T]],
        conf: Mapping[str, str],
        who: str,
        log: logging.Logger,
        settings: RideSettings | None = None,
        watch: BrokerWatch | None = None,
        stuck: StuckSignal | None = None,
        probe: Callable[[Mapping[str, str], float], None] = probe,
    ) -> None:
        self.make_round = make_round
        self.conf = conf
        self.who = who
        self.log = log
        self.settings = settings or RideSettings()
        self.watch = watch or BrokerWatch()
        self.rounds = 0
        self.stuck = stuck or StuckSignal()
        self.probe = probe

    def run(self, stop: threading.Event) -> T | None:
        """The last round's result (None if ``stop`` came while waiting for the broker); raises what
        ended a round when it is not an outage, when Kafka answered all along and rounds kept
        failing (:data:`MAX_RELAPSES`: a missing topic looks like an outage to a producer), or
        :class:`~processor.kafka.exits.TransientFailure` when the outage outlasted ``outage_exit_s``."""
        done = threading.Event()
        if self.settings.lookout_s is not None:
            threading.Thread(target=self._look_out, args=(done,), name="broker-lookout", daemon=True).start()
        try:
            return self._rounds(stop)
        finally:
            done.set()

    def _rounds(self, stop: threading.Event) -> T | None:
        relapses = 0
        while not stop.is_set():
            self.stuck.take()  # a report about a round already left behind
            current = _Round(self.make_round(), f"{self.who}-round-{self.rounds}")
            self.rounds += 1
            error = self._follow(current, stop)
            if error is None:
                return current.result
            if time.monotonic() - current.started_s >= FRESH_AFTER_S:
                relapses = 0
            if isinstance(error, StuckCall) or not is_outage(error) or self.settings.outage_exit_s == 0:
                raise error
            asked = time.monotonic()
            if self._answers() and time.monotonic() - asked < QUICK_S:  # there: the outage is over
                self._back()
                relapses += 1
                if relapses > MAX_RELAPSES:
                    raise error
                self.log.info(
                    "%s: %s; Kafka answers: resuming from the last commit", self.who, _one_line(error)
                )
                continue
            self._away(_one_line(error))
            if not self._wait_for_broker(error, asked - self.watch.away_for_s(), stop):
                return None
        return None

    def _look_out(self, done: threading.Event) -> None:
        """Ask the cluster every ``lookout_s`` while rounds run; say when it stops and starts answering."""
        every = self.settings.lookout_s or LOOKOUT_S
        while not done.wait(every):
            try:
                self.probe(self.conf, every)
            except BrokerUnreachable as exc:
                self._away(_one_line(exc))
            else:
                self._back()

    def _away(self, why: str) -> None:
        if self.watch.went_away():
            self.log.warning(
                "%s: Kafka at %s does not answer (%s): not ready; the open transaction is dropped and "
                "the run resumes from the last commit once a broker answers (giving up after %g s)",
                self.who,
                self.conf.get("bootstrap.servers", "?"),
                why,
                self.settings.outage_exit_s,
            )

    def _back(self) -> None:
        away_s = self.watch.away_for_s()
        if self.watch.came_back():
            self.log.info("%s: Kafka answers again after %.0f s: resuming", self.who, away_s)

    def _answers(self) -> bool:
        try:
            self.probe(self.conf, self.settings.probe_timeout_s)
        except BrokerUnreachable as exc:
            if type(exc) is not BrokerUnreachable:
                raise  # refused: waiting does not cure it
            return False
        return True

    def _follow(self, current: _Round[T], stop: threading.Event) -> BaseException | None:
        """Wait for the round to end; pass ``stop`` on; a :class:`StuckCall` when the watchdog says it is
        stuck (the caller ends the process: a stuck round is never left behind)."""
        while not current.done.is_set():
            self.stuck.event.wait(0.2)
            if stop.is_set():
                current.stop.set()
            said = self.stuck.take()
            if said is not None:
                current.stop.set()  # should the call ever return, the round ends at its next step
                return StuckCall(f"{self.who}: {said}")
        return current.error

    def _wait_for_broker(self, error: BaseException, began: float, stop: threading.Event) -> bool:
        """Probe until the broker answers (True) or ``stop`` (False); raise past ``outage_exit_s``
        counted from ``began``."""
        s = self.settings
        while not stop.is_set():
            waited = time.monotonic() - began
            if waited > s.outage_exit_s:
                raise _gave_up(self.who, waited, error)
            if self._answers():
                self._back()
                return True
            stop.wait(s.retry_s)
        return False


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]


def _gave_up(who: str, waited_s: float, error: BaseException) -> BaseException:
    from processor.kafka.exits import TransientFailure

    return TransientFailure(
        f"{who}: Kafka away for {waited_s:.0f} s, past --outage-exit-s; last error: {_one_line(error)}"
    )
