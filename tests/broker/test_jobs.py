"""Jobs end to end on a real broker: submit a dataset, run it, collect it, collect it again.

A processor and one simulated card run in threads of this process (tests/broker/rig.py); the
commands run through ``processor.cli.main`` exactly as a person would type them. The scenario:

1. submit 200 rows of which row 57 has no ``review`` column: 199 items, the bad row reported, exit 3;
2. every item completes; then the results topic gets 10 of its messages again (duplicates) and one
   stray completion;
3. ``collect --wait`` writes 200 rows: 199 ok, joined to their own input, and row 57 ``invalid``;
4. a second collect (a restart) rewrites the same bytes; so does one after a crash that tore the
   journal's last line and lost its last 20 rows and checkpoint;
5. the same job to Parquet, ``jobs`` showing it finished, and the ``collector`` service's file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from confluent_kafka import Producer

from processor.cli.tokenfabric import main
from processor.core.contract import Contract
from processor.jobs.collect import journal_path
from processor.jobs.datasets import read_output
from processor.jobs.topic import read_jobs
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.wire.completions import decode_completions, encode_completion
from processor.wire.records import CompletionRecord
from tests.broker.rig import running_in_process

pytestmark = pytest.mark.kafka

CARD = Contract("jobcard", "default", budget_tokens=4096, max_items=32, pad_multiple=8, max_inflight=2)
ROWS = 200
BAD_ROW = 57
TEMPLATE = """
[[parts]]
name = "system"
cacheable = true
text = "You label the sentiment of product reviews with one word.\\n"

[[parts]]
name = "review"
text = "Review: {review}\\nSentiment:"
"""


@pytest.fixture
def running(kafka_bootstrap: str) -> Iterator[tuple[dict[str, str], TopicNames]]:
    """One card and a processor in threads (tests/broker/rig.py)."""
    with running_in_process(
        kafka_bootstrap,
        [CARD],
        letter="j",
        ingest_partitions=2,
        instance="jobs-itest",
        commit_interval_ms=200,
    ) as rig:
        yield rig.conf, rig.topics


def _dataset(folder: Path) -> tuple[Path, Path, list[dict[str, object]]]:
    rows: list[dict[str, object]] = []
    for n in range(ROWS):
        row: dict[str, object] = {"id": f"r{n}", "stars": n % 5 + 1}
        row["text" if n == BAD_ROW else "review"] = f"review number {n}: " + "good " * (n % 37)
        rows.append(row)
    data = folder / "reviews.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    template = folder / "sentiment.toml"
    template.write_text(TEMPLATE, encoding="utf-8")
    return data, template, rows


def _results_for(conf: dict[str, str], topics: TopicNames, job: str) -> list[tuple[bytes, bytes, set[str]]]:
    """Results messages holding completions of ``job``'s items (either form), with those item ids."""
    found = []
    for m in read_topic(conf, topics.results):
        ids = {c.item_id for c in decode_completions(m.value()) if c.item_id.startswith(f"{job}:")}
        if ids:
            found.append((m.key(), m.value(), ids))
    return found


