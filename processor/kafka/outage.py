"""Which failures are the broker being away, and so worth waiting out in the process.

Why a module of its own: a long-running command (processor, consumer) that meets one of these does
not exit any more. It abandons the run (nothing past the last commit is kept), waits until a broker
answers, and starts the run again from its last commit, as a restarted process would
(processor.apps.ride). Everything else keeps its exit code (processor.kafka.exits): a twin
(78), an authorizer's or a login's refusal (77), wrong settings (2, 78 for the configuration
refusals of issue 38), missing topics (75: an operator creates them), a bug (1).

An outage, as librdkafka reports it while the broker is stopped, frozen or restarting:

- no broker answers: ``_ALL_BROKERS_DOWN``, ``_TRANSPORT``, ``_RESOLVE``, ``_TIMED_OUT``,
  ``REQUEST_TIMED_OUT``, ``NETWORK_EXCEPTION``, a message timed out (``_MSG_TIMED_OUT``), or a
  probe that found nobody (:class:`~processor.kafka.exits.BrokerUnreachable`, not its refusals);
- a coordinator that moved or is loading its state after a restart: ``COORDINATOR_LOAD_IN_PROGRESS``,
  ``COORDINATOR_NOT_AVAILABLE``, ``NOT_COORDINATOR``, ``NOT_ENOUGH_REPLICAS`` and the like, and a
  reader's ``_UNKNOWN_PARTITION`` while the broker's metadata comes back (a topic really gone fails
  again at once, and the ride then ends with it: processor.apps.ride.MAX_RELAPSES);
- a transaction that did not survive it: any error that is ``retriable()`` or ``txn_requires_abort()``
  and not ``fatal()`` (librdkafka makes a commit whose coordinator vanished abortable), a
  transaction the broker aborted on its timeout (:class:`~processor.kafka.exits.TransientFailure`
  from ``ended_by``), a produce not delivered for a transient cause
  (:class:`~processor.kafka.exits.DeliveryFailed` with ``transient``), and a call the watchdog found
  stuck past its timeout (:class:`StuckCall`: librdkafka#5456).

A fenced producer (``_FENCED``) is fatal in librdkafka; it counts only when ``ended_by`` already
said the broker's transaction timeout did it, never when a twin did (that is ``Superseded``).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from processor.kafka.exits import (
    BrokerUnreachable,
    DeliveryFailed,
    MissingTopics,
    Refused,
    Superseded,
    TransientFailure,
    WrongSettings,
    kafka_cause,
)

if TYPE_CHECKING:
    from confluent_kafka import KafkaError

__all__ = ["Abandoned", "StuckCall", "is_outage", "outage_error"]


class StuckCall(TransientFailure):
    """A Kafka call did not return within its own timeout plus the watchdog's margin
    (processor.kafka.watchdog): the run is abandoned, its thread left in the C library."""


class Abandoned(TransientFailure):
    """Kafka went away while this round's clients were open: the round ends before its next call to
    the transaction coordinator, which may block for ever on clients that lived through an outage
    (librdkafka#5456/#5511). Its open transaction is not aborted here: the next round's
    ``init_transactions`` (same transactional id) aborts it, as after a crash."""


@cache
def _outage_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    names = (
        "_ALL_BROKERS_DOWN",
        "_TRANSPORT",
        "_RESOLVE",
        "_TIMED_OUT",
        "_MSG_TIMED_OUT",
        "_TIMED_OUT_QUEUE",
        "_WAIT_COORD",
        "_NO_OFFSET",
        "REQUEST_TIMED_OUT",
        "NETWORK_EXCEPTION",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_COORDINATOR",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_FOR_PARTITION",
        "CONCURRENT_TRANSACTIONS",
        "_UNKNOWN_PARTITION",  # a reader's metadata just after the broker came back
    )
    return frozenset(getattr(KafkaError, n) for n in names if hasattr(KafkaError, n))


def outage_error(error: KafkaError) -> bool:
    """A Kafka error that a broker coming back cures (module docstring); never a fatal one but the
    group's refusal of an instance id still held (:func:`instance_id_held`)."""
    if error.fatal():
        return instance_id_held(error)
    return error.code() in _outage_codes() or error.retriable() or error.txn_requires_abort()


def instance_id_held(error: KafkaError) -> bool:
    """The consumer protocol's fatal refusal of a member whose ``group.instance.id`` another member
    still holds (UNRELEASED_INSTANCE_ID): after an outage that member is the ride's own last round,
    whose leave never reached the broker; the next round waits for its session to end
    (processor.apps.membership.wait_for_own_id) instead of the process ending."""
    from confluent_kafka import KafkaError

    held = KafkaError(KafkaError.UNRELEASED_INSTANCE_ID).str()
    return error.code() == KafkaError.UNRELEASED_INSTANCE_ID or held in error.str()


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc``, as a run ended with it (after ``ended_by``), is the broker being away."""
    from confluent_kafka import KafkaError, KafkaException

    exc = kafka_cause(exc)
    if isinstance(exc, (Superseded, Refused, WrongSettings, MissingTopics)):
        return False
    if isinstance(exc, BrokerUnreachable):  # the probe found nobody; its refusals are subclasses
        return type(exc) is BrokerUnreachable
    if isinstance(exc, DeliveryFailed):
        return exc.transient
    if isinstance(exc, TransientFailure):
        return True
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return outage_error(exc.args[0])
    return False
