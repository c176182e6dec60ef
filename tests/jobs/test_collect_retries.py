"""Collecting while the pipeline retries failed items (processor/jobs/collect.py, ``provisional``): a
completion that failed retriably on an attempt before the job's ``max_attempts`` is not the row's
result (the processor sends the item again), so ``collect --wait`` does not stop on it and does not
write it; the row's result is its completion of the greatest attempt, whatever the reading order.

The scenario: job-1 has rows 0-3 (row 2 bad) and ``max_attempts`` 2. Row 0 succeeds at once; row 1
times out on attempt 1 and succeeds on attempt 2; row 3 times out on both attempts, so its attempt-2
failure is final."""

from __future__ import annotations

import json
from pathlib import Path

from processor.core.shares import JobPolicy
from processor.jobs.collect import JobCollector, max_attempts_by_job, provisional
from processor.jobs.datasets import read_output
from processor.wire.completions import decode_completion
from processor.wire.job_share import JobShareRecord
from tests.jobs.helpers import job_record
from tests.jobs.test_collect import completion


def timed_out(item: str, attempt: int) -> bytes:
    return completion(item, "failed", reason="engine timed out", retriable=True, attempt=attempt)


def open_collector(tmp_path: Path, max_attempts: int | None) -> tuple[JobCollector, Path]:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"n": n}) + "\n" for n in range(4)))
    job = job_record(data, state="finished")
    shares = {"job-1": JobShareRecord("job-1", JobPolicy(), 0, max_attempts=max_attempts)}
    out = tmp_path / "out.jsonl"
    c = JobCollector.open(job, out, max_attempts=max_attempts_by_job(shares))
    c.starts = {0: 0, 1: 0}
    return c, out


def test_a_retriable_failure_is_not_a_rows_result_until_the_attempts_are_spent(tmp_path: Path) -> None:
    c, out = open_collector(tmp_path, max_attempts=2)
    c.offer(0, 0, "job-1:0", completion("job-1:0"))
    c.offer(0, 1, "job-1:1", timed_out("job-1:1", 1))
    c.offer(0, 2, "job-1:3", timed_out("job-1:3", 1))
    c.commit({0: 3, 1: 0})
    assert not c.complete and c.done == 1 and c.provisional == 2  # --wait keeps waiting
    c.materialize()
    assert [(r["row"], r["status"]) for r in read_output(out)] == [(0, "ok"), (2, "invalid")]

    c.offer(1, 0, "job-1:3", timed_out("job-1:3", 2))  # the last attempt: final
    c.offer(1, 1, "job-1:1", completion("job-1:1", output=b"second try", attempt=2))
    c.offer(0, 3, "job-1:1", timed_out("job-1:1", 1))  # attempt 1 replayed, read after attempt 2
    c.commit({0: 4, 1: 2})
    assert c.complete
    s = c.summary()
    assert (s.ok, s.failed, s.extra["retried completions (a later attempt answers)"]) == (2, 1, 3)
    c.materialize()
    rows = {r["row"]: r for r in read_output(out)}
    assert {n: (r["status"], r["output"]) for n, r in rows.items()} == {
        0: ("ok", "out:job-1:0"),
        1: ("ok", "second try"),
        2: ("invalid", ""),
        3: ("failed", ""),
    }
    assert c.journal.results[3].tries == 2 and c.journal.results[1].tries == 2
    c.close()


def test_without_a_recorded_max_attempts_the_default_of_three_holds(tmp_path: Path) -> None:
    c, _out = open_collector(tmp_path, max_attempts=None)
    c.offer(0, 0, "job-1:1", timed_out("job-1:1", 2))
    c.commit({0: 1, 1: 0})
    assert c.done == 0 and c.attempts_allowed("job-1") == 3
    c.offer(0, 1, "job-1:1", timed_out("job-1:1", 3))
    c.commit({0: 2, 1: 0})
    assert c.done == 1 and c.journal.results[1].status == "failed"
    c.close()


def test_only_a_retriable_failure_before_the_last_attempt_is_provisional() -> None:
    def of(value: bytes) -> bool:
        return provisional(decode_completion(value), 3)

    assert of(timed_out("job-1:1", 1)) and of(timed_out("job-1:1", 2))
    assert not of(timed_out("job-1:1", 3))
    assert not of(completion("job-1:1", "failed", attempt=1))  # not retriable: final
    assert not of(completion("job-1:1", "rejected", reason="prompt refused", attempt=1))
    assert not of(completion("job-1:1", attempt=1))
