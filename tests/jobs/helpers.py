"""Templates, template parts and job records that the jobs tests (and the submit command's) share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from processor.jobs.datasets import file_sha256
from processor.jobs.model import BadRow, JobRecord
from processor.jobs.templates import parse_template
from tests.common import ROOT

EXAMPLES = ROOT / "examples" / "jobs"


def template(*parts: dict[str, Any], **top: Any) -> Any:
    return parse_template({"parts": list(parts), **top}, "t")


SYSTEM = {"name": "system", "text": "Be brief.\n", "cacheable": True}
TOOLS = {"name": "tools", "text": '{"type": "object", "properties": {}}\n', "cacheable": True}
QUESTION = {"name": "q", "text": "Q: {question}\nA:"}


# ------------------------------------------------------------------------------------------------
# the job record


def job_record(dataset: Path, **changes: Any) -> JobRecord:
    fields: dict[str, Any] = {
        "name": "job-1",
        "state": "submitted",
        "dataset": str(dataset),
        "dataset_sha256": file_sha256(dataset),
        "template": "t.toml",
        "shape": (1 << 64) - 5,
        "model": "default",
        "tokenizer": "tokenizer.json",
        "rows": 4,
        "items": 3,
        "input_tokens": 30,
        "bad_rows": (BadRow(2, "missing column 'review'"),),
        "started_ms": 1_700_000_000_000,
        "submitted_ms": 1_700_000_001_000,
    }
    fields.update(changes)
    return JobRecord(**fields)
