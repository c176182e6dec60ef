"""A job and its retry attempts collected as one (processor/jobs/collect.py, journal.py): each row's
result is its last attempt's, written once per (row, attempt), resumed from the journal.

The scenario: job-1 has rows 0-3 (row 2 bad). Row 1 failed and row 3 expired; attempt 2
(``job-1.r2``) runs rows 1 and 3 again. Row 1 now succeeds; row 3 fails again, so attempt 3 runs
row 3 alone, and its result arrives on a partition read *before* attempt 2's (order across
partitions is arbitrary): the later attempt must still win."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from processor.jobs.collect import JobCollector, attempts_of
from processor.jobs.datasets import read_output
from processor.jobs.journal import Journal
from processor.jobs.model import RowResult
from tests.jobs.helpers import job_record
from tests.jobs.test_collect import completion


def _dataset(tmp_path: Path) -> Path:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"n": n}) + "\n" for n in range(4)))
    return data


def test_a_later_attempt_supersedes_and_the_job_completes_only_with_its_attempts(tmp_path: Path) -> None:
    job = job_record(_dataset(tmp_path), state="finished")
    r2 = replace(
        job,
        name="job-1.r2",
        retry_of="job-1",
        attempt=2,
        rows=2,
        items=2,
        bad_rows=(),
        started_ms=job.started_ms + 10,
    )
    out = tmp_path / "out.jsonl"
    c = JobCollector.open(job, out)
    c.starts = {0: 0, 1: 0}
    c.offer(0, 0, "job-1:0", completion("job-1:0"))
    c.offer(0, 1, "job-1:1", completion("job-1:1", "failed"))
    c.offer(0, 2, "job-1:3", completion("job-1:3", "expired", batch_id=""))
    c.offer(0, 3, "job-1.r2:1", completion("job-1.r2:1"))  # an attempt this collector does not know yet
    assert c.commit({0: 4, 1: 0}) == 3
    assert c.complete and c.stray == 1
    s = c.summary()
    assert (s.ok, s.failed, s.expired, s.complete, s.attempts) == (1, 2, 1, True, 1)

    assert c.add_attempt(r2) and not c.add_attempt(r2)  # the second time it is only an update
    assert not c.complete and c.summary().retrying == 2
    c.offer(1, 0, "job-1.r2:1", completion("job-1.r2:1", output=b"second try"))
    c.offer(1, 1, "job-1.r2:1", completion("job-1.r2:1", "failed"))  # a duplicate of a row's attempt
    c.offer(1, 2, "job-2.r2:3", completion("job-2.r2:3"))  # another job's attempt: stray
    assert c.commit({0: 4, 1: 3}) == 1
    assert (c.summary().retrying, c.complete, c.stray) == (1, False, 2)  # row 3 waits for attempt 2
    c.offer(1, 3, "job-1.r2:3", completion("job-1.r2:3", "failed", reason="timed out again"))
    c.commit({0: 4, 1: 4})
    assert c.complete
    s = c.summary()
    assert (s.ok, s.failed, s.expired, s.retrying, s.attempts) == (2, 1, 0, 0, 2)
    c.close()

    # attempt 3 runs row 3; its result comes on partition 0, attempt 2's duplicate of row 3 after it
    r3 = replace(r2, name="job-1.r3", attempt=3, rows=1, items=1, started_ms=r2.started_ms + 10)
    again = JobCollector.open(job, out, attempts=attempts_of("job-1", {j.name: j for j in (job, r2, r3)}))
    assert [a.attempt for a in again.attempts.values()] == [2, 3] and again.journal.attempts == {"job-1.r2"}
    again.starts = {0: 4, 1: 4}
    again.offer(0, 4, "job-1.r3:3", completion("job-1.r3:3", output=b"third time lucky"))
    again.offer(1, 4, "job-1.r2:3", completion("job-1.r2:3", "failed"))  # older attempt, read later
    again.commit({0: 5, 1: 5})
    assert again.complete
    again.materialize()
    rows = {r["row"]: r for r in read_output(out)}
    assert {n: (r["status"], r["output"]) for n, r in rows.items()} == {
        0: ("ok", "out:job-1:0"),
        1: ("ok", "second try"),
        2: ("invalid", ""),
        3: ("ok", "third time lucky"),
    }
    records = {r.name: r for r in again.progress_records(99)}
    assert (records["job-1"].results_ok, records["job-1"].results_failed) == (3, 0)
    assert (records["job-1.r2"].results_ok, records["job-1.r2"].state) == (2, "finished")
    assert (records["job-1.r3"].results_ok, records["job-1.r3"].finished_ms) == (1, 99)
    again.close()

    # the journal holds one line per (row, attempt) and reads back to the same rows
    lines = [json.loads(line) for line in journal_lines(out)]
    results = [(e["row"], e["attempt"]) for e in lines if "row" in e]
    assert sorted(results) == sorted(set(results)) and (3, 3) in results and (1, 2) in results
    with Journal.open(out.with_name(out.name + ".journal"), job) as journal:
        assert {n: (r.attempt, r.status) for n, r in journal.results.items()} == {
            0: (1, "ok"),
            1: (2, "ok"),
            3: (3, "ok"),
        }
        assert journal.attempts == {"job-1.r2", "job-1.r3"}


def journal_lines(out: Path) -> list[str]:
    return out.with_name(out.name + ".journal").read_text().splitlines()[1:]


def test_the_journal_replays_the_latest_result_whatever_the_order_of_its_lines(tmp_path: Path) -> None:
    job = job_record(_dataset(tmp_path))
    path = tmp_path / "j.journal"
    first = RowResult(row=1, status="failed", reason="boom")
    later_try = replace(first, status="ok", tries=2, reason=None)
    retried = RowResult(row=1, status="failed", attempt=2, reason="again")
    with Journal.open(path, job) as journal:
        assert journal.add([retried], {0: 1}) == 1
        assert journal.add([later_try, first], {0: 2}) == 0  # older than attempt 2's: not appended
        assert journal.add([replace(retried, tries=3, status="ok")], {0: 3}) == 1
    with Journal.open(path, job) as journal:
        assert (journal.results[1].attempt, journal.results[1].tries, journal.results[1].status) == (
            2,
            3,
            "ok",
        )
    assert first.supersedes(None) and later_try.supersedes(first) and not first.supersedes(replace(first))


def test_a_collect_journal_from_before_attempts_reads_as_attempt_one(tmp_path: Path) -> None:
    job = job_record(_dataset(tmp_path))
    path = tmp_path / "old.journal"
    header = {
        "journal": 1,
        "job": job.name,
        "started_ms": job.started_ms,
        "dataset_sha256": job.dataset_sha256,
    }
    old_row = {
        "row": 0, "status": "ok", "reason": None, "output": "hi", "output_base64": None, "input_tokens": 3,
        "output_tokens": 1, "padded_tokens": 4, "batch_id": "b", "consumer": "c", "completed_ms": 5,
    }  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in (header, old_row, {"checkpoint": {"0": 7}})))
    with Journal.open(path, job) as journal:
        r = journal.results[0]
        assert (r.attempt, r.tries, r.output, journal.checkpoint, journal.attempts) == (
            1,
            1,
            b"hi",
            {0: 7},
            set(),
        )
