"""The collector's journal (processor/jobs/journal.py): one result per row, and a torn last line survived."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.jobs.journal import Journal, JournalError
from processor.jobs.model import RowResult
from tests.jobs.helpers import job_record

# ------------------------------------------------------------------------------------------------
# the journal


def test_the_journal_keeps_one_result_per_row_and_survives_a_torn_line(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    job, path = job_record(data), tmp_path / "out.jsonl.journal"
    with Journal.open(path, job) as j:
        assert j.add([RowResult(row=1, status="ok"), RowResult(row=1, status="failed")], {0: 5}) == 1
        assert j.add([RowResult(row=1, status="ok"), RowResult(row=0, status="ok")], {0: 9, 1: 2}) == 1
        with pytest.raises(JournalError, match="in use"):
            Journal.open(path, job)
    path.write_bytes(path.read_bytes() + b'{"row": 3, "stat')
    with Journal.open(path, job) as j:
        assert sorted(j.results) == [0, 1] and j.results[1].status == "ok"
        assert j.checkpoint == {0: 9, 1: 2}
    assert path.read_bytes().endswith(b"}\n")
    with pytest.raises(JournalError, match="belongs to job 'job-1' started at 1700000000000"):
        Journal.open(path, job_record(data, started_ms=1))
