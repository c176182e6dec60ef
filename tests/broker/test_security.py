"""A secured broker (TLS, mutual TLS, SCRAM-SHA-512, an authorizer that denies by default): the
pipeline runs under principals holding only what ``tokenfabric acls`` prints, and every refusal an
operator can meet is one line with exit code 77 (processor.kafka.exits.EXIT_REFUSED).

This file starts its **own** broker (``start_broker(..., secure_users=...)``, processor.local.secure)
in a temp dir, once per session (tests/broker/test_acls.py uses the same one), whatever the default
broker is: about 20 s on a quiet machine (the CA, seven certificates and the broker), a minute
loaded. The broker's super user ``tokenfabric-admin`` only creates topics and ACLs and reads the
topics back for the checks; every pipeline role runs as its own principal.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.apps.service import ProcessorService
from processor.apps.settings import ProcessorSettings
from processor.cli.tokenfabric import main as cli_main
from processor.kafka.acls import Acl, acls_for, create_acls, delete_acls, distinct
from processor.kafka.exits import EXIT_REFUSED, Refused, exit_code
from processor.kafka.factory import KAFKA
from processor.kafka.reach import ClusterRefused, probe
from processor.kafka.topics import TopicNames, create_topics, topic_specs
from processor.local.broker import BrokerInfo, start_broker, stop_broker
from processor.local.secure import MTLS, SCRAM, TLS
from processor.ops.status import gather
from processor.sim.tracegen import synthetic_records
from tests.broker.cmdlines import CommandLines
from tests.broker.rig import CARDS, Threads, instant_app, wait_for

pytestmark = pytest.mark.kafka

#: proc, cons, ops: one pipeline's roles; alice, bob: two pipelines; carol: one ACL missing at a time;
#: nobody: never granted an ACL (tests/broker/test_refusals.py).
USERS = ("proc", "cons", "ops", "alice", "bob", "carol", "nobody")
EXPIRED = "old"
OPS_ROLES = ("topics", "producer", "submit", "collect", "jobs", "status", "audit")


_WATCHED: list[CommandLines] = []
"""The command lines the machine showed while :func:`secured` started the broker
(tests/broker/test_refusals.py looks for the passwords in them: :func:`started_with`)."""


def started_with() -> CommandLines:
    """What :func:`secured`'s watch saw while the session's secured broker started."""
    return _WATCHED[-1]


_STARTED: list[BrokerInfo] = []
"""The one secured broker of the session: tests/broker/test_acls.py imports :func:`secured`, which
pytest then knows as a second session fixture; both hand out this broker."""


@pytest.fixture(scope="session")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerInfo]:
    if _STARTED:
        yield _STARTED[0]
        return
    state = tmp_path_factory.mktemp("kafka-secured")
    watch = CommandLines()  # every process the start runs (keytool, kafka-storage format, the broker)
    _WATCHED.append(watch)
    with watch:
        info = start_broker(
            state, heap_mb=512, secure_users=[*USERS, EXPIRED], expired_users=[EXPIRED], timeout_s=240
        )
    _STARTED.append(info)
    try:
        yield info
    finally:
        _STARTED.clear()
        stop_broker(state)


def admin_conf(info: BrokerInfo) -> dict[str, str]:
    return info.client_conf()


def grant(info: BrokerInfo, user: str, acls: list[Acl]) -> None:
    create_acls(KAFKA.admin(admin_conf(info)), acls, f"User:{user}")


def revoke(info: BrokerInfo, user: str, acls: list[Acl]) -> None:
    delete_acls(KAFKA.admin(admin_conf(info)), acls, f"User:{user}")


def properties(info: BrokerInfo, user: str, listener: str) -> Path:
    """The ``--kafka-config`` file the broker wrote for ``user`` on ``listener``."""
    return info.data_dir.parent / "security" / f"{user}.{listener.lower()}.properties"


def new_pipeline(info: BrokerInfo, letter: str) -> TopicNames:
    names = TopicNames(f"{letter}{uuid.uuid4().hex[:8]}")
    create_topics(
        admin_conf(info), topic_specs(names, ingest_partitions=2, consumers=[c.consumer for c in CARDS])
    )
    return names


def produce_items(conf: dict[str, str], names: TopicNames, n: int, seed: int) -> int:
    """``n`` items through the producer the project ships; returns their tokens."""
    records = synthetic_records(n, seed=seed, shapes=6, min_len=16, max_len=400, rate_per_s=None)
    with TokenProducer(conf, names) as producer:
        for r in records:
            producer.send(r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
    return sum(r.length for r in records)


TEMPLATE = '[[parts]]\nname = "review"\ntext = "Review: {review}\\nSentiment:"\n'


def _job_files(folder: Path, rows: int) -> tuple[Path, Path]:
    data, template = folder / "rows.jsonl", folder / "t.toml"
    data.write_text(
        "".join(json.dumps({"id": f"r{n}", "review": "good " * (n % 9 + 1)}) + "\n" for n in range(rows))
    )
    template.write_text(TEMPLATE)
    return data, template


@pytest.mark.parametrize("listener", [TLS, MTLS, SCRAM])
def test_a_pipeline_under_the_printed_acls_completes_with_a_clean_audit(
    secured: BrokerInfo, listener: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over TLS (SASL_SSL + SCRAM), mutual TLS and SCRAM: the processor, two consumers, a producer,
    submit, collect, jobs, status and audit, each under a principal holding only its role's ACLs."""
    names = new_pipeline(secured, listener[0].lower())
    roles = acls_for(["processor", "consumer", *OPS_ROLES], names)
    grant(secured, "proc", roles["processor"])
    grant(secured, "cons", roles["consumer"])
    grant(secured, "ops", distinct(a for r in OPS_ROLES for a in roles[r]))
    conf = {u: secured.client_conf(u, listener) for u in ("proc", "cons", "ops")}
    ops = ["--kafka-config", str(properties(secured, "ops", listener)), "--topic-prefix", names.prefix]
    assert cli_main(["topics", "create", "--ingest-partitions", "2", *ops]) == 0  # all exist: no change

    runner = Threads()
    for contract in CARDS:
        runner.start(instant_app(conf["cons"], names, contract).run, contract.consumer)
    service = ProcessorService(conf["proc"], names, ProcessorSettings(instance="p0", commit_interval_ms=200))
    runner.start(service.run, "processor")
    full = listener == TLS  # the job commands once: they differ from the others only in their clients
    rows = 40 if full else 0
    try:
        tokens = produce_items(conf["ops"], names, 120, seed=3)
        if full:
            data, template = _job_files(tmp_path, rows)
            submit = ["submit", str(data), "--job", "j1", "--template", str(template), "--no-progress"]
            assert cli_main([*submit, *ops]) == 0
            out = tmp_path / "out.jsonl"
            collect = ["collect", "--job", "j1", "--out", str(out), "--wait", "--timeout-s", "90"]
            assert cli_main([*collect, "--no-progress", *ops]) == 0
            assert len(out.read_text().splitlines()) == rows
        wait_for(
            lambda: gather(conf["ops"], names).total("completed_items") == 120 + rows,
            60,
            "every item completed",
        )
        assert not runner.errors, runner.errors
        capsys.readouterr()
        if full:
            assert cli_main(["jobs", *ops]) == 0
        assert cli_main(["status", *ops]) == 0
        assert cli_main(["audit", *ops]) == 0, capsys.readouterr().out
    finally:
        runner.join(60)
    assert not runner.errors, runner.errors
    view = gather(admin_conf(secured), names)
    assert view.total("received_tokens") >= tokens
    assert view.total("completed_items") == 120 + rows
    assert view.total("queued_items") == view.total("in_flight_items") == 0


