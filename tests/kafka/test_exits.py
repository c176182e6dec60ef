"""Exit codes (processor/kafka/exits.py): 75 (restart me) only where a restart can recover."""

from __future__ import annotations

import pytest

# ------------------------------------------------------------------------------------------------
# exit codes


@pytest.mark.parametrize(
    ("flags", "code"),
    [
        ({}, 1),
        ({"retriable": True}, 75),
        ({"txn_requires_abort": True}, 75),
        ({"fatal": True, "retriable": True}, 1),  # fenced: a restart would fence the other instance
    ],
)
def test_a_kafka_error_exits_75_only_when_a_restart_recovers(flags: dict[str, bool], code: int) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from processor.kafka.exits import exit_code

    assert exit_code(KafkaException(KafkaError(KafkaError._TIMED_OUT, "x", **flags))) == code


def test_a_delivery_failure_exits_75_unless_no_restart_can_deliver() -> None:
    from confluent_kafka import KafkaError

    from processor.apps.consumer import ConsumerAppError
    from processor.kafka.exits import DeliveryFailed, exit_code

    assert exit_code(DeliveryFailed("broker away", KafkaError(KafkaError._MSG_TIMED_OUT))) == 75
    assert exit_code(DeliveryFailed("topic not there yet", KafkaError(KafkaError._UNKNOWN_TOPIC))) == 75
    assert exit_code(DeliveryFailed("3 still unacknowledged after 60 s")) == 75
    assert exit_code(DeliveryFailed("too large", KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))) == 1
    # missing rights: 77, the authorizer's refusal (test_an_authorization_failure_is_fatal_...)
    assert exit_code(DeliveryFailed("no rights", KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))) == 77
    assert exit_code(DeliveryFailed("fenced", KafkaError(KafkaError._FENCED, fatal=True))) == 1
    assert exit_code(ConsumerAppError("not open")) == 1
    assert exit_code(ValueError("a bug")) == 1


# ------------------------------------------------------------------------------------------------
# who ended the run: a twin, the broker's timeout abort, or the error itself


def _fenced_producer() -> BaseException:
    from confluent_kafka import KafkaError, KafkaException

    return KafkaException(KafkaError(KafkaError._FENCED, "fenced by newer producer instance", fatal=True))


def test_a_producer_fenced_while_its_transaction_is_young_was_fenced_by_a_twin() -> None:
    from processor.kafka.exits import EXIT_SUPERSEDED, Superseded, ended_by, exit_code

    ended = ended_by(_fenced_producer(), "processor p0 of pipeline a", 0.4, 10.0)
    assert isinstance(ended, Superseded)
    assert exit_code(ended) == EXIT_SUPERSEDED == 78
    assert str(ended).startswith("processor p0 of pipeline a: a newer process") and "\n" not in str(ended)


def test_a_producer_fenced_after_its_transaction_outlived_the_timeout_exits_75() -> None:
    from processor.kafka.exits import TransientFailure, ended_by, exit_code

    ended = ended_by(_fenced_producer(), "processor p0 of pipeline a", 14.2, 10.0)
    assert isinstance(ended, TransientFailure) and exit_code(ended) == 75
    assert "open 14 s, past the transaction timeout (10 s)" in str(ended)


def test_a_fence_first_seen_as_a_failed_delivery_is_judged_by_the_transactions_age() -> None:
    """A twin's init_transactions can reach the older producer as a delivery report (the broker
    refuses its in-flight produce: an old epoch) before any transactional call fails; the broker
    test of two processes with one --instance caught it exiting 75 that way."""
    from confluent_kafka import KafkaError

    from processor.kafka.exits import DeliveryFailed, Superseded, TransientFailure, ended_by, exit_code

    def epoch() -> DeliveryFailed:
        error = KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "attempted an operation with an old epoch")
        return DeliveryFailed("processor p0: a produce failed: old epoch", error)

    young = ended_by(epoch(), "processor p0 of pipeline a", 0.3, 10.0)
    assert isinstance(young, Superseded) and exit_code(young) == 78
    old = ended_by(epoch(), "processor p0 of pipeline a", 12.0, 10.0)
    assert isinstance(old, TransientFailure) and exit_code(old) == 75
    timed_out = DeliveryFailed("broker away", KafkaError(KafkaError._MSG_TIMED_OUT))
    assert ended_by(timed_out, "processor p0 of pipeline a", 0.3, 10.0) is timed_out


def test_a_fenced_static_member_was_fenced_by_a_twin_whatever_its_transaction() -> None:
    """librdkafka hands a consumer's FENCED_INSTANCE_ID over as a message error with code _FATAL."""
    from confluent_kafka import KafkaError, KafkaException

    from processor.kafka.exits import Superseded, ended_by, fatal, instance_fenced

    text = f"Fatal consumer error: {KafkaError(KafkaError.FENCED_INSTANCE_ID).str()}"
    error = KafkaError(KafkaError._FATAL, text)
    assert fatal(error) and not error.fatal()
    assert instance_fenced(KafkaException(error))
    assert isinstance(ended_by(KafkaException(error), "consumer gpu0 of pipeline a", 99.0, 60.0), Superseded)
    other = KafkaException(KafkaError(KafkaError._FATAL, "Fatal error: something else"))
    assert not instance_fenced(other) and ended_by(other, "x", 0.0, 60.0) is other


