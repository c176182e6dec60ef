"""The deployment files validate against the schemas the tools that read them use.

``k8s/*.yaml`` (and what ``kubectl kustomize k8s`` renders, or, without kubectl, the resources the
kustomization lists) against the Kubernetes OpenAPI schemas that kubernetes-validate ships, in strict
mode: an unknown or misspelt field fails, as ``kubectl apply --validate=strict`` would. And
``docker-compose.yml`` against the compose specification's JSON schema that check-jsonschema vendors.
Both packages are in the dev extra, so the checks need no network and no cluster.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from typing import Any

import jsonschema
import pytest
import yaml

from tests.common import ROOT

kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S = ROOT / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
#: The Kubernetes minor the manifests are checked against: an older one, so a field that only newer
#: clusters know fails here.
KUBERNETES_VERSION = "1.29"


def _load_all(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _files() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.name}:{doc['kind']}/{doc['metadata'].get('name', '')}", doc)
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in _load_all(path.read_text())
    ]


def _rendered() -> list[dict[str, Any]]:
    """What ``kubectl apply -k k8s`` sends: kubectl's rendering, else the listed resources as they are
    (the kustomization has no patches or generators, so the two agree; the kubectl test checks it)."""
    if shutil.which("kubectl") is not None:
        out = subprocess.run(
            ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False
        )
        assert out.returncode == 0, out.stderr
        return _load_all(out.stdout)
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kustomization) <= {"apiVersion", "kind", "resources"}, "render the new fields here too"
    return [d for name in kustomization["resources"] for d in _load_all((K8S / name).read_text())]


def _k8s_errors(doc: dict[str, Any]) -> str | None:
    from kubernetes_validate.utils import ValidationError, validate

    try:
        validate(doc, KUBERNETES_VERSION, strict=True)
    except ValidationError as exc:
        return f"{'.'.join(str(p) for p in exc.path)}: {exc.message}"
    return None


FILES = _files()


@pytest.mark.parametrize(("where", "doc"), FILES, ids=[w for w, _ in FILES])
def test_each_manifest_matches_the_kubernetes_schema(where: str, doc: dict[str, Any]) -> None:
    assert _k8s_errors(doc) is None, f"{where}: {_k8s_errors(doc)}"


def test_the_kustomize_output_matches_the_kubernetes_schema() -> None:
    docs = _rendered()
    assert len(docs) >= 5
    for doc in docs:
        error = _k8s_errors(doc)
        assert error is None, f"{doc['kind']}/{doc['metadata']['name']}: {error}"


def test_the_schema_check_catches_a_misspelt_field() -> None:
    """Strict mode is on: a typo that kubectl would reject fails here too."""
    (sts,) = [d for _, d in FILES if d["kind"] == "StatefulSet"]
    broken = json.loads(json.dumps(sts))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    assert _k8s_errors(broken) is not None
    broken = json.loads(json.dumps(sts))
    broken["spec"]["replicas"] = "one"
    assert _k8s_errors(broken) is not None


def _compose_validator() -> jsonschema.Draft202012Validator:
    pytest.importorskip("check_jsonschema")
    ref = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    schema = json.loads(ref.read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def _compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def test_the_compose_file_matches_the_compose_specification() -> None:
    found = _compose_validator().iter_errors(_compose())
    errors = [f"{'.'.join(str(p) for p in e.path)}: {e.message}" for e in found]
    assert errors == []


def test_the_compose_check_catches_a_misspelt_field() -> None:
    doc = _compose()
    doc["services"]["processor"]["comand"] = ["processor"]
    assert list(_compose_validator().iter_errors(doc))


def test_published_metrics_ports_listen_beyond_the_containers_loopback() -> None:
    """A port compose publishes is reached through the container's interface, never its 127.0.0.1."""
    from processor.ops.health import CONSUMER_PORT, PROCESSOR_PORT

    services = _compose()["services"]
    default_port = {"processor": PROCESSOR_PORT, "consumer": CONSUMER_PORT}
    published = 0
    for name, svc in services.items():
        command = svc.get("command", [])
        if not command or command[0] not in default_port:
            continue
        port = int(command[command.index("--metrics-port") + 1]) if "--metrics-port" in command else None
        port = port or default_port[command[0]]
        targets = {int(str(p).rsplit(":", 1)[-1]) for p in svc.get("ports", [])}
        assert port in targets, f"{name}: its metrics port {port} is not published"
        assert "--metrics-addr" in command, f"{name}: metrics listen on 127.0.0.1 inside the container"
        assert command[command.index("--metrics-addr") + 1] == "0.0.0.0", name
        published += 1
    assert published >= 3