def test_a_wrong_ca_is_one_line_naming_the_ca(secured: BrokerInfo, tmp_path: Path) -> None:
    from processor.local.tls import make_authority

    other = make_authority(tmp_path / "other-ca", name="some-other-ca")
    conf = {**secured.client_conf("carol", TLS), "ssl.ca.location": str(other.cert_pem)}
    with pytest.raises(ClusterRefused) as refused:
        probe(conf, timeout_s=4)
    line = str(refused.value)
    assert "\n" not in line
    assert "not signed by the CA this client trusts" in line and str(other.cert_pem) in line
    assert refused.value.exit_code == EXIT_REFUSED


def test_a_wrong_scram_password_is_one_line_naming_the_user(secured: BrokerInfo) -> None:
    for listener in (TLS, SCRAM):
        conf = {**secured.client_conf("carol", listener), "sasl.password": "not-the-password"}
        with pytest.raises(ClusterRefused) as refused:
            probe(conf, timeout_s=4)
        line = str(refused.value)
        assert "SASL login refused for user 'carol' (SCRAM-SHA-512)" in line and "\n" not in line
        assert "not-the-password" not in line


def test_an_expired_client_certificate_is_one_line_naming_the_certificate(secured: BrokerInfo) -> None:
    conf = secured.client_conf(EXPIRED, MTLS)
    with pytest.raises(ClusterRefused) as refused:
        probe(conf, timeout_s=4)
    line = str(refused.value)
    assert "does not accept this client's certificate" in line and conf["ssl.keystore.location"] in line
    assert "expired" in line and "\n" not in line
    # the same user's SCRAM login still works: the certificate, not the principal, is refused
    probe(secured.client_conf(EXPIRED, TLS), timeout_s=10)


