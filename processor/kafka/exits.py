"""Exit codes of the long-running commands (processor, consumer), and which failures a restart cures.

Why: Kubernetes restarts a pod whatever its exit code, but a supervisor script, systemd or a person
reading a log should be able to tell the failures a restart recovers from (the broker went away long
enough that a message timed out, a transaction could not commit, a topic is still being created)
from those it does not (bad settings, a message too large for the broker, being fenced by another
instance, a bug). The former leave nothing half-done: progress is committed transactionally or
re-run at least once, so a restarted process resumes from its last commit (docs/reliability.md).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where needed: the CLI imports this module before any Kafka client
    from confluent_kafka import KafkaError

EXIT_FAILED = 1
#: Bad arguments or settings, found at start or when the topics' contents contradict them (a
#: ``--group`` that did not process these topics): the same settings would fail the same way.
EXIT_USAGE = 2
#: ``EX_TEMPFAIL`` (sysexits.h): the process ended on a failure that a restart recovers from.
EXIT_TEMPFAIL = 75


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
        self.transient = error is None or delivery_recovers(error)


def delivery_recovers(error: KafkaError) -> bool:
    """Whether a restart can deliver what this delivery error refused."""
    return not error.fatal() and error.code() not in _permanent_delivery()


def exit_code(exc: BaseException) -> int:
    """:data:`EXIT_TEMPFAIL` for a failure a restart recovers from, :data:`EXIT_USAGE` for settings
    the topics contradict, else :data:`EXIT_FAILED`."""
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
