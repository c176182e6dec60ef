"""``tokenfabric jobs``: result counts from the processors' ledger when no collect has counted them
(never "0 ok, 300 missing" beside a cost line that says the job completed), and ``jobs NAME``'s
lines folded to the terminal's width (issue 38: lines of 177, 106 and 83 characters at 80 columns)."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.cli.jobs import _Costs, _count_from_the_ledger, print_field
from processor.core.accounting import Ledger
from processor.ops.status import StatusView
from processor.wire.records import LedgerSnapshotRecord
from tests.jobs.helpers import job_record


def _view(ledger: Ledger) -> StatusView:
    view = StatusView()
    view.checkpoints["p0"] = LedgerSnapshotRecord(
        instance="p0", taken_ms=0, sequence=1, counters=ledger.snapshot(), per_model={}, per_consumer={}
    )
    return view


def test_a_job_no_collect_has_counted_takes_its_counts_from_the_ledger(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("{}\n", encoding="utf-8")
    ledger = Ledger()
    ledger.job_received("nightly", 300, 30_000)
    ledger.job_routed("nightly", 300, 30_000, 30_400)
    ledger.job_finished("nightly", 299, 29_900, 1, 100)
    jobs = {
        "nightly": job_record(data, name="nightly", rows=300, items=300, bad_rows=()),
        "counted": job_record(data, name="counted", results_ok=3, progress_ms=5),  # a collect ran
    }
    costs = _Costs({}, _view(ledger))
    _count_from_the_ledger(jobs, costs)
    nightly = jobs["nightly"]
    assert (nightly.results_ok, nightly.results_failed, nightly.state) == (299, 1, "finished")
    assert nightly.progress_ms is None and costs.from_ledger == {"nightly"}
    assert jobs["counted"].results_ok == 3  # the ledger knows nothing of it: the collect's counts stay


def test_jobs_name_folds_each_line_to_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    cost = (
        "30,000 tokens received, 30,000 routed, 29,900 completed, 30,400 padded in 12 batches; "
        "completed prompts: 0 tokens from the prefix cache, 29,900 computed (0.0% cached)"
    )
    print_field("cost", cost, columns=80)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("cost       30,000 tokens") and lines[1].startswith(
        " " * 11 + lines[1].strip()
    )
    assert (
        " ".join(line.split(maxsplit=1)[1] if n == 0 else line.strip() for n, line in enumerate(lines))
        == cost
    )
