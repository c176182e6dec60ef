"""``submit --retry-failed`` on a real broker: rows a failing engine failed run again as attempt 2, and
``collect`` merges the attempts into one result per row (docs/jobs.md, "Retrying failed rows").

A processor and one consumer app run in threads of this process (tests/broker/rig.py). The consumer's
engine fails every item of the job's first attempt whose row is 3 mod 7 (an engine that timed out
on them); items of a retry attempt (``NAME.r2:<row>``) all succeed. The scenario:

1. submit 60 rows; ``collect --wait --format openai`` writes 51 lines to the output file and the 9
   failed rows to the error file, both valid OpenAI batch files; the job is ``finished``;
2. ``--retry-failed`` on the attempt's name, or before anything failed again, is refused or does nothing;
   on the job it submits ``NAME.r2`` with exactly the 9 rows, the job's share copied;
3. the same ``collect`` (its journal resumed) now writes 60 output lines and an empty error file, the
   9 retried rows from attempt 2; the journal holds one line per (row, attempt); collecting the
   attempt alone is refused; the collector service and a plain jsonl collect agree; the jobs topic
   shows both records finished, and ``jobs`` their OpenAI status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.apps.consumer import ConsumerApp
from processor.cli.tokenfabric import main
from processor.core.contract import Contract
from processor.core.shares import JobPolicy
from processor.engines.base import Engine, ItemResult
from processor.jobs.collect import journal_path
from processor.jobs.datasets import read_output
from processor.jobs.model import job_of, row_of
from processor.jobs.topic import JobWriter, read_job_shares, read_jobs
from processor.wire.records import BatchRecord
from tests.broker.rig import QUICK, InProcess, new_topics, review_job, running_in_process
from tests.jobs.openai_batch import validate_files

pytestmark = pytest.mark.kafka

CARD = Contract("retrycard", "default", budget_tokens=4096, max_items=16, pad_multiple=8, max_inflight=2)
JOB = "reviews-r"
ROWS = 60
FAILED_ROWS = [row for row in range(ROWS) if row % 7 == 3]


class FirstAttemptFails(Engine):
    """Fails the first attempt's items of rows 3 mod 7; answers everything else at once."""

    name = "first-attempt-fails"

    def run(self, batch: BatchRecord) -> list[ItemResult]:
        out = []
        for item in batch.items:
            row = row_of(JOB, item.item_id)
            if row is not None and row % 7 == 3:
                out.append(ItemResult(item.item_id, "failed", b"", 0, "engine timed out after 30 s", False))
            else:
                out.append(ItemResult(item.item_id, "ok", f"answer {item.item_id}".encode(), 2, None, False))
        return out


@pytest.fixture
def rig(kafka_bootstrap: str) -> Iterator[InProcess]:
    """A processor in a thread, and a consumer app whose engine is :class:`FirstAttemptFails`."""
    topics = new_topics(kafka_bootstrap, "r", [CARD.consumer], ingest_partitions=2)
    with running_in_process(
        kafka_bootstrap, [], topics=topics, instance="retry-itest", commit_interval_ms=200
    ) as rig:
        app = ConsumerApp(rig.conf, rig.topics, CARD, FirstAttemptFails(), QUICK)
        rig.apps.append(app)
        rig.runner.start(app.run, CARD.consumer)
        yield rig


