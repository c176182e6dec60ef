"""Exit codes of the long-running commands (processor, consumer), and which failures a restart cures.

Why: Kubernetes restarts a pod whatever its exit code, but a supervisor script, systemd or a person
reading a log should be able to tell the failures a restart recovers from (the broker went away long
enough that a message timed out, a transaction could not commit, a topic is still being created)
from those it does not (bad settings, a message too large for the broker, a bug), and both from the
one a restart makes worse: another process now runs under this instance's identity
(:data:`EXIT_SUPERSEDED`). The first leave nothing half-done: progress is committed transactionally or
re-run at least once, so a restarted process resumes from its last commit (docs/reliability.md).
docs/operations.md ("How a processor or consumer ends") has one row per code, checked against this
module by tests/kafka/test_exits.py.

Who wins when two processes share an instance id: the newer one. Its ``init_transactions`` fences
the older one's transactional id, and its join with the same ``group.instance.id`` fences the older
group member (``FENCED_INSTANCE_ID``). That is what a restart needs (a replacement must win over a
frozen predecessor), and Kafka gives no way to tell a frozen predecessor from a live twin at start.
The older one exits once with :data:`EXIT_SUPERSEDED`, which a supervisor must not restart blindly:
restarting it would fence the newer one, and so on for ever.

Telling a twin from a pause: the broker also fences a producer whose transaction it aborted on its
own because the transaction outlived ``transaction.timeout.ms`` (a process paused by SIGSTOP, a GC or
a VM stall, or a commit blocked while the broker was away); the error is the same ``_FENCED``. A
transaction younger than that timeout cannot have been aborted by it, so only a twin fenced it
(:data:`EXIT_SUPERSEDED`). An older one may have been either; it ends with :data:`EXIT_TEMPFAIL`: if
it was the broker, the restart is the fix, and if a twin was there too, the restarted process fences
the twin, whose young transaction then makes it exit :data:`EXIT_SUPERSEDED`: one process is left,
never a loop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where needed: the CLI imports this module before any Kafka client
    from confluent_kafka import KafkaError

#: A clean stop: SIGTERM/SIGINT (work committed), or a consumer's ``--max-batches``, ``--idle-exit-s``,
#: ``--retire``.
EXIT_OK = 0
#: A failure a restart does not cure (a fatal Kafka error, missing rights, a message too large, a bug).
EXIT_FAILED = 1
#: Bad arguments or settings, found at start or when the topics' contents contradict them (a
#: ``--group`` that did not process these topics), or the metrics port is taken: nothing was started,
#: and the same settings would fail the same way.
EXIT_USAGE = 2
#: ``EX_TEMPFAIL`` (sysexits.h): the process ended on a failure that a restart recovers from.
EXIT_TEMPFAIL = 75
#: ``EX_UNAVAILABLE`` (sysexits.h): the cluster could not be reached (processor.kafka.reach); every
#: short command exits so.
EXIT_UNREACHABLE = 69
#: ``EX_NOPERM`` (sysexits.h): the cluster refused this client: its ACLs do not allow what it asked
#: (:class:`Refused`), or it could not prove who it is (a wrong CA, password or certificate:
#: processor.kafka.reach). A restart does not cure it: grant the ACL (``tokenfabric acls``) or fix the
#: security settings.
EXIT_REFUSED = 77
#: ``EX_CONFIG`` (sysexits.h): a newer process took over this instance id (two were given the same
#: ``--instance`` or consumer ``--id``, or this one was a zombie that got replaced). Do not restart.
EXIT_SUPERSEDED = 78
#: ``EX_CONFIG`` (sysexits.h) again: the client's own settings are wrong (an unknown or malformed
#: property, a TLS file missing or unreadable, a key store its password does not open, a SASL mechanism
#: the broker does not offer: processor.kafka.settings_check). Like a superseded process, a restart
#: does not cure it: fix the setting the line names.
EXIT_CONFIG = 78
#: A consumer's second SIGINT/SIGTERM: aborted without committing the current batch (128 + SIGINT).
EXIT_INTERRUPTED = 130


@cache
def _permanent_delivery() -> frozenset[int]:
    """Delivery errors that a restart does not cure: the message, the settings or the rights are wrong."""
    from confluent_kafka import KafkaError

    return frozenset(
        {
            KafkaError.MSG_SIZE_TOO_LARGE,
            KafkaError.RECORD_LIST_TOO_LARGE,
            KafkaError.INVALID_RECORD,
            KafkaError.POLICY_VIOLATION,
            KafkaError.UNSUPPORTED_COMPRESSION_TYPE,
            KafkaError.INVALID_CONFIG,
            KafkaError._INVALID_ARG,
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.CLUSTER_AUTHORIZATION_FAILED,
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            KafkaError.SASL_AUTHENTICATION_FAILED,
            KafkaError._AUTHENTICATION,
        }
    )


class TransientFailure(RuntimeError):
    """Nothing was committed past the last good commit, and the cause lies outside the process."""


class FencedByGroup(TransientFailure):
    """The group fenced this member (its session expired: a long pause, or a broker away longer than
    the session) and took its partitions back. The open transaction may hold batches of partitions
    another member now owns, and with no partition left to send offsets for, nothing else would
    refuse its commit: it is abandoned, and a restart (or the ride's next round) resumes from the
    last commit, as a process that died there would."""


class WrongSettings(RuntimeError):
    """The settings contradict what the topics hold; nothing was written. Exit :data:`EXIT_USAGE`."""


class MissingTopics(TransientFailure):
    """Topics the process needs do not exist (yet). Nothing was read or written; a restart succeeds
    once they are created (in k8s/ the topics Job runs beside the processor, which restarts until
    the Job is done: docs/operations.md)."""


class DeliveryFailed(TransientFailure):
    """A produced message was not delivered, so the transaction (or offset commit) that would have
    covered it was not made. ``transient`` is False for errors no restart cures (see
    :func:`_permanent_delivery`)."""

    def __init__(self, message: str, error: KafkaError | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.transient = error is None or delivery_recovers(error)


class BrokerUnreachable(RuntimeError):
    """No broker of ``bootstrap.servers`` answered a metadata request within the probe's time
    (processor.kafka.reach). The base of every error that means "this cluster cannot be used as
    configured": ``tokenfabric``'s ``main`` prints its one-line message, wherever it was raised, and
    exits with its ``exit_code``."""

    exit_code = EXIT_UNREACHABLE


class Refused(BrokerUnreachable):
    """The cluster's authorizer refused an operation; the message is one line naming the operation,
    the resource (topic, group or transactional id) and the principal. Exit :data:`EXIT_REFUSED`."""

    exit_code = EXIT_REFUSED


@cache
def _authorization() -> dict[int, str]:
    """Authorization errors -> the kind of resource they refuse."""
    from confluent_kafka import KafkaError

    return {
        KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
        KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
        KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    }


#: The operation a client needs on each kind of resource when the caller does not say: a group is
#: joined and committed to (Read), a transactional id written under (Write).
_USUAL_OPERATION = {"group": "Read", "transactional id": "Write"}

#: librdkafka names the topic in a subscription's error: "Subscribed topic not available: T: ..."
_TOPIC_IN_TEXT = re.compile(r"(?:topic not available|[Tt]opic)[: ]+([A-Za-z0-9._-]+):")


def authorization_refused(error: KafkaError) -> bool:
    """An authorizer's refusal (topic, group, transactional id or cluster)."""
    return error.code() in _authorization()


def principal_of(conf: Mapping[str, Any]) -> str:
    """Who the client is, as its settings say: ``User:<sasl.username>``, or its certificate's file."""
    user = conf.get("sasl.username")
    if user:
        return f"User:{user}"
    cert = conf.get("ssl.keystore.location") or conf.get("ssl.certificate.location")
    if cert:
        return f"the principal of the certificate in {cert}"
    return "this client's principal"


def refusal(
    exc: BaseException | KafkaError,
    conf: Mapping[str, Any] | None = None,
    *,
    operation: str | Mapping[str, str] | None = None,
    resource: str | None = None,
    topic: str | None = None,
    who: str = "",
) -> Refused | None:
    """The one-line :class:`Refused` for an authorization error, else None.

    The resource is named from what the caller knows (``resource``; ``topic``, used only when the
    topic was refused), else from the client's settings (its ``group.id`` for a group,
    ``transactional.id`` for a transactional id), else from the error's text (librdkafka names a
    subscribed topic); the operation likewise (``operation``, or a mapping from the kind of resource
    to it, else the usual one for the kind).
    """
    from confluent_kafka import KafkaError

    error = exc if isinstance(exc, KafkaError) else _error(kafka_cause(exc))
    if error is None or not authorization_refused(error):
        return None
    conf = conf or {}
    kind = _authorization()[error.code()]
    if resource is None:
        known = {
            "group": conf.get("group.id"),
            "transactional id": conf.get("transactional.id"),
            "topic": topic,
        }
        name = known.get(kind)
        if name is None and kind == "topic":
            found = _TOPIC_IN_TEXT.search(error.str())
            name = found.group(1) if found else None
        resource = f"{kind} '{name}'" if name else ("the cluster" if kind == "cluster" else f"a {kind}")
    op = operation.get(kind) if isinstance(operation, Mapping) else operation
    op = op or _USUAL_OPERATION.get(kind, "access")
    lead = f"{who}: " if who else ""
    said = error.str()
    if len(said) > _SAID_MAX:  # the broker may put a whole request's dump there: its name says enough
        said = error.name()
    return Refused(
        f"{lead}refused by the cluster's authorizer: {op} on {resource} for {principal_of(conf)} "
        f"({said}); grant it ('tokenfabric acls' lists what each role needs); exiting with "
        f"{EXIT_REFUSED}"
    )


#: The longest error text a refusal quotes; longer ones are replaced by the error's name.
_SAID_MAX = 160


class Superseded(RuntimeError):
    """Another process now runs under this process's identity (module docstring: the newer one wins)."""


def delivery_recovers(error: KafkaError) -> bool:
    """Whether a restart can deliver what this delivery error refused."""
    return not error.fatal() and error.code() not in _permanent_delivery()


def fatal(error: KafkaError) -> bool:
    """A consumer's fatal error arrives as a message error with code ``_FATAL`` whose ``fatal()`` is
    False (librdkafka keeps the cause for ``rd_kafka_fatal_error``); both mean the client is done.

    An authorizer's refusal is fatal too: librdkafka reports it as a plain message error and retries,
    so a process whose ACL was removed under it would log a warning per poll for ever; no retry
    grants an ACL (:func:`refusal` makes its one line)."""
    from confluent_kafka import KafkaError

    return error.fatal() or error.code() == KafkaError._FATAL or authorization_refused(error)


def purged(error: KafkaError) -> bool:
    """A message librdkafka dropped from its queue itself: the effect of an abort or of a fatal error
    (fencing), which the next transactional call reports as the cause."""
    from confluent_kafka import KafkaError

    return error.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)