def test_the_systemerror_confluent_kafka_raises_around_a_callback_is_unwrapped_to_its_cause() -> None:
    from processor.kafka.exits import Superseded, ended_by, exit_code, kafka_cause

    cause = _fenced_producer()
    try:
        try:
            raise cause
        except BaseException as exc:
            raise SystemError("<function _Base._failed> returned a result with an exception set") from exc
    except SystemError as wrapped:
        assert kafka_cause(wrapped) is cause
        assert exit_code(wrapped) == 1  # a fatal error: no restart cures it by itself
        assert isinstance(ended_by(wrapped, "p", 0.1, 10.0), Superseded)
    bug = SystemError("something else")
    assert kafka_cause(bug) is bug


def test_a_purged_message_is_an_effect_and_not_a_cause() -> None:
    from confluent_kafka import KafkaError

    from processor.kafka.exits import purged

    assert purged(KafkaError(KafkaError._PURGE_QUEUE)) and purged(KafkaError(KafkaError._PURGE_INFLIGHT))
    assert not purged(KafkaError(KafkaError._MSG_TIMED_OUT))


def test_any_kafka_error_of_a_transaction_past_its_timeout_exits_75() -> None:
    """Paused past the timeout, librdkafka first times the messages out and refuses to produce."""
    from confluent_kafka import KafkaError, KafkaException

    from processor.kafka.exits import TransientFailure, ended_by

    state = KafkaException(KafkaError(KafkaError._STATE, "Unable to produce message: Local: Erroneous state"))
    assert isinstance(ended_by(state, "processor p0 of pipeline a", 16.0, 2.0), TransientFailure)
    assert ended_by(state, "processor p0 of pipeline a", 0.5, 2.0) is state


# ------------------------------------------------------------------------------------------------
# docs/operations.md, "How a processor or consumer ends": one row per way, each with its test


def _exit_table() -> list[list[str]]:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = text.split("## How a processor or consumer ends\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| code")]
    return [[cell.strip() for cell in row.replace("\\|", "/").strip("|").split("|")] for row in rows]


def test_the_exit_table_in_the_docs_has_every_code_of_the_module_and_no_other() -> None:
    from processor.kafka import exits

    codes = {value for name, value in vars(exits).items() if name.startswith("EXIT_")}
    table = {int(row[0]) for row in _exit_table()}
    assert table == codes


def test_every_row_of_the_exit_table_names_tests_that_exist() -> None:
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for row in _exit_table():
        named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row[3])
        assert named, f"exit {row[0]} ({row[1][:40]}...) names no test"
        for path, test in named:
            assert f"def {test}(" in (root / path).read_text(), f"{path}::{test} does not exist"


def test_an_authorization_failure_is_fatal_one_line_and_exits_77() -> None:
    """librdkafka reports a refused Read or Write as a plain (non-fatal, non-retriable) error and
    retries; tokenfabric ends on it with one line naming what was refused, never a retry loop."""
    from confluent_kafka import KafkaError, KafkaException

    from processor.kafka.exits import EXIT_REFUSED, Refused, ended_by, exit_code, fatal, refusal

    group = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "FindCoordinator response error")
    assert not group.fatal() and fatal(group)
    conf = {"group.id": "p-consumer-gpu0", "sasl.username": "cons", "sasl.password": "s3cret"}
    ended = ended_by(KafkaException(group), "consumer gpu0 of pipeline p", 0.0, 10.0, conf=conf)
    assert isinstance(ended, Refused) and exit_code(ended) == EXIT_REFUSED == 77
    line = str(ended)
    assert line.startswith("consumer gpu0 of pipeline p: refused by the cluster's authorizer: ")
    assert "Read on group 'p-consumer-gpu0' for User:cons" in line and "\n" not in line
    assert "s3cret" not in line

    txn = KafkaError(
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "Transactional Id authorization failed"
    )
    refused = refusal(KafkaException(txn), {"transactional.id": "p-processor-p0"})
    assert refused is not None and "Write on transactional id 'p-processor-p0'" in str(refused)

    topic = KafkaError(
        KafkaError.TOPIC_AUTHORIZATION_FAILED, "Subscribed topic not available: p.ingest: Broker: ..."
    )
    refused = refusal(topic, {"ssl.keystore.location": "/etc/tf/client.p12"})
    assert refused is not None
    assert "on topic 'p.ingest' for the principal of the certificate in /etc/tf/client.p12" in str(refused)
    # a delivery refused by the authorizer exits 77 too, and no other error is a refusal
    from processor.kafka.exits import DeliveryFailed

    assert exit_code(DeliveryFailed("lost", KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))) == 77
    assert refusal(KafkaException(KafkaError(KafkaError._TIMED_OUT))) is None