def test_a_job_is_submitted_run_and_collected_once_per_row_across_restarts(
    running: tuple[dict[str, str], TopicNames], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf, topics = running
    data, template, rows = _dataset(tmp_path)
    kafka = ["--bootstrap", conf["bootstrap.servers"], "--topic-prefix", topics.prefix]
    job = "reviews-1"

    # 1. submit: the bad row is reported by number, the rest go out, exit 3 (bad rows, not allowed)
    rc = main(["submit", str(data), "--job", job, "--template", str(template), "--no-progress", *kafka])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert f"bad row {BAD_ROW}: missing column 'review'" in err
    record = read_jobs(conf, topics)[job]
    assert (record.state, record.rows, record.items) == ("submitted", ROWS, ROWS - 1)
    assert [(b.row, b.reason) for b in record.bad_rows] == [(BAD_ROW, "missing column 'review'")]
    # the name is single-use
    assert main(["submit", str(data), "--job", job, "--template", str(template), *kafka]) == 2
    capsys.readouterr()

    # 2. every item completes; then duplicates and a stray completion land on the results topic
    deadline = time.monotonic() + 60
    while len(set().union(*(ids for _, _, ids in _results_for(conf, topics, job)))) < ROWS - 1:
        assert time.monotonic() < deadline, "items did not all complete within 60 s"
        time.sleep(0.5)
    replayed = [(key, value) for key, value, _ in _results_for(conf, topics, job)[:10]]
    stray = encode_completion(
        CompletionRecord(
            item_id=f"{job}:{ROWS + 5}",
            job_id=job,
            model="default",
            status="ok",
            input_tokens=3,
            completed_ms=0,
        )
    )
    producer = Producer(conf)
    for key, value in [*replayed, (f"{job}:{ROWS + 5}".encode(), stray)]:
        producer.produce(topics.results, value, key)
    producer.flush(30)

    # 3. collect: one row per dataset row, each joined to its own input
    out = tmp_path / "out.jsonl"
    collect = ["collect", "--job", job, "--out", str(out), "--no-progress", *kafka]
    assert main([*collect, "--wait", "--timeout-s", "60"]) == 0
    summary = capsys.readouterr().out
    assert f"{ROWS:,} rows: {ROWS - 1} ok, 0 failed, 1 invalid, 0 missing" in summary
    assert "1 stray completions" in summary
    written = read_output(out)
    assert [r["row"] for r in written] == list(range(ROWS))
    for r in written:
        assert r["input"] == rows[r["row"]]
        if r["row"] == BAD_ROW:
            assert (r["status"], r["reason"]) == ("invalid", "missing column 'review'")
        else:
            assert r["status"] == "ok"
            assert r["output"] == f"sim:{job}:{r['row']}"
            assert 0 < r["input_tokens"] <= r["padded_tokens"]
    first = out.read_bytes()

    # 4a. a restart collects nothing new and rewrites the same file
    assert main(collect) == 0
    assert out.read_bytes() == first
    # 4b. a crash that lost the journal's tail (last 20 rows and the checkpoint) and tore a line
    journal = journal_path(out)
    lines = journal.read_bytes().splitlines(keepends=True)
    result_lines = [n for n, line in enumerate(lines) if b'"status"' in line]
    kept = lines[: result_lines[-20]]
    journal.write_bytes(b"".join(kept) + b'{"row": 3, "sta')
    assert main(collect) == 0
    assert out.read_bytes() == first
    rows_in_journal = [json.loads(x)["row"] for x in journal.read_bytes().splitlines() if b'"status"' in x]
    assert sorted(rows_in_journal) == sorted(set(rows_in_journal)) and len(rows_in_journal) == ROWS - 1
    capsys.readouterr()

    # 5. Parquet, the jobs listing, and the collector service all agree
    pq_out = tmp_path / "out.parquet"
    assert main(["collect", "--job", job, "--out", str(pq_out), "--no-progress", *kafka]) == 0
    as_parquet = read_output(pq_out)
    assert [(r["row"], r["status"], r["output"]) for r in as_parquet] == [
        (r["row"], r["status"], r["output"]) for r in written
    ]
    assert json.loads(as_parquet[0]["input"]) == rows[0]
    final = read_jobs(conf, topics)[job]
    assert (final.state, final.results_ok, final.results_failed) == ("finished", ROWS - 1, 0)
    assert main(["jobs", *kafka]) == 0
    assert job in capsys.readouterr().out
    with mock.patch.dict(os.environ, {"COLUMNS": "80"}):
        assert main(["jobs", job, *kafka]) == 0  # in full, folded to 80 columns
    detail = capsys.readouterr().out.splitlines()
    assert any(line.startswith("cost ") for line in detail), detail
    wide = [line for line in detail if len(line) > 80]
    assert all(len(line.split()) == 2 for line in wide), wide  # only a label and one path, kept whole
    service_dir = tmp_path / "service"
    assert main(["collector", "--out-dir", str(service_dir), "--once", *kafka]) == 0
    assert (service_dir / f"{job}.jsonl").read_bytes() == first
