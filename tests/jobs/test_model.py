"""The job model (processor/jobs/model.py): item ids that carry their row, progress, and the summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.jobs.model import RowResult, check_job_name, item_id, row_of, summarize
from tests.jobs.helpers import job_record


def test_item_ids_carry_the_row_and_only_this_jobs_ids_parse() -> None:
    assert item_id("job-1", 42) == "job-1:42"
    assert row_of("job-1", "job-1:42") == 42
    for foreign in ("job-12:42", "job-1:", "job-1:x", "job-1:007", "job-1:4 2", "other:1", "job-1:٣"):
        assert row_of("job-1", foreign) is None, foreign
    assert check_job_name("a.b_c-1") == "a.b_c-1"
    for bad in ("", "a:b", "a b", "x" * 101, "é"):
        with pytest.raises(ValueError, match="job name"):
            check_job_name(bad)


def test_progress_marks_a_job_finished_once_every_item_has_a_result(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    rec = job_record(data)
    assert rec.with_progress(2, 0, 10, 5).state == "submitted"
    done = rec.with_progress(2, 1, 10, 7)
    assert (done.state, done.finished_ms, done.progress_ms) == ("finished", 7, 7)
    aborted = job_record(data, state="aborted", submitted_ms=None, error="interrupted")
    assert aborted.with_progress(3, 0, 0, 9).state == "aborted"  # keeps its state, gets finished_ms
    assert aborted.with_progress(3, 0, 0, 9).finished_ms == 9


def test_padding_waste_is_one_minus_prompt_over_padded_tokens_of_batched_rows(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    results = [
        RowResult(row=0, status="ok", input_tokens=6, output_tokens=4, padded_tokens=8),
        RowResult(row=1, status="failed", input_tokens=8, padded_tokens=8),
        RowResult(row=3, status="rejected", input_tokens=100, padded_tokens=0),  # never batched
    ]
    s = summarize(job_record(data), results)
    assert (s.ok, s.failed, s.invalid, s.missing, s.complete) == (1, 2, 1, 0, True)
    assert (s.input_tokens, s.output_tokens, s.padded_tokens) == (114, 4, 16)
    assert s.padding_waste == pytest.approx(1 - 14 / 16)
    assert "padding waste 12.50%" in "\n".join(s.lines())
