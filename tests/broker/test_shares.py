"""Token shares through the pipeline (docs/shares.md): a weighted pair of jobs on a real broker.

A backlog job is produced first, then a small job with weight 4 set on the job-shares topic; one
card whose simulated engine takes real time, so a backlog forms. The small job must be served
before the backlog is done, every batch must hold one job's items, and the processor's per-job
ledger must balance with the tokens produced. Changing the weight while it runs reaches the
processor through the compacted topic.
"""

from __future__ import annotations

import time

import pytest

from processor.apps.consumer import ConsumerApp
from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.cli.tokenfabric import main
from processor.core.contract import Contract
from processor.core.shares import JobPolicy
from processor.engines.sim import SimEngine
from processor.jobs.topic import JobWriter, read_job_shares
from processor.kafka.reader import read_topic
from processor.sim.cardmodel import CardSpec
from processor.wire.items import decode_batch
from tests.broker.rig import QUICK, in_process, wait_for

pytestmark = pytest.mark.kafka

CARD = Contract("card", "default", budget_tokens=4096, max_items=32, pad_multiple=8, max_inflight=1)


def test_a_weighted_small_job_behind_a_backlog_is_served_first_and_counted_per_job(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = in_process(kafka_bootstrap, (), letter="s", instance="shares", commit_interval_ms=300)
    engine = SimEngine(CardSpec(tokens_per_s=150_000, overhead_ms=1), 0.0)
    rig.apps.append(ConsumerApp(rig.conf, rig.topics, CARD, engine, QUICK))
    writer = JobWriter(rig.conf, rig.topics)
    writer.write_share("small", JobPolicy(weight=4), int(time.time() * 1000))
    sent: dict[str, int] = {"big": 0, "small": 0}
    rig.start()
    try:
        with TokenProducer(rig.conf, rig.topics) as producer:
            for i in range(1500):
                n = 100 + (i * 37) % 300
                producer.send(f"big:{i}", "default", synthetic_tokens(f"big:{i}", n), shape=1, job_id="big")
                sent["big"] += n
        core = rig.processor.core
        wait_for(lambda: core.view.job_book("big").received.items == 1500, 60, "the backlog to be read")
        assert core.view.job_book("big").queued.items > 500  # a backlog is waiting
        with TokenProducer(rig.conf, rig.topics) as producer:
            for i in range(60):
                n = 100 + (i * 53) % 300
                producer.send(
                    f"small:{i}", "default", synthetic_tokens(f"small:{i}", n), shape=2, job_id="small"
                )
                sent["small"] += n
        wait_for(lambda: core.view.job_book("small").completed.items == 60, 60, "the small job to complete")
        assert core.view.job_book("big").queued.items > 0, "the backlog drained first: no sharing to see"
        assert core.view.policy("small").weight == 4
        writer.write_share("small", JobPolicy(weight=2), int(time.time() * 1000))
        wait_for(lambda: core.view.policy("small").weight == 2, 30, "the new weight to reach the processor")
        wait_for(lambda: core.view.job_book("big").completed.items == 1500, 120, "the backlog to complete")
    finally:
        rig.close()
        writer.close()
    assert not rig.errors, rig.errors
    core = rig.processor.core
    core.check(deep=False)  # the ledger's equations, the jobs' books among them
    for job, tokens in sent.items():
        book = core.view.job_book(job)
        assert (book.received.tokens, book.routed.tokens, book.completed.tokens) == (
            tokens,
            tokens,
            tokens,
        ), job
        assert book.padded_tokens >= tokens
    assert read_job_shares(rig.conf, rig.topics) == {"small": JobPolicy(weight=2)}
    kafka = ["--bootstrap", kafka_bootstrap, "--topic-prefix", rig.topics.prefix]
    capsys.readouterr()
    assert main(["share", "small", *kafka]) == 0
    assert capsys.readouterr().out.strip() == "job small: weight 2"
    assert main(["share", "big", "--max-tokens", "10", *kafka]) == 0
    assert read_job_shares(rig.conf, rig.topics)["big"] == JobPolicy(max_tokens=10)
    assert main(["share", "big", "--clear", *kafka]) == 0
    assert "big" not in read_job_shares(rig.conf, rig.topics)
    jobs_in_order = []
    for msg in read_topic(rig.conf, rig.topics.batches(CARD.consumer)):
        jobs = {it.job_id for it in decode_batch(msg.value()).items}
        assert len(jobs) == 1, jobs  # a batch is one job's
        jobs_in_order.append(jobs.pop())
    last_small = max(i for i, j in enumerate(jobs_in_order) if j == "small")
    last_big = max(i for i, j in enumerate(jobs_in_order) if j == "big")
    assert last_small < last_big
