"""``tokenfabric registry start|status|stop`` runs a real registry on loopback; ``schemas register`` and
``topics create --registry`` put the schemas under the topic-name strategy with a rule it enforces."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from processor.apps.schema_registry import RegistryClient, RegistryRefused, RegistrySettings
from processor.cli.tokenfabric import main as tokenfabric
from processor.local.processes import process_argv
from processor.wire.schemas import CANONICAL_FORMS, schema_dir

pytestmark = pytest.mark.kafka


def lines(out: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in out.splitlines() if "=" in line and " " not in line.split("=")[0]
    )


def test_registry_start_status_stop_and_the_schemas_under_their_subjects(
    tmp_path: Path, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state = ["--state-dir", str(tmp_path / "registry")]
    assert tokenfabric(["registry", *state, "start"]) == 0
    started = lines(capsys.readouterr().out)
    try:
        url, pid = started["url"], int(started["pid"])
        assert url.startswith("http://127.0.0.1:") and url.endswith("/apis/ccompat/v7")
        assert "-Dquarkus.http.host=127.0.0.1" in process_argv(pid)  # loopback only
        assert tokenfabric(["registry", *state, "status"]) == 0
        assert lines(capsys.readouterr().out)["pid"] == str(pid)

        prefix = f"s{uuid.uuid4().hex[:8]}"
        kafka = ["--bootstrap", kafka_bootstrap, "--topic-prefix", prefix]
        assert tokenfabric(["topics", "create", *kafka, "--ingest-partitions", "1", "--registry", url]) == 0
        out = capsys.readouterr().out
        assert f"registered {prefix}.ingest-value id=" in out and "compatibility=BACKWARD" in out
        config = tmp_path / "client.properties"
        config.write_text(f"schema.registry.url={url}\n")
        assert (
            tokenfabric(["schemas", "register", "--kafka-config", str(config), "--topic-prefix", prefix]) == 0
        )
        again = capsys.readouterr().out
        assert again.count("registered ") == 3 and again.split("id=")[1] == out.split("id=")[1]

        client = RegistryClient(RegistrySettings(url))
        ours = json.loads((schema_dir() / "TokenItem.avsc").read_text())
        required = {**ours, "fields": [*ours["fields"], {"name": "team", "type": "string"}]}
        with pytest.raises(RegistryRefused) as refused:  # BACKWARD: a new field needs a default
            client.register(f"{prefix}.ingest-value", json.dumps(required))
        assert refused.value.status == 409
        optional = {
            **ours,
            "fields": [*ours["fields"], {"name": "team", "type": ["null", "string"], "default": None}],
        }
        new_id = client.register(f"{prefix}.ingest-value", json.dumps(optional))
        assert (
            client.schema_text(new_id) is not None
            and client.schema_text(new_id) != CANONICAL_FORMS["TokenItem"]
        )
    finally:
        assert tokenfabric(["registry", *state, "stop"]) == 0
    assert capsys.readouterr().out.strip().endswith("stopped")
    assert tokenfabric(["registry", *state, "status"]) == 1


def test_schemas_register_without_a_registry_says_how_to_name_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert tokenfabric(["schemas", "register"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--registry URL" in err and "schema.registry.url" in err


def test_a_registry_that_does_not_answer_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert tokenfabric(["schemas", "register", "--registry", "http://127.0.0.1:9/apis/ccompat/v7"]) == 69
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not answering" in err
