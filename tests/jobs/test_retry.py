"""Retry attempts, the pure part (processor/jobs/retry.py): names, which rows, when, with what options.
Through a broker: tests/broker/test_retry_failed.py."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from processor.jobs.model import JobRecord, RowResult, summarize
from processor.jobs.retry import (
    ITEM_OPTIONS,
    RowSubset,
    attempt_name,
    item_options,
    next_attempt,
    options_namespace,
    recorded_options,
    retry_problem,
    rows_to_retry,
)
from tests.jobs.helpers import job_record


def _job(tmp_path: Path, **changes: Any) -> JobRecord:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"n": n}) + "\n" for n in range(5)))
    return job_record(data, rows=5, items=5, bad_rows=(), **changes)


def test_attempts_are_named_after_their_job_and_numbered_from_two(tmp_path: Path) -> None:
    job = _job(tmp_path)
    assert attempt_name("reviews", 2) == "reviews.r2"
    assert next_attempt([]) == 2
    assert next_attempt([replace(job, attempt=2), replace(job, attempt=3)]) == 4
    with pytest.raises(ValueError, match="attempt 2 or later"):
        attempt_name("reviews", 1)
    with pytest.raises(ValueError, match="job name"):
        attempt_name("x" * 98, 2)


def test_only_failed_and_expired_rows_are_retried_once_every_row_has_its_result(tmp_path: Path) -> None:
    job = _job(tmp_path)
    results = [
        RowResult(row=0, status="ok"),
        RowResult(row=1, status="failed"),
        RowResult(row=2, status="rejected"),
        RowResult(row=3, status="cancelled"),
    ]
    assert "rows without their result yet (1 rows)" in (retry_problem(job, summarize(job, results)) or "")
    results.append(RowResult(row=4, status="expired"))
    assert retry_problem(job, summarize(job, results)) is None
    assert rows_to_retry(results) == [1, 4]
    attempt = replace(job, name="job-1.r2", retry_of="job-1", attempt=2, items=2)
    assert "retry job-1 instead" in (retry_problem(attempt, summarize(attempt, [])) or "")
    # attempt 2 has one of its two rows back: the job waits for the other
    mid = summarize(job, [*results[:4], replace(results[1], attempt=2, status="ok")], attempts=[attempt])
    assert mid.retrying == 1 and "(1 rows)" in (retry_problem(job, mid) or "")
    submitting = replace(attempt, state="submitting", submitted_ms=None)
    assert summarize(job, results, attempts=[submitting]).retrying is None


def test_the_options_recorded_with_a_job_are_what_its_attempt_renders_with(tmp_path: Path) -> None:
    settings = tmp_path / "settings.json"
    settings.write_text('{"temperature": 0.5}')
    args = argparse.Namespace(
        template="t.toml",
        request=f"@{settings}",
        model="m",
        tokenizer=None,
        output_budget=7,
        dataset="x.jsonl",
    )
    recorded = json.loads(item_options(args))
    assert set(recorded) == set(ITEM_OPTIONS)
    assert recorded["template"] == str(Path("t.toml").resolve())  # resolved: the retry may run elsewhere
    assert recorded["request"] == '{"temperature": 0.5}'  # the file's text, as it was at submit
    job = _job(tmp_path, options=item_options(args))
    merged = options_namespace(
        {"dataset": "x", "template": "ignored.toml", "max_bad_rows": 5}, recorded_options(job)
    )
    assert (merged["template"], merged["output_budget"], merged["max_bad_rows"]) == (
        recorded["template"],
        7,
        5,
    )
    assert merged["input_format"] == "auto"

    old = _job(tmp_path, template="/srv/t.toml", model="small")  # recorded before options existed
    assert {k: v for k, v in recorded_options(old).items() if v is not None} == {
        "input_format": "rows",
        "template": "/srv/t.toml",
        "model": "small",
        "tokenizer": "tokenizer.json",
    }
    openai = _job(tmp_path, template="openai-batch:/srv/chat.jinja")
    assert recorded_options(openai)["input_format"] == "openai"
    assert recorded_options(openai)["chat_template"] == "/srv/chat.jinja"


def test_an_attempts_dataset_reads_its_rows_under_their_own_numbers(tmp_path: Path) -> None:
    job = _job(tmp_path)
    subset = RowSubset(job.dataset, [4, 1])
    assert [(r.row, r.values) for r in subset.rows()] == [(1, {"n": 1}), (4, {"n": 4})]
