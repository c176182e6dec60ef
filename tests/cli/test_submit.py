"""Submitting a job (processor/cli/submit.py) with stand-ins for the producer and the job writer that
record what they are given. On a real broker: tests/broker/test_jobs.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from processor.cli.submit import Aborted, SubmitPlan, submit
from processor.jobs.datasets import Dataset, file_sha256
from processor.jobs.model import JobRecord
from processor.jobs.textprep import TextTokenizer
from processor.wire.records import ids_from_tokens
from tests.jobs.helpers import QUESTION, SYSTEM, template

# ------------------------------------------------------------------------------------------------
# submitting


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, item_id: str, model: str, tokens: bytes, **kw: Any) -> int:
        self.sent.append({"item_id": item_id, "model": model, "tokens": tokens, **kw})
        return int(kw["shape"])

    def close(self, timeout: float = 0) -> None:
        pass

    def flush(self, timeout: float = 0) -> int:
        return 0


class FakeWriter:
    def __init__(self) -> None:
        self.records: list[JobRecord] = []

    def write(self, rec: JobRecord) -> None:
        self.records.append(rec)


def plan(tmp_path: Path, lines: list[str], max_bad_rows: int = 100) -> SubmitPlan:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(line + "\n" for line in lines))
    return SubmitPlan(
        "job-1",
        template(SYSTEM, QUESTION),
        Dataset(data),
        TextTokenizer(),
        "m",
        16,
        max_bad_rows,
    )


def test_submit_produces_good_rows_reports_bad_ones_and_records_the_job(tmp_path: Path) -> None:
    p = plan(
        tmp_path, ['{"question": "a"}', '{"q": 1}', "oops", '{"question": "\\ud800"}', '{"question": 7}']
    )
    producer, writer, reported = FakeProducer(), FakeWriter(), []
    final = submit(p, producer, writer, on_bad=reported.append)  # type: ignore[arg-type]
    assert [s["item_id"] for s in producer.sent] == ["job-1:0", "job-1:4"]
    assert {(s["model"], s["shape"], s["job_id"], s["output_budget"]) for s in producer.sent} == {
        ("m", p.template.shape, "job-1", 16)
    }
    ids = ids_from_tokens(producer.sent[0]["tokens"])
    assert list(ids) == list(p.tokenizer.encode_many([p.template.render({"question": "a"})])[0].ids)
    assert [r.state for r in writer.records] == ["submitting", "submitted"]
    assert [b.row for b in reported] == [1, 2, 3] and [b.row for b in final.bad_rows] == [1, 2, 3]
    assert final.bad_rows[0].reason == "missing column 'question'"
    assert (final.rows, final.items, final.input_tokens) == (
        5,
        2,
        len(ids) + len(producer.sent[1]["tokens"]) // 4,
    )
    assert final.dataset_sha256 == file_sha256(p.dataset.path) and final.submitted_ms is not None


def test_submit_aborts_past_max_bad_rows_and_records_why(tmp_path: Path) -> None:
    p = plan(tmp_path, ['{"x": 1}'] * 3 + ['{"question": "a"}'], max_bad_rows=2)
    writer = FakeWriter()
    with pytest.raises(Aborted, match="more than 2 bad rows"):
        submit(p, FakeProducer(), writer)  # type: ignore[arg-type]
    last = writer.records[-1]
    assert (last.state, last.submitted_ms, len(last.bad_rows)) == ("aborted", None, 3)
    assert last.error is not None and "--max-bad-rows" in last.error
