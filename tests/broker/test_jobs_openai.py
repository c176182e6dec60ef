"""An OpenAI batch input file through the whole pipeline and back out as the OpenAI batch output and
error files (``submit``, a processor and a consumer app in threads, ``collect --format openai``).

300 lines: chat and completions requests, many with their own settings (temperature, seed,
max_tokens, logprobs, a JSON schema); every 40th malformed (a wrong url, a missing body, a duplicate
custom_id, not JSON). Every line of the input comes back as exactly one line: the usable ones in the
output file with status 200 and their own ``custom_id``, the malformed ones in the error file, both
valid against the format's JSON Schema (tests/jobs/openai_batch.py); a second collect writes the
same bytes; the collector service writes the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from processor.cli.tokenfabric import main
from processor.core.contract import Contract
from processor.jobs.states import openai_view
from processor.jobs.topic import read_jobs
from tests.broker.rig import running_in_process
from tests.jobs.helpers import EXAMPLES
from tests.jobs.openai_batch import validate_files

pytestmark = pytest.mark.kafka

CARD = Contract("oacard", "default", budget_tokens=4096, max_items=32, pad_multiple=8, max_inflight=2)
LINES = 300
SYSTEM = {"role": "system", "content": "Answer in one short sentence."}


def _line(n: int) -> str:
    """Line ``n`` (module docstring): malformed when ``n % 40 == 39``."""
    if n % 40 == 39:
        kind = (n // 40) % 4
        if kind == 0:
            return json.dumps(
                {"custom_id": f"req-{n}", "method": "POST", "url": "/v1/embeddings", "body": {}}
            )
        if kind == 1:
            return json.dumps({"custom_id": f"req-{n}", "method": "POST", "url": "/v1/completions"})
        if kind == 2:
            return json.dumps({"custom_id": "req-1", "method": "POST", "url": "/v1/completions", "body": {}})
        return '{"custom_id": "req-broken", "body": '
    body: dict[str, object] = {"model": "default"}
    url = "/v1/chat/completions"
    if n % 2 == 0:
        body["messages"] = [SYSTEM, {"role": "user", "content": f"Row {n}: what is {n} squared?"}]
    else:
        url = "/v1/completions"
        body["prompt"] = f"Row {n}: once upon a time"
    if n % 3 == 0:
        body.update(temperature=0.2, seed=n, max_tokens=8)
    if n % 5 == 0:
        body["logprobs"] = True if url == "/v1/chat/completions" else 2
    if n % 7 == 0 and url == "/v1/chat/completions":
        schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    return json.dumps({"custom_id": f"req-{n}", "method": "POST", "url": url, "body": body})


def test_an_openai_batch_file_comes_back_as_valid_output_and_error_files(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_in_process(
        kafka_bootstrap, [CARD], letter="o", ingest_partitions=2, instance="oa-itest", commit_interval_ms=200
    ) as rig:
        conf, topics = rig.conf, rig.topics
        kafka = ["--bootstrap", conf["bootstrap.servers"], "--topic-prefix", topics.prefix]
        data = tmp_path / "batch.jsonl"
        data.write_text("".join(_line(n) + "\n" for n in range(LINES)), encoding="utf-8")
        chat = EXAMPLES / "chatml" / "tokenizer_config.json"
        rc = main(["submit", str(data), "--job", "oa", "--chat-template", str(chat), "--no-progress", *kafka])
        assert rc == 3, capsys.readouterr().err  # malformed lines, not allowed
        malformed = {n for n in range(LINES) if n % 40 == 39}

        out, errors = tmp_path / "results.jsonl", tmp_path / "results.errors.jsonl"
        collect = ["collect", "--job", "oa", "--out", str(out), "--format", "openai", "--no-progress", *kafka]
        assert main([*collect, "--wait", "--timeout-s", "120"]) == 0, capsys.readouterr().err
        said = capsys.readouterr().out
        assert f"wrote {LINES - len(malformed)} rows to {out} and {len(malformed)} to {errors}" in said

        ok, bad = validate_files(out, errors)
        assert sorted(x["custom_id"] for x in ok) == sorted(
            f"req-{n}" for n in range(LINES) if n not in malformed
        )
        assert len(ok) + len(bad) == LINES  # one line per input line
        # a refused line is an HTTP 400, as OpenAI writes one: the response carries it, error is null
        assert {x["error"] is None for x in bad} == {True}
        errors_said = {x["custom_id"]: x["response"]["body"]["error"] for x in bad}
        assert {e["code"] for e in errors_said.values()} == {"invalid_request"}
        assert {x["response"]["status_code"] for x in bad} == {400}
        assert "req-broken" not in {x["custom_id"] for x in bad}  # not JSON: no custom_id, its item id
        duplicates = {c: e["message"] for c, e in errors_said.items() if "duplicate" in e["message"]}
        assert duplicates == {  # under their item ids: req-1 is the line that ran
            f"oa:{n}": "duplicate custom_id 'req-1' (first at row 1)" for n in (119, 279)
        }
        for line in ok:
            n = int(line["custom_id"].split("-")[1])
            body = line["response"]["body"]
            assert body["object"] == ("chat.completion" if n % 2 == 0 else "text_completion")
            choice = body["choices"][0]
            text = choice["message"]["content"] if n % 2 == 0 else choice["text"]
            assert text == f"sim:oa:{n}"  # the sim engine's answer to this very line
            assert body["usage"]["prompt_tokens"] > 0
            assert (
                body["usage"]["total_tokens"]
                == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
            )
            assert body["model"] == "default"

        first = out.read_bytes(), errors.read_bytes()
        assert main(collect) == 0
        assert (out.read_bytes(), errors.read_bytes()) == first
        service = tmp_path / "service"
        assert main(["collector", "--out-dir", str(service), "--format", "openai", "--once", *kafka]) == 0
        assert ((service / "oa.jsonl").read_bytes(), (service / "oa.errors.jsonl").read_bytes()) == first

        record = read_jobs(conf, topics)["oa"]
        view = openai_view(record)
        assert (view.status, view.total, view.completed, view.failed) == (
            "completed",
            LINES,
            LINES - len(malformed),
            len(malformed),
        )
