"""``tokenfabric submit`` on chat rows and OpenAI batch inputs, with per-row settings: the arguments
become a plan (processor/cli/submit.py plan_from), and the plan's items are what each row asks
(stand-ins for the producer and the job writer; on a real broker: tests/broker/test_submit_openai.py)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from processor.cli.submit import SubmitPlan, configure, plan_from, submit
from processor.core.signature import shape_signature
from processor.jobs.chat import NO_SHAPE, load_chat_template
from processor.jobs.prepare import OpenAIRows
from processor.jobs.retry import RowSubset, options_namespace, recorded_options
from processor.jobs.textprep import TextTokenizer
from processor.wire.records import ids_from_tokens
from processor.wire.request import GenerationRequest
from tests.cli.test_submit import FakeProducer, FakeWriter
from tests.jobs.helpers import EXAMPLES

CHATML = EXAMPLES / "chatml" / "tokenizer_config.json"
SYSTEM = {"role": "system", "content": "Answer yes or no."}
SHOT = [{"role": "user", "content": "Is water wet?"}, {"role": "assistant", "content": "yes"}]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def plan_of(*argv: str) -> SubmitPlan:
    p = argparse.ArgumentParser()
    configure(p)
    return plan_from(p.parse_args(list(argv)))


def run(plan: SubmitPlan) -> tuple[list[dict[str, Any]], Any]:
    producer, writer = FakeProducer(), FakeWriter()
    final = submit(plan, producer, writer)  # type: ignore[arg-type]
    return producer.sent, final


def test_chat_rows_render_with_the_template_share_the_leading_messages_shape_and_take_row_settings(
    tmp_path: Path,
) -> None:
    data = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {"messages": [SYSTEM, *SHOT, user("Is fire cold?")]},
            {"messages": [SYSTEM, *SHOT, user("Is ice cold?")], "settings": {"seed": 5, "max_tokens": 2}},
            {"messages": [SYSTEM, *SHOT, user("Is snow hot?")], "settings": {"temperature": -1}},
            {"text": "no messages"},
            {"messages": [SYSTEM, *SHOT, user("Is sand dry?")], "settings": {"choices": ["yes", "no"]}},
        ],
    )
    plan = plan_of(
        str(data),
        *("--job", "chat-1", "--messages-column", "messages", "--chat-template", str(CHATML)),
        *(
            "--request",
            '{"temperature": 0, "json_schema": {"type": "string"}}',
            "--request-column",
            "settings",
        ),
        *("--output-budget", "4"),
    )
    sent, final = run(plan)
    chat = load_chat_template(CHATML)
    prefix = chat.render([SYSTEM, *SHOT], add_generation_prompt=False)
    assert final.shape == shape_signature([prefix]) and final.template == str(CHATML.resolve())
    assert [s["item_id"] for s in sent] == ["chat-1:0", "chat-1:1", "chat-1:4"]
    assert {s["shape"] for s in sent} == {final.shape}
    expected = TextTokenizer().encode_many(
        [chat.render([SYSTEM, *SHOT, user("Is fire cold?")])], add_special_tokens=False
    )
    assert list(ids_from_tokens(sent[0]["tokens"])) == list(expected[0].ids)
    job_wide = GenerationRequest(temperature=0.0, json_schema='{"type":"string"}')
    assert [(s["request"], s["output_budget"]) for s in sent] == [
        (job_wide, 4),
        (GenerationRequest(temperature=0.0, seed=5, json_schema='{"type":"string"}'), 2),
        (GenerationRequest(temperature=0.0, choices=("yes", "no")), 4),
    ]
    assert [(b.row, b.reason) for b in final.bad_rows] == [
        (2, "settings: temperature -1.0 is not a number >= 0"),
        (3, "missing column 'messages'"),
    ]


UNKNOWN_M2 = (
    "body.model 'm2' is neither the job's model 'm1' nor a LoRA adapter a consumer serves for it "
    "(adapters served: sql-lora; a consumer with --model m1 --adapter m2 serves it)"
)


def openai_line(custom_id: str, url: str = "/v1/chat/completions", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "m1", **body}}


def test_an_openai_batch_input_is_detected_and_each_line_is_a_row_or_a_bad_row(tmp_path: Path) -> None:
    data = write_jsonl(
        tmp_path / "batch.jsonl",
        [
            openai_line("a", messages=[SYSTEM, user("Is it?")], temperature=0, max_tokens=3),
            openai_line("b", "/v1/completions", prompt="Once upon", seed=11, stop=["\n"]),
            "not json",
            openai_line("a", messages=[SYSTEM, user("again")]),
            openai_line("c", "/v1/embeddings", input="x"),
            openai_line("d", "/v1/completions", prompt=[101, 2023, 102], model="m2"),
            {"custom_id": "e", "method": "POST", "url": "/v1/completions"},
            openai_line("f", messages=[SYSTEM, user("Or not?")], response_format={"type": "json_object"}),
            openai_line("c", messages=[SYSTEM, user("c belongs to row 4, a bad line")]),
        ],
    )
    plan = plan_of(str(data), "--job", "oa-1", "--chat-template", str(CHATML), "--request", '{"top_p": 0.5}')
    sent, final = run(plan)
    assert (final.model, final.template) == ("m1", f"openai-batch:{CHATML.resolve()}")
    assert [s["item_id"] for s in sent] == ["oa-1:0", "oa-1:1", "oa-1:5", "oa-1:7"]
    assert {s["model"] for s in sent} == {"m1"}  # an adapter's item keeps its base model (request.adapter)
    assert {json.dumps(s["metadata"]) for s in sent} == {'{"output": "json"}'}  # finish_reason comes back
    chat = load_chat_template(CHATML)
    assert final.shape == shape_signature([chat.render([SYSTEM], add_generation_prompt=False)])
    assert [s["shape"] for s in sent] == [final.shape, NO_SHAPE, NO_SHAPE, final.shape]
    assert [(s["request"], s["output_budget"]) for s in sent] == [
        (GenerationRequest(top_p=0.5, temperature=0.0), 3),
        (GenerationRequest(top_p=0.5, seed=11, stop=("\n",)), None),
        (GenerationRequest(top_p=0.5, adapter="m2"), None),  # body.model names a LoRA adapter, as in vLLM
        (GenerationRequest(top_p=0.5, json_schema='{"type":"object"}'), None),
    ]
    assert [(b.row, b.reason) for b in final.bad_rows] == [
        (2, "not JSON: Expecting value at column 1"),
        (3, "duplicate custom_id 'a' (first at row 0)"),
        (
            4,
            "url '/v1/embeddings' in a job of completions lines: a batch input takes one kind "
            "(submit embeddings and generations as jobs of their own)",
        ),
        (6, "missing body"),
        (8, "duplicate custom_id 'c' (first at row 4)"),
    ]
    # with the adapters consumers serve known (submit reads their contracts), another name is bad
    known = plan_of(str(data), "--job", "oa-3", "--chat-template", str(CHATML))
    assert isinstance(known.job_rows.reader, OpenAIRows)
    known.job_rows.reader.adapters = frozenset({"sql-lora"})
    sent, final = run(known)
    assert [s["item_id"] for s in sent] == ["oa-3:0", "oa-3:1", "oa-3:7"]
    assert (5, UNKNOWN_M2) in [(b.row, b.reason) for b in final.bad_rows]
    overridden, _ = run(
        plan_of(str(data), "--job", "oa-2", "--chat-template", str(CHATML), "--model", "mine")
    )
    assert [s["item_id"] for s in overridden] == ["oa-2:0", "oa-2:1", "oa-2:5", "oa-2:7"]
    assert {s["model"] for s in overridden} == {"mine"}  # the file's own model name runs on --model
    assert overridden[0]["request"].adapter == "" and overridden[2]["request"].adapter == "m2"
    assert list(ids_from_tokens(overridden[2]["tokens"])) == [101, 2023, 102]  # token ids go as they are


def test_setup_errors_are_found_before_anything_is_produced(tmp_path: Path) -> None:
    batch = write_jsonl(tmp_path / "batch.jsonl", [openai_line("a", messages=[user("x")])])
    with pytest.raises(ValueError, match="chat messages need the model's chat template"):
        plan_of(str(batch), "--job", "j")  # the default tokenizer's folder has no chat template
    with pytest.raises(ValueError, match="--request-column: an OpenAI batch input carries"):
        plan_of(str(batch), "--job", "j", "--request-column", "s")
    with pytest.raises(ValueError, match="give --template T"):
        plan_of(str(batch), "--job", "j", "--input-format", "rows")
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(ValueError, match=r"^empty.jsonl has no JSON lines: nothing to submit$"):
        plan_of(str(empty), "--job", "j")
    no_id = write_jsonl(tmp_path / "no-id.jsonl", [{"method": "POST", "url": "/v1/completions", "body": {}}])
    with pytest.raises(ValueError, match=r"^the first JSON line of no-id.jsonl has no custom_id: an OpenAI"):
        plan_of(str(no_id), "--job", "j")
    rows = tmp_path / "rows.csv"
    rows.write_text('messages\n"[]"\n')
    with pytest.raises(ValueError, match="--request-column s uses column"):
        plan_of(
            str(rows),
            "--job",
            "j",
            "--messages-column",
            "messages",
            "--chat-template",
            str(CHATML),
            "--request-column",
            "s",
        )
    with pytest.raises(ValueError, match="unknown setting"):
        plan_of(str(rows), "--job", "j", "--messages-column", "messages", "--request", '{"temp": 1}')


def test_a_retry_attempt_renders_its_rows_as_the_job_did_from_the_options_the_job_recorded(
    tmp_path: Path,
) -> None:
    settings = tmp_path / "settings.json"
    settings.write_text('{"temperature": 0.5}')
    data = write_jsonl(
        tmp_path / "batch.jsonl",
        [openai_line(f"r{n}", messages=[SYSTEM, user(f"q{n}")], seed=n) for n in range(4)],
    )
    argv = [str(data), "--job", "oa", "--chat-template", str(CHATML), "--request", f"@{settings}"]
    first, job = run(plan_of(*argv))
    settings.write_text('{"temperature": 1.5}')  # the attempt uses the settings the job was submitted with
    p = argparse.ArgumentParser()
    configure(p)
    base = vars(p.parse_args([]))
    options = options_namespace(base, recorded_options(job))
    attempt = plan_from(argparse.Namespace(**{**options, "job": "oa.r2", "dataset": str(data)}))
    again, retried = run(replace(attempt, dataset=RowSubset(data, [1, 3])))
    assert [s["item_id"] for s in again] == ["oa.r2:1", "oa.r2:3"]
    strip = [{k: v for k, v in s.items() if k not in ("item_id", "job_id")} for s in again]
    assert strip == [{k: v for k, v in first[n].items() if k not in ("item_id", "job_id")} for n in (1, 3)]
    assert retried.shape == job.shape and again[0]["request"].temperature == 0.5


def test_a_lines_adapter_is_its_model_name_or_its_body_adapter_and_must_be_served() -> None:
    from processor.jobs.datasets import DatasetRow
    from processor.jobs.prepare import SettingsSource

    reader = OpenAIRows(SettingsSource(), model="m1", adapters=frozenset({"sql-lora"}))

    def read(row: int, **body: Any) -> Any:
        return reader.read(DatasetRow(row, openai_line(f"r{row}", "/v1/completions", prompt="hi", **body)))

    assert read(0).settings.request is None  # the job's model: the base model, no request at all
    assert read(1, model="sql-lora").settings.request == GenerationRequest(adapter="sql-lora")
    assert read(2, adapter="sql-lora").settings.request == GenerationRequest(adapter="sql-lora")
    assert read(3, adapter="french").error == (
        "body.adapter 'french' is neither the job's model 'm1' nor a LoRA adapter a consumer serves for "
        "it (adapters served: sql-lora; a consumer with --model m1 --adapter french serves it)"
    )
    assert read(4, model="french").error == UNKNOWN_M2.replace("'m2'", "'french'").replace(
        "--adapter m2", "--adapter french"
    )