def kafka_cause(exc: BaseException) -> BaseException:
    """The Kafka error behind ``exc``.

    confluent-kafka 2.x raises a producer's fatal error (``_FENCED``) as a pending exception *before*
    it calls a delivery callback, so the callback, whatever it does, "returns a result with an
    exception set": ``poll`` or ``flush`` then raise ``SystemError`` whose ``__cause__`` is the
    ``KafkaException`` (reproduced against the broker: fence a transactional producer that has a
    message queued). That exception is the error; the ``SystemError`` is noise.
    """
    from confluent_kafka import KafkaException

    if isinstance(exc, SystemError) and isinstance(exc.__cause__, KafkaException):
        return exc.__cause__
    return exc


def _error(exc: BaseException) -> KafkaError | None:
    """The Kafka error ``exc`` carries: a client call's, or a failed delivery's (a twin's fence may
    reach a producer first as a delivery report, ``INVALID_PRODUCER_EPOCH``, before any call fails)."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(exc, DeliveryFailed):
        return exc.error
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return error if isinstance(error, KafkaError) else None


def instance_fenced(exc: BaseException) -> bool:
    """The group coordinator gave this member's ``group.instance.id`` to a newer member: a twin, always.

    librdkafka reports it as a message error with code ``_FATAL``, the broker's error only in its text.
    """
    from confluent_kafka import KafkaError

    error = _error(exc)
    if error is None:
        return False
    if error.code() == KafkaError.FENCED_INSTANCE_ID:
        return True
    broker_says = KafkaError(KafkaError.FENCED_INSTANCE_ID).str()  # librdkafka's text for the code
    return error.code() == KafkaError._FATAL and broker_says in error.str()


def producer_fenced(exc: BaseException) -> bool:
    """A newer producer with this transactional id, or the broker's own abort of an expired transaction."""
    from confluent_kafka import KafkaError

    error = _error(exc)
    fenced = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    return error is not None and error.code() in fenced


