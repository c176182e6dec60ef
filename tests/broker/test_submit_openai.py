"""An OpenAI batch input submitted to a real broker: every usable line becomes one item carrying its
own generation request, every malformed line a bad row in the job record.

Only ``submit`` runs (no processor): the items are read back from the ingest topic and decoded, so
this proves the request survives the real producer and the wire. The pipeline after ingest, and
``collect --format openai``, are the concern of tests/broker/test_jobs*.py and the engine tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from processor.cli.tokenfabric import main
from processor.jobs.chat import NO_SHAPE
from processor.jobs.openai_input import custom_id_of, is_openai_job
from processor.jobs.topic import read_jobs
from processor.kafka.reader import read_topic
from processor.wire.items import decode_token_item
from processor.wire.request import GenerationRequest
from tests.broker.rig import new_topics
from tests.jobs.helpers import EXAMPLES

pytestmark = pytest.mark.kafka

LINES = 300
SYSTEM = {"role": "system", "content": "Extract the fields as JSON."}
SCHEMAS = [{"type": "object", "properties": {"name": {"type": "string"}}}, {"type": "array"}]


def _line(n: int) -> str:
    """Line ``n``: chat lines with one of two schemas, completions lines with a seed, choice lines;
    every 50th malformed (every other of those a duplicate custom_id, the rest a wrong url)."""
    if n % 50 == 49:
        if n % 100 == 49:
            return json.dumps({"custom_id": "req-0", "method": "POST", "url": "/v1/completions", "body": {}})
        return json.dumps({"custom_id": f"req-{n}", "method": "POST", "url": "/v1/embeddings", "body": {}})
    body: dict[str, object] = {"model": "default", "max_tokens": 16 + n % 3}
    url = "/v1/chat/completions"
    if n % 3 == 0:
        body["messages"] = [SYSTEM, {"role": "user", "content": f"Row {n}: Ada Lovelace"}]
        schema = SCHEMAS[n % 2]
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
        body["temperature"] = 0
    elif n % 3 == 1:
        url = "/v1/completions"
        body.update(prompt=f"Row {n}: once upon a time", seed=n, temperature=0.8)
    else:
        body["messages"] = [SYSTEM, {"role": "user", "content": f"Row {n}: yes or no?"}]
        body["guided_choice"] = ["yes", "no"]
    return json.dumps({"custom_id": f"req-{n}", "method": "POST", "url": url, "body": body})


def test_an_openai_batch_input_reaches_the_ingest_topic_with_each_line_s_request(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf, topics = new_topics(kafka_bootstrap, "o", ["card"], ingest_partitions=2)
    data = tmp_path / "batch.jsonl"
    data.write_text("".join(_line(n) + "\n" for n in range(LINES)), encoding="utf-8")
    chat = EXAMPLES / "chatml" / "tokenizer_config.json"
    kafka = ["--bootstrap", kafka_bootstrap, "--topic-prefix", topics.prefix]
    rc = main(["submit", str(data), "--job", "oa", "--chat-template", str(chat), "--no-progress", *kafka])
    err = capsys.readouterr().err
    assert rc == 3, err  # bad lines, not allowed

    record = read_jobs(conf, topics)["oa"]
    bad = {n for n in range(LINES) if n % 50 == 49}
    assert is_openai_job(record) and (record.rows, record.items) == (LINES, LINES - len(bad))
    mixed = "url '/v1/embeddings' in a job of completions lines: a batch input takes one kind"
    assert {b.row: b.reason.split(" (")[0] for b in record.bad_rows} == {
        n: "duplicate custom_id 'req-0'" if n % 100 == 49 else mixed for n in bad
    }

    items = {}
    for m in read_topic(conf, topics.ingest):
        item = decode_token_item(m.value())
        items[int(item.item_id.split(":")[1])] = item
    assert sorted(items) == sorted(set(range(LINES)) - bad)
    lines = [json.loads(line) for line in data.read_text().splitlines()]
    for row, item in items.items():
        assert custom_id_of(lines[row]) == f"req-{row}"  # collect finds it in the input row
        assert (item.job_id, item.model, item.output_budget) == ("oa", "default", 16 + row % 3)
        assert item.metadata == {"output": "json"}  # the output file says the server's finish_reason
        if row % 3 == 0:
            schema = json.dumps(SCHEMAS[row % 2], separators=(",", ":"))
            assert item.request == GenerationRequest(temperature=0.0, json_schema=schema)
            assert item.shape == record.shape != NO_SHAPE  # the shared system message
        elif row % 3 == 1:
            assert item.request == GenerationRequest(temperature=0.8, seed=row)
            assert item.shape == NO_SHAPE
        else:
            assert item.request == GenerationRequest(choices=("yes", "no"))
            assert item.shape == record.shape
