"""OpenAI batch lines against the real llama-server, and embeddings lines against the embed engine, end
to end (``submit``, a processor and consumer apps in threads, ``collect --format openai``,
``submit --retry-failed``). The server loads a real LoRA adapter file (tests/broker/lora_file.py).

* a row held to ``max_tokens`` (``ignore_eos`` goes to llama.cpp as it is) comes back with
  ``finish_reason: "length"``, as the server said, without ``--engine-opt output=json``;
* prompts the server refuses with HTTP 400 (longer than a slot's context; an id outside the
  vocabulary; a schema it cannot convert) are ``rejected``: one dispatch each, never retried in the
  pipeline, their error-file line an HTTP 400 response carrying the server's message (``error``
  null, no server address), and ``submit --retry-failed`` finds nothing to retry;
* a line whose ``model`` names the adapter runs on it (greedy text differs from the same prompt on
  the base model); a line naming an adapter no consumer serves is that row's error;
* ``/v1/embeddings`` lines, served by an embed consumer, come back in OpenAI's embeddings shape;
* the audit is clean.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.apps.consumer import ConsumerApp
from processor.cli.tokenfabric import main
from processor.core.contract import Contract
from processor.core.serving import serving_key
from processor.engines.base import Engine, make_engine
from processor.kafka.reader import read_topic
from processor.local.llm.build import build_server
from processor.local.llm.model import ensure_model
from processor.local.llm.server import ServerInfo, ServerSettings, start_server, stop_server
from processor.ops.audit import audit
from processor.ops.contracts import announced_contracts
from processor.wire.completions import decode_completions
from tests.broker.lora_file import write_lora
from tests.broker.rig import QUICK, new_topics, running_in_process, wait_for
from tests.jobs.openai_batch import validate_files
from tests.local.test_llm_server import llm_home  # noqa: F401 (the module's fixture: a temporary home)

pytestmark = [pytest.mark.kafka, pytest.mark.llm]

MODEL, ADAPTER, EMBEDDER = "tiny-llama", "sql", "minilm"
SLOT_TOKENS = 256
BASE = Contract("fid-base", MODEL, budget_tokens=1024, max_items=8, pad_multiple=1, max_inflight=2)
LORA = Contract("fid-sql", serving_key(MODEL, ADAPTER), budget_tokens=1024, max_items=8, max_inflight=2)
EMBED = Contract("fid-embed", EMBEDDER, budget_tokens=2048, max_items=16, pad_multiple=8, max_inflight=2)
PROMPT = [101, 2023, 2003, 1037, 3231, 102]
#: A schema llama.cpp cannot turn into a grammar (a $ref to nothing): it refuses the request, 400.
UNCONVERTIBLE = {
    "type": "json_schema",
    "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}},
}


@pytest.fixture(scope="module")
def llm(llm_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:  # noqa: F811
    lora = write_lora(tmp_path_factory.mktemp("lora") / "sql.gguf")
    settings = ServerSettings(slots=2, ctx_tokens=2 * SLOT_TOKENS, threads=1, lora=(str(lora),))
    info = start_server(build_server().binary, ensure_model(), name="pytest-oai-fid", settings=settings)
    yield info
    stop_server(info.name)


def _line(custom_id: str, url: str = "/v1/completions", **body: Any) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def _completions_file(path: Path) -> Path:
    greedy: dict[str, Any] = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
    lines = [
        _line("held", model=MODEL, prompt="the soup was warm", max_tokens=4, ignore_eos=True),
        _line("too-long", model=MODEL, prompt=[101] + [2023] * (SLOT_TOKENS + 40) + [102], max_tokens=4),
        _line("bad-ids", model=MODEL, prompt=[101, 999_999, 102], max_tokens=4),
        _line("bad-schema", model=MODEL, prompt=PROMPT, max_tokens=4, response_format=UNCONVERTIBLE),
        _line("base", model=MODEL, prompt=PROMPT, **greedy),
        _line("adapter", model=ADAPTER, prompt=PROMPT, **greedy),
        _line("unknown", model="french", prompt=PROMPT, **greedy),
    ]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _embeddings_file(path: Path) -> Path:
    lines = [
        _line("e-text", "/v1/embeddings", model=EMBEDDER, input="the parcel came late"),
        _line("e-same", "/v1/embeddings", model=EMBEDDER, input=["the parcel came late"]),
        _line("e-ids", "/v1/embeddings", model=EMBEDDER, input=PROMPT, encoding_format="float"),
    ]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _start(rig: Any, contract: Contract, engine: Engine) -> None:
    app = ConsumerApp(rig.conf, rig.topics, contract, engine, QUICK)
    rig.apps.append(app)
    rig.runner.start(app.run, contract.consumer)


def test_openai_lines_keep_the_servers_finish_reason_refusals_adapters_and_embeddings(
    kafka_bootstrap: str, llm: ServerInfo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = {"url": llm.url, "server": "llamacpp", "lora_ids": f"{ADAPTER}:0", "timeout_s": "60"}
    topics = new_topics(kafka_bootstrap, "f", [c.consumer for c in (BASE, LORA, EMBED)], ingest_partitions=1)
    with running_in_process(kafka_bootstrap, [], topics=topics, commit_interval_ms=200) as rig:
        _start(rig, BASE, make_engine("openai", options))
        _start(rig, LORA, make_engine("openai", options))
        _start(rig, EMBED, make_engine("embed", {}))
        wanted = {c.model for c in (BASE, LORA, EMBED)}
        wait_for(
            lambda: wanted <= {c.model for c in announced_contracts(rig.conf, rig.topics).values()},
            30,
            "contracts",
        )
        kafka = ["--bootstrap", rig.conf["bootstrap.servers"], "--topic-prefix", rig.topics.prefix]
        for job, data in (
            ("fid", _completions_file(tmp_path / "c.jsonl")),
            ("emb", _embeddings_file(tmp_path / "e.jsonl")),
        ):
            rc = main(["submit", str(data), "--job", job, "--allow-bad-rows", "--no-progress", *kafka])
            assert rc == 0, capsys.readouterr().err
            out = tmp_path / f"{job}.jsonl"
            collect = ["collect", "--job", job, "--out", str(out), "--format", "openai", "--no-progress"]
            assert main([*collect, "--wait", "--timeout-s", "120", *kafka]) == 0, capsys.readouterr().err
        capsys.readouterr()
        assert main(["submit", "--retry-failed", "fid", "--no-progress", *kafka]) == 0
        assert "nothing to retry" in capsys.readouterr().out  # rejected rows are not run again
        dispatches: dict[str, int] = {}
        for m in read_topic(rig.conf, rig.topics.results):
            for done in decode_completions(m.value()):
                dispatches[done.item_id] = dispatches.get(done.item_id, 0) + 1
        audited = audit(rig.conf, rig.topics, rig.processor.settings.group_id)
    assert audited.clean, "\n".join(audited.lines())
    assert dispatches == {f"fid:{n}": 1 for n in range(6)} | {f"emb:{n}": 1 for n in range(3)}

    ok, bad = validate_files(tmp_path / "fid.jsonl", tmp_path / "fid.errors.jsonl")
    by_id = {line["custom_id"]: line for line in ok + bad}
    assert sorted(line["custom_id"] for line in ok) == ["adapter", "base", "held"]
    held = by_id["held"]["response"]["body"]
    assert held["choices"][0]["finish_reason"] == "length" and held["usage"]["completion_tokens"] == 4
    refusals = {
        "too-long": "exceeds the available context size",
        "bad-ids": "invalid tokens",
        "bad-schema": "JSON schema conversion failed",
    }
    for refused, said in refusals.items():
        line = by_id[refused]
        assert line["error"] is None and line["response"]["status_code"] == 400, line
        error = line["response"]["body"]["error"]
        assert said in error["message"] and error["type"] == "invalid_request_error", error
        assert llm.url not in error["message"] and "127.0.0.1" not in error["message"]
    texts = {c: by_id[c]["response"]["body"]["choices"][0]["text"] for c in ("base", "adapter")}
    assert texts["base"] != texts["adapter"], texts  # the adapter's weights changed the greedy text
    assert by_id["adapter"]["response"]["body"]["model"] == ADAPTER
    unknown = by_id["unknown"]["response"]["body"]["error"]["message"]
    assert "'french' is neither the job's model" in unknown and f"adapters served: {ADAPTER}" in unknown

    ok, bad = validate_files(tmp_path / "emb.jsonl", tmp_path / "emb.errors.jsonl")
    assert bad == [] and [line["custom_id"] for line in ok] == ["e-text", "e-same", "e-ids"]
    vectors = {}
    for line in ok:
        body = line["response"]["body"]
        assert (body["object"], body["model"], body["data"][0]["object"]) == ("list", EMBEDDER, "embedding")
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
        vectors[line["custom_id"]] = body["data"][0]["embedding"]
    assert {len(v) for v in vectors.values()} == {384}
    assert all(abs(math.fsum(x * x for x in v) - 1.0) < 1e-4 for v in vectors.values())  # unit norm
    assert vectors["e-text"] == vectors["e-same"] != vectors["e-ids"]
