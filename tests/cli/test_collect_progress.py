"""``collect``'s progress counts every row of the dataset (the invalid ones submit refused are done
from the start), stays within 80 columns, and a collect stopped by a signal says so last, with what
it wrote and how to go on (issue 38)."""

from __future__ import annotations

import signal
from pathlib import Path

from processor.cli.collect import interrupted_line, progress_counts, progress_text
from processor.jobs.model import JobSummary
from tests.jobs.helpers import job_record


def _summary(ok: int, failed: int, invalid: int) -> JobSummary:
    return JobSummary(
        job="job-1", rows=4, ok=ok, failed=failed, invalid=invalid, missing=4 - ok - failed - invalid,
        input_tokens=30, output_tokens=0, padded_tokens=0, batched_input_tokens=0,
    )  # fmt: skip


def test_progress_counts_every_row_invalid_ones_included(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"review": "a"}\n', encoding="utf-8")
    job = job_record(data)  # 4 rows read, 3 submitted, 1 bad
    assert progress_counts(_summary(ok=0, failed=0, invalid=1), job) == (1, 4)
    assert progress_counts(_summary(ok=2, failed=1, invalid=1), job) == (4, 4)
    assert (
        progress_counts(_summary(0, 0, 0), job_record(data, submitted_ms=None, state="submitting"))[1] is None
    )


def test_progress_names_failed_and_invalid_rows_only_once_there_are_some() -> None:
    assert progress_text(_summary(ok=3, failed=0, invalid=0)) == "3 ok"
    assert progress_text(_summary(ok=1, failed=1, invalid=1)) == "1 ok, 1 failed, 1 invalid"


def test_an_interrupted_collect_says_so_with_what_it_wrote() -> None:
    line = interrupted_line(signal.SIGINT, 1234, "out.jsonl")
    assert line == (
        "interrupted by SIGINT: wrote the 1,234 rows collected so far to out.jsonl; "
        "run the same command again to go on from there"
    )
    assert len(f"tokenfabric collect: {line}") < 2 * 80  # one line, folded by the terminal at most once
