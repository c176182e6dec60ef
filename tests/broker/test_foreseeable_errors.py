"""A processor started against topics it cannot use says why in one line and exits by the rule.

docs/operations.md and processor/kafka/exits.py: 75 (``EX_TEMPFAIL``) when a restart cures it, such
as topics the topics Job has not created yet; 2 when the settings contradict what the topics hold,
such as a ``--group`` that did not process them, which a restart with the same flags cannot cure.
``--log-level ERROR`` leaves only the error on stderr. The broker-free cases are in
tests/cli/test_foreseeable_errors.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.kafka.exits import EXIT_TEMPFAIL, EXIT_USAGE
from processor.ops.status import gather
from processor.sim.tracegen import synthetic_records
from tests.broker.rig import running_in_process, wait_for
from tests.common import ROOT

pytestmark = pytest.mark.kafka


def _processor(bootstrap: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["processor", "--bootstrap", bootstrap, "--metrics-port", "0", "--log-level", "ERROR", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFABRIC_KAFKA_")}
    return subprocess.run(
        [sys.executable, "-m", "processor", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "KafkaError{" not in err, err
    return lines[0]


def test_missing_topics_exit_75_in_one_line_naming_them(kafka_bootstrap: str) -> None:
    prefix = f"m{uuid.uuid4().hex[:8]}"
    done = _processor(kafka_bootstrap, "--topic-prefix", prefix)
    assert done.returncode == EXIT_TEMPFAIL, done.stderr
    line = _one_line(done.stderr)
    assert f"missing topic(s) {prefix}.ingest, {prefix}.results" in line, line
    assert f"tokenfabric topics create --topic-prefix {prefix}" in line, line
    assert line.endswith("exiting with 75, a restart recovers from the last commit"), line


def test_a_group_that_did_not_process_the_topics_exits_2_in_one_line(kafka_bootstrap: str) -> None:
    records = synthetic_records(40, seed=5, shapes=4, min_len=16, max_len=300, rate_per_s=None)
    # no consumer: every item waits in a lane, so the changelog holds them when the processor stops
    with running_in_process(kafka_bootstrap, [], letter="g") as rig:
        with TokenProducer(rig.conf, rig.topics) as producer:
            for r in records:
                producer.send(r.id, r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
        wait_for(lambda: gather(rig.conf, rig.topics).total("received_items") == len(records), 60, "intake")
    prefix = rig.topics.prefix
    done = _processor(kafka_bootstrap, "--topic-prefix", prefix, "--group", "not-this-pipelines-group")
    assert done.returncode == EXIT_USAGE, done.stderr
    line = _one_line(done.stderr)
    assert "group 'not-this-pipelines-group' has committed no offset on them" in line, line
    assert "--group is not the group that processed these topics" in line, line
    # (with the right group, a restart restores such a changelog: tests/broker/test_restore.py)
