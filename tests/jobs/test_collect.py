"""Collecting a job (processor/jobs/collect.py) with completions offered by hand: first results joined to
their rows, resumed from the journal. On a real broker: tests/broker/test_jobs.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from processor.jobs.collect import JobCollector, journal_path
from processor.jobs.datasets import DatasetError, read_output
from processor.wire.completions import encode_completion
from processor.wire.records import CompletionRecord
from tests.jobs.helpers import job_record


def completion(item: str, status: str = "ok", **changes: Any) -> bytes:
    fields: dict[str, Any] = {
        "item_id": item,
        "job_id": "job-1",
        "batch_id": "b1",
        "consumer": "card",
        "model": "default",
        "status": status,
        "reason": None if status == "ok" else "engine fell over",
        "input_tokens": 10,
        "output_tokens": 4 if status == "ok" else 0,
        "padded_tokens": 16,
        "output": b"out:" + item.encode() if status == "ok" else b"",
        "completed_ms": 123,
    }
    fields.update(changes)
    return encode_completion(CompletionRecord(**fields))


def test_a_collector_joins_first_results_to_rows_and_resumes_from_its_journal(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"n": n}) + "\n" for n in range(4)))
    job = job_record(data)
    out = tmp_path / "out.jsonl"
    c = JobCollector.open(job, out)
    c.starts = {0: 0, 1: 0}
    c.offer(0, 0, "job-1:0", completion("job-1:0"))
    c.offer(0, 1, "job-1:0", completion("job-1:0", "failed"))  # a duplicate: the first one wins
    c.offer(1, 0, "job-1:2", completion("job-1:2"))  # the bad row: not an item of this job
    c.offer(1, 1, "job-1:9", completion("job-1:9"))  # past the last row
    c.offer(1, 2, "job-1:3", b"garbage")
    assert c.commit({0: 2, 1: 3}) == 1
    assert (c.stray, c.undecodable, c.complete) == (2, 1, False)
    c.materialize()
    assert [(r["row"], r["status"]) for r in read_output(out)] == [(0, "ok"), (2, "invalid")]
    c.close()

    again = JobCollector.open(job, out)  # a restart: rows and offsets come back from the journal
    assert again.journal.checkpoint == {0: 2, 1: 3} and sorted(again.journal.results) == [0]
    again.starts = dict(again.journal.checkpoint)
    again.offer(0, 1, "job-1:0", completion("job-1:0", "failed"))  # below the checkpoint: ignored
    again.offer(0, 2, "job-1:1", completion("job-1:1", "failed"))
    again.offer(1, 3, "job-1:3", completion("job-1:3", output=b"\xff\xfe"))
    again.commit({0: 3, 1: 4})
    assert again.complete
    again.materialize()
    rows = read_output(out)
    assert [(r["row"], r["status"], r["input"]) for r in rows] == [
        (0, "ok", {"n": 0}),
        (1, "failed", {"n": 1}),
        (2, "invalid", {"n": 2}),
        (3, "ok", {"n": 3}),
    ]
    assert rows[0]["output"] == "out:job-1:0" and rows[1]["reason"] == "engine fell over"
    assert (rows[3]["output"], rows[3]["output_base64"]) == (None, "//4=")
    s = again.summary()
    assert (s.ok, s.failed, s.invalid, s.missing) == (2, 1, 1, 0)
    again.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "out.jsonl", "out.jsonl.journal"]


def test_collect_refuses_a_dataset_that_changed_since_submit(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"n": 0}\n')
    job = job_record(data)
    data.write_text('{"n": 1}\n')
    with pytest.raises(DatasetError, match="changed since job job-1 was submitted"):
        JobCollector.open(job, tmp_path / "out.jsonl")
    assert not journal_path(tmp_path / "out.jsonl").exists()
