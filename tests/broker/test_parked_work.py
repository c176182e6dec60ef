"""Work that would park without a word: ``submit`` says when no consumer serves the job's model.

A job for a model nobody serves used to be accepted silently, and ``collect --wait`` then counted its
rows missing until it timed out. ``submit`` now reads the contracts topic first and warns (the job
still goes out: a consumer may come later), and says nothing once a consumer of the model has
announced itself; a retired consumer (a tombstone) no longer counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer

from processor.cli.tokenfabric import main
from processor.core.contract import Contract
from processor.wire.control import encode_contract
from processor.wire.records import ContractRecord
from tests.broker.rig import new_topics, review_job

pytestmark = pytest.mark.kafka


def test_submit_warns_while_no_consumer_serves_the_model(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf, topics = new_topics(kafka_bootstrap, "w", ["card"], ingest_partitions=1)
    data, template = review_job(tmp_path, 3, model="labeller")
    kafka = ["--bootstrap", kafka_bootstrap, "--topic-prefix", topics.prefix]

    def submit(job: str) -> str:
        assert (
            main(["submit", str(data), "--job", job, "--template", str(template), "--no-progress", *kafka])
            == 0
        )
        return capsys.readouterr().err

    warning = (
        f"tokenfabric submit: warning: no consumer serves model 'labeller' on {topics.contracts}; the job's "
        "items wait until one announces it "
        f"('tokenfabric status --bootstrap {kafka_bootstrap} --topic-prefix {topics.prefix}' lists them as "
        "UNSERVED)\n"
    )
    assert submit("j1") == warning

    producer = Producer(conf)
    other = Contract("other", "another-model", budget_tokens=512, max_items=4, pad_multiple=8, max_inflight=1)
    producer.produce(topics.contracts, encode_contract(ContractRecord(other, 1)), b"other")
    producer.flush(10)
    assert submit("j2") == warning  # a consumer of another model changes nothing

    card = Contract("card", "labeller", budget_tokens=512, max_items=4, pad_multiple=8, max_inflight=1)
    producer.produce(topics.contracts, encode_contract(ContractRecord(card, 1)), b"card")
    producer.flush(10)
    assert submit("j3") == ""

    producer.produce(topics.contracts, None, b"card")  # retired
    producer.flush(10)
    assert submit("j4") == warning