def test_a_command_refused_by_the_authorizer_prints_one_line_and_exits_77(
    secured: BrokerInfo, capfd: pytest.CaptureFixture[str]
) -> None:
    names = new_pipeline(secured, "r")
    wanted = acls_for(["status"], names)["status"]
    held = [a for a in wanted if not (a.name == names.contracts and a.operation == "Read")]
    assert len(held) == len(wanted) - 1
    grant(secured, "carol", held)
    try:
        status = ["status", "--kafka-config", str(properties(secured, "carol", TLS))]
        code = cli_main([*status, "--topic-prefix", names.prefix])
    finally:
        revoke(secured, "carol", held)
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert (
        f"refused by the cluster's authorizer: Read on topic '{names.contracts}' for User:carol" in lines[0]
    )
    assert code == EXIT_REFUSED, err


def test_an_acl_removed_under_a_running_processor_ends_it_with_the_refusal(secured: BrokerInfo) -> None:
    """At run time an authorization failure is fatal, with its one line: never a retry loop."""
    names = new_pipeline(secured, "x")
    roles = acls_for(["processor", "consumer", "producer"], names)
    grant(secured, "proc", roles["processor"])
    grant(secured, "cons", roles["consumer"])
    grant(secured, "ops", roles["producer"])
    conf = {u: secured.client_conf(u, TLS) for u in ("proc", "cons", "ops")}
    runner = Threads()
    for contract in CARDS:
        runner.start(instant_app(conf["cons"], names, contract).run, contract.consumer)
    service = ProcessorService(conf["proc"], names, ProcessorSettings(instance="p0", commit_interval_ms=200))
    runner.start(service.run, "processor")
    try:
        produce_items(conf["ops"], names, 30, seed=5)
        done_items = lambda: gather(admin_conf(secured), names).total("completed_items")  # noqa: E731
        wait_for(lambda: done_items() == 30, 60, "30 items")
        # the processor's results reader fetches all the time: the next fetch is refused
        results = [a for a in roles["processor"] if a.name == names.results and a.operation == "Read"]
        revoke(secured, "proc", results)
        wait_for(lambda: bool(runner.errors), 30, "the processor to stop on the refusal, not retry it")
    finally:
        runner.join(60)
    assert len(runner.errors) == 1, runner.errors  # the processor's; the consumers were stopped, cleanly
    refused = runner.errors[0]
    assert isinstance(refused, Refused), repr(refused)
    assert exit_code(refused) == EXIT_REFUSED
    line = str(refused)
    assert line.startswith(f"processor p0 of pipeline {names.prefix}: refused by the cluster's authorizer")
    assert "\n" not in line and "topic" in line, line