def ended_by(
    exc: BaseException,
    who: str,
    transaction_age_s: float,
    transaction_timeout_s: float,
    conf: Mapping[str, Any] | None = None,
) -> BaseException:
    """What ended a run, classified: :class:`Superseded` for a twin, :class:`TransientFailure` for a
    transaction the broker aborted on timeout, else the Kafka error itself (module docstring).

    A transaction open past the timeout is dead whatever error the client met first (its messages
    timed out locally, librdkafka then refuses to produce with ``_STATE``, or the broker fenced its
    epoch), so any Kafka error then ends with :class:`TransientFailure`; an error that a restart does
    not cure comes back in the restarted process, with a young transaction, and ends it with 1.

    ``who`` names the process and its pipeline (``processor p0 of pipeline tokenfabric``);
    ``transaction_age_s`` is how long the open transaction had been open (0 when there was none).
    An authorizer's refusal becomes :class:`Refused`, named from ``conf`` (the failing client's
    settings: its group and transactional id) where the caller gives it.
    """
    from confluent_kafka import KafkaException

    exc = kafka_cause(exc)
    refused = refusal(exc, conf, who=who)
    if refused is not None:
        return refused
    expired = transaction_age_s >= transaction_timeout_s
    if instance_fenced(exc) or (producer_fenced(exc) and not expired):
        return Superseded(
            f"{who}: a newer process with the same id took over its group membership and transactional "
            f"id; exiting with {EXIT_SUPERSEDED}: do not restart this one while the other runs"
        )
    # fenced, or any error of the dead transaction: its messages time out too (DeliveryFailed)
    if expired and isinstance(exc, (KafkaException, DeliveryFailed)):
        return TransientFailure(
            f"{who}: its transaction was open {transaction_age_s:.0f} s, past the transaction timeout "
            f"({transaction_timeout_s:.0f} s), and the broker aborted it (a pause or a long broker outage)"
        )
    return exc


