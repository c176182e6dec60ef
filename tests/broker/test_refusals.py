"""On the secured broker of tests/broker/test_security.py: a principal with no ACLs meets one line and
exit 77 from every command; a prefix nested in another pipeline's names gains none of its rights;
wrong client settings are one line and exit 78; no process the project starts shows a password.

The commands run as processes (``python -m processor``), as a person runs them, with ``nobody``'s
``--kafka-config`` (SCRAM over TLS): what they print on stderr and their exit codes are the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from processor.kafka.acls import acls_for, held_acls
from processor.kafka.exits import EXIT_CONFIG, EXIT_REFUSED, EXIT_USAGE, Refused, refusal
from processor.kafka.factory import KAFKA
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames, create_topics, topic_specs
from processor.local.broker import BrokerInfo
from processor.local.secure import MTLS, TLS
from tests.broker.test_security import (
    USERS,
    admin_conf,
    grant,
    new_pipeline,
    properties,
    revoke,
    secured,
    started_with,
)
from tests.common import ROOT

pytestmark = pytest.mark.kafka

__all__ = ["secured"]  # the session fixture, imported to be found here

TEMPLATE = '[[parts]]\nname = "review"\ntext = "Review: {review}\\nSentiment:"\n'
QUIET = ["--metrics-port", "0", "--log-level", "WARNING"]


def _commands(folder: Path) -> dict[str, list[str]]:
    """The 12 commands a person with no rights may try on someone's pipeline, with their own arguments."""
    rows, template = folder / "rows.jsonl", folder / "t.toml"
    rows.write_text('{"id": "r1", "review": "good"}\n')
    template.write_text(TEMPLATE)
    consumer = ["consumer", "--id", "c1", "--model", "m", "--budget", "4096", "--items", "8"]
    return {
        "status": ["status"],
        "produce": ["produce", "--trace", "mooncake_synthetic", "--limit", "5", "--backlog"],
        "audit": ["audit"],
        "jobs": ["jobs"],
        "processor": ["processor", "--instance", "p0", *QUIET],
        "consumer": [*consumer, *QUIET],
        "topics create": ["topics", "create"],
        "consumer --retire": ["consumer", "--id", "c1", "--retire"],
        "submit": ["submit", "--job", "j1", "--template", str(template), str(rows)],
        "collect": ["collect", "--job", "j1", "--out", str(folder / "out.jsonl")],
        "cancel": ["cancel", "j1"],
        "share": ["share", "j1"],
    }


