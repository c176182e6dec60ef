"""A job's OpenAI batch status and request counts (processor/jobs/states.py), state by state."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from processor.jobs.model import BadRow, JobRecord
from processor.jobs.states import OPENAI_STATUSES, openai_status, openai_view
from tests.jobs.helpers import job_record


@pytest.fixture
def job(tmp_path: Path) -> JobRecord:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    # 10 rows, 1 bad, 9 items
    return job_record(data, rows=10, items=9, bad_rows=(BadRow(4, "missing column"),))


def test_each_tokenfabric_state_maps_to_its_openai_status(job: JobRecord) -> None:
    cases = [
        (replace(job, state="submitting", submitted_ms=None, rows=0, items=0, bad_rows=()), {}, "validating"),
        (replace(job, state="aborted", error="too many bad rows"), {}, "failed"),
        (replace(job, results_ok=3, results_failed=1), {}, "in_progress"),
        (replace(job, results_ok=3), {"cancel_requested": True}, "cancelling"),
        (replace(job, results_ok=3, results_failed=2, results_cancelled=2), {}, "cancelling"),
        (replace(job, results_ok=8, results_failed=1), {}, "finalizing"),  # counted, not yet written finished
        (replace(job, state="finished", results_ok=8, results_failed=1), {}, "completed"),
        (replace(job, state="finished", results_ok=5, results_failed=4, results_expired=4), {}, "expired"),
        (
            replace(
                job, state="finished", results_ok=5, results_failed=4, results_cancelled=1, results_expired=3
            ),
            {},
            "cancelled",
        ),
    ]
    for rec, flags, status in cases:
        assert openai_status(rec, **flags) == status, (rec, flags)
    assert {status for _, _, status in cases} == set(OPENAI_STATUSES)


def test_request_counts_count_every_row_and_refused_rows_as_failed(job: JobRecord) -> None:
    view = openai_view(replace(job, state="finished", results_ok=7, results_failed=2))
    assert (view.status, view.total, view.completed, view.failed, view.counts) == (
        "completed",
        10,
        7,
        3,
        "10/7/3",
    )
    attempt = replace(
        job, name="job-1.r2", retry_of="job-1", attempt=2, rows=2, items=2, bad_rows=(), results_ok=1
    )
    assert (openai_view(attempt).total, openai_view(attempt).status) == (2, "in_progress")
