"""The lifecycle commands' pure parts (processor/ops/lifecycle.py): windows, deadlines, and how a
change keeps the rest of a job's record. The reads and writes run against the in-memory Kafka."""

from __future__ import annotations

from dataclasses import replace

import pytest

from processor.core.shares import JobPolicy
from processor.kafka.memory import MemoryKafka
from processor.kafka.topics import TopicNames, topic_specs
from processor.ops.lifecycle import (
    change_job_share,
    deadline_from,
    deadline_ms_of,
    describe_lifecycle,
    max_attempts_from,
    read_job_share,
    record_deadline,
    window_ms,
    write_job_share,
)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("24h", 86_400_000), ("90m", 5_400_000), ("1.5d", 129_600_000), ("30s", 30_000), ("500ms", 500)],
)
def test_a_window_is_a_number_and_a_unit(text: str, ms: int) -> None:
    assert window_ms(text) == ms


@pytest.mark.parametrize("text", ["24", "h", "-1h", "0s", "24 hours", ""])
def test_a_window_without_a_unit_or_not_positive_is_refused_with_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="window"):
        window_ms(text)


def test_a_deadline_is_iso_8601_utc_unless_it_names_a_zone() -> None:
    assert deadline_ms_of("2026-12-04T06:00:00Z") == 1_796_364_000_000
    assert deadline_ms_of("2026-12-04T06:00:00") == 1_796_364_000_000
    assert deadline_ms_of("2026-12-04 07:00+01:00") == 1_796_364_000_000
    with pytest.raises(ValueError, match="ISO 8601"):
        deadline_ms_of("tomorrow")
    assert deadline_from("1h", None, 1_000) == 3_601_000
    assert deadline_from(None, "2026-12-04T06:00:00Z", 0) == 1_796_364_000_000
    assert deadline_from(None, None, 0) is None
    with pytest.raises(ValueError, match="not both"):
        deadline_from("1h", "2026-12-04T06:00:00Z", 0)


def test_each_change_keeps_the_rest_of_the_record_and_a_cancel_keeps_its_first_time() -> None:
    mk, topics = MemoryKafka(), TopicNames("lc")
    mk.create_topics(topic_specs(topics))
    clients = mk.clients()
    assert read_job_share({}, topics, "j", clients) is None
    record_deadline({}, topics, "j", 50_000, 10, clients)  # submit's call
    change_job_share({}, topics, "j", 20, policy=JobPolicy(weight=4.0), clients=clients)
    change_job_share({}, topics, "j", 30, cancel=True, clients=clients)
    rec = change_job_share({}, topics, "j", 40, cancel=True, policy=JobPolicy(weight=2.0), clients=clients)
    assert (rec.policy.weight, rec.deadline_ms, rec.cancelled_ms, rec.set_ms) == (2.0, 50_000, 30, 40)
    assert read_job_share({}, topics, "j", clients) == rec
    assert "cancelled at" in describe_lifecycle(rec) and "deadline" in describe_lifecycle(rec)
    write_job_share({}, topics, None, "j", clients=clients)
    assert read_job_share({}, topics, "j", clients) is None
    assert (
        describe_lifecycle(None)
        == describe_lifecycle(replace(rec, cancelled_ms=None, deadline_ms=None))
        == ""
    )


def test_max_attempts_is_kept_by_every_later_change_and_submit_writes_it_with_the_deadline() -> None:
    mk, topics = MemoryKafka(), TopicNames("lc")
    mk.create_topics(topic_specs(topics))
    clients = mk.clients()
    assert max_attempts_from(None) is None and max_attempts_from("1") == 1 and max_attempts_from("5") == 5
    record_deadline({}, topics, "j", None, 10, clients, max_attempts=5)  # submit --max-attempts 5
    change_job_share({}, topics, "j", 20, policy=JobPolicy(weight=4.0), clients=clients)  # share
    rec = change_job_share({}, topics, "j", 30, cancel=True, clients=clients)  # cancel
    assert (rec.max_attempts, rec.policy.weight, rec.deadline_ms, rec.cancelled_ms) == (5, 4.0, None, 30)
    assert read_job_share({}, topics, "j", clients) == rec
