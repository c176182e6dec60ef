"""A job whose rows ask different things of a real generation server, end to end: ``submit`` with
per-row settings (``--request-column``), the processor on the broker, a consumer app whose ``openai``
engine (``server=llamacpp``, ``requests=settings``) runs on llama.cpp's ``llama-server`` (the
random-weight model with MiniLM's WordPiece vocabulary, whose ids ``submit``'s default tokenizer
writes), and ``collect``.

* every row completes ``ok``, and each row's output is valid against its own row's JSON schema or
  choice list (two schemas and two choice lists in one job): the constraint travelled from the
  dataset through the item's request to the server;
* rows that repeat a prompt with the same seed at temperature 1 give the same output, and rows with
  different prompts and seeds are still each other's own (the seed went with its row);
* the audit of the topics is clean.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from processor.apps.consumer import ConsumerApp
from processor.cli.tokenfabric import main
from processor.core.contract import Contract
from processor.engines.base import make_engine
from processor.jobs.datasets import read_output
from processor.local.llm.build import build_server
from processor.local.llm.model import ensure_model
from processor.local.llm.server import ServerInfo, ServerSettings, start_server, stop_server
from processor.ops.audit import audit
from tests.broker.rig import QUICK, new_topics, running_in_process
from tests.local.test_llm_server import llm_home  # noqa: F401 (the module's fixture: a temporary home)

pytestmark = [pytest.mark.kafka, pytest.mark.llm]

MODEL = "tiny-llama"
CARD = Contract("gpu-req", MODEL, budget_tokens=512, max_items=8, pad_multiple=1, max_inflight=2)
COLOUR = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}}, "required": ["colour"]}
SIZE = {"type": "object", "properties": {"size": {"enum": ["small", "large", "huge"]}}, "required": ["size"]}
LABELS = ["positive", "negative", "mixed"]
YES_NO = ["yes", "no"]


def rows() -> list[dict[str, object]]:
    """Twenty rows: four constrained kinds, then seeded pairs (the same prompt and seed twice)."""
    kinds: list[dict[str, object]] = [
        {"json_schema": COLOUR},
        {"json_schema": SIZE},
        {"choices": LABELS},
        {"choices": YES_NO},
    ]
    out: list[dict[str, object]] = [
        {"review": f"the parcel number {n} came late but the soup was warm", "settings": kinds[n % 4]}
        for n in range(12)
    ]
    for n in range(4):
        seeded = {"temperature": 1.0, "seed": 100 + n}
        text = f"tell me a story about lamp {n} and the river"
        out += [{"review": text, "settings": seeded}, {"review": text, "settings": seeded}]
    return out


@pytest.fixture(scope="module")
def llm(llm_home: Path) -> Iterator[ServerInfo]:  # noqa: F811 (the imported fixture)
    settings = ServerSettings(slots=4, ctx_tokens=4 * 256, threads=1)
    info = start_server(build_server().binary, ensure_model(), name="pytest-llm-job", settings=settings)
    yield info
    stop_server(info.name)


def test_a_job_whose_rows_carry_their_own_settings_gets_each_row_its_own_answer(
    kafka_bootstrap: str, llm: ServerInfo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, template = tmp_path / "rows.jsonl", tmp_path / "t.toml"
    table = rows()
    data.write_text("".join(json.dumps(r) + "\n" for r in table), encoding="utf-8")
    template.write_text('[[parts]]\nname = "review"\ntext = "{review}"\n', encoding="utf-8")
    topics = new_topics(kafka_bootstrap, "g", [CARD.consumer], ingest_partitions=1)
    engine = make_engine(
        "openai",
        {"url": llm.url, "server": "llamacpp", "requests": "settings", "timeout_s": "60", "concurrency": "4"},
    )
    with running_in_process(kafka_bootstrap, [], topics=topics, commit_interval_ms=200) as rig:
        app = ConsumerApp(rig.conf, rig.topics, CARD, engine, QUICK)
        rig.apps.append(app)
        rig.runner.start(app.run, CARD.consumer)
        kafka = ["--bootstrap", rig.conf["bootstrap.servers"], "--topic-prefix", rig.topics.prefix]
        submit = ["submit", str(data), "--job", "asks", "--template", str(template), "--model", MODEL]
        options = ["--request", '{"max_tokens": 24}', "--request-column", "settings", "--no-progress"]
        assert main([*submit, *options, *kafka]) == 0, capsys.readouterr().err
        out = tmp_path / "out.jsonl"
        collect = [
            "collect",
            "--job",
            "asks",
            "--out",
            str(out),
            "--wait",
            "--timeout-s",
            "180",
            "--no-progress",
        ]
        assert main([*collect, *kafka]) == 0, capsys.readouterr().err
        audited = audit(rig.conf, rig.topics, rig.processor.settings.group_id)
    assert not rig.errors, rig.errors
    assert audited.clean, "\n".join(audited.lines())

    written = {r["row"]: r for r in read_output(out)}
    assert sorted(written) == list(range(len(table)))
    for n, row in enumerate(table):
        result, asked = written[n], row["settings"]
        assert (result["status"], result["reason"]) == ("ok", None), result
        text = result["output"].strip()
        assert isinstance(asked, dict)
        if "json_schema" in asked:
            jsonschema.validate(json.loads(text), asked["json_schema"])
        elif "choices" in asked:
            assert text in asked["choices"], (n, text)
    seeded = range(12, len(table), 2)
    assert all(written[n]["output"] == written[n + 1]["output"] for n in seeded), [
        (written[n]["output"], written[n + 1]["output"]) for n in seeded
    ]
    assert len({written[n]["output"] for n in seeded}) > 1  # each seed and prompt its own text
