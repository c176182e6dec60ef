"""The long-running commands, started with no broker to talk to, say so once and keep waiting.

The processor, a consumer and the collector are pointed at a closed port: each logs one warning
(what it tried, what librdkafka saw, what to check, how often it retries), none of librdkafka's
own lines, and keeps
probing until it is stopped; SIGTERM then ends it with exit 0 (processor/kafka/reach.py,
``wait_for_cluster``; docs/operations.md). They run side by side to keep the test to one probe's time;
tests/kafka/test_reach.py checks that the retries stay silent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from processor.kafka.reach import PROBE_TIMEOUT_S, RETRY_S
from tests.common import ROOT

DEAD = "127.0.0.1:1"
#: The collector serves no metrics.
SILENT = {
    "processor": ["--bootstrap", DEAD, "--metrics-port", "0"],
    "consumer": ["--bootstrap", DEAD, "--metrics-port", "0"],
    "collector": ["--bootstrap", DEAD],
}
COMMANDS = {
    "processor": ["processor"],
    "consumer": ["consumer", "--id", "c1", "--model", "m", "--budget", "1024", "--items", "4"],
    "collector": ["collector", "--out-dir", "{tmp}"],
}


def test_the_long_running_commands_say_once_that_no_broker_answers_and_keep_retrying(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENFABRIC_KAFKA_")}
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "processor",
                *(a.replace("{tmp}", str(tmp_path)) for a in argv),
                *SILENT[name],
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, argv in COMMANDS.items()
    }
    # the first probe fails after PROBE_TIMEOUT_S; that later ones stay silent is test_reach.py's
    time.sleep(PROBE_TIMEOUT_S + 3)
    for proc in procs.values():
        assert proc.poll() is None, "it gave up instead of waiting"
        proc.send_signal(signal.SIGTERM)
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=PROBE_TIMEOUT_S + 30)
        assert proc.returncode == 0, (name, err)
        assert "%3|" not in err and "Traceback" not in err and "KafkaError{" not in err, err
        said = [line for line in err.splitlines() if "no Kafka broker answered" in line]
        assert len(said) == 1, (name, err)
        line = said[0]
        assert f" WARNING tokenfabric.{name}: no Kafka broker answered at {DEAD} within" in line, line
        assert "Connection refused" in line, line
        assert line.endswith(f"retrying every {RETRY_S:g} s until it answers"), line
        assert "stopped before Kafka answered" in err, err