def now_stamp() -> tuple[float, float]:
    """The monotonic and wall-clock time now, for :func:`age_s`."""
    import time

    return time.monotonic(), time.time()


def age_s(stamp: tuple[float, float], now: tuple[float, float] | None = None) -> float:
    """Seconds from ``stamp`` to ``now`` (default: :func:`now_stamp`): the larger of the monotonic and
    the wall-clock age, as a suspended VM may stop the monotonic clock while the broker's transaction
    timeout runs on."""
    monotonic, wall = now_stamp() if now is None else now
    return max(monotonic - stamp[0], wall - stamp[1])


def taking_over(who: str, member: str) -> str:
    """The newer process's one line when its id was still in use as it started."""
    return (
        f"{who}: the group still had a member with this id ({member}): another process still running, "
        f"or one stopped less than the session timeout ago. This process takes over; a running one "
        f"exits with {EXIT_SUPERSEDED}"
    )


def exit_code(exc: BaseException) -> int:
    """:data:`EXIT_SUPERSEDED` for a twin, :data:`EXIT_REFUSED` for an authorizer's refusal,
    :data:`EXIT_TEMPFAIL` for a failure a restart recovers from, else :data:`EXIT_FAILED`."""
    exc = kafka_cause(exc)
    if isinstance(exc, Superseded):
        return EXIT_SUPERSEDED
    if isinstance(exc, Refused) or refusal(exc) is not None:
        return EXIT_REFUSED
    if isinstance(exc, WrongSettings):
        return EXIT_USAGE
    if isinstance(exc, DeliveryFailed):
        return EXIT_TEMPFAIL if exc.transient else EXIT_FAILED
    if isinstance(exc, TransientFailure):
        return EXIT_TEMPFAIL
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(exc, KafkaException):
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and not error.fatal():
            return EXIT_TEMPFAIL if error.retriable() or error.txn_requires_abort() else EXIT_FAILED
    return EXIT_FAILED
