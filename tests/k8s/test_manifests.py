"""The Kubernetes manifests in k8s/ agree with the code they run.

No cluster is needed. Each manifest is parsed and checked against the CLI. Every container's
``args`` must parse with that subcommand's real parser (after Kubernetes' ``$(VAR)`` expansion),
using only its exact flags. Ports and probes must match the metrics server's defaults and paths.
Every environment variable must be one the code reads or one the args expand. The Kafka properties
in the ConfigMap must be real librdkafka properties. ``kubectl kustomize`` renders the set when
kubectl is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from processor.cli.tokenfabric import COMMANDS, build_parser
from processor.kafka.config import ENV_PREFIX, RESERVED_ENV, client_config, read_properties
from processor.ops.health import CONSUMER_PORT, PROCESSOR_PORT
from tests.common import ROOT

K8S = ROOT / "k8s"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WORKLOADS = ("Deployment", "StatefulSet", "Job")
METRICS_PORT = {"processor": PROCESSOR_PORT, "consumer": CONSUMER_PORT}
#: Environment variables the code reads itself (besides TOKENFABRIC_KAFKA_*).
CODE_ENV = {"KAFKA_BOOTSTRAP"}
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                doc["__file__"] = path.name
                docs.append(doc)
    return docs


DOCS = _docs()


def _workloads() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, pod spec, container) for every container of every workload."""
    for doc in DOCS:
        if doc["kind"] in WORKLOADS:
            spec = doc["spec"]["template"]["spec"]
            for c in spec["containers"]:
                yield f"{doc['__file__']}:{doc['metadata']['name']}/{c['name']}", spec, c


CONTAINERS = list(_workloads())
IDS = [where for where, _, _ in CONTAINERS]


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in DOCS if d["kind"] == kind]


def _expanded_args(container: dict[str, Any]) -> list[str]:
    """``args`` as the container gets them: each ``$(VAR)`` replaced by the env's value, or a stand-in."""
    env = {e["name"]: e.get("value", "pod-0") for e in container.get("env", [])}
    out = []
    for arg in container["args"]:
        for name in VAR.findall(arg):
            assert name in env, f"$({name}) in args but not in env"
        out.append(VAR.sub(lambda m: env[m.group(1)], arg))
    return out


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_there_is_something_to_check() -> None:
    kinds = sorted({d["kind"] for d in DOCS})
    assert kinds == [
        "ConfigMap", "Deployment", "Job", "Kustomization", "PersistentVolumeClaim", "Secret", "Service",
        "StatefulSet",
    ]  # fmt: skip
    commands = sorted({c["args"][0] for _, _, c in CONTAINERS})
    assert commands == ["collector", "consumer", "processor", "submit", "topics"]


@pytest.mark.parametrize(("where", "pod", "container"), CONTAINERS, ids=IDS)
def test_images_are_the_packages_version(where: str, pod: dict[str, Any], container: dict[str, Any]) -> None:
    assert container["image"] == f"tokenfabric:{VERSION}", where


@pytest.mark.parametrize(("where", "pod", "container"), CONTAINERS, ids=IDS)
def test_args_are_real_flags_of_the_subcommand(
    where: str, pod: dict[str, Any], container: dict[str, Any]
) -> None:
    args = _expanded_args(container)
    command = args[0]
    assert command in COMMANDS, f"{where}: unknown command {command!r}"
    parser = build_parser(command)
    sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    known = {s for a in sub._actions for s in a.option_strings}
    for arg in args:
        if arg.startswith("--"):  # exact names: argparse would also take an abbreviation
            assert arg.split("=", 1)[0] in known, f"{where}: {arg} is not a flag of 'tokenfabric {command}'"
    try:
        parser.parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"{where}: 'tokenfabric {' '.join(args)}' does not parse (exit {exc.code})")


@pytest.mark.parametrize(("where", "pod", "container"), CONTAINERS, ids=IDS)
def test_env_is_read_by_the_code_or_expanded_in_args(
    where: str, pod: dict[str, Any], container: dict[str, Any]
) -> None:
    expanded = {name for arg in container["args"] for name in VAR.findall(arg)}
    for e in container.get("env", []):
        name = e["name"]
        if not (name.startswith(ENV_PREFIX) and name not in RESERVED_ENV):
            assert name in CODE_ENV | expanded, f"{where}: env {name} is read by nothing"


@pytest.mark.parametrize(("where", "pod", "container"), CONTAINERS, ids=IDS)
def test_the_pods_kafka_settings_make_a_client(
    where: str, pod: dict[str, Any], container: dict[str, Any], tmp_path: Path
) -> None:
    """The mounted file plus the TOKENFABRIC_KAFKA_* env, merged as client_config does, is valid."""
    path = _flag(container["args"], "--kafka-config")
    assert path is not None, f"{where}: no --kafka-config"
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    (config_map,) = [d for d in _by_kind("ConfigMap") if d["metadata"]["name"] == volume["configMap"]["name"]]
    key = Path(path).name
    assert key in config_map["data"], f"{where}: {path} is not a key of the ConfigMap"
    file = tmp_path / key
    file.write_text(config_map["data"][key])
    assert not any("password" in k for k in read_properties(file)), "credentials belong in the Secret"
    env = {e["name"]: e.get("value", "from-a-secret") for e in container.get("env", [])}
    conf = client_config(None, str(file), env)
    assert conf["bootstrap.servers"] == read_properties(file)["bootstrap.servers"]
    assert {"sasl.username", "sasl.password"} <= conf.keys()
    _assert_librdkafka_properties(conf, where)