def test_retry_failed_runs_the_failed_rows_again_and_collect_merges_the_attempts(
    rig: InProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf, topics = rig.conf, rig.topics
    kafka = ["--bootstrap", conf["bootstrap.servers"], "--topic-prefix", topics.prefix]
    data, template = review_job(tmp_path, ROWS)
    assert (
        main(["submit", str(data), "--job", JOB, "--template", str(template), "--no-progress", *kafka]) == 0
    )
    JobWriter(conf, topics).write_share(JOB, JobPolicy(weight=3.0), 1)

    # 1. the first attempt: 9 rows failed, in the OpenAI error file
    out, errors = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    collect = ["collect", "--job", JOB, "--out", str(out), "--format", "openai", "--no-progress", *kafka]
    assert main([*collect, "--wait", "--timeout-s", "120"]) == 0, capsys.readouterr().err
    assert f"{ROWS} rows: {ROWS - 9} ok, 9 failed, 0 invalid, 0 missing" in capsys.readouterr().out
    ok, bad = validate_files(out, errors)
    assert len(ok) == ROWS - 9
    assert sorted(int(x["custom_id"].split(":")[1]) for x in bad) == FAILED_ROWS
    assert {x["error"]["code"] for x in bad} == {"server_error"}
    assert read_jobs(conf, topics)[JOB].state == "finished"

    # 2. an attempt is started for the job only, and only for its failed rows
    retry = ["submit", "--no-progress", *kafka, "--retry-failed"]
    assert main([*retry, f"{JOB}.r9"]) == 2  # no such job
    assert main([*retry, JOB]) == 0
    said = capsys.readouterr().out
    assert all(len(line) <= 80 for line in said.splitlines()), said  # folded to the terminal
    said = " ".join(said.split())
    assert f"submitted attempt 2 of job {JOB} as job {JOB}.r2: 9 of 9 failed or expired rows" in said
    jobs = read_jobs(conf, topics)
    attempt = jobs[f"{JOB}.r2"]
    assert (attempt.retry_of, attempt.attempt, attempt.items, attempt.rows) == (JOB, 2, 9, 9)
    assert (attempt.dataset_sha256, attempt.shape) == (jobs[JOB].dataset_sha256, jobs[JOB].shape)
    assert attempt.options == jobs[JOB].options and json.loads(jobs[JOB].options or "")["template"] == str(
        template
    )
    assert read_job_shares(conf, topics)[f"{JOB}.r2"] == JobPolicy(weight=3.0)
    assert main([*retry, f"{JOB}.r2"]) == 2  # an attempt: retry the job
    assert "retry reviews-r instead" in capsys.readouterr().err

    # 3. collect resumes its journal and merges: every row ok, the retried ones from attempt 2
    assert main([*collect, "--wait", "--timeout-s", "120"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert f"{ROWS} rows: {ROWS} ok, 0 failed" in printed and "attempts: 2" in printed
    ok, bad = validate_files(out, errors)
    assert (len(ok), bad) == (ROWS, [])
    by_row = {int(x["custom_id"].split(":")[1]): x for x in ok}
    assert sorted(by_row) == list(range(ROWS))
    for row, line in by_row.items():
        producer = line["response"]["request_id"]
        assert job_of(producer) == (f"{JOB}.r2" if row in FAILED_ROWS else JOB), (row, producer)
        assert line["response"]["body"]["choices"][0]["text"] == f"answer {producer}"
    entries = [json.loads(x) for x in journal_path(out).read_text().splitlines()[1:]]
    per_row_attempt = [(e["row"], e["attempt"]) for e in entries if "row" in e]
    assert len(per_row_attempt) == len(set(per_row_attempt)) == ROWS + 9

    attempt_out = ["collect", "--job", f"{JOB}.r2", "--out", str(tmp_path / "a.jsonl"), *kafka]
    assert main(attempt_out) == 2 and f"'collect --job {JOB}' merges it" in capsys.readouterr().err
    service = tmp_path / "service"
    assert main(["collector", "--out-dir", str(service), "--format", "openai", "--once", *kafka]) == 0
    assert (service / f"{JOB}.jsonl").read_bytes() == out.read_bytes()  # the attempt merged, not its own file
    assert sorted(p.name for p in service.iterdir() if not p.name.endswith(".journal")) == [
        f"{JOB}.errors.jsonl",
        f"{JOB}.jsonl",
    ]

    plain = tmp_path / "plain.jsonl"
    assert main(["collect", "--job", JOB, "--out", str(plain), "--no-progress", *kafka]) == 0
    assert [(r["row"], r["status"]) for r in read_output(plain)] == [(n, "ok") for n in range(ROWS)]
    assert main([*retry, JOB]) == 0
    assert "nothing to retry" in capsys.readouterr().out

    final = read_jobs(conf, topics)
    assert (final[JOB].state, final[JOB].results_ok, final[JOB].results_failed) == ("finished", ROWS, 0)
    assert (final[f"{JOB}.r2"].state, final[f"{JOB}.r2"].results_ok) == ("finished", 9)
    assert main(["jobs", *kafka]) == 0
    listing = capsys.readouterr().out
    assert f"{JOB}.r2" in listing and "completed" in listing and f"{ROWS}/{ROWS}/0" in listing
    assert main(["jobs", f"{JOB}.r2", *kafka]) == 0
    detail = capsys.readouterr().out
    assert f"(attempt 2 of {JOB})" in detail
    assert "completed: request_counts total 9, completed 9, failed 0" in detail
