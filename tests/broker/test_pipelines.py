"""Two pipelines on one cluster: every Kafka identity comes from the pipeline's name (its topic prefix).

Both pipelines here use the default processor group, the same processor instance id (``p0``), the
same consumer ids and even the same item ids. Were the groups or transactional ids not derived from the
prefix, the second processor would fence the first (same transactional id) and the consumer apps of
one pipeline would fence, or read for, the other's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.local.pipeline import Pipeline
from tests.broker.rig import CARDS, Rig, assert_exactly_once, new_topics, produce

pytestmark = pytest.mark.kafka

ITEMS = 300


def _processor_args(rig: Rig) -> list[str]:
    """``tokenfabric processor`` with the defaults a deployment keeps: no --group."""
    return [
        "processor", "--bootstrap", rig.bootstrap, "--topic-prefix", rig.topics.prefix,
        "--instance", "p0", "--commit-interval-ms", "200", "--metrics-port", "0", "--log-level", "WARNING",
    ]  # fmt: skip


def test_two_pipelines_with_the_same_ids_run_side_by_side_each_exactly_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    rigs = []
    for letter in ("a", "b"):
        conf, topics = new_topics(kafka_bootstrap, letter, [c.consumer for c in CARDS])
        (tmp_path / letter).mkdir()
        rigs.append(Rig(conf, topics, topics.processor_group, Pipeline(tmp_path / letter), kafka_bootstrap))
    assert rigs[0].group != rigs[1].group
    try:
        for rig in rigs:
            rig.spawn("processor", _processor_args(rig))
            for contract in CARDS:
                rig.spawn_consumer(contract.consumer, contract)
        produced = [produce(rig, ITEMS, seed=7) for rig in rigs]  # the same item ids in both
        for rig, (ids, _tokens) in zip(rigs, produced, strict=True):
            rig.wait_completed(len(ids), timeout_s=180)
        for rig in rigs:
            rig.pipeline.check_alive()  # nobody was fenced
        for rig, (ids, tokens) in zip(rigs, produced, strict=True):
            assert_exactly_once(rig, ids, tokens)
    finally:
        codes = [rig.pipeline.stop() for rig in rigs]
    assert all(code == 0 for pipeline in codes for code in pipeline.values()), codes