def _assert_librdkafka_properties(conf: dict[str, str], where: str) -> None:
    """Building a client rejects unknown names and incomplete settings (it does not connect yet)."""
    from confluent_kafka import KafkaException

    try:
        Producer({**conf, "log_level": 0}).flush(0)
    except KafkaException as exc:
        pytest.fail(f"{where}: {exc}")


def test_secret_refs_name_the_example_secret() -> None:
    (secret,) = _by_kind("Secret")
    keys = set(secret["stringData"])
    for where, _, container in CONTAINERS:
        for e in container.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                assert ref["name"] == secret["metadata"]["name"], where
                assert ref["key"] in keys, where
                assert e["name"].startswith(ENV_PREFIX), f"{where}: a secret must reach librdkafka only"
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    examples = {p.name for p in K8S.glob("*.example.yaml")}  # a Secret to make, a Job per job: not applied
    assert examples == {"sasl-secret.example.yaml", "submit-job.example.yaml"}
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", *examples}


@pytest.mark.parametrize(
    ("where", "pod", "container"),
    [c for c in CONTAINERS if c[2]["args"][0] in METRICS_PORT],
    ids=[w for w, _, c in CONTAINERS if c["args"][0] in METRICS_PORT],
)
def test_metrics_port_and_probes_match_the_server(
    where: str, pod: dict[str, Any], container: dict[str, Any]
) -> None:
    command = container["args"][0]
    args = container["args"]
    port = METRICS_PORT[command]
    assert _flag(args, "--metrics-addr") == "0.0.0.0", f"{where}: 127.0.0.1 is unreachable for probes"
    assert _flag(args, "--metrics-port") in (None, str(port)), f"{where}: not the default port"
    (named,) = [p for p in container["ports"] if p["name"] == "metrics"]
    assert named["containerPort"] == port
    kinds = ("startupProbe", "livenessProbe", "readinessProbe")
    probes = {k: container[k]["httpGet"] for k in kinds if k in container}
    for kind, probe in probes.items():
        assert probe["port"] in ("metrics", port), f"{where}: {kind} on port {probe['port']}"
    assert probes["livenessProbe"]["path"] == "/healthz"
    if command == "processor":
        assert probes["readinessProbe"]["path"] == "/readyz"
        # a restore runs before the first step: only a startup probe keeps liveness from killing it
        assert probes["startupProbe"]["path"] == "/healthz"


@pytest.mark.parametrize(("where", "pod", "container"), CONTAINERS, ids=IDS)
def test_resources_are_bounded(where: str, pod: dict[str, Any], container: dict[str, Any]) -> None:
    res = container["resources"]
    assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"], where
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    if container["args"][0] == "consumer":
        assert res["limits"]["nvidia.com/gpu"] == 1


def test_processor_is_a_statefulset_of_stable_instances() -> None:
    (sts,) = _by_kind("StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert _flag(container["args"], "--instance") == "$(POD_NAME)"
    (pod_name,) = [e for e in container["env"] if e["name"] == "POD_NAME"]
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert sts["spec"]["replicas"] == 1
    services = {s["metadata"]["name"]: s for s in _by_kind("Service")}
    assert sts["spec"]["serviceName"] in services


def test_services_select_pods_and_name_their_ports() -> None:
    pods = [
        (d["spec"]["template"]["metadata"]["labels"], d["spec"]["template"]["spec"]["containers"])
        for d in DOCS
        if d["kind"] in WORKLOADS
    ]
    for svc in _by_kind("Service"):
        selector = svc["spec"]["selector"]
        matched = [cs for labels, cs in pods if selector.items() <= labels.items()]
        assert matched, f"Service {svc['metadata']['name']} selects no pod"
        for port in svc["spec"]["ports"]:
            names = {p["name"] for cs in matched for c in cs for p in c.get("ports", [])}
            assert port["targetPort"] in names


def test_workload_selectors_match_their_templates() -> None:
    for d in DOCS:
        if d["kind"] in ("Deployment", "StatefulSet"):
            labels = d["spec"]["template"]["metadata"]["labels"]
            assert d["spec"]["selector"]["matchLabels"].items() <= labels.items()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_kustomize_renders_the_set() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(out.stdout))
    assert kinds == [
        "ConfigMap", "ConfigMap", "Deployment", "Deployment", "Job", "PersistentVolumeClaim", "Service",
        "Service", "StatefulSet",
    ]  # fmt: skip


def test_the_topics_job_creates_every_consumers_batch_topic() -> None:
    jobs = [c for _, _, c in CONTAINERS if c["args"][:2] == ["topics", "create"]]
    (job,) = jobs
    args = job["args"]
    created = {args[i + 1] for i, a in enumerate(args) if a == "--consumer"}
    ids = {_flag(_expanded_args(c), "--id") for _, _, c in CONTAINERS if c["args"][0] == "consumer"}
    assert ids and ids <= created, f"consumer ids {sorted(ids - created)} missing from the topics Job"


def test_each_consumers_engine_options_build_its_engine() -> None:
    """The manifest's --engine-opt pairs are the engine's real options (an unknown or missing one,
    a url left out, would stop the pod at start)."""
    from processor.cli.options import engine_options
    from processor.engines.base import make_engine

    consumers = [(where, c) for where, _, c in CONTAINERS if c["args"][0] == "consumer"]
    assert consumers
    for where, container in consumers:
        args = build_parser("consumer").parse_args(_expanded_args(container))
        engine = make_engine(args.engine, engine_options(args))
        assert engine.name == args.engine == "openai", where
        engine.close()
