"""Kafka client settings: file, environment and flags in the documented order; secrets never printed.

The SASL round trip against a real secured broker is tests/broker/test_sasl.py; these tests need no broker.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import Producer

from processor.cli.tokenfabric import COMMANDS, build_parser
from processor.kafka.config import ConfigError, client_config, describe, from_env, read_properties, redacted

SECRET = "s3cr3t-Pa55word"


def _props(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kafka.properties"
    path.write_text(text)
    return path


def test_file_then_environment_then_flag(tmp_path: Path) -> None:
    path = _props(
        tmp_path,
        "# comment\n! also a comment\n\nbootstrap.servers = file:9092\nsecurity.protocol=SASL_SSL\n"
        "sasl.mechanism: SCRAM-SHA-512\nclient.id=from-file\n",
    )
    env = {"TOKENFABRIC_KAFKA_CLIENT_ID": "from-env", "TOKENFABRIC_KAFKA_SASL_PASSWORD": SECRET}
    conf = client_config(None, str(path), env)
    assert conf == {
        "bootstrap.servers": "file:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "client.id": "from-env",
        "sasl.password": SECRET,
    }
    assert client_config("flag:1", str(path), env)["bootstrap.servers"] == "flag:1"
    env["TOKENFABRIC_KAFKA_BOOTSTRAP_SERVERS"] = "env:2"
    assert client_config(None, str(path), env)["bootstrap.servers"] == "env:2"


def test_the_file_can_come_from_the_environment_and_bootstrap_from_kafka_bootstrap(tmp_path: Path) -> None:
    path = _props(tmp_path, "security.protocol=SASL_PLAINTEXT\n")
    conf = client_config(env={"TOKENFABRIC_KAFKA_CONFIG": str(path), "KAFKA_BOOTSTRAP": "kb:9092"})
    assert conf == {"security.protocol": "SASL_PLAINTEXT", "bootstrap.servers": "kb:9092"}


def test_names_under_the_prefix_that_are_not_properties_are_left_alone() -> None:
    # TOKENFABRIC_KAFKA_JVM_OPTS is the local broker's: as a client property it would break every client.
    env = {
        "TOKENFABRIC_KAFKA_JVM_OPTS": "-Djava.io.tmpdir=/x",
        "TOKENFABRIC_KAFKA_CONFIG": "/etc/kafka.properties",
        "TOKENFABRIC_KAFKA_": "nothing",
        "KAFKA_BOOTSTRAP": "not-a-property",
        "TOKENFABRIC_KAFKA_SSL_CA_LOCATION": "/ca.pem",
    }
    assert from_env(env) == {"ssl.ca.location": "/ca.pem"}


def test_environment_names_become_real_librdkafka_properties() -> None:
    env = {
        "TOKENFABRIC_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "TOKENFABRIC_KAFKA_SASL_MECHANISM": "PLAIN",
        "TOKENFABRIC_KAFKA_SASL_USERNAME": "alice",
        "TOKENFABRIC_KAFKA_SASL_PASSWORD": SECRET,
        "TOKENFABRIC_KAFKA_SOCKET_KEEPALIVE_ENABLE": "true",
        "TOKENFABRIC_KAFKA_ENABLE_SSL_CERTIFICATE_VERIFICATION": "false",
    }
    conf = client_config("127.0.0.1:1", env=env)
    Producer(conf).flush(0)  # an unknown property name raises KafkaException here


def test_a_malformed_line_is_reported_without_its_content(tmp_path: Path) -> None:
    path = _props(tmp_path, "bootstrap.servers=a:1\n" + SECRET + "\n")
    with pytest.raises(ConfigError) as err:
        read_properties(path)
    assert f"{path}:2" in str(err.value)
    assert SECRET not in str(err.value)
    with pytest.raises(ConfigError, match="No such file"):
        read_properties(tmp_path / "missing.properties")


def test_values_keep_their_separators(tmp_path: Path) -> None:
    path = _props(tmp_path, "sasl.password=a=b:c\nbootstrap.servers=h1:9092,h2:9092\n")
    assert read_properties(path) == {"sasl.password": "a=b:c", "bootstrap.servers": "h1:9092,h2:9092"}


def test_every_separator_kafka_users_write(tmp_path: Path) -> None:
    """``key=value``, ``key = value``, ``key: value`` and ``key value`` read alike, as in Java."""
    path = _props(
        tmp_path,
        "a=1\nb = 2\nc: 3\nd 4\ne\t5\n  f=6\ng=\nbootstrap.servers h:9092\n",
    )
    assert read_properties(path) == {
        "a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6", "g": "", "bootstrap.servers": "h:9092"
    }  # fmt: skip


def test_continuation_lines_and_comments(tmp_path: Path) -> None:
    path = _props(
        tmp_path,
        "# a comment \\\n"  # a comment line never continues
        "! another\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        '    username="alice" \\\n'
        f'    password="{SECRET}";\n'
        "ssl.ca.location=/etc/\\\n"
        "  # not a comment: the line continues\n"
        "client.id = tf\n",
    )
    assert read_properties(path) == {
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="alice" password="{SECRET}";',
        "ssl.ca.location": "/etc/# not a comment: the line continues",
        "client.id": "tf",
    }


def test_escapes_as_java_reads_them(tmp_path: Path) -> None:
    path = _props(tmp_path, "my\\ key\\=x = a\\=b\\:c\\\\d\\u00e9\\tend\\ \ntrail = v  \n")
    assert read_properties(path) == {"my key=x": "a=b:c\\d\u00e9\tend ", "trail": "v"}


def test_a_continued_line_is_numbered_by_its_first_line(tmp_path: Path) -> None:
    path = _props(tmp_path, "a=1\nb=2 \\\n  3\n" + SECRET + "\n")
    with pytest.raises(ConfigError, match=r"kafka\.properties:4: expected key=value") as err:
        read_properties(path)
    assert SECRET not in str(err.value)
    assert read_properties(_props(tmp_path, "a=1\nb=2 \\\n  3\n")) == {"a": "1", "b": "2 3"}


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "sasl.jaas.config",
    ],
)
def test_redacted_hides_secrets(key: str) -> None:
    out = redacted({key: SECRET, "sasl.username": "alice", "ssl.key.location": "/k.pem"})
    assert out == {key: "***", "sasl.username": "alice", "ssl.key.location": "/k.pem"}


def test_describe_is_one_safe_line() -> None:
    conf = {
        "bootstrap.servers": "b:9092",
        "sasl.password": SECRET,
        "sasl.username": "alice",
        "logger": logging.getLogger("x"),
        "error_cb": print,
    }
    line = describe(conf)
    assert SECRET not in line
    assert line == "bootstrap.servers=b:9092, sasl.password=***, sasl.username=alice"


#: ``local`` runs its own stack on the local broker (or a plain --bootstrap): no security settings.
KAFKA_COMMANDS = sorted(set(COMMANDS) - {"simulate", "kafka", "demo", "llm", "local", "registry"})


@pytest.mark.parametrize("command", KAFKA_COMMANDS)
def test_every_kafka_command_takes_the_shared_settings(command: str, tmp_path: Path) -> None:
    """Each command that talks to Kafka parses --bootstrap/--kafka-config into client_config."""
    parser = build_parser(command)
    sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    flags = {s for a in sub._actions for s in a.option_strings}
    assert {"--bootstrap", "--kafka-config", "--topic-prefix"} <= flags

    from processor.cli.options import kafka_settings

    path = _props(tmp_path, "security.protocol=SASL_SSL\n")
    required = {
        "topics": ["create"],
        "produce": ["--trace", "x"],
        "consumer": ["--id", "c"],
        "submit": ["d.jsonl", "--job", "j", "--template", "t.toml"],
        "collect": ["--job", "j", "--out", "o.jsonl"],
        "share": ["j"],
        "cancel": ["j"],
        "collector": ["--out-dir", "d"],
        "schemas": ["register"],
    }.get(command, [])
    args = parser.parse_args([command, *required, "--bootstrap", "b:1", "--kafka-config", str(path)])
    conf, _ = kafka_settings(args)
    assert conf["security.protocol"] == "SASL_SSL" and conf["bootstrap.servers"] == "b:1"


def test_schema_registry_keys_go_to_the_registry_client_not_to_librdkafka(tmp_path: Path) -> None:
    """The same file feeds both clients: ``schema.registry.*`` is taken out of librdkafka's settings
    (which would refuse it) and handed, without the prefix, to the registry client."""
    from processor.kafka.config import registry_config

    path = _props(
        tmp_path,
        "bootstrap.servers=b:9092\nschema.registry.url=https://r:8081\n"
        "schema.registry.basic.auth.user.info=u:p\n",
    )
    env = {"TOKENFABRIC_KAFKA_SCHEMA_REGISTRY_SSL_CA_LOCATION": "/ca.pem"}
    assert client_config(config_file=str(path), env=env) == {"bootstrap.servers": "b:9092"}
    assert registry_config(str(path), env) == {
        "url": "https://r:8081",
        "basic.auth.user.info": "u:p",
        "ssl.ca.location": "/ca.pem",
    }
    assert registry_config(None, {}) == {}
