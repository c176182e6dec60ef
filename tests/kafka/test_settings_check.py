"""Client settings librdkafka will not build a client with, and a SASL mechanism the broker does not
offer: one line naming the setting, exit 78 (processor/kafka/settings_check.py), at once.

librdkafka itself judges the settings here (the probe builds a real client; no broker is needed, as
the client is refused before it connects). A broker that answers with another mechanism is
tests/broker/test_refusals.py's and the text it sends is quoted below.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from processor.kafka.exits import EXIT_CONFIG
from processor.kafka.reach import probe
from processor.kafka.settings_check import WrongClientSettings, misconfigured_line

NOWHERE = {"bootstrap.servers": "127.0.0.1:1"}


def _refused(conf: dict[str, str]) -> str:
    with pytest.raises(WrongClientSettings) as wrong:
        probe({**NOWHERE, **conf}, timeout_s=30)
    line = str(wrong.value)
    assert wrong.value.exit_code == EXIT_CONFIG and "\n" not in line, line
    return line


def test_an_unknown_key_is_named() -> None:
    line = _refused({"sasl.mechanisms.typo": "PLAIN"})
    assert "unknown client setting 'sasl.mechanisms.typo'" in line, line


def test_a_missing_or_unreadable_ca_file_is_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    line = _refused({"security.protocol": "SSL", "ssl.ca.location": missing})
    assert f"ssl.ca.location={missing}: no such file" in line, line
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    line = _refused({"security.protocol": "SSL", "ssl.ca.location": str(garbage)})
    assert f"ssl.ca.location={garbage}: not a PEM certificate" in line, line


def test_a_key_store_its_password_does_not_open_is_named_and_the_password_is_not(tmp_path: Path) -> None:
    key, cert, store = tmp_path / "k.pem", tmp_path / "c.pem", tmp_path / "me.p12"
    run = {"check": True, "capture_output": True, "env": {**os.environ, "STOREPASS": "right-one"}}
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=me", "-days", "1"], **run,
    )  # fmt: skip
    subprocess.run(
        ["openssl", "pkcs12", "-export", "-inkey", str(key), "-in", str(cert), "-out", str(store),
         "-passout", "env:STOREPASS"], **run,
    )  # fmt: skip
    conf = {"security.protocol": "SSL", "ssl.keystore.location": str(store)}
    line = _refused({**conf, "ssl.keystore.password": "wrong-one"})
    assert f"ssl.keystore.password does not open ssl.keystore.location={store}" in line, line
    assert "wrong-one" not in line


def test_a_mechanism_the_broker_does_not_offer_is_named() -> None:
    said = [
        "SASL PLAIN mechanism handshake failed: Broker: Unsupported SASL mechanism: broker's supported "
        "mechanisms: SCRAM-SHA-512 (after 303ms in state AUTH_HANDSHAKE)"
    ]  # librdkafka 2.x, against tests/broker's secured broker
    line = misconfigured_line(said, {"sasl.mechanism": "PLAIN"})
    assert line == (
        "sasl.mechanism=PLAIN: the broker does not offer it (it offers SCRAM-SHA-512); set "
        "sasl.mechanism to one of those"
    )
    assert misconfigured_line(["Connect to ipv4#127.0.0.1:1 failed"], {}) is None
