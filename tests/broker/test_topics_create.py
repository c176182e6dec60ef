"""``topics create`` with a replication factor and ``min.insync.replicas``, on a real broker.

The local broker has one node: a factor of 1 with ``min.insync.replicas`` 1 is applied to every
topic (read back through the Admin API), and a factor of 3 is refused by the broker in one line.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

from processor.cli.tokenfabric import main
from processor.kafka.topics import TopicNames

pytestmark = pytest.mark.kafka


def test_durability_flags_reach_every_topic(kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    names = TopicNames(f"d{uuid.uuid4().hex[:8]}")
    kafka = ["--bootstrap", kafka_bootstrap, "--topic-prefix", names.prefix]
    assert main(["topics", "create", "--replication-factor", "1", "--min-insync-replicas", "1", *kafka]) == 0
    capsys.readouterr()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in (names.ingest, names.accounting)]
    for resource, future in admin.describe_configs(resources).items():
        entry = future.result(timeout=30)["min.insync.replicas"]
        assert (entry.value, entry.source) == ("1", ConfigSource.DYNAMIC_TOPIC_CONFIG.value), resource

    other = TopicNames(f"d{uuid.uuid4().hex[:8]}")
    code = main(
        [
            "topics",
            "create",
            "--replication-factor",
            "3",
            "--bootstrap",
            kafka_bootstrap,
            "--topic-prefix",
            other.prefix,
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"tokenfabric topics: error: creating topics on {kafka_bootstrap}: "), err
    assert "replication factor" in err.lower() and len(err.strip().splitlines()) == 1, err