def _run(argv: list[str], config: Path, prefix: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFABRIC_KAFKA_")}
    return subprocess.run(
        [sys.executable, "-m", "processor", *argv, "--kafka-config", str(config), "--topic-prefix", prefix],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def test_twelve_commands_by_a_principal_with_no_acls_each_print_one_line_and_exit_77(
    secured: BrokerInfo, tmp_path: Path
) -> None:
    names = new_pipeline(secured, "n")
    config = properties(secured, "nobody", TLS)
    commands = _commands(tmp_path)
    with ThreadPoolExecutor(4) as pool:
        done = dict(
            zip(commands, pool.map(lambda a: _run(a, config, names.prefix), commands.values()), strict=True)
        )
    wrong = {}
    for name, proc in done.items():
        lines = proc.stderr.strip().splitlines()
        said = lines[0] if len(lines) == 1 else proc.stderr
        one_refusal = (
            len(lines) == 1
            and "refused by the cluster's authorizer" in said
            and "for User:nobody" in said
            and any(f"'{names.prefix}{d}" in said for d in ".-")  # the resource, under the prefix
        )
        if proc.returncode != EXIT_REFUSED or not one_refusal:
            wrong[name] = (proc.returncode, proc.stderr[-600:])
    assert not wrong, wrong
    assert len(done) == 12


def test_a_nested_prefix_is_refused_and_gains_no_rights(secured: BrokerInfo, tmp_path: Path) -> None:
    """carol asks for ``<alice>-consumer`` (alice's prefixed ACLs would cover its groups and
    transactional ids): refused, nothing created. carol's own pipeline, whose name starts with
    alice's letters, stays out of alice's reach while alice holds every ACL of her own pipeline."""
    alice = new_pipeline(secured, "a")
    nested = f"{alice.prefix}-consumer"
    argv = ["acls", "--principal", "User:carol", "--create", "--topic-prefix", nested, "--bootstrap", "x:1"]
    proc = subprocess.run(
        [sys.executable, "-m", "processor", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "not isolated" in proc.stderr, proc.stderr
    admin = KAFKA.admin(admin_conf(secured))
    assert not [a for a in held_acls(admin, "User:carol") if a.name.startswith(nested)]
    carol = TopicNames(f"{alice.prefix}consumer")  # an isolated prefix starting with alice's letters
    create_topics(admin_conf(secured), topic_specs(carol, ingest_partitions=1))
    every = [a for acls in acls_for(["processor", "consumer", "audit"], alice).values() for a in acls]
    grant(secured, "alice", every)
    conf = secured.client_conf("alice", TLS)
    try:
        _init_transactions(conf, alice.processor_group + "-p0")  # her own: allowed
        with pytest.raises(KafkaException, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            _init_transactions(conf, carol.processor_group + "-p0")  # carol's processor p0
        with pytest.raises(Exception) as read:  # carol's ingest topic
            list(read_topic(conf, carol.ingest, timeout_s=10))
        assert refusal(read.value) is not None or isinstance(read.value, Refused), repr(read.value)
    finally:
        revoke(secured, "alice", every)


def _init_transactions(conf: dict[str, str], transactional_id: str) -> None:
    producer = KAFKA.producer({**conf, "transactional.id": transactional_id})
    producer.init_transactions(20)


def test_a_settings_file_with_an_unknown_key_is_one_line_and_exit_78(
    secured: BrokerInfo, tmp_path: Path
) -> None:
    names = new_pipeline(secured, "u")
    config = tmp_path / "bad.properties"
    config.write_text(properties(secured, "nobody", TLS).read_text() + "sasl.mechanisms.typo=PLAIN\n")
    for argv in (["status"], ["topics", "create"], ["processor", "--instance", "p0", *QUIET]):
        proc = _run(argv, config, names.prefix)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == EXIT_CONFIG and len(lines) == 1, (argv, proc.returncode, proc.stderr)
        assert "unknown client setting 'sasl.mechanisms.typo'" in lines[0], lines[0]


def test_no_process_started_with_the_secured_broker_showed_a_password(secured: BrokerInfo) -> None:
    """The watch ran while the session's secured broker started (keytool for every certificate,
    ``kafka-storage format`` with the SCRAM users, the broker): no password in any command line."""
    secrets = {
        value
        for user in (*USERS, "tokenfabric-admin")
        for listener in (TLS, MTLS)
        for key, value in secured.client_conf(user, listener).items()
        if key.endswith("password")
    }
    assert len(secrets) >= len(USERS)
    watched = started_with()
    assert watched.scans > 10, "the watch did not run"
    assert any("keytool" in line for line in watched.lines), "the watch missed keytool"
    assert any(".format-" in line for line in watched.lines), "the watch missed kafka-storage format"
    shown = {s[:4] + "...": watched.showing(s) for s in secrets if watched.showing(s)}
    assert not shown, shown


def test_acls_creates_and_deletes_exactly_its_list(secured: BrokerInfo) -> None:
    names = new_pipeline(secured, "d")
    admin_config = str(properties(secured, "tokenfabric-admin", TLS))
    wanted = set(acls_for(["producer", "status"], names)["producer"] + acls_for(["status"], names)["status"])
    argv = ["acls", "--principal", "User:dave", "--role", "producer", "--role", "status"]
    admin = KAFKA.admin(admin_conf(secured))
    created = _run([*argv, "--create"], Path(admin_config), names.prefix)
    assert created.returncode == 0, created.stderr
    assert held_acls(admin, "User:dave") == wanted
    deleted = _run([*argv, "--delete"], Path(admin_config), names.prefix)
    assert deleted.returncode == 0 and f"deleted {len(wanted)} ACLs" in deleted.stdout, deleted.stderr
    assert held_acls(admin, "User:dave") == set()


@pytest.mark.parametrize("resource", ["transactional-id", "group"])
def test_a_processor_refused_its_group_or_transactional_id_at_start_exits_77_not_75(
    secured: BrokerInfo, resource: str
) -> None:
    """Not "a restart recovers": under Kubernetes 75 would be a restart loop on a missing ACL."""
    names = new_pipeline(secured, "g")
    held = [a for a in acls_for(["processor"], names)["processor"] if a.resource != resource]
    grant(secured, "carol", held)
    try:
        proc = _run(
            ["processor", "--instance", "p0", *QUIET], properties(secured, "carol", TLS), names.prefix
        )
    finally:
        revoke(secured, "carol", held)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == EXIT_REFUSED and len(lines) == 1, (proc.returncode, proc.stderr[-800:])
    kind = resource.replace("-", " ")
    assert (
        "refused by the cluster's authorizer: " in lines[0]
        and f"on {kind} '{names.prefix}-processor" in lines[0]
    )
