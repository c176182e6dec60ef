"""The secured local broker's settings (processor/local/secure.py) and its certificates
(processor/local/tls.py), without a broker: tests/broker/test_security.py runs one."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest

from processor.local.jars import KafkaLocalError
from processor.local.secure import ADMIN_USER, BROKER_USER, LISTENERS, MTLS, SCRAM, TLS, SecureSetup
from processor.local.tls import PRINCIPAL_RULE, Authority, Identity, issue, make_authority


def _setup(tmp_path: Path) -> SecureSetup:
    """A setup with made-up stores: enough for the settings, no keytool."""
    ca = Authority(tmp_path, tmp_path / "ca.pem", tmp_path / "ca.p12", "capw")
    users = {ADMIN_USER: "adminpw", "alice": "alicepw"}
    ids = {u: Identity(u, tmp_path / f"{u}.p12", f"{u}-store") for u in users}
    return SecureSetup(tmp_path, ca, Identity(BROKER_USER, tmp_path / "b.p12", "bpw"), users, ids)


def test_the_broker_denies_what_no_acl_allows_and_takes_no_anonymous_client(tmp_path: Path) -> None:
    props = _setup(tmp_path).broker_properties({TLS: 1001, MTLS: 1002, SCRAM: 1003}, 1004, "127.0.0.1")
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == f"User:{BROKER_USER};User:{ADMIN_USER}"
    protocols = dict(pair.split(":") for pair in props["listener.security.protocol.map"].split(","))
    assert protocols == {TLS: TLS, MTLS: MTLS, SCRAM: SCRAM, "CONTROLLER": "SSL"}  # no PLAINTEXT port
    assert (
        props["ssl.client.auth"] == "required" and props["listener.name.sasl_ssl.ssl.client.auth"] == "none"
    )
    assert props["inter.broker.listener.name"] == MTLS
    assert props["ssl.principal.mapping.rules"] == PRINCIPAL_RULE
    assert (
        props["advertised.listeners"]
        == "SASL_SSL://127.0.0.1:1001,SSL://127.0.0.1:1002,SASL_PLAINTEXT://127.0.0.1:1003"
    )


def test_scram_users_are_formatted_in_and_clients_log_in_per_listener(tmp_path: Path) -> None:
    setup = _setup(tmp_path)
    args = setup.format_args()
    assert "SCRAM-SHA-512=[name=alice,password=alicepw]" in args and args.count("--add-scram") == 2
    tls, mtls, scram = (setup.client_conf("alice", listener, "h:1") for listener in LISTENERS)
    assert tls["sasl.username"] == "alice" and tls["ssl.ca.location"] == str(tmp_path / "ca.pem")
    assert mtls["ssl.keystore.location"] == str(tmp_path / "alice.p12") and "sasl.username" not in mtls
    assert "ssl.ca.location" not in scram and scram["sasl.mechanism"] == "SCRAM-SHA-512"
    java = setup.java_client_conf("alice", TLS)
    assert 'username="alice" password="alicepw";' in java["sasl.jaas.config"]
    with pytest.raises(KafkaLocalError, match="no user 'bob'"):
        setup.client_conf("bob", TLS, "h:1")


@pytest.mark.parametrize(
    ("users", "says"),
    [
        (["tokenfabric-admin"], "the broker's own"),
        (["a b"], "use 1-64 of"),
        ({"alice": "pass word"}, "without"),
        ({"alice": "a,b"}, "without"),
    ],
)
def test_bad_users_are_refused_before_any_certificate_is_made(
    users: list[str] | dict[str, str], says: str, tmp_path: Path
) -> None:
    with pytest.raises(KafkaLocalError, match=says):
        SecureSetup.create(tmp_path / "security", users)
    assert not (tmp_path / "security").exists()


def test_an_expired_identity_expired_yesterday_and_a_fresh_one_is_valid(tmp_path: Path) -> None:
    ca = make_authority(tmp_path)
    assert ca.cert_pem.read_text().startswith("-----BEGIN CERTIFICATE-----")
    now = datetime.now(UTC)
    for name, start, days, expired in (("fresh", None, 30, False), ("old", "-2d", 1, True)):
        ident = issue(ca, name, start=start, validity_days=days)
        assert ident.store.stat().st_mode & 0o077 == 0
        keytool = ["keytool", "-list", "-v", "-alias", "me", "-keystore", str(ident.store)]
        listing = subprocess.run(
            [*keytool, "-storepass", ident.password], capture_output=True, text=True, check=True
        ).stdout
        assert f"Owner: CN={name}" in listing and "Issuer: CN=tokenfabric-local-ca" in listing
        until = listing.split("until: ", 1)[1].splitlines()[0]
        assert (parsedate_to_datetime(_rfc2822(until)) < now) is expired, until


def _rfc2822(keytool_date: str) -> str:
    """keytool's ``Sat Dec 05 17:11:01 UTC 2026`` as ``Sat, 05 Dec 2026 17:11:01 +0000``."""
    day, month, date, time, _zone, year = keytool_date.split()
    return f"{day}, {date} {month} {year} {time} +0000"
