"""docker-compose.yml runs the Kafka version the local broker and CI run, so the two stacks agree."""

from __future__ import annotations

import yaml

from processor.local.jars import KAFKA_VERSION
from tests.common import ROOT


def test_compose_runs_the_local_broker_s_kafka_version() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))["services"]
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
